"""Errors over real HTTP: the OpenAI shape, and 400 (not 422) / 401 / 404 / 413 as specified."""
import httpx2 as httpx
import openai
import pytest


def _post(served, path, body=None, headers=None, **kw):
    return httpx.post(f"{served.base_url}{path}", json=body, headers=headers if headers is not None
                      else served.headers, timeout=60, **kw)


def _assert_error(resp, status, param=None):
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic e2e-secret"}])
def test_bad_api_key_is_401(served, headers):
    _assert_error(_post(served, "/v1/completions", {"prompt": "x"}, headers=headers), 401)
    _assert_error(httpx.get(f"{served.base_url}/v1/models", headers=headers), 401)


def test_health_and_metrics_need_no_key(served):
    assert httpx.get(f"{served.base_url}/health").status_code == 200
    assert httpx.get(f"{served.base_url}/metrics").status_code == 200


def test_unknown_model_is_404(served):
    _assert_error(_post(served, "/v1/completions", {"model": "gpt-x", "prompt": "x"}), 404, "model")
    _assert_error(_post(served, "/v1/chat/completions",
                        {"model": "gpt-x", "messages": [{"role": "user", "content": "x"}]}), 404, "model")


def test_unknown_route_is_404_in_openai_shape(served):
    _assert_error(_post(served, "/v1/embeddings", {"input": "x"}), 404)


def test_context_overflow_is_400(served):
    """Prompt alone or prompt + max_tokens over the context: 400 either way (as OpenAI and vLLM)."""
    _assert_error(_post(served, "/v1/completions", {"prompt": [5] * (served.max_model_len + 10)}), 400, "prompt")
    _assert_error(_post(served, "/v1/completions", {"prompt": "word " * 2000}), 400, "prompt")
    _assert_error(_post(served, "/v1/completions", {"prompt": [5] * 10, "max_tokens": served.max_model_len}), 400,
                  "max_tokens")


@pytest.mark.parametrize("path, raw, param", [
    ("/v1/completions", '{"model":"demo","prompt":"a\\ud800b","max_tokens":4}', "prompt"),
    ("/v1/chat/completions", '{"messages":[{"role":"user","content":"\\udc00"}]}', "messages"),
    ("/v1/completions", '{"prompt":"x","stream":"yes"}', "stream"),
    ("/v1/completions", '{"prompt":"x","best_of":2}', "best_of"),
    ("/v1/chat/completions", '{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function",'
                             '"function":{"name":"f"}}]}', "tools"),
    ("/v1/chat/completions", '{"messages":[{"role":"user","content":"x"}],'
                             '"response_format":{"type":"json_object"}}', "response_format"),
])
def test_undecodable_text_unsupported_fields_and_loose_types_are_400(served, path, raw, param):
    resp = httpx.post(f"{served.base_url}{path}", content=raw.encode(), timeout=60,
                      headers={**served.headers, "content-type": "application/json"})
    _assert_error(resp, 400, param)


def test_logit_bias_steers_the_output(served, offline_llm):
    body = {"prompt": "hello", "max_tokens": 4, "temperature": 0, "logit_bias": {"42": 100}, "ignore_eos": True}
    resp = _post(served, "/v1/completions", body)
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["text"] == offline_llm.tokenizer.decode([42] * 4)


def test_too_large_body_is_413(served):
    body = b'{"prompt": "' + b"x" * (9 * 1024 * 1024) + b'"}'
    resp = httpx.post(f"{served.base_url}/v1/completions", content=body, timeout=60,
                      headers={**served.headers, "content-type": "application/json"})
    _assert_error(resp, 413)


@pytest.mark.parametrize("body, param", [
    ({"prompt": "x", "temperature": -1}, "temperature"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 10**9}, "max_tokens"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "logprobs": 99}, "logprobs"),
    ({"prompt": "x", "min_tokens": 50, "max_tokens": 5}, "min_tokens"),
    ({"prompt": "x", "stop_token_ids": [10**6]}, "stop_token_ids"),
    ({"prompt": [10**6]}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({}, "prompt"),
    ({"prompt": "x", "stop": [""]}, "stop"),
    ({"prompt": "x", "seed": 2**70}, "seed"),
])
def test_invalid_completion_is_400(served, body, param):
    _assert_error(_post(served, "/v1/completions", body), 400, param)


@pytest.mark.parametrize("body", [
    {"messages": []},
    {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
    {"messages": [{"content": "no role"}]},
    {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
])
def test_invalid_chat_is_400(served, body):
    _assert_error(_post(served, "/v1/chat/completions", body), 400)


def test_malformed_json_is_400(served):
    resp = httpx.post(f"{served.base_url}/v1/completions", content=b'{"prompt": ', timeout=30,
                      headers={**served.headers, "content-type": "application/json"})
    _assert_error(resp, 400)


def test_openai_client_exceptions(client):
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="demo", prompt="x", temperature=-2)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x")
    bad = openai.OpenAI(base_url=str(client.base_url), api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
