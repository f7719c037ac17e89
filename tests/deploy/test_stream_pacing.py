"""Streaming under load without Ray, the replica's side: a replica batches a stream's tokens by
`stream_interval` and `stream_max_messages_per_s` (its first token and its end at once; a lone
stream token by token), and AsyncLLMEngine's pace wakes a consumer only when a message is due.
The ingress's side is in test_stream_coalescing.py."""
from __future__ import annotations

import asyncio
import time

import pytest

from hybrid_serve.deploy.config import AppConfig
from hybrid_serve.deploy.server import GenerateRequest, LLMServerImpl, Started
from hybrid_serve.engine.async_engine import EngineDeadError, RequestDelta, StreamPace
from hybrid_serve.engine.sampling_params import SamplingParams
from stream_fakes import WORDS, StepEngine, paced_engine


ENGINES = {"delta_by_delta": StepEngine, "paced": paced_engine}


def _replica_messages(tokens: int, step_s: float, n: int = 1, engine: str = "delta_by_delta",
                      **config) -> list[RequestDelta]:
    if engine == "paced":  # its steps come from a thread: long enough for the consumer to keep up
        step_s = max(step_s, 0.01)
    engine = ENGINES[engine](tokens, step_s)
    server = LLMServerImpl(AppConfig(**config), "r0", engine_factory=lambda c, r: engine)

    async def run():
        items = [d async for d in server.generate(GenerateRequest("q", [1, 2, 3], SamplingParams(n=n, max_tokens=tokens)))]
        assert isinstance(items[0], Started)
        return items[1:]

    try:
        return asyncio.run(run())
    finally:
        engine.shutdown()


def _check_whole(messages: list[RequestDelta], tokens: int, n: int = 1) -> None:
    for i in range(n):
        seqs = [s for m in messages for s in m.seqs if s.index == i]
        assert [t for s in seqs for t in s.token_ids] == [100 + k for k in range(tokens)]
        assert "".join(s.text for s in seqs) == "".join(WORDS[k % len(WORDS)] for k in range(tokens))
        assert [s.finish_reason for s in seqs][-1] == "length" and all(s.finish_reason is None for s in seqs[:-1])
    assert messages[-1].finished and not any(m.finished for m in messages[:-1])


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_a_lone_stream_sends_every_token(engine):
    """Default budget (1,000 messages/s): one stream may send every 1 ms; steps of 3 ms."""
    messages = _replica_messages(6, 0.003, engine=engine)
    sizes = [len(m.seqs[0].token_ids) for m in messages]
    if engine == "paced":  # its 10 ms steps come from a thread: a consumer held up by a loaded
        assert sizes[0] == 1 and len(sizes) >= 4, sizes  # machine may take two at once, rarely
    else:
        assert sizes == [1] * 6
    _check_whole(messages, 6)


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_stream_interval_batches_tokens_after_the_first(engine):
    messages = _replica_messages(10, 0.0, n=2, engine=engine, stream_interval=4, stream_max_messages_per_s=0)
    sizes = [len(m.seqs[0].token_ids) for m in messages]
    if engine == "paced":  # (a consumer held up by a loaded machine may take more than 4 at once)
        assert sizes[0] == 1 and all(n >= 4 for n in sizes[1:-1]) and sum(sizes) == 10, sizes
    else:
        assert sizes == [1, 4, 4, 1]  # first at once; the end at once
    _check_whole(messages, 10, n=2)


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_message_budget_batches_a_stream_by_time(engine):
    """A budget of 20 messages/s for the replica's one stream: at least 50 ms between its
    messages, so 10 ms steps go out ~5 at a time; the first token and the end at once."""
    messages = _replica_messages(16, 0.01, engine=engine, stream_max_messages_per_s=20)
    sizes = [len(m.seqs[0].token_ids) for m in messages]
    assert sizes[0] == 1 and sum(sizes) == 16 and len(messages) <= 5 and max(sizes) >= 4, sizes
    _check_whole(messages, 16)


def test_budget_gap_grows_with_the_streams_a_replica_sends():
    server = LLMServerImpl(AppConfig(stream_max_messages_per_s=1000), "r0",
                           engine_factory=lambda c, r: StepEngine(1, 0.0))
    server.num_answered = 1
    assert server.stream_gap_s() == pytest.approx(0.001)
    server.num_answered = 256
    assert server.stream_gap_s() == pytest.approx(0.256)
    off = LLMServerImpl(AppConfig(stream_max_messages_per_s=0), "r0", engine_factory=lambda c, r: StepEngine(1, 0.0))
    off.num_answered = 256
    assert off.stream_gap_s() == 0.0


@pytest.mark.parametrize("args", [{"stream_interval": 0}, {"stream_interval": 1.5},
                                  {"stream_max_messages_per_s": -1}, {"stream_max_messages_per_s": "many"},
                                  {"delta_channels": "yes"}])
def test_bad_stream_settings_are_refused(args):
    with pytest.raises(ValueError, match=next(iter(args))):
        AppConfig.from_args(args)


def test_a_paced_stream_wakes_its_consumer_only_when_a_message_is_due():
    """AsyncLLMEngine with a pace (the replica's budget): the consumer resumes once per delta
    it takes, each spaced by the gap, with every token in order and the end at once."""
    engine = paced_engine(40, 0.002)
    pace = StreamPace(min_tokens=1, gap_s=lambda: 0.03)

    async def run():
        return [(time.monotonic(), d) async for d in engine.generate([1, 2, 3], SamplingParams(max_tokens=40), "p",
                                                                      pace=pace)]

    try:
        got = asyncio.run(run())
    finally:
        engine.shutdown()
    times, deltas = zip(*got)
    # The first token goes at once, not held for the gap (which would gather ~15 tokens); a
    # loaded machine may let the 2 ms engine make one or two more before the consumer wakes.
    first_ids = deltas[0].seqs[0].token_ids
    assert first_ids[0] == 100 and len(first_ids) <= 5 and deltas[-1].finished
    assert all(b - a >= 0.03 for a, b in zip(times[:-2], times[1:-1]))  # the last may follow its previous at once
    assert len(deltas) <= (times[-1] - times[0]) / 0.03 + 2
    _check_whole(list(deltas), 40)


def test_a_paced_stream_gives_its_held_tokens_before_the_engine_error_and_close_aborts():
    engine = paced_engine(1000, 0.002)
    pace = StreamPace(min_tokens=1, gap_s=lambda: 60.0)

    async def run():
        gen = engine.generate([1, 2, 3], SamplingParams(max_tokens=1000), "e", pace=pace)
        first = await gen.__anext__()
        await asyncio.sleep(0.05)  # tokens pile up, held by the pace
        engine.backend.stopping.set()
        await asyncio.sleep(0.02)
        engine._on_exit(RuntimeError("a step failed"))  # the engine died
        held = await gen.__anext__()
        with pytest.raises(EngineDeadError):
            await gen.__anext__()
        return first, held

    try:
        first, held = asyncio.run(run())
    finally:
        engine.shutdown()
    first_ids = first.seqs[0].token_ids  # at once (a loaded machine may let the 2 ms engine add one or two)
    assert first_ids == list(range(100, 100 + len(first_ids))) and len(first_ids) <= 5
    held_ids, after = held.seqs[0].token_ids, 100 + len(first_ids)
    assert len(held_ids) >= 5 and held_ids == list(range(after, after + len(held_ids)))

    engine = paced_engine(1000, 0.002)

    async def close_early():
        gen = engine.generate([1, 2, 3], SamplingParams(max_tokens=1000), "c", pace=pace)
        await gen.__anext__()
        await gen.aclose()  # a client disconnect

    try:
        asyncio.run(close_early())
        assert engine.backend.aborted == ["c"]
    finally:
        engine.shutdown()
