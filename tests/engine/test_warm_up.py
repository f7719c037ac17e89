"""The warm-up's steps (engine/runner/model_runner.py `warm_up_plans`, run on CUDA before the
engine reports ready) are valid plans on every path: each runs on a CPU engine, and a plan
with a checkpoint outside its row fails in ForwardBatch on any device, not only in the GPU
kernels (a warm-up checkpoint at a chunk's end once failed every CUDA start)."""
import pytest
import torch

from hybrid_serve import LLM
from hybrid_serve.engine.runner.model_runner import warm_up_plans
from hybrid_serve.engine.runner.step_plan import StepPlan


@pytest.fixture(scope="module")
def runner():
    torch.set_num_threads(2)
    return LLM(device="cpu", max_num_seqs=4, max_model_len=512, cache_memory_bytes=64 << 20).engine.runner


def test_every_warm_up_plan_runs(runner):
    plans = warm_up_plans(256, runner.state_pool.num_slots)
    assert any(p.checkpoints for p in plans)
    offsets = {off for p in plans for _, off, _ in p.checkpoints}
    assert 1 in offsets and max(offsets) >= 3  # both conv snapshot variants: taps from the slot and from x
    for plan in plans:
        logits = runner.execute(plan)
        assert logits.shape[0] == len(plan.sample_rows) and torch.isfinite(logits).all()


@pytest.mark.parametrize("offset", [0, 8, 9])
def test_a_checkpoint_outside_its_row_is_refused(runner, offset):
    plan = StepPlan(req_rows=[0], prefix_lens=[0], extend_lens=[8], input_ids=[0] * 8, sample_rows=[0],
                    checkpoints=[(0, offset, 1)])
    with pytest.raises(ValueError, match=f"checkpoint offset {offset} is not inside batch row 0"):
        runner.execute(plan)
