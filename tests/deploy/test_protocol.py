"""The HTTP boundary without Ray: schemas, responses and SSE framing, the OpenAI error
shape and status codes, error events after a stream started, the API key (http_fakes.py's
scripted engine behind the ingress)."""
from __future__ import annotations

import json

import pytest

from hybrid_serve.deploy.config import API_KEY_ENV, AppConfig
from hybrid_serve.deploy.protocol import ChatCompletionRequest, CompletionRequest
from http_fakes import FakeEngine, MAX_LEN, VOCAB, expect_error, make_client, sse_events


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


def test_sse_framing_with_usage(tokenizer):
    client, _ = make_client(tokenizer)
    resp = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    events = sse_events(resp.text)
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
    events = sse_events(resp.text)
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
    expect_error(client.post("/v1/completions", content=raw, headers={"content-type": "application/json"}), 400, param)


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
    err = expect_error(client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"}),
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
    expect_error(client.get("/openapi.json"), 401)
    assert client.get("/docs").status_code == 404
    spec = client.get("/openapi.json", headers={"Authorization": "Bearer k1"}).json()
    assert "/v1/completions" in spec["paths"]


def test_context_overflow_is_400_with_the_numbers_and_unknown_model_404(tokenizer):
    client, _ = make_client(tokenizer)
    err = expect_error(client.post("/v1/completions", json={"prompt": [1] * MAX_LEN}), 400, "prompt")
    assert err["code"] == "context_length_exceeded" and f"max_model_len={MAX_LEN}" in err["message"]
    err = expect_error(client.post("/v1/completions", json={"prompt": [1] * 10, "max_tokens": MAX_LEN}), 400, "max_tokens")
    assert err["code"] == "context_length_exceeded" and f"10 tokens + max_tokens={MAX_LEN}" in err["message"]
    expect_error(client.post("/v1/completions", json={"prompt": "x", "model": "other"}), 404, "model")
    expect_error(client.get("/v1/nope"), 404)


def test_model_retrieve_is_the_listed_card_and_404_for_another_name(tokenizer, monkeypatch):
    """GET /v1/models/{model}, as `client.models.retrieve` calls it; a Hub id's slash is part of the name."""
    client, _ = make_client(tokenizer)
    card = client.get("/v1/models/demo")
    assert card.status_code == 200 and card.json() == client.get("/v1/models").json()["data"][0]
    err = expect_error(client.get("/v1/models/other"), 404, "model")
    assert err["code"] == "model_not_found" and "'other'" in err["message"]
    client, _ = make_client(tokenizer, served_model_name="org/name")
    assert client.get("/v1/models/org/name").json()["id"] == "org/name"
    expect_error(client.get("/v1/models/org"), 404, "model")
    monkeypatch.setenv(API_KEY_ENV, "k1")
    client, _ = make_client(tokenizer, api_key="k1")
    expect_error(client.get("/v1/models/demo"), 401)


def test_body_limit_by_header_and_by_stream(tokenizer):
    client, _ = make_client(tokenizer, max_body_bytes=1000)
    expect_error(client.post("/v1/completions", json={"prompt": "x" * 2000}), 413)

    def chunks():  # no content-length: counted as it arrives
        yield b'{"prompt": "'
        for _ in range(10):
            yield b"x" * 200
        yield b'"}'

    resp = client.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    expect_error(resp, 413)


def test_api_key(tokenizer, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "k1")
    cfg = AppConfig.from_args({})
    assert cfg.api_key == "k1"
    client, _ = make_client(tokenizer, api_key="k1")
    expect_error(client.get("/v1/models"), 401)
    expect_error(client.get("/v1/models", headers={"Authorization": "Bearer k2"}), 401)
    assert client.get("/v1/models", headers={"Authorization": "Bearer k1"}).json()["data"][0]["id"] == "demo"
    assert client.get("/health").status_code == 200  # health and metrics stay open
