"""Replica failures at the HTTP boundary without Ray: a replica that dies before the first
token is retried elsewhere, one that dies after a token ends the response cleanly, and
replicas failing every time give 503, never 500."""
from __future__ import annotations

import json

import pytest
from starlette.testclient import TestClient

from hybrid_serve import metrics
from hybrid_serve.deploy.config import AppConfig
from hybrid_serve.deploy.ingress import create_app
from hybrid_serve.deploy.errors import GenerateError
from hybrid_serve.deploy.server import LLMServerImpl, Started
from hybrid_serve.deploy.replica_calls import LocalBackend
from hybrid_serve.deploy.serving import OpenAIServing
from http_fakes import FakeEngine, expect_error, sse_events


class FlakyBackend(LocalBackend):
    """Replica attempts, scripted: "dead" (unreachable before Started), "before" (dies after
    Started, before a token), "after" (dies after one token), "engine_dead" (a replica whose
    engine died earlier), "engine_dies" (its engine dies before this request's first token),
    "engine_dies_after" (... after its first token), "ok". The engine modes are real
    `LLMServerImpl`s over a `FakeEngine` that is dead or raises EngineDeadError."""

    def __init__(self, server, script):
        super().__init__(server)
        self.script, self.attempts = list(script), 0
        dead = FakeEngine()
        dead.dead = True
        engines = {"engine_dead": dead, "engine_dies": FakeEngine(fail_after=0),
                   "engine_dies_after": FakeEngine(fail_after=1)}
        self.engine_servers = {mode: LLMServerImpl(server.config, mode, engine_factory=lambda c, r, e=e: e)
                               for mode, e in engines.items()}

    async def generate(self, request):
        from hybrid_serve.deploy.errors import REPLICA_FAILED, replica_failed

        mode = self.script[min(self.attempts, len(self.script) - 1)]
        self.attempts += 1
        if mode in self.engine_servers:
            async for item in self.engine_servers[mode].generate(request):
                yield item
            return
        if mode == "dead":
            yield GenerateError(503, "the replica failed (ActorDiedError)", code=REPLICA_FAILED)
            return
        count = 0
        async for item in self.server.generate(request):
            if mode == "before" and not isinstance(item, Started) or mode == "after" and count == 2:
                raise replica_failed("the replica failed (ActorDiedError)")
            count += 1
            yield item


def flaky_client(tokenizer, script):
    cfg = AppConfig()
    server = LLMServerImpl(cfg, "r0", engine_factory=lambda c, r: FakeEngine())
    backend = FlakyBackend(server, script)
    serving = OpenAIServing(cfg, backend, tokenizer, metrics.IngressMetrics("demo", "ingress-test"))
    return TestClient(create_app(serving)), backend


@pytest.mark.parametrize("stream", [False, True])
def test_replica_failure_before_the_first_token_is_retried_elsewhere(tokenizer, stream):
    client, backend = flaky_client(tokenizer, ["dead", "before", "ok"])
    resp = client.post("/v1/completions", json={"prompt": "hi", "stream": stream})
    assert resp.status_code == 200 and backend.attempts == 3
    text = "".join(json.loads(e)["choices"][0]["text"] for e in sse_events(resp.text)[:-1]) if stream \
        else resp.json()["choices"][0]["text"]
    assert text == "Hello there!"


@pytest.mark.parametrize("stream", [False, True])
def test_a_replica_whose_engine_died_is_retried_elsewhere_before_the_first_token(tokenizer, stream, monkeypatch):
    """An engine found dead at arrival, or dying under the request before its first token:
    503 engine_dead from that replica, tried on another like any replica failure; the dead
    replicas are told once (their Serve wrapper then leaves)."""
    from hybrid_serve.deploy import replica_calls

    monkeypatch.setattr(replica_calls, "REPLICA_RETRY_BACKOFF_S", 0.0)
    client, backend = flaky_client(tokenizer, ["engine_dead", "engine_dies", "ok"])
    told = []
    for mode, server in backend.engine_servers.items():
        server.on_engine_dead = lambda mode=mode: told.append(mode)
    resp = client.post("/v1/completions", json={"prompt": "hi", "stream": stream})
    assert resp.status_code == 200 and backend.attempts == 3
    text = "".join(json.loads(e)["choices"][0]["text"] for e in sse_events(resp.text)[:-1]) if stream \
        else resp.json()["choices"][0]["text"]
    assert text == "Hello there!" and told == ["engine_dead", "engine_dies"]
    client.post("/v1/completions", json={"prompt": "hi"})  # a second request there: told only once
    assert told == ["engine_dead", "engine_dies"]


def test_an_engine_dying_after_a_token_ends_cleanly(tokenizer):
    """After a token: no retry; 503 + Retry-After with code engine_dead (non-streaming), an
    SSE error event then [DONE] (streaming), never a 500 or a server_error event."""
    client, backend = flaky_client(tokenizer, ["engine_dies_after", "ok"])
    resp = client.post("/v1/completions", json={"prompt": "hi"})
    assert expect_error(resp, 503)["code"] == "engine_dead" and resp.headers["retry-after"] == "1"
    assert backend.attempts == 1
    client, backend = flaky_client(tokenizer, ["engine_dies_after", "ok"])
    resp = client.post("/v1/completions", json={"prompt": "hi", "stream": True})
    events = sse_events(resp.text)
    assert resp.status_code == 200 and events[-1] == "[DONE]" and backend.attempts == 1
    assert json.loads(events[0])["choices"][0]["text"] == "Hello"
    error = json.loads(events[-2])["error"]
    assert error["type"] == "service_unavailable_error" and error["code"] == "engine_dead"


def test_replica_failure_after_a_token_ends_cleanly(tokenizer):
    """Non-streaming: 503 with Retry-After (never 500). Streaming: an SSE error event with
    type and code, then [DONE]. No retry: the client already has part of the output."""
    client, backend = flaky_client(tokenizer, ["after", "ok"])
    resp = client.post("/v1/completions", json={"prompt": "hi"})
    assert expect_error(resp, 503)["code"] == "replica_failed" and resp.headers["retry-after"] == "1"
    assert backend.attempts == 1
    client, backend = flaky_client(tokenizer, ["after", "ok"])
    resp = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "stream": True})
    events = sse_events(resp.text)
    assert resp.status_code == 200 and events[-1] == "[DONE]" and backend.attempts == 1
    error = json.loads(events[-2])["error"]
    assert error["type"] == "service_unavailable_error" and error["code"] == "replica_failed"


def test_replicas_failing_every_time_give_503_not_500(tokenizer, monkeypatch):
    from hybrid_serve.deploy import replica_calls

    monkeypatch.setattr(replica_calls, "REPLICA_RETRY_BACKOFF_S", 0.0)
    client, backend = flaky_client(tokenizer, ["dead"])
    resp = client.post("/v1/completions", json={"prompt": "hi"})
    assert expect_error(resp, 503)["code"] == "replica_failed" and backend.attempts == replica_calls.REPLICA_ATTEMPTS
