"""Reply checkpoints on a GPU (EngineConfig.reply_checkpoints): the snapshot of a decoding
request's state at its reply's page boundary is a copy queued after a decode-graph replay
(overlapped scheduling: the step's tokens still on the device), or, after a verify step, a
copy from the step's scratch. Conversations of three turns, replies ending on content: every
turn's greedy tokens equal those of a run without any cache, later turns resume past their
reply, and the pools are consistent after each turn, for every family (fp32). Marker `gpu`."""
import os

import pytest
import torch

from hf_reference import FAMILIES
from hybrid_serve import LLM, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                       reason="needs a CUDA GPU with compiled Triton"),
]

PAGE = 16
STOP = SamplingParams(max_tokens=48, temperature=0.0, stop_token_ids=list(range(0, 256, 13)), min_tokens=10)
ENGINE = dict(dtype="float32", device="cuda", max_num_seqs=6, max_model_len=512,
              cache_memory_bytes=64 * 1024**2, chunked_prefill_size=64, async_scheduling=True)


def _conversations(llm: LLM, off: LLM, turns: int = 3, seed: int = 0) -> tuple[int, int]:
    """Ten conversations through `llm`, each turn checked against `off`. Returns (turns
    resumed at their reply's last page boundary, later turns that could be)."""
    rng = torch.Generator().manual_seed(seed)
    histories = [torch.randint(0, 256, (int(torch.randint(5, 60, (1,), generator=rng)),), generator=rng).tolist()
                 for _ in range(10)]
    sent, resumed, could = [None] * len(histories), 0, 0
    for _ in range(turns):
        outs = llm.generate(histories, STOP)
        want = [o.outputs[0].token_ids for o in off.generate(histories, STOP)]
        assert [o.outputs[0].token_ids for o in outs] == want
        llm.engine.cache.check_empty()
        for n_sent, out in zip(sent, outs):
            if n_sent is not None and (n_sent - 1) // PAGE > 0:
                could += 1
                resumed += out.num_cached_tokens == (n_sent - 1) // PAGE * PAGE
        sent = [len(h) + len(o.outputs[0].token_ids) for h, o in zip(histories, outs)]
        histories = [h + o.outputs[0].token_ids + torch.randint(0, 256, (5,), generator=rng).tolist()
                     for h, o in zip(histories, outs)]
    return resumed, could


@pytest.mark.parametrize("family", FAMILIES)
def test_turns_resume_after_graph_decoded_replies(family, reference_models):
    """Decode graphs and overlapped scheduling: the snapshot copy follows the graph's replay on
    the stream, before the next step overwrites the state."""
    model_dir, _ = reference_models(family)
    llm = LLM(model=model_dir, **ENGINE)
    assert llm.engine.runner.decode_graphs is not None
    off = LLM(model=model_dir, enable_prefix_caching=False, **ENGINE)
    resumed, could = _conversations(llm, off)
    assert could > 0 and resumed >= could * 3 // 4, (resumed, could)


@pytest.mark.parametrize("uniform", [False, True], ids=["random_lengths", "uniform_verify_graphs"])
def test_turns_resume_after_verified_replies(uniform, reference_models):
    """Speculative verify (synthetic drafts, 60% accepted; uniform K replays verify graphs):
    the snapshot is copied from the verify step's scratch at the boundary the accepted
    tokens reached."""
    model_dir, _ = reference_models("qwen3_5")
    off = LLM(model=model_dir, enable_prefix_caching=False, **ENGINE)
    rng = torch.Generator().manual_seed(5)
    firsts = [torch.randint(0, 256, (30 + 11 * i,), generator=rng).tolist() for i in range(5)]
    greedy = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    replies = [o.outputs[0].token_ids for o in off.generate(firsts, greedy)]
    seconds = [p + r + torch.randint(0, 256, (9,), generator=rng).tolist() for p, r in zip(firsts, replies)]
    want = [o.outputs[0].token_ids for o in off.generate(seconds, greedy)]
    spec = dict(method="synthetic", num_speculative_tokens=4, adaptive=False, vary_length=not uniform, seed=3,
                acceptance_rate=0.6, continuations={tuple(p): w for p, w in zip(firsts + seconds, replies + want)})
    llm = LLM(model=model_dir, speculative_config=spec, **ENGINE)
    assert [o.outputs[0].token_ids for o in llm.generate(firsts, greedy)] == replies
    outs = llm.generate(seconds, greedy)
    assert [o.outputs[0].token_ids for o in outs] == want
    assert [o.num_cached_tokens for o in outs] == [(len(p) + 40 - 1) // PAGE * PAGE for p in firsts]
    if uniform:
        assert llm.engine.runner.num_verify_graph_steps > 0
    llm.engine.cache.check_empty()
