"""AsyncLLMEngine with its engine in an engine process of its own (engine/core_process.py):
the same streams as the engine thread gives (greedy tokens and text, n > 1, stop strings held
back), aborts, metrics and load from the reports, the prefix cache's events, the suffix
drafter's index forwarded, and a killed or failing engine process answered with
EngineDeadError / a start error naming the cause, never a hang."""
import asyncio
import os
import signal
import time

import pytest

from hybrid_serve import LLM, SamplingParams
from hybrid_serve.engine.async_engine import AsyncLLMEngine, EngineDeadError
from hybrid_serve.metrics import EngineMetrics
from test_async_engine import _collect, _ids  # (same folder: the thread's tests' helpers)

ARGS = dict(cache_memory_bytes=32 * 1024**2, max_model_len=128)


@pytest.fixture(scope="module")
def ref_llm():
    return LLM(**ARGS)


@pytest.fixture(scope="module")
def step_log(tmp_path_factory):
    return tmp_path_factory.mktemp("steps") / "steps.log"


@pytest.fixture(scope="module")
def engine(ref_llm, step_log):
    os.environ["HYBRID_SERVE_STEP_LOG"] = str(step_log)  # read by the child when it starts
    try:
        eng = AsyncLLMEngine.from_config(ref_llm.config, model_name="demo", replica="proc-test",
                                         engine_process=True, torch_num_threads=1)
    finally:
        del os.environ["HYBRID_SERVE_STEP_LOG"]
    yield eng
    eng.shutdown()


def _wait_for(check, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "not within the timeout"
        time.sleep(0.01)


def test_streams_equal_the_offline_output(ref_llm, engine, step_log):
    assert engine.engine is None and engine.backend.proc.pid != os.getpid()
    assert engine.model_info().max_model_len == 128
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompts = [_ids(ref_llm), _ids(ref_llm, "def fibonacci(n):"), _ids(ref_llm, "import os\n")]
    want = [o.outputs[0] for o in ref_llm.generate(prompts, params)]
    tokens_before = engine.metrics.generation_tokens._value.get()

    async def main():
        return await asyncio.gather(*[_collect(engine, p, params, f"p{i}") for i, p in enumerate(prompts)])

    for (texts, tokens, finish), ref in zip(asyncio.run(main()), want):
        assert tokens[0] == ref.token_ids and texts[0] == ref.text and finish[0] == "length"
    assert engine.metrics.generation_tokens._value.get() == tokens_before + 36
    _wait_for(lambda: engine.load().num_running == 0)  # (the step after the last tokens frees the rows)
    assert engine.load().max_num_seqs == ref_llm.engine.load_view().max_num_seqs
    # HYBRID_SERVE_STEP_LOG: a line per pass of the engine's loop (pid, time, deltas, tokens,
    # running, waiting, 2 token counts), every line from the engine process, the lines' tokens
    # summing to the streams' 36
    lines = [line.split() for line in step_log.read_text().splitlines()]
    assert lines and all(len(f) == 8 and f[0] == str(engine.backend.proc.pid) for f in lines)
    assert sum(int(f[3]) for f in lines) == 36
    assert [float(f[1]) for f in lines] == sorted(float(f[1]) for f in lines)


def test_a_step_log_that_cannot_be_opened_is_a_warning(tmp_path, monkeypatch, caplog):
    from hybrid_serve.engine import core_process

    monkeypatch.setenv("HYBRID_SERVE_STEP_LOG", str(tmp_path))  # a directory: open() fails
    with caplog.at_level("WARNING"):
        assert core_process._open_step_log() is None
    assert "HYBRID_SERVE_STEP_LOG" in caplog.text and str(tmp_path) in caplog.text
    monkeypatch.delenv("HYBRID_SERVE_STEP_LOG")
    assert core_process._open_step_log() is None


def test_n2_stop_strings_and_bad_input(ref_llm, engine):
    params = SamplingParams(n=2, max_tokens=6, temperature=1.0, seed=5, ignore_eos=True)
    _texts, tokens, _finish = asyncio.run(_collect(engine, _ids(ref_llm), params, "n2"))
    assert sorted(tokens) == [0, 1] and all(len(t) == 6 for t in tokens.values())
    free = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    text = ref_llm.generate([_ids(ref_llm)], free)[0].outputs[0].text
    at = next(i for i in range(4, len(text) - 4) if text.find(text[i:i + 4]) == i)
    stop = text[at:at + 4]
    texts, _tokens, finish = asyncio.run(_collect(engine, _ids(ref_llm), SamplingParams(
        max_tokens=24, temperature=0.0, ignore_eos=True, stop=[stop]), "stop"))
    assert texts[0] == text[:at] and finish[0] == "stop"
    with pytest.raises(ValueError, match="vocabulary"):
        asyncio.run(_collect(engine, [10**6], SamplingParams(max_tokens=2), "bad"))


def test_aborts_end_streams_and_are_counted(ref_llm, engine):
    params = SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True)
    aborted = engine.metrics.success["abort"]._value.get()

    async def main():
        gen = engine.generate(_ids(ref_llm), params, "close-me")
        await gen.__anext__()
        await gen.aclose()  # a client disconnect
        deltas = []

        async def consume():
            async for delta in engine.generate(_ids(ref_llm), params, "abort-me"):
                deltas.append(delta)

        task = asyncio.create_task(consume())
        while not deltas:
            await asyncio.sleep(0.01)
        await engine.abort("abort-me")
        await asyncio.wait_for(task, timeout=30)
        return deltas

    deltas = asyncio.run(main())
    assert deltas[-1].finished and [s.finish_reason for s in deltas[-1].seqs] == ["abort"]
    _wait_for(lambda: engine.load().num_running == 0)
    assert engine.metrics.success["abort"]._value.get() == aborted + 2


def test_prefix_cache_events_cross_the_process(ref_llm, engine):
    engine.take_cache_events()
    prompt = list(range(1, 90))
    asyncio.run(_collect(engine, prompt, SamplingParams(max_tokens=2, temperature=0.0), "cached-1"))
    _texts, _tokens, _finish = asyncio.run(_collect(engine, prompt, SamplingParams(max_tokens=2), "cached-2"))
    events = engine.take_cache_events()
    assert events and {e.kind for e in events} & {"checkpoint_taken", "kv_stored"}


def test_suffix_drafts_come_from_the_forwarded_index(ref_llm):
    """Method "suffix" in an engine process: the replica's feed forwards what its copy takes,
    the process's drafter proposes from its own copy; greedy output unchanged."""
    from hybrid_serve.routing.suffix_index import SuffixIndex

    class Feed:  # SuffixFeed's side the front end uses: new_copy and listeners
        listeners: list = []

        def new_copy(self):
            return SuffixIndex()

    ids = _ids(ref_llm, "def fibonacci(n):")
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    want = ref_llm.generate([ids], params)[0].outputs[0].token_ids
    llm_config = LLM(**ARGS, speculative_config=dict(method="suffix", num_speculative_tokens=4, adaptive=False)).config
    metrics = EngineMetrics("demo", "proc-suffix")
    eng = AsyncLLMEngine.from_config(llm_config, replica="proc-suffix", engine_process=True, torch_num_threads=1)
    eng.metrics = metrics
    try:
        feed = Feed()
        eng.attach_draft_source(feed)
        feed.listeners[0](0, [list(ids) + list(want)])
        _texts, tokens, _finish = asyncio.run(_collect(eng, ids, params, "suffix"))
    finally:
        eng.shutdown()
    assert tokens[0] == want
    assert metrics.spec_accepted_tokens._value.get() >= 8


def test_killed_engine_process_fails_open_streams(ref_llm):
    eng = AsyncLLMEngine.from_config(ref_llm.config, replica="proc-killed", engine_process=True, torch_num_threads=1)
    params = SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True)

    async def main():
        got = []

        async def consume():
            async for delta in eng.generate(_ids(ref_llm), params, "victim"):
                got.append(delta)

        task = asyncio.create_task(consume())
        while not got:
            await asyncio.sleep(0.01)
        os.kill(eng.backend.proc.pid, signal.SIGKILL)
        with pytest.raises(EngineDeadError, match="exit code -9"):
            await asyncio.wait_for(task, timeout=30)

    asyncio.run(main())
    with pytest.raises(EngineDeadError):
        eng.check_health()
    eng.shutdown(timeout_s=5)


def test_start_failure_names_the_cause(tmp_path):
    from hybrid_serve.engine.config import EngineConfig

    (tmp_path / "config.json").write_text('{"model_type": "no_such_family"}')
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="failed to start(.|\n)*no_such_family"):
        AsyncLLMEngine.from_config(EngineConfig(model=str(tmp_path)), engine_process=True)
    assert time.monotonic() - started < 120


def test_engine_process_exits_with_its_replica(ref_llm, tmp_path):
    """A replica killed outright (SIGKILL: no shutdown) takes its engine process with it."""
    import subprocess
    import sys

    script = tmp_path / "replica.py"
    script.write_text(
        "import pickle, sys, time\n"
        "from hybrid_serve.engine.async_engine import AsyncLLMEngine\n"
        "config = pickle.load(open(sys.argv[1], 'rb'))\n"
        "eng = AsyncLLMEngine.from_config(config, engine_process=True, torch_num_threads=1)\n"
        "print(eng.backend.proc.pid, flush=True)\n"
        "time.sleep(600)\n")
    import pickle

    (tmp_path / "config.pkl").write_bytes(pickle.dumps(ref_llm.config))
    replica = subprocess.Popen([sys.executable, str(script), str(tmp_path / "config.pkl")], stdout=subprocess.PIPE,
                               text=True)
    try:
        engine_pid = int(replica.stdout.readline())
        assert _running(engine_pid)
        replica.kill()
        replica.wait()
        _wait_for(lambda: not _running(engine_pid), timeout_s=20)
    finally:
        replica.kill()


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")  # a zombie has exited
    except FileNotFoundError:
        return False
