"""AsyncLLMEngine (no Ray): deltas add up to the offline output, n > 1, stop strings held
back while streaming, abort on close, bad input before the first delta, a failing step
fails every request and marks the engine dead."""
import asyncio

import pytest

from hybrid_serve import LLM, SamplingParams
from hybrid_serve.engine.admission import LoadView
from hybrid_serve.engine.async_engine import AsyncLLMEngine, EngineDeadError
from hybrid_serve.engine.validation import ModelLimits
from hybrid_serve.metrics import EngineMetrics


@pytest.fixture(scope="module")
def llm():
    return LLM(cache_memory_bytes=32 * 1024**2, max_model_len=128)


@pytest.fixture(scope="module")
def ref_llm():
    """A second engine for reference outputs (the first one belongs to the engine thread)."""
    return LLM(cache_memory_bytes=32 * 1024**2, max_model_len=128)


@pytest.fixture(scope="module")
def engine(llm):
    eng = AsyncLLMEngine(llm.engine, model_name="demo", replica="async-test")
    yield eng
    eng.shutdown()


def _ids(llm, text="Hello, hybrid world"):
    return llm.tokenizer.encode(text, add_special_tokens=False)


async def _collect(engine, ids, params, rid):
    texts, tokens, finish = {}, {}, {}
    async for delta in engine.generate(ids, params, rid):
        for s in delta.seqs:
            texts[s.index] = texts.get(s.index, "") + s.text
            tokens[s.index] = tokens.get(s.index, []) + s.token_ids
            if s.finish_reason:
                finish[s.index] = s.finish_reason
    return texts, tokens, finish


def test_deltas_add_up_to_offline_output(llm, ref_llm, engine):
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    ref = ref_llm.generate([_ids(llm)], params)[0].outputs[0]
    texts, tokens, finish = asyncio.run(_collect(engine, _ids(llm), params, "a1"))
    assert tokens[0] == ref.token_ids and texts[0] == ref.text and finish[0] == "length"


def test_n2_and_concurrent_requests(llm, engine):
    params = SamplingParams(n=2, max_tokens=6, temperature=1.0, seed=5, ignore_eos=True)

    async def main():
        return await asyncio.gather(*[_collect(engine, _ids(llm), params, f"c{i}") for i in range(3)])

    results = asyncio.run(main())
    for _texts, tokens, _finish in results:
        assert sorted(tokens) == [0, 1] and all(len(t) == 6 for t in tokens.values())
        assert tokens == results[0][1]  # same seed, same tokens whatever the batch


def test_stop_string_is_never_streamed(llm, ref_llm, engine):
    free = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    text = ref_llm.generate([_ids(llm)], free)[0].outputs[0].text
    at = next(i for i in range(4, len(text) - 4) if text.find(text[i:i + 4]) == i)
    stop = text[at:at + 4]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, stop=[stop])

    async def main():
        pieces = []
        async for delta in engine.generate(_ids(llm), params, "s1"):
            pieces.append(delta.seqs[0].text)
            assert stop not in "".join(pieces)
        return "".join(pieces), delta.seqs[0]

    streamed, last = asyncio.run(main())
    assert streamed == text[:at] and last.finish_reason == "stop" and last.stop_reason == stop


def test_close_aborts(llm, engine):
    params = SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True)
    aborted = engine.metrics.success["abort"]._value.get()

    async def main():
        gen = engine.generate(_ids(llm), params, "ab1")
        await gen.__anext__()
        await gen.aclose()
        for _ in range(200):
            await asyncio.sleep(0.01)
            if not llm.engine.has_unfinished():
                return True
        return False

    assert asyncio.run(main())
    assert engine.metrics.success["abort"]._value.get() == aborted + 1


def test_bad_input_raises_before_any_delta(llm, engine):
    async def main(ids, params):
        async for _ in engine.generate(ids, params, "bad"):
            pass

    with pytest.raises(ValueError, match="vocabulary"):
        asyncio.run(main([10**6], SamplingParams(max_tokens=2)))
    with pytest.raises(ValueError, match="max_model_len"):
        asyncio.run(main([5] * 127, SamplingParams(max_tokens=8)))


class _BrokenEngine:
    """Takes requests, then every step raises."""

    def __init__(self):
        self.limits, self.pending = ModelLimits(max_model_len=64, vocab_size=10), []

    def load_view(self):
        return LoadView(len(self.pending), 0, 0, 1, 1, 1, 8)

    def add_request(self, rid, ids, params, validated=False):
        self.pending.append(rid)
        return [rid]

    def has_unfinished(self):
        return bool(self.pending)

    def get_request(self, seq_id):
        return None

    def step(self):
        raise RuntimeError("boom")

    def abort(self, seq_id):
        pass


def test_failing_step_fails_requests_and_kills_engine():
    eng = AsyncLLMEngine(_BrokenEngine(), metrics=EngineMetrics("broken", "b0"))

    async def main():
        async for _ in eng.generate([1, 2], SamplingParams(max_tokens=2), "x"):
            pass

    with pytest.raises(EngineDeadError, match="boom"):
        asyncio.run(main())
    with pytest.raises(EngineDeadError):
        eng.check_health()
    eng.shutdown()


def test_abort_from_outside_ends_the_stream_within_a_step(llm, engine):
    """An abort from another task (an RL rollout, the caller's own server) ends the caller's
    stream with a final delta (finish_reason "abort"), as vLLM's does, and frees the pools."""
    params = SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True)

    async def main():
        deltas = []

        async def consume():
            async for delta in engine.generate(_ids(llm), params, "abort-me"):
                deltas.append(delta)
            return deltas

        task = asyncio.create_task(consume())
        while not deltas:
            await asyncio.sleep(0.01)
        await engine.abort("abort-me")
        return await asyncio.wait_for(task, timeout=10)

    deltas = asyncio.run(main())
    assert deltas[-1].finished and [s.finish_reason for s in deltas[-1].seqs] == ["abort"]
    assert sum(len(s.token_ids) for d in deltas for s in d.seqs) < 100


@pytest.mark.parametrize("engine_process", [False, True], ids=["thread", "process"])
def test_shutdown_ends_every_open_stream(engine_process):
    llm = LLM(cache_memory_bytes=32 * 1024**2, max_model_len=128)
    if engine_process:  # (engine/core_process.py; its other cases: test_engine_process.py)
        eng = AsyncLLMEngine.from_config(llm.config, replica="shutdown-proc", engine_process=True, torch_num_threads=1)
        assert eng.load().max_num_seqs == llm.engine.load_view().max_num_seqs  # known before any step (admission)
    else:
        eng = AsyncLLMEngine(llm.engine, model_name="demo", replica="shutdown-test")
    params = SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True, n=2)

    async def main():
        started = asyncio.Event()

        async def consume(rid):
            last = None
            async for delta in eng.generate(_ids(llm), params, rid):
                started.set()
                last = delta
            return last

        tasks = [asyncio.create_task(consume(f"s{i}")) for i in range(3)]
        await started.wait()
        await asyncio.to_thread(eng.shutdown)
        finals = await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
        with pytest.raises(EngineDeadError):
            async for _ in eng.generate(_ids(llm), params, "late"):
                pass
        return finals

    finals = asyncio.run(main())
    assert all(d.finished for d in finals)
    assert all(s.finish_reason in ("abort", "length") for d in finals for s in d.seqs)
    if engine_process:
        assert eng.backend.proc.poll() == 0  # it exited by itself
    else:
        llm.engine.cache.check_empty()


def test_speculative_stream_and_metrics(ref_llm):
    """With speculation, a verify step streams several tokens in one delta, the stream adds
    up to the plain output, and the spec counters (what the dashboard's panel reads) move."""
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    ids = _ids(ref_llm)
    want = ref_llm.generate([ids], params)[0].outputs[0].token_ids
    spec = dict(method="synthetic", num_speculative_tokens=4, adaptive=False, acceptance_rate=1.0,
                continuations={tuple(ids): want})
    llm = LLM(cache_memory_bytes=32 * 1024**2, max_model_len=128, speculative_config=spec)
    metrics = EngineMetrics("demo", "spec-test")
    eng = AsyncLLMEngine(llm.engine, model_name="demo", replica="spec-test", metrics=metrics)
    try:
        texts, tokens, finish = asyncio.run(_collect(eng, ids, params, "s1"))
    finally:
        eng.shutdown()
    assert tokens[0] == want and finish[0] == "length"
    accepted = metrics.spec_accepted_tokens._value.get()
    assert accepted >= 8 and metrics.spec_draft_tokens._value.get() >= accepted
    assert metrics.spec_drafts._value.get() >= 2 and metrics.spec_accepted_at(3)._value.get() >= 1


def test_requests_the_engine_has_not_taken_count_as_waiting_requests_not_tokens():
    """A request handed to the engine but not yet in its last report counts as a waiting
    request for admission, its prompt tokens not (their cached part is unknown here); the
    router's view (`reported_load`) is the last report and the requests it accounts for."""
    class Backend:  # an engine process that has not taken anything yet
        first_report = type("First", (), {"view": LoadView(0, 0, 0, 8, 8, 100, 8), "stats": {}})()
        limits = ModelLimits(max_model_len=128, vocab_size=256)
        sent: list = []

        def __init__(self, on_report, on_exit):
            nonlocal backend
            self.on_report, backend = on_report, self

        def send(self, msg):
            self.sent.append(msg)
            return True

        def alive(self):
            return True

        def stop(self, timeout_s):
            pass

    backend = None
    eng = AsyncLLMEngine(model_name="demo", backend_factory=Backend)
    params = SamplingParams(max_tokens=1)

    async def start(ids, rid):
        gen = eng.generate(ids, params, rid, validated=True)
        task = asyncio.ensure_future(gen.__anext__())
        await asyncio.sleep(0.01)  # runs up to the hand-over, then waits for a delta
        return task

    async def main():
        tasks = [await start([5] * 30, "a"), await start([6] * 12, "b")]
        view, reported = eng.load(), eng.reported_load()
        for t in tasks:
            t.cancel()
        await asyncio.sleep(0.01)  # (the aborts go out)
        return view, reported

    view, reported = asyncio.run(main())
    assert (view.num_waiting, view.num_waiting_tokens) == (2, 0)
    # the router's view: the last report (nothing taken, nothing waiting): the router counts
    # both requests itself until a report's count of taken requests covers them
    assert reported[0].num_waiting == 0 and reported[1] == 0
    from hybrid_serve.engine.engine_core import StepReport
    taken = LoadView(0, 1, 18, 8, 8, 100, 8)  # the engine took "a" (18 tokens past its cached prefix)
    backend.on_report(StepReport(time=0.0, num_adds=1, view=taken))
    assert eng.reported_load() == (taken, 1)
    assert eng.load().num_waiting == 2  # admission: "a" waiting in the engine, "b" not taken yet
