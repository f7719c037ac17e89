"""Piecewise graphs (engine/runner/piecewise_graph.py) on CPU, where no CUDA graph exists:

- padding: nothing captured, each padded step runs the model eagerly on the static buffers
  with its padding row (request row 0: the dummy KV slot and state slot);
- the capture and replay mechanics: `RecordedGraph` has CUDAGraph's interface and its
  semantics (capture records the aten ops; replay runs them again and writes each result
  into the tensor the capture produced, as a graph writes to fixed addresses), so the cuts
  at the varlen ops, their outputs feeding the next graph and the step's ForwardBatch in
  place of the capture's are exercised as on a GPU.

Prompt chunks beside decoding rows, checkpoints inside them and the padding must leave greedy
tokens as the plain path has them, and the pools clean. Captured CUDA graphs:
tests/gpu/test_piecewise_graphs.py."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from hybrid_serve import LLM, SamplingParams
from hybrid_serve.engine.runner.piecewise_graph import piecewise_sizes


class _Recorder(TorchDispatchMode):
    def __init__(self, log: list) -> None:
        super().__init__()
        self.log = log

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.log.append((func, args, kwargs, out))
        return out


class RecordedGraph:
    """torch.cuda.CUDAGraph's interface on CPU (see the module docstring)."""

    def __init__(self) -> None:
        self.log: list = []
        self._mode = None

    def capture_begin(self, pool=None) -> None:
        self._mode = _Recorder(self.log)
        self._mode.__enter__()

    def capture_end(self) -> None:
        self._mode.__exit__(None, None, None)

    def replay(self) -> None:
        for func, args, kwargs, out in self.log:
            result = func(*args, **kwargs)
            for o, r in zip(tree_flatten(out)[0], tree_flatten(result)[0]):
                if isinstance(o, torch.Tensor) and o is not r and o.data_ptr() != r.data_ptr():
                    o.copy_(r)


def test_sizes():
    assert piecewise_sizes(96) == [16, 32, 64, 96]
    assert piecewise_sizes(2048)[-3:] == [1536, 1792, 2048]
    assert piecewise_sizes(10) == [10]
    # past the table's 2,048, a size every 256 tokens up to the budget (CUDA's default: 8,192)
    assert piecewise_sizes(8192)[-6:] == [6912, 7168, 7424, 7680, 7936, 8192]
    assert piecewise_sizes(8192)[13:16] == [2048, 2304, 2560] and len(piecewise_sizes(8192)) == 38
    assert piecewise_sizes(5000)[-3:] == [4608, 4864, 5000]
    assert piecewise_sizes(4608)[-3:] == [4096, 4352, 4608]
    with pytest.raises(ValueError):
        piecewise_sizes(0)


def _greedy(model_dir, mode: str | None):
    llm = LLM(model=model_dir, dtype="float32", max_num_seqs=4, max_num_batched_tokens=24, chunked_prefill_size=16,
              max_model_len=96, state_checkpoint_interval=16)
    runner = llm.engine.runner
    sizes_run = []
    if mode is not None:
        pw = runner.use_piecewise_graphs(24)
        if mode == "recorded":
            pw.capture(graph_class=RecordedGraph)
            for pieces in pw.pieces.values():
                assert pieces.calls and len(pieces.graphs) == len(pieces.calls) + 1
        run = pw.run
        pw.run = lambda size, fb: sizes_run.append(size) or run(size, fb)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (5, 37, 12, 21)]
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (9, 4, 7, 5)]
    outs = llm.generate(prompts, params)
    llm.engine.cache.check_empty()
    if mode is not None:
        assert set(sizes_run) >= {16, 24} and len(sizes_run) >= 4
    return [o.outputs[0].token_ids for o in outs]


# The recorder replays aten ops, so the recorded families are those whose token-parallel ops
# have static shapes on the torch reference path too: the MoE reference groups tokens by
# expert (data-dependent shapes; the Triton MoE a GPU captures has none), so MoE families
# (nemotron_h's tiny config has an MoE layer, qwen3_next) check the padding only here.
@pytest.mark.parametrize("family, recorded", [("qwen3_5", True), ("lfm2", True), ("bamba", True),
                                              ("nemotron_h", False), ("qwen3_next", False)])
def test_padded_and_recorded_steps_give_the_same_tokens(family, recorded, reference_models):
    model_dir = reference_models(family)[0]
    plain = _greedy(model_dir, None)
    assert _greedy(model_dir, "padding") == plain
    if recorded:
        assert _greedy(model_dir, "recorded") == plain


def test_a_size_out_of_memory_runs_eagerly_and_the_rest_keep_graphs(reference_models, caplog):
    """A capture that runs out of memory (graphs beside a cache that took the card) skips that
    size with a warning: its steps run eagerly, smaller sizes replay, tokens unchanged; when
    no size fits, capture raises the OOM (the runner turns it into a start error naming the
    remedies)."""
    model_dir = reference_models("qwen3_5")[0]
    plain = _greedy(model_dir, None)
    llm = LLM(model=model_dir, dtype="float32", max_num_seqs=4, max_num_batched_tokens=24, chunked_prefill_size=16,
              max_model_len=96, state_checkpoint_interval=16)
    pw = llm.engine.runner.use_piecewise_graphs(24)
    capture_one = pw._capture

    def capture_until_16(size, pool, graph_class):
        if size > 16:
            raise torch.OutOfMemoryError(f"no room for {size} tokens")
        return capture_one(size, pool, graph_class)

    pw._capture = capture_until_16
    with caplog.at_level("WARNING"):
        pw.capture(graph_class=RecordedGraph)
    assert pw.sizes == [16] and pw.skipped_sizes == [24] and list(pw.pieces) == [16]
    assert "[24]" in caplog.text and "up to 16 tokens" in caplog.text
    assert pw.padded_size(16) == 16 and pw.padded_size(17) is None  # 17..24 tokens: eager
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (5, 37, 12, 21)]
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (9, 4, 7, 5)]
    outs = llm.generate(prompts, params)
    llm.engine.cache.check_empty()
    assert [o.outputs[0].token_ids for o in outs] == plain
    assert pw.num_steps > 0  # the 16-token graphs replayed

    none_fit = llm.engine.runner.use_piecewise_graphs(24)
    none_fit._capture = lambda size, pool, graph_class: (_ for _ in ()).throw(torch.OutOfMemoryError("full"))
    with pytest.raises(torch.OutOfMemoryError, match=r"\[16, 24\]"):
        none_fit.capture(graph_class=RecordedGraph)
