"""Streaming under load without Ray, the ingress's side: it sends the SSE events that are ready
together as one chunk (the same events as one per chunk, and a first token never waits for more).
The replica's side (stream_interval, stream_max_messages_per_s, the engine's pace) is in
test_stream_pacing.py."""
from __future__ import annotations

import asyncio
import json

import pytest

from hybrid_serve.deploy.config import AppConfig
from hybrid_serve.deploy.protocol import ChatCompletionRequest, CompletionRequest
from hybrid_serve.deploy.replica_calls import Job, batches
from hybrid_serve.deploy.server import GenerateRequest, Started
from hybrid_serve.deploy.serving import OpenAIServing
from hybrid_serve.engine.async_engine import ModelInfo
from stream_fakes import WORDS, delta


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
            yield delta(request.request_id, k, request.params.n, k == self.tokens - 1)


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
            yield delta(rid, i, last=i == k - 1 and not fail)
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
