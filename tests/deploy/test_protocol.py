"""The HTTP boundary without Ray: schemas, the OpenAI error shape and status codes, SSE
framing, error events after a stream started, the app config, and metrics merging.
A scripted fake engine stands behind the ingress (injected through LLMServerImpl)."""
from __future__ import annotations

import asyncio
import json

import pytest
from starlette.testclient import TestClient

from hybrid_serve import metrics
from hybrid_serve.deploy.config import API_KEY_ENV, AppConfig
from hybrid_serve.deploy.ingress import create_app
from hybrid_serve.deploy.protocol import ChatCompletionRequest, CompletionRequest
from hybrid_serve.deploy.errors import GenerateError
from hybrid_serve.deploy.server import LLMServerImpl, Started
from hybrid_serve.deploy.replica_calls import LocalBackend
from hybrid_serve.deploy.serving import OpenAIServing
from hybrid_serve.engine.admission import LoadView
from hybrid_serve.engine.async_engine import EngineDeadError, ModelInfo, RequestDelta, SeqDelta
from hybrid_serve.engine.tokenizer import load_tokenizer

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


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(AppConfig().tokenizer_path())


def make_client(tokenizer, engine: FakeEngine | None = None, **config) -> tuple[TestClient, FakeEngine]:
    engine = engine or FakeEngine()
    cfg = AppConfig(**config)
    server = LLMServerImpl(cfg, "r0", engine_factory=lambda c, r: engine)
    serving = OpenAIServing(cfg, LocalBackend(server), tokenizer, metrics.IngressMetrics("demo", "ingress-test"))
    client = TestClient(create_app(serving))
    client.server = server
    return client, engine


def _error(resp, status: int, param: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    if param is not None:
        assert err["param"] == param
    return err


# ----- schemas -------------------------------------------------------------------------------
def test_unknown_fields_are_accepted():
    req = CompletionRequest.model_validate({"prompt": "x", "best_of_future_field": {"a": 1}})
    assert req.model_extra == {"best_of_future_field": {"a": 1}}
    chat = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x", "extra": 1}]})
    assert chat.messages[0].model_extra == {"extra": 1}


@pytest.mark.parametrize("prompt", ["text", ["a", "b"], [1, 2, 3], [[1, 2], [3]]])
def test_prompt_shapes(prompt):
    assert CompletionRequest(prompt=prompt).prompt == prompt


# ----- responses -----------------------------------------------------------------------------
def test_completion_and_usage(tokenizer):
    client, engine = make_client(tokenizer)
    body = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 5, "n": 2}).json()
    assert body["object"] == "text_completion" and body["model"] == "demo"
    assert [c["text"] for c in body["choices"]] == ["Hello there!"] * 2
    assert body["usage"]["completion_tokens"] == 6
    assert engine.requests[0][2].max_tokens == 5


def test_chat_uses_the_template(tokenizer):
    client, engine = make_client(tokenizer)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    body = client.post("/v1/chat/completions", json={"messages": msgs}).json()
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Hello there!"}
    expected = tokenizer.apply_chat_template([{"role": "system", "content": "be brief"},
                                              {"role": "user", "content": "hi"}],
                                             tokenize=False, add_generation_prompt=True)
    assert engine.requests[0][1] == tokenizer.encode(expected, add_special_tokens=False)
    assert engine.requests[0][2].max_tokens == MAX_LEN - len(engine.requests[0][1])  # chat default: the rest


def _events(text: str) -> list[str]:
    events = [e for e in text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    return [e[len("data: "):] for e in events]


def test_sse_framing_with_usage(tokenizer):
    client, _ = make_client(tokenizer)
    resp = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    events = _events(resp.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-1]) == "Hello there!"
    assert [c["usage"]["completion_tokens"] for c in chunks[1:-1]] == [1, 2, 3]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 3


def test_error_after_stream_start_is_an_sse_event(tokenizer):
    client, _ = make_client(tokenizer, FakeEngine(fail_after=1))
    resp = client.post("/v1/completions", json={"prompt": "hi", "stream": True})
    assert resp.status_code == 200
    events = _events(resp.text)
    assert json.loads(events[0])["choices"][0]["text"] == "Hello"
    assert "the fake engine broke" in json.loads(events[1])["error"]["message"]
    assert events[-1] == "[DONE]"


# ----- errors --------------------------------------------------------------------------------
@pytest.mark.parametrize("body, param", [
    ({"prompt": "x", "temperature": -0.5}, "temperature"),
    ({"prompt": "x", "temperature": 1000}, "temperature"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "top_k": -2}, "top_k"),
    ({"prompt": "x", "max_tokens": 100}, "max_tokens"),
    ({"prompt": [VOCAB]}, "prompt"),
    ({"prompt": "x", "presence_penalty": 0.5}, "presence_penalty"),
    ({"prompt": "x", "echo": True}, "echo"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": "x", "stream_options": "yes"}, "stream_options"),
    ({"prompt": "x", "stream": "yes"}, "stream"),  # strict booleans: "yes", 1 and "true" are not true
    ({"prompt": "x", "stream": 1}, "stream"),
    ({"prompt": "x", "ignore_eos": "true"}, "ignore_eos"),
    ({"prompt": "x", "max_tokens": "5"}, "max_tokens"),
    ({"prompt": "a\ud800b", "max_tokens": 4}, "prompt"),  # lone surrogates are not text
    ({"prompt": ["ok", "\udfff"]}, "prompt"),
    ({"prompt": "x", "stop": ["\ud800"]}, "stop"),
    ({"prompt": "x", "logit_bias": {"a": 1}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"5": 101}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {str(VOCAB): 1}}, "logit_bias"),
    ({"prompt": "x", "best_of": 3}, "best_of"),  # known fields that would change the output: refused
    ({"prompt": "x", "response_format": {"type": "json_object"}}, "response_format"),
    ({"prompt": "x", "guided_json": {"type": "object"}}, "guided_json"),
    ({"prompt": "x", "repetition_penalty": 1.2}, "repetition_penalty"),
])
def test_invalid_input_is_400_not_422(tokenizer, body, param):
    client, _ = make_client(tokenizer)
    raw = json.dumps(body)  # ASCII escapes: lone surrogates travel as JSON allows ("\\ud800")
    _error(client.post("/v1/completions", content=raw, headers={"content-type": "application/json"}), 400, param)


@pytest.mark.parametrize("body, param", [
    ({"messages": [{"role": "user", "content": "hi\ud800"}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}]},
     "tools"),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, "tool_choice"),
    ({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, "response_format"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": "yes"}, "logprobs"),
])
def test_invalid_chat_is_400_naming_the_field(tokenizer, body, param):
    client, _ = make_client(tokenizer)
    raw = json.dumps(body)
    err = _error(client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"}),
                 400, param)
    assert "surrogate" in err["message"] or "not supported" in err["message"] or "valid" in err["message"]


def test_no_op_values_of_unsupported_fields_are_accepted_and_logit_bias_reaches_the_engine(tokenizer):
    client, engine = make_client(tokenizer)
    ok = {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "text"}, "tools": [],
          "tool_choice": "none", "best_of": 1, "logit_bias": {"7": -100, "9": 2.5}}
    assert client.post("/v1/chat/completions", json=ok).status_code == 200
    assert engine.requests[-1][2].logit_bias == {7: -100.0, 9: 2.5}


def test_openapi_and_docs_need_the_api_key_when_one_is_set(tokenizer):
    open_client, _ = make_client(tokenizer)
    assert open_client.get("/openapi.json").status_code == 200 and open_client.get("/docs").status_code == 200
    client, _ = make_client(tokenizer, api_key="k1")
    _error(client.get("/openapi.json"), 401)
    assert client.get("/docs").status_code == 404
    spec = client.get("/openapi.json", headers={"Authorization": "Bearer k1"}).json()
    assert "/v1/completions" in spec["paths"]


def test_context_overflow_is_400_with_the_numbers_and_unknown_model_404(tokenizer):
    client, _ = make_client(tokenizer)
    err = _error(client.post("/v1/completions", json={"prompt": [1] * MAX_LEN}), 400, "prompt")
    assert err["code"] == "context_length_exceeded" and f"max_model_len={MAX_LEN}" in err["message"]
    err = _error(client.post("/v1/completions", json={"prompt": [1] * 10, "max_tokens": MAX_LEN}), 400, "max_tokens")
    assert err["code"] == "context_length_exceeded" and f"10 tokens + max_tokens={MAX_LEN}" in err["message"]
    _error(client.post("/v1/completions", json={"prompt": "x", "model": "other"}), 404, "model")
    _error(client.get("/v1/nope"), 404)


def test_body_limit_by_header_and_by_stream(tokenizer):
    client, _ = make_client(tokenizer, max_body_bytes=1000)
    _error(client.post("/v1/completions", json={"prompt": "x" * 2000}), 413)

    def chunks():  # no content-length: counted as it arrives
        yield b'{"prompt": "'
        for _ in range(10):
            yield b"x" * 200
        yield b'"}'

    resp = client.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    _error(resp, 413)


def test_api_key(tokenizer, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "k1")
    cfg = AppConfig.from_args({})
    assert cfg.api_key == "k1"
    client, _ = make_client(tokenizer, api_key="k1")
    _error(client.get("/v1/models"), 401)
    _error(client.get("/v1/models", headers={"Authorization": "Bearer k2"}), 401)
    assert client.get("/v1/models", headers={"Authorization": "Bearer k1"}).json()["data"][0]["id"] == "demo"
    assert client.get("/health").status_code == 200  # health and metrics stay open


class GatedEngine(FakeEngine):
    """Holds every request before its first token until `gate` is set."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.gate = asyncio.Event()

    async def generate(self, ids, params, request_id, validated=False):
        await self.gate.wait()
        async for delta in super().generate(ids, params, request_id, validated):
            yield delta


def test_replica_admission_bounds_requests_and_tokens_waiting_for_a_first_token():
    """The replica counts requests (not sequences) and prompt tokens without a first token;
    past either bound a new one is refused at once with a Retry-After; an empty queue takes
    any prompt; the queue empties as first tokens arrive. The request bound is
    max_waiting_requests + the rows not held by answered requests (max_num_seqs -
    num_answered), counted from a first token to the end, however the request ends."""
    from hybrid_serve.deploy.server import GenerateRequest, Started
    from hybrid_serve.deploy.errors import GenerateError
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
    assert _error(resp, 503)["code"] == "overloaded" and resp.headers["retry-after"] == "3"
    client.server.num_answered -= 1  # one row free: it may wait for it
    assert client.post("/v1/completions", json={"prompt": "x"}).status_code == 200
    client.server.queue.leave(5)
    client.server.num_answered = 0
    assert client.post("/v1/completions", json={"prompt": "x"}).status_code == 200
    engine.dead = True
    _error(client.post("/v1/completions", json={"prompt": "x"}), 503)
    _error(client.get("/health"), 503)


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


def _replicas_client(tokenizer, engines, **config):
    cfg = AppConfig(**config)
    servers = [LLMServerImpl(cfg, f"r{i}", engine_factory=lambda c, r, e=e: e) for i, e in enumerate(engines)]
    backend = ReplicasBackend(servers)
    serving = OpenAIServing(cfg, backend, tokenizer, metrics.IngressMetrics("demo", "ingress-test"))
    return TestClient(create_app(serving)), backend


def _fill(server, ttft_s):
    """Every row held by an answered request and max_waiting_requests waiting: full."""
    server.num_answered = server.admission.max_num_seqs
    for _ in range(server.admission.max_waiting):
        server.queue.enter(1)
    server.ttft_avg_s = ttft_s


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_refused_by_an_overloaded_replica_is_tried_on_another(tokenizer, stream):
    client, backend = _replicas_client(tokenizer, [FakeEngine(), FakeEngine()], replicas=2)
    _fill(backend.servers[0], 2.0)
    resp = client.post("/v1/completions", json={"prompt": "hi", "stream": stream})
    assert resp.status_code == 200 and backend.routed == ["r0", "r1"]
    text = "".join(json.loads(e)["choices"][0]["text"] for e in _events(resp.text)[:-1]) if stream \
        else resp.json()["choices"][0]["text"]
    assert text == "Hello there!"


def test_503_only_when_every_replica_is_overloaded(tokenizer):
    """Each replica is tried once (config.max_replicas of them), at once; then 503 with the
    smallest Retry-After they gave. With one replica there is nowhere else to go."""
    client, backend = _replicas_client(tokenizer, [FakeEngine(), FakeEngine()], replicas=2)
    _fill(backend.servers[0], 7.5)
    _fill(backend.servers[1], 2.5)
    resp = client.post("/v1/completions", json={"prompt": "hi"})
    err = _error(resp, 503)
    assert err["code"] == "overloaded" and resp.headers["retry-after"] == "3" and backend.routed == ["r0", "r1"]
    client, backend = _replicas_client(tokenizer, [FakeEngine(), FakeEngine()])  # replicas=1
    _fill(backend.servers[0], 1.0)
    _error(client.post("/v1/completions", json={"prompt": "hi"}), 503)
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
    assert _error(resp, 503)["code"] == "overloaded" and resp.headers["retry-after"] == "1"
    assert BackPressure.calls == 1


class CountingTokenizer:
    def __init__(self, tokenizer):
        self.tokenizer, self.encoded = tokenizer, 0

    def encode(self, *args, **kwargs):
        self.encoded += 1
        return self.tokenizer.encode(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


async def _asgi(app, method: str, path: str, body: bytes = b"", hang_up: asyncio.Event | None = None
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
            return _asgi(app, "POST", path, json.dumps(payload).encode() if isinstance(payload, dict) else payload)

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
        assert (await _asgi(app, "GET", "/v1/models"))[0] == 200  # other routes: not counted, not refused
        engine.gate.set()
        done = await asyncio.gather(*held)
        assert [d[0] for d in done] == [200, 200] and done[1][2].endswith(b"data: [DONE]\n\n")
        assert serving.in_flight == 0
        assert (await post("/v1/completions", {"prompt": "hi"}))[0] == 200 and serving.in_flight == 0
        engine.gate.clear()  # a streaming client that hangs up before its first token: no longer counted
        gone = asyncio.Event()
        stream = asyncio.create_task(_asgi(app, "POST", "/v1/completions", b'{"prompt": "hi", "stream": true}', gone))
        while server.queue.num_requests < 1:
            await asyncio.sleep(0.01)
        assert serving.in_flight == 1
        gone.set()
        await asyncio.wait_for(stream, 10)
        assert serving.in_flight == 0 and server.queue.num_requests == 0

    asyncio.run(scenario())


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


def _flaky_client(tokenizer, script):
    cfg = AppConfig()
    server = LLMServerImpl(cfg, "r0", engine_factory=lambda c, r: FakeEngine())
    backend = FlakyBackend(server, script)
    serving = OpenAIServing(cfg, backend, tokenizer, metrics.IngressMetrics("demo", "ingress-test"))
    return TestClient(create_app(serving)), backend


@pytest.mark.parametrize("stream", [False, True])
def test_replica_failure_before_the_first_token_is_retried_elsewhere(tokenizer, stream):
    client, backend = _flaky_client(tokenizer, ["dead", "before", "ok"])
    resp = client.post("/v1/completions", json={"prompt": "hi", "stream": stream})
    assert resp.status_code == 200 and backend.attempts == 3
    text = "".join(json.loads(e)["choices"][0]["text"] for e in _events(resp.text)[:-1]) if stream \
        else resp.json()["choices"][0]["text"]
    assert text == "Hello there!"


@pytest.mark.parametrize("stream", [False, True])
def test_a_replica_whose_engine_died_is_retried_elsewhere_before_the_first_token(tokenizer, stream, monkeypatch):
    """An engine found dead at arrival, or dying under the request before its first token:
    503 engine_dead from that replica, tried on another like any replica failure; the dead
    replicas are told once (their Serve wrapper then leaves)."""
    from hybrid_serve.deploy import replica_calls

    monkeypatch.setattr(replica_calls, "REPLICA_RETRY_BACKOFF_S", 0.0)
    client, backend = _flaky_client(tokenizer, ["engine_dead", "engine_dies", "ok"])
    told = []
    for mode, server in backend.engine_servers.items():
        server.on_engine_dead = lambda mode=mode: told.append(mode)
    resp = client.post("/v1/completions", json={"prompt": "hi", "stream": stream})
    assert resp.status_code == 200 and backend.attempts == 3
    text = "".join(json.loads(e)["choices"][0]["text"] for e in _events(resp.text)[:-1]) if stream \
        else resp.json()["choices"][0]["text"]
    assert text == "Hello there!" and told == ["engine_dead", "engine_dies"]
    client.post("/v1/completions", json={"prompt": "hi"})  # a second request there: told only once
    assert told == ["engine_dead", "engine_dies"]


def test_an_engine_dying_after_a_token_ends_cleanly(tokenizer):
    """After a token: no retry; 503 + Retry-After with code engine_dead (non-streaming), an
    SSE error event then [DONE] (streaming), never a 500 or a server_error event."""
    client, backend = _flaky_client(tokenizer, ["engine_dies_after", "ok"])
    resp = client.post("/v1/completions", json={"prompt": "hi"})
    assert _error(resp, 503)["code"] == "engine_dead" and resp.headers["retry-after"] == "1"
    assert backend.attempts == 1
    client, backend = _flaky_client(tokenizer, ["engine_dies_after", "ok"])
    resp = client.post("/v1/completions", json={"prompt": "hi", "stream": True})
    events = _events(resp.text)
    assert resp.status_code == 200 and events[-1] == "[DONE]" and backend.attempts == 1
    assert json.loads(events[0])["choices"][0]["text"] == "Hello"
    error = json.loads(events[-2])["error"]
    assert error["type"] == "service_unavailable_error" and error["code"] == "engine_dead"


def test_replica_failure_after_a_token_ends_cleanly(tokenizer):
    """Non-streaming: 503 with Retry-After (never 500). Streaming: an SSE error event with
    type and code, then [DONE]. No retry: the client already has part of the output."""
    client, backend = _flaky_client(tokenizer, ["after", "ok"])
    resp = client.post("/v1/completions", json={"prompt": "hi"})
    assert _error(resp, 503)["code"] == "replica_failed" and resp.headers["retry-after"] == "1"
    assert backend.attempts == 1
    client, backend = _flaky_client(tokenizer, ["after", "ok"])
    resp = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "stream": True})
    events = _events(resp.text)
    assert resp.status_code == 200 and events[-1] == "[DONE]" and backend.attempts == 1
    error = json.loads(events[-2])["error"]
    assert error["type"] == "service_unavailable_error" and error["code"] == "replica_failed"


def test_replicas_failing_every_time_give_503_not_500(tokenizer, monkeypatch):
    from hybrid_serve.deploy import replica_calls

    monkeypatch.setattr(replica_calls, "REPLICA_RETRY_BACKOFF_S", 0.0)
    client, backend = _flaky_client(tokenizer, ["dead"])
    resp = client.post("/v1/completions", json={"prompt": "hi"})
    assert _error(resp, 503)["code"] == "replica_failed" and backend.attempts == replica_calls.REPLICA_ATTEMPTS


# ----- config and metrics --------------------------------------------------------------------
def test_app_config():
    with pytest.raises(ValueError, match="unknown hybrid-serve app args"):
        AppConfig.from_args({"replicaz": 2})
    with pytest.raises(ValueError, match="unknown engine_args"):
        AppConfig.from_args({"engine_args": {"max_num_seq": 2}})
    with pytest.raises(ValueError, match="replicas"):
        AppConfig.from_args({"replicas": 0})
    assert AppConfig().model_name == "demo"
    assert AppConfig(served_model_name="m").model_name == "m"


def test_metrics_merge_keeps_one_family_per_name():
    from prometheus_client.parser import text_string_to_metric_families

    a, b = metrics.EngineMetrics("demo", "ra"), metrics.EngineMetrics("demo", "rb")
    a.ttft.observe(0.01)
    b.ttft.observe(0.02)
    snap = metrics.snapshot()
    text = metrics.render([snap, []]).decode()
    assert text.count("# TYPE hybrid_serve_time_to_first_token_seconds histogram") == 1
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    counts = [s for s in fams["hybrid_serve_time_to_first_token_seconds"].samples if s.name.endswith("_count")]
    assert {s.labels["replica"] for s in counts} >= {"ra", "rb"}


def test_metrics_merge_sums_a_series_several_ingresses_report():
    """Two ingress replicas each route to the same engine replica: the decisions and their
    histograms add up (the first process's copy alone undercounted); a gauge keeps one value."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    from prometheus_client.parser import text_string_to_metric_families

    snaps = []
    for decisions, blocks in ((3, 10), (4, 99)):
        reg = CollectorRegistry()
        c = Counter("hybrid_serve_router_decisions", "d", ("replica",), registry=reg)
        g = Gauge("hybrid_serve_router_index_blocks", "b", ("replica",), registry=reg)
        h = Histogram("hybrid_serve_router_decision_seconds", "t", ("replica",), buckets=(0.001, 0.01), registry=reg)
        c.labels("engine-1").inc(decisions)
        g.labels("engine-1").set(blocks)
        for _ in range(decisions):
            h.labels("engine-1").observe(0.005)
        snaps.append(metrics.snapshot(reg))
    fams = {f.name: f for f in text_string_to_metric_families(metrics.render(snaps).decode())}
    values = {(s.name, s.labels.get("le")): s.value for f in fams.values() for s in f.samples}
    assert values[("hybrid_serve_router_decisions_total", None)] == 7
    assert values[("hybrid_serve_router_index_blocks", None)] == 10
    assert values[("hybrid_serve_router_decision_seconds_count", None)] == 7
    assert values[("hybrid_serve_router_decision_seconds_bucket", "0.01")] == 7
    assert values[("hybrid_serve_router_decision_seconds_bucket", "0.001")] == 0
    assert abs(values[("hybrid_serve_router_decision_seconds_sum", None)] - 0.035) < 1e-9


def test_finished_requests_feed_the_suffix_index(tokenizer):
    """Speculative method "suffix": each finished request's prompt and output ids go to the
    replica's suffix feed (then, batched, to the Router actor's cluster-wide index)."""
    class Feed:
        def __init__(self):
            self.documents = []

        def add_finished(self, prompt_ids, output_ids):
            self.documents.append((list(prompt_ids), list(output_ids)))

    client, engine = make_client(tokenizer)
    feed = Feed()
    client.server.attach_suffix_feed(feed)
    for stream in (False, True):
        assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3, "stream": stream}).status_code == 200
    assert feed.documents == [(engine.requests[0][1], [10, 11, 12]), (engine.requests[1][1], [10, 11, 12])]


def test_routing_stats_count_the_requests_the_reported_load_accounts_for():
    """The router matches its placements to `num_received_requests` and counts the rest
    itself (with the prefill it predicts): the replica reports those its engine has taken,
    plus those it refused, not every arrival (one still on its way to the engine would drop
    out of the router's count before its tokens are in the engine's load)."""
    from hybrid_serve.deploy.errors import GenerateError
    from hybrid_serve.deploy.server import GenerateRequest
    from hybrid_serve.engine.sampling_params import SamplingParams

    class Engine(FakeEngine):
        taken = 0

        def reported_load(self):
            return LoadView(0, self.taken, 7 * self.taken, 8, 8, 8, 8), self.taken

    async def scenario():
        engine = Engine(max_num_seqs=1)
        server = LLMServerImpl(AppConfig(max_waiting_requests=1), "r0", engine_factory=lambda c, r: engine)
        streams = [server.generate(GenerateRequest(f"q{i}", [1] * 9, SamplingParams(max_tokens=2))) for i in range(3)]
        assert isinstance(await streams[0].__anext__(), Started)
        assert isinstance(await streams[1].__anext__(), Started)
        stats = server.routing_stats()
        assert (stats["num_received_requests"], stats["num_waiting"]) == (0, 0)  # received, not yet taken
        assert isinstance(await streams[2].__anext__(), GenerateError)  # refused: in the count at once
        engine.taken = 1
        stats = server.routing_stats()
        assert (stats["num_received_requests"], stats["num_waiting_tokens"]) == (2, 7)
        for stream in streams[:2]:
            await stream.aclose()

    asyncio.run(scenario())
    plain = LLMServerImpl(AppConfig(), "r0", engine_factory=lambda c, r: FakeEngine())
    assert plain.routing_stats()["num_received_requests"] == 0  # an engine client without the count


def test_the_hop_log_marks_each_hop_of_a_request_on_one_clock(tokenizer, tmp_path, monkeypatch):
    # HYBRID_SERVE_HOP_LOG: the ingress and the replica mark a request's arrival, first and last
    # tokens; benchmarks/hop_report.py joins them with the client's marks by the response's id
    import time

    from hybrid_serve.benchmarks.hop_report import report
    from hybrid_serve.deploy import hop_log

    prefix = str(tmp_path / "hops")
    monkeypatch.setenv(hop_log.ENV, prefix)
    hop_log.reset()  # read the environment again
    try:
        client, _ = make_client(tokenizer)
        sent = time.monotonic()
        resp = client.post("/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 3, "stream": True})
        done = time.monotonic()
        rid = json.loads(_events(resp.text)[0])["id"]
        plain = client.post("/v1/completions", json={"prompt": [5, 6], "max_tokens": 2}).json()["id"]
    finally:
        monkeypatch.delenv(hop_log.ENV)
        hop_log.reset()
    with open(f"{prefix}.client", "w") as f:
        f.write(f"{sent:.6f} client send {rid}\n{done:.6f} client first {rid}\n{done:.6f} client last {rid}\n")
    rows = hop_log.read(sorted(tmp_path.glob("hops.*")))
    times = {(hop, event): t for t, hop, event, r in rows if r == rid}
    order = [("client", "send"), ("ingress", "in"), ("replica", "in"), ("ingress", "started"),
             ("replica", "first"), ("ingress", "first"), ("replica", "last"), ("ingress", "last"), ("client", "last")]
    assert set(times) == set(order) | {("client", "first")}
    assert [times[k] for k in order] == sorted(times[k] for k in order)
    assert {(hop, event) for _, hop, event, r in rows if r == plain} == {
        ("ingress", "in"), ("ingress", "started"), ("ingress", "last"),
        ("replica", "in"), ("replica", "first"), ("replica", "last")}
    out = report(rows)  # the streamed request: the only one the client marked
    assert out["requests"] == 1
    assert set(out["segments_ms"]) == {"client send -> ingress in", "ingress in -> replica in",
                                       "replica in -> replica first", "replica first -> ingress first",
                                       "ingress first -> client first", "replica last -> ingress last",
                                       "ingress last -> client last"}
    assert all(s["n"] == 1 and s["p50"] >= 0 for s in out["segments_ms"].values())
    assert out["arrivals_ms"]["client send"]["first"] == 0


def test_observe_many_records_what_observe_does():
    # the engine replica records a step's inter-token latencies at once (metrics.observe_many)
    from prometheus_client import CollectorRegistry, Histogram

    reg = CollectorRegistry()
    one = Histogram("one_seconds", "x", ["r"], buckets=(0.01, 0.1, 1.0), registry=reg).labels("a")
    many = Histogram("many_seconds", "x", ["r"], buckets=(0.01, 0.1, 1.0), registry=reg).labels("a")
    values = [0.0, 0.01, 0.010001, 0.05, 0.1, 0.1, 2.0, 0.5, 0.003]  # bounds themselves go in their bucket
    for v in values:
        one.observe(v)
    metrics.observe_many(many, values)
    metrics.observe_many(many, [])

    def samples(name):
        return {(s.name[len(name):], s.labels.get("le")): s.value for m in reg.collect() if m.name == name
                for s in m.samples}

    assert samples("one_seconds") == samples("many_seconds")
    assert samples("many_seconds")[("_bucket", "0.01")] == 3


def test_a_hop_log_that_cannot_be_opened_is_a_warning(tmp_path, monkeypatch, caplog):
    from hybrid_serve.deploy import hop_log

    monkeypatch.setenv(hop_log.ENV, str(tmp_path / "missing" / "hops"))  # no such directory
    hop_log.reset()
    try:
        with caplog.at_level("WARNING"):
            hop_log.mark("ingress", "in", "cmpl-1")  # no log, no error
            hop_log.mark("ingress", "last", "cmpl-1")
        assert caplog.text.count(hop_log.ENV) == 1  # warned once, not per mark
    finally:
        monkeypatch.delenv(hop_log.ENV)
        hop_log.reset()
