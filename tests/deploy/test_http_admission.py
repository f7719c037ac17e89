"""Admission at the HTTP boundary without Ray: the replica's bound on requests and tokens
waiting for a first token, 503s with Retry-After, a request refused by an overloaded replica
tried on another, and the ingress's own in-flight bound."""
from __future__ import annotations

import asyncio
import json

import pytest
from starlette.testclient import TestClient

from hybrid_serve import metrics
from hybrid_serve.deploy.config import AppConfig
from hybrid_serve.deploy.errors import GenerateError
from hybrid_serve.deploy.ingress import create_app
from hybrid_serve.deploy.server import LLMServerImpl
from hybrid_serve.deploy.replica_calls import LocalBackend
from hybrid_serve.deploy.serving import OpenAIServing
from http_fakes import (CountingTokenizer, FakeEngine, GatedEngine, asgi_request, expect_error, fill_replica,
                        make_client, replicas_client, sse_events)


def test_replica_admission_bounds_requests_and_tokens_waiting_for_a_first_token():
    """The replica counts requests (not sequences) and prompt tokens without a first token;
    past either bound a new one is refused at once with a Retry-After; an empty queue takes
    any prompt; the queue empties as first tokens arrive. The request bound is
    max_waiting_requests + the rows not held by answered requests (max_num_seqs -
    num_answered), counted from a first token to the end, however the request ends."""
    from hybrid_serve.deploy.server import GenerateRequest, Started
    from hybrid_serve.engine.sampling_params import SamplingParams

    async def scenario():
        engine = GatedEngine(max_num_seqs=2)
        server = LLMServerImpl(AppConfig(max_waiting_requests=2, max_waiting_tokens=100), "r0",
                               engine_factory=lambda c, r: engine)

        def request(i, num_tokens, n=1):
            return server.generate(GenerateRequest(f"r{i}", [1] * num_tokens, SamplingParams(n=n, max_tokens=2)))

        huge = request(0, 500, n=3)  # an empty queue takes it, however long; n=3 is one request
        assert isinstance(await huge.__anext__(), Started)
        assert (server.queue.num_requests, server.queue.num_tokens) == (1, 500)
        refused = await request(1, 10).__anext__()
        assert isinstance(refused, GenerateError) and refused.code == "overloaded" and refused.retry_after_s >= 1
        assert "500 prompt tokens are waiting" in refused.message and refused.replica == "r0"
        engine.gate.set()
        first = await huge.__anext__()  # its first token: it leaves the queue and holds a row
        assert first.seqs and server.queue.num_requests == 0 and server.ttft_avg_s is not None
        assert server.num_answered == 1
        engine.gate.clear()
        small = [request(i, 10) for i in (2, 3, 4)]  # 2 waiting + the 1 row huge leaves free
        for stream in small:
            assert isinstance(await stream.__anext__(), Started)
        refused = await request(5, 1).__anext__()
        assert isinstance(refused, GenerateError) and "3 requests are waiting for their first token (limit 3: " \
            "max_waiting_requests=2 + 1 rows" in refused.message
        await huge.aclose()  # a hang-up after the first token: its row is free again
        assert server.num_answered == 0
        fourth = request(6, 10)
        assert isinstance(await fourth.__anext__(), Started)
        for stream in small + [fourth]:
            await stream.aclose()  # disconnects before a first token also leave the queue
        assert (server.queue.num_requests, server.queue.num_tokens, server.num_answered) == (0, 0, 0)
        engine.gate.set()
        done = [d async for d in request(7, 10)]  # to the end: answered, then not
        assert isinstance(done[0], Started) and done[-1].finished and server.num_answered == 0
        engine.fail_after = 1  # the engine dies after a token: the stream ends with an engine_dead item
        items = [d async for d in request(8, 10)]
        assert isinstance(items[-1], GenerateError) and items[-1].code == "engine_dead" and items[-2].seqs
        assert (server.queue.num_requests, server.num_answered) == (0, 0)  # an error after a token, too

    asyncio.run(scenario())


def test_overloaded_is_503_with_retry_after_and_dead_is_503(tokenizer):
    client, engine = make_client(tokenizer, max_waiting_requests=1)
    client.server.queue.enter(5)  # one request already waits for its first token
    client.server.num_answered = engine.max_num_seqs  # and every row is held by answered requests
    client.server.ttft_avg_s = 2.4
    resp = client.post("/v1/completions", json={"prompt": "x"})
    assert expect_error(resp, 503)["code"] == "overloaded" and resp.headers["retry-after"] == "3"
    client.server.num_answered -= 1  # one row free: it may wait for it
    assert client.post("/v1/completions", json={"prompt": "x"}).status_code == 200
    client.server.queue.leave(5)
    client.server.num_answered = 0
    assert client.post("/v1/completions", json={"prompt": "x"}).status_code == 200
    engine.dead = True
    expect_error(client.post("/v1/completions", json={"prompt": "x"}), 503)
    expect_error(client.get("/health"), 503)


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_refused_by_an_overloaded_replica_is_tried_on_another(tokenizer, stream):
    client, backend = replicas_client(tokenizer, [FakeEngine(), FakeEngine()], replicas=2)
    fill_replica(backend.servers[0], 2.0)
    resp = client.post("/v1/completions", json={"prompt": "hi", "stream": stream})
    assert resp.status_code == 200 and backend.routed == ["r0", "r1"]
    text = "".join(json.loads(e)["choices"][0]["text"] for e in sse_events(resp.text)[:-1]) if stream \
        else resp.json()["choices"][0]["text"]
    assert text == "Hello there!"


def test_503_only_when_every_replica_is_overloaded(tokenizer):
    """Each replica is tried once (config.max_replicas of them), at once; then 503 with the
    smallest Retry-After they gave. With one replica there is nowhere else to go."""
    client, backend = replicas_client(tokenizer, [FakeEngine(), FakeEngine()], replicas=2)
    fill_replica(backend.servers[0], 7.5)
    fill_replica(backend.servers[1], 2.5)
    resp = client.post("/v1/completions", json={"prompt": "hi"})
    err = expect_error(resp, 503)
    assert err["code"] == "overloaded" and resp.headers["retry-after"] == "3" and backend.routed == ["r0", "r1"]
    client, backend = replicas_client(tokenizer, [FakeEngine(), FakeEngine()])  # replicas=1
    fill_replica(backend.servers[0], 1.0)
    expect_error(client.post("/v1/completions", json={"prompt": "hi"}), 503)
    assert backend.routed == ["r0"]


def test_serves_back_pressure_is_not_retried(tokenizer):
    """Serve's own refusal (every replica busy and its queue full) names no replica: 503 at once."""

    class BackPressure(LocalBackend):
        calls = 0

        async def generate(self, request):
            BackPressure.calls += 1
            yield GenerateError(503, "every replica is busy and the ingress queue is full", code="overloaded")

    cfg = AppConfig(replicas=4)
    server = LLMServerImpl(cfg, "r0", engine_factory=lambda c, r: FakeEngine())
    serving = OpenAIServing(cfg, BackPressure(server), tokenizer)
    resp = TestClient(create_app(serving)).post("/v1/completions", json={"prompt": "hi"})
    assert expect_error(resp, 503)["code"] == "overloaded" and resp.headers["retry-after"] == "1"
    assert BackPressure.calls == 1


def test_the_ingress_refuses_past_its_in_flight_bound_before_any_work(tokenizer):
    """Generation requests in flight at the ingress (arrival to the end of the response,
    streams included) are bounded by replicas x max_ongoing_requests + max_queued_requests;
    past it: 503 + Retry-After at once, the body not even parsed (invalid JSON gets 503,
    not 400), nothing tokenized, no replica called. Other routes are not counted."""
    async def scenario():
        engine = GatedEngine()  # every request waits for its first token until the gate opens
        cfg = AppConfig(max_ongoing_requests=1, max_queued_requests=1)
        assert cfg.queue_bounds()["max_ingress_requests"] == 2
        server = LLMServerImpl(cfg, "r0", engine_factory=lambda c, r: engine)
        counting = CountingTokenizer(tokenizer)
        serving = OpenAIServing(cfg, LocalBackend(server), counting, metrics.IngressMetrics("demo", "ingress-test"))
        serving.ttft_avg_s = 4.2
        app = create_app(serving)

        def post(path, payload):
            return asgi_request(app, "POST", path, json.dumps(payload).encode() if isinstance(payload, dict) else payload)

        held = [asyncio.create_task(post("/v1/completions", {"prompt": "hi", "stream": stream}))
                for stream in (False, True)]
        while server.queue.num_requests < 2:  # both reached the replica and wait for a first token
            await asyncio.sleep(0.01)
        assert serving.in_flight == 2
        encoded = counting.encoded
        status, headers, body = await post("/v1/completions", {"prompt": "hi"})
        assert status == 503 and headers["retry-after"] == "5"
        err = json.loads(body)["error"]
        assert err["code"] == "overloaded" and "2 requests are in flight at this ingress (limit 2)" in err["message"]
        status, _, _ = await post("/v1/chat/completions", b"{not json")
        assert status == 503
        assert counting.encoded == encoded and server.queue.num_requests == 2  # no work done for them
        assert (await asgi_request(app, "GET", "/v1/models"))[0] == 200  # other routes: not counted, not refused
        engine.gate.set()
        done = await asyncio.gather(*held)
        assert [d[0] for d in done] == [200, 200] and done[1][2].endswith(b"data: [DONE]\n\n")
        assert serving.in_flight == 0
        assert (await post("/v1/completions", {"prompt": "hi"}))[0] == 200 and serving.in_flight == 0
        engine.gate.clear()  # a streaming client that hangs up before its first token: no longer counted
        gone = asyncio.Event()
        stream = asyncio.create_task(asgi_request(app, "POST", "/v1/completions", b'{"prompt": "hi", "stream": true}', gone))
        while server.queue.num_requests < 1:
            await asyncio.sleep(0.01)
        assert serving.in_flight == 1
        gone.set()
        await asyncio.wait_for(stream, 10)
        assert serving.in_flight == 0 and server.queue.num_requests == 0

    asyncio.run(scenario())
