"""Fakes and helpers for the HTTP boundary tests without Ray (test_protocol.py,
test_http_admission.py, test_http_replica_failures.py, test_ingress_config_metrics.py): a
scripted fake engine behind the ingress (injected through LLMServerImpl), clients over one or
several in-process replicas, the OpenAI error shape, SSE events, and one ASGI request at a
time in the caller's event loop."""
from __future__ import annotations

import asyncio

from starlette.testclient import TestClient

from hybrid_serve import metrics
from hybrid_serve.deploy.config import AppConfig
from hybrid_serve.deploy.ingress import create_app
from hybrid_serve.deploy.server import LLMServerImpl
from hybrid_serve.deploy.replica_calls import LocalBackend
from hybrid_serve.deploy.serving import OpenAIServing
from hybrid_serve.engine.admission import LoadView
from hybrid_serve.engine.async_engine import EngineDeadError, ModelInfo, RequestDelta, SeqDelta


MAX_LEN, VOCAB = 64, 4096


class FakeEngine:
    """Each sequence yields the words of `script`, one per delta, one delta per step of
    `step_s` (longer than a lone stream's least gap between messages: 1 ms by default, so each
    delta streams alone); `fail_after` raises mid-way."""

    def __init__(self, script=("Hello", " there", "!"), fail_after: int | None = None, waiting: int = 0,
                 max_num_seqs: int = 8, step_s: float = 0.003):
        self.script, self.fail_after, self.waiting, self.dead = script, fail_after, waiting, False
        self.max_num_seqs, self.step_s = max_num_seqs, step_s
        self.requests = []

    def model_info(self):
        return ModelInfo("fake", MAX_LEN, VOCAB)

    async def generate(self, ids, params, request_id, validated=False):
        self.requests.append((request_id, list(ids), params))
        steps = min(len(self.script), params.max_tokens)
        for step in range(steps):
            await asyncio.sleep(self.step_s)
            if self.fail_after is not None and step == self.fail_after:
                raise EngineDeadError("the fake engine broke")
            last = step == steps - 1
            reason = ("length" if steps == params.max_tokens else "stop") if last else None
            seqs = [SeqDelta(i, [10 + step], self.script[step], None, reason) for i in range(params.n)]
            yield RequestDelta(request_id, seqs, len(ids), 0, last)

    async def abort(self, request_id):
        pass

    def load(self):
        return LoadView(num_running=0, num_waiting=self.waiting, num_waiting_tokens=0,
                        num_free_req_rows=self.max_num_seqs, num_free_state_slots=8, num_free_kv_pages=8,
                        max_num_seqs=self.max_num_seqs)

    def check_health(self):
        if self.dead:
            raise EngineDeadError("dead")

    def shutdown(self):
        pass


def make_client(tokenizer, engine: FakeEngine | None = None, **config) -> tuple[TestClient, FakeEngine]:
    engine = engine or FakeEngine()
    cfg = AppConfig(**config)
    server = LLMServerImpl(cfg, "r0", engine_factory=lambda c, r: engine)
    serving = OpenAIServing(cfg, LocalBackend(server), tokenizer, metrics.IngressMetrics("demo", "ingress-test"))
    client = TestClient(create_app(serving))
    client.server = server
    return client, engine


def expect_error(resp, status: int, param: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    if param is not None:
        assert err["param"] == param
    return err


class GatedEngine(FakeEngine):
    """Holds every request before its first token until `gate` is set."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.gate = asyncio.Event()

    async def generate(self, ids, params, request_id, validated=False):
        await self.gate.wait()
        async for delta in super().generate(ids, params, request_id, validated):
            yield delta


class ReplicasBackend(LocalBackend):
    """Several in-process replicas; attempt k of a request goes to replica k mod their number
    (as a router would move on); the last attempt of each request is remembered."""

    def __init__(self, servers):
        super().__init__(servers[0])
        self.servers, self.attempts, self.routed = servers, 0, []

    def generate(self, request):
        server = self.servers[self.attempts % len(self.servers)]
        self.attempts += 1
        self.routed.append(server.replica)
        return server.generate(request)


def replicas_client(tokenizer, engines, **config):
    cfg = AppConfig(**config)
    servers = [LLMServerImpl(cfg, f"r{i}", engine_factory=lambda c, r, e=e: e) for i, e in enumerate(engines)]
    backend = ReplicasBackend(servers)
    serving = OpenAIServing(cfg, backend, tokenizer, metrics.IngressMetrics("demo", "ingress-test"))
    return TestClient(create_app(serving)), backend


def fill_replica(server, ttft_s):
    """Every row held by an answered request and max_waiting_requests waiting: full."""
    server.num_answered = server.admission.max_num_seqs
    for _ in range(server.admission.max_waiting):
        server.queue.enter(1)
    server.ttft_avg_s = ttft_s


class CountingTokenizer:
    def __init__(self, tokenizer):
        self.tokenizer, self.encoded = tokenizer, 0

    def encode(self, *args, **kwargs):
        self.encoded += 1
        return self.tokenizer.encode(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


async def asgi_request(app, method: str, path: str, body: bytes = b"", hang_up: asyncio.Event | None = None
                ) -> tuple[int, dict, bytes]:
    """One HTTP request straight through an ASGI app, in this event loop (so tests can hold
    several in flight): status, headers, body. The client goes away when `hang_up` is set."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 1), "server": ("test", 80)}
    sent, out = False, {"status": None, "headers": {}, "body": b""}
    finished = hang_up or asyncio.Event()

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await finished.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.start":
            out["status"] = message["status"]
            out["headers"] = {k.decode().lower(): v.decode() for k, v in message.get("headers", [])}
        elif message["type"] == "http.response.body":
            out["body"] += message.get("body", b"")
            if not message.get("more_body"):
                finished.set()

    await app(scope, receive, send)
    return out["status"], out["headers"], out["body"]


def sse_events(text: str) -> list[str]:
    events = [e for e in text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    return [e[len("data: "):] for e in events]
