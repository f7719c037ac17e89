"""The HTTP boundary without Ray: schemas, the OpenAI error shape and status codes, SSE
framing, error events after a stream started, the app config, and metrics merging.
A scripted fake engine stands behind the ingress (injected through LLMServerImpl)."""
from __future__ import annotations

import json

import pytest
from starlette.testclient import TestClient

from hybrid_serve import metrics
from hybrid_serve.deploy.config import API_KEY_ENV, AppConfig
from hybrid_serve.deploy.ingress import create_app
from hybrid_serve.deploy.protocol import ChatCompletionRequest, CompletionRequest
from hybrid_serve.deploy.server import LLMServerImpl
from hybrid_serve.deploy.serving import LocalBackend, OpenAIServing
from hybrid_serve.engine.admission import LoadView
from hybrid_serve.engine.async_engine import EngineDeadError, ModelInfo, RequestDelta, SeqDelta
from hybrid_serve.engine.tokenizer import load_tokenizer

MAX_LEN, VOCAB = 64, 4096


class FakeEngine:
    """Each sequence yields the words of `script`, one per delta; `fail_after` raises mid-way."""

    def __init__(self, script=("Hello", " there", "!"), fail_after: int | None = None, waiting: int = 0):
        self.script, self.fail_after, self.waiting, self.dead = script, fail_after, waiting, False
        self.requests = []

    def model_info(self):
        return ModelInfo("fake", MAX_LEN, VOCAB)

    async def generate(self, ids, params, request_id, validated=False):
        self.requests.append((request_id, list(ids), params))
        steps = min(len(self.script), params.max_tokens)
        for step in range(steps):
            if self.fail_after is not None and step == self.fail_after:
                raise EngineDeadError("the fake engine broke")
            last = step == steps - 1
            reason = ("length" if steps == params.max_tokens else "stop") if last else None
            seqs = [SeqDelta(i, [10 + step], self.script[step], None, reason) for i in range(params.n)]
            yield RequestDelta(request_id, seqs, len(ids), 0, last)

    async def abort(self, request_id):
        pass

    def load(self):
        return LoadView(num_running=0, num_waiting=self.waiting, num_waiting_tokens=0, num_free_req_rows=8,
                        num_free_state_slots=8, num_free_kv_pages=8, max_num_seqs=8)

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
    return TestClient(create_app(serving)), engine


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
])
def test_invalid_input_is_400_not_422(tokenizer, body, param):
    client, _ = make_client(tokenizer)
    _error(client.post("/v1/completions", json=body), 400, param)


def test_too_long_prompt_is_413_and_unknown_model_404(tokenizer):
    client, _ = make_client(tokenizer)
    _error(client.post("/v1/completions", json={"prompt": [1] * MAX_LEN}), 413, "prompt")
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


def test_overloaded_and_dead_are_503(tokenizer):
    client, engine = make_client(tokenizer, FakeEngine(waiting=10), max_waiting_requests=10)
    assert _error(client.post("/v1/completions", json={"prompt": "x"}), 503)["code"] == "overloaded"
    engine.waiting, engine.dead = 0, True
    _error(client.post("/v1/completions", json={"prompt": "x"}), 503)
    _error(client.get("/health"), 503)


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
    text = metrics.render([snap, snap]).decode()  # duplicates collapse
    assert text.count("# TYPE hybrid_serve_time_to_first_token_seconds histogram") == 1
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    counts = [s for s in fams["hybrid_serve_time_to_first_token_seconds"].samples if s.name.endswith("_count")]
    assert {s.labels["replica"] for s in counts} >= {"ra", "rb"}
