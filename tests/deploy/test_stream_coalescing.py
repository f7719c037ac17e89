"""Streaming under load without Ray: the ingress sends the SSE events that are ready together as
one chunk (the same events as one per chunk, and a first token never waits for more), and a
replica batches a stream's tokens by `stream_interval` and `stream_max_messages_per_s` (its
first token and its end at once; a lone stream token by token)."""
from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from hybrid_serve.deploy.config import AppConfig
from hybrid_serve.deploy.protocol import ChatCompletionRequest, CompletionRequest
from hybrid_serve.deploy.replica_calls import Job, batches
from hybrid_serve.deploy.server import GenerateRequest, LLMServerImpl, Started
from hybrid_serve.deploy.serving import OpenAIServing
from hybrid_serve.engine.admission import LoadView
from hybrid_serve.engine.async_engine import (AsyncLLMEngine, EngineDeadError, ModelInfo, RequestDelta, SeqDelta,
                                              StreamPace)
from hybrid_serve.engine.engine_core import StepReport
from hybrid_serve.engine.sampling_params import SamplingParams
from hybrid_serve.engine.validation import ModelLimits

WORDS = ["Once", " upon", " a", " time", " there", " was", " a", " model"]


def _delta(rid: str, step: int, n: int = 1, last: bool = False) -> RequestDelta:
    seqs = [SeqDelta(i, [100 + step], WORDS[step % len(WORDS)], None, "length" if last else None) for i in range(n)]
    return RequestDelta(rid, seqs, 3, 0, last)


class PacedBackend:
    """A Backend (replica_calls.Backend) whose replica streams `tokens` deltas per prompt. With
    `gates`, delta k is sent only once gates[k] is set (the test paces the replica); without,
    every delta is already there when the ingress asks (a backlog: the ingress was busy)."""

    def __init__(self, tokens: int, gated: bool = False) -> None:
        self.tokens = tokens
        self.gates = [asyncio.Event() for _ in range(tokens)] if gated else None

    async def model_info(self):
        return ModelInfo("fake", 1024, 4096)

    async def check_health(self):
        pass

    async def generate(self, request: GenerateRequest):
        yield Started("r0")
        for k in range(self.tokens):
            if self.gates is not None:
                await self.gates[k].wait()
            yield _delta(request.request_id, k, request.params.n, k == self.tokens - 1)


def _serving(backend) -> OpenAIServing:
    return OpenAIServing(AppConfig(), backend, tokenizer=None)


def _events(chunks: list[str]) -> list[str]:
    """The SSE events of a stream's chunks (each chunk holds whole events only)."""
    out = []
    for chunk in chunks:
        assert chunk.endswith("\n\n") and chunk.startswith("data: "), chunk
        out += [e[len("data: "):] for e in chunk[:-2].split("\n\n")]
    return out


def _normalized(events: list[str]) -> list:
    """Events with the request id and creation time (per request) checked and left out."""
    objs = [json.loads(e) if e != "[DONE]" else e for e in events]
    assert len({o["id"] for o in objs if isinstance(o, dict)}) == 1
    return [{k: v for k, v in o.items() if k not in ("id", "created")} if isinstance(o, dict) else o for o in objs]


async def _paced_chunks(serving: OpenAIServing, body, backend: PacedBackend) -> list[str]:
    """Stream `body` releasing one delta at a time, each after the previous one went out."""
    stream = await (serving.chat(body) if isinstance(body, ChatCompletionRequest) else serving.completions(body))
    chunks = []
    if isinstance(body, ChatCompletionRequest):
        chunks.append(await stream.__anext__())  # the role chunk
    for gate in backend.gates:
        gate.set()
        chunks.append(await asyncio.wait_for(stream.__anext__(), 5))
    chunks += [c async for c in stream]
    return chunks


@pytest.mark.parametrize("chat", [False, True])
def test_backlog_goes_out_as_one_chunk_of_the_same_events(chat):
    """A backlog of 8 deltas: 1 chunk of deltas (chat: + the role chunk) holding exactly the
    events that 8 deltas paced one by one give (ids, text, finish_reason, usage, [DONE])."""
    raw = {"max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}}
    if chat:
        raw["messages"] = [{"role": "user", "content": "hi"}]
    else:
        raw["prompt"] = [1, 2, 3]
    cls = ChatCompletionRequest if chat else CompletionRequest

    async def run():
        backlog = PacedBackend(8)
        serving = _serving(backlog)
        serving._chat_prompt = _fake_chat_prompt
        body = cls.model_validate_json(json.dumps(raw))
        stream = await (serving.chat(body) if chat else serving.completions(body))
        coalesced = [c async for c in stream]
        paced_backend = PacedBackend(8, gated=True)
        paced_serving = _serving(paced_backend)
        paced_serving._chat_prompt = _fake_chat_prompt
        paced = await _paced_chunks(paced_serving, cls.model_validate_json(json.dumps(raw)), paced_backend)
        return coalesced, paced

    coalesced, paced = asyncio.run(run())
    assert len(coalesced) == 1 + chat and len(paced) == 8 + chat  # the last delta shares usage + [DONE]
    events = _events(coalesced)
    assert _normalized(events) == _normalized(_events(paced))
    objs = [json.loads(e) for e in events[:-1]]
    deltas = objs[1:-1] if chat else objs[:-1]
    assert len(deltas) == 8 and events[-1] == "[DONE]" and objs[-1]["usage"]["completion_tokens"] == 8
    text = [d["choices"][0]["delta"].get("content") if chat else d["choices"][0]["text"] for d in deltas]
    assert "".join(text) == "".join(WORDS)
    assert [d["choices"][0]["finish_reason"] for d in deltas] == [None] * 7 + ["length"]


async def _fake_chat_prompt(body):
    return [1, 2, 3]


def test_first_token_goes_out_without_waiting_for_more():
    """Low load: each delta is a chunk of its own as soon as it arrives, while the next one
    is still being made."""

    async def run():
        backend = PacedBackend(3, gated=True)
        stream = await _serving(backend).completions(
            CompletionRequest.model_validate_json('{"prompt": [1, 2, 3], "max_tokens": 3, "stream": true}'))
        backend.gates[0].set()
        first = await asyncio.wait_for(stream.__anext__(), 5)  # deltas 2 and 3 are not made yet
        backend.gates[1].set()
        second = await asyncio.wait_for(stream.__anext__(), 5)
        backend.gates[2].set()
        rest = [c async for c in stream]
        return first, second, rest

    first, second, rest = asyncio.run(run())
    assert [json.loads(e)["choices"][0]["text"] for e in _events([first, second])] == WORDS[:2]
    assert _events(rest)[-1] == "[DONE]" and len(rest) == 1


def test_batches_of_several_prompts_and_a_failure_after_its_deltas():
    """`batches`: what has arrived, in arrival order, across jobs; a failure is raised after
    the deltas that came before it."""

    async def stream(rid, k, fail=False):
        for i in range(k):
            yield _delta(rid, i, last=i == k - 1 and not fail)
        if fail:
            raise RuntimeError("replica gone")

    async def run():
        jobs = [Job(0, 3, stream("a", 3)), Job(1, 3, stream("b", 2))]
        got = [b async for b in batches(jobs)]
        failing = [Job(0, 3, stream("c", 2, fail=True))]
        seen = []
        with pytest.raises(RuntimeError, match="replica gone"):
            async for batch in batches(failing):
                seen.append(batch)
        return got, seen

    got, seen = asyncio.run(run())
    assert len(got) == 1 and [(j.prompt_index, d.seqs[0].text) for j, d in got[0]] == \
        [(0, "Once"), (0, " upon"), (0, " a"), (1, "Once"), (1, " upon")]
    assert [[d.seqs[0].text for _, d in b] for b in seen] == [["Once", " upon"]]


# ----- the replica's side: stream_interval and stream_max_messages_per_s ---------------------------
class StepEngine:
    """An engine client: one token per `step_s` for each request, `tokens` in all."""

    def __init__(self, tokens: int, step_s: float) -> None:
        self.tokens, self.step_s = tokens, step_s

    def model_info(self):
        return ModelInfo("fake", 1024, 4096)

    async def generate(self, ids, params, request_id, validated=False):
        for k in range(self.tokens):
            await asyncio.sleep(self.step_s)
            yield _delta(request_id, k, params.n, k == self.tokens - 1)

    async def abort(self, request_id):
        pass

    def load(self):
        return LoadView(num_running=0, num_waiting=0, num_waiting_tokens=0, num_free_req_rows=8,
                        num_free_state_slots=8, num_free_kv_pages=8, max_num_seqs=8)

    def check_health(self):
        pass

    def shutdown(self):
        pass


class StepBackend:
    """AsyncLLMEngine's back end without an engine: a thread reports, every `step_s`, a delta
    of one token for each request added, `tokens` in all, as the engine process's reader does."""

    def __init__(self, tokens: int, step_s: float, on_report, on_exit) -> None:
        self.tokens, self.step_s, self.on_report = tokens, step_s, on_report
        self.limits = ModelLimits(1024, 4096)
        self.first_report = StepReport(time.monotonic(), view=LoadView(0, 0, 0, 8, 8, 8, 8))
        self.requests: dict[str, int] = {}  # request id -> sequences
        self.aborted: list[str] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def send(self, command) -> bool:
        with self.lock:
            if command[0] == "add":
                self.requests[command[1]] = command[3].n
            elif command[0] == "abort":
                self.aborted.append(command[1])
                self.requests.pop(command[1], None)
        return True

    def _run(self) -> None:
        made: dict[str, int] = {}
        while not self.stopping.is_set():
            time.sleep(self.step_s)
            with self.lock:
                deltas = []
                for rid, n in list(self.requests.items()):
                    k = made.get(rid, 0)
                    made[rid] = k + 1
                    deltas.append(_delta(rid, k, n, k == self.tokens - 1))
                    if k == self.tokens - 1:
                        del self.requests[rid]
            if deltas:
                self.on_report(StepReport(time.monotonic(), deltas))

    def alive(self) -> bool:
        return True

    def stop(self, timeout_s: float) -> None:
        self.stopping.set()


def paced_engine(tokens: int, step_s: float) -> AsyncLLMEngine:
    """The real front end (it paces its streams, `StreamPace`) over a StepBackend."""
    engine = AsyncLLMEngine(model_name="fake", replica="r0",
                            backend_factory=lambda on_report, on_exit: StepBackend(tokens, step_s, on_report, on_exit))
    assert engine.paces_streams
    return engine


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


class SlowEndBackend(PacedBackend):
    """A replica whose call ends (Serve's end of the stream) only once `end` is set, after its
    final delta: at the end of a burst, a replica sending hundreds of final deltas."""

    def __init__(self, tokens: int) -> None:
        super().__init__(tokens)
        self.end = asyncio.Event()
        self.ended = False

    async def generate(self, request: GenerateRequest):
        async for item in super().generate(request):
            yield item
        await self.end.wait()
        self.ended = True


def test_the_last_chunk_does_not_wait_for_the_replica_call_to_end():
    backend = SlowEndBackend(4)
    body = CompletionRequest.model_validate({"prompt": [1, 2, 3], "max_tokens": 4, "stream": True})

    async def run():
        stream = await _serving(backend).completions(body)
        chunks = await asyncio.wait_for(_collect_all(stream), 5)  # [DONE] before the call's end
        assert not backend.ended
        backend.end.set()  # the rest of the call is consumed in the background, not cancelled
        for _ in range(100):
            if backend.ended:
                break
            await asyncio.sleep(0.01)
        return chunks

    chunks = asyncio.run(run())
    events = _events(chunks)
    assert events[-1] == "[DONE]" and backend.ended
    assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == "".join(WORDS[:4])


async def _collect_all(stream) -> list[str]:
    return [c async for c in stream]
