"""The official `openai` client against the Serve app: completions and chat, streaming or
not, usage in the stream, stop strings, n=2, logprobs, token-id prompts; greedy output
over HTTP equals the offline `LLM` API's."""
import json
import time

import httpx2 as httpx
import pytest

from hybrid_serve import SamplingParams

PROMPT = "Hello, hybrid world"
MESSAGES = [{"role": "user", "content": "Say something about state space models."}]


def _offline(offline_llm, prompt=PROMPT, **kw):
    return offline_llm.generate([prompt], SamplingParams(temperature=0.0, **kw))[0].outputs[0]


def test_models_list(client):
    models = client.models.list().data
    assert [m.id for m in models] == ["demo"]


def test_greedy_completion_equals_offline(client, offline_llm):
    ref = _offline(offline_llm, max_tokens=16)
    out = client.completions.create(model="demo", prompt=PROMPT, max_tokens=16, temperature=0)
    assert out.choices[0].text == ref.text
    assert out.choices[0].finish_reason == ref.finish_reason
    assert out.usage.completion_tokens == len(ref.token_ids)
    assert out.usage.prompt_tokens == len(offline_llm.tokenizer.encode(PROMPT, add_special_tokens=False))


def test_greedy_chat_equals_offline(client, offline_llm):
    ref = offline_llm.chat(MESSAGES, SamplingParams(max_tokens=12, temperature=0.0)).outputs[0]
    out = client.chat.completions.create(model="demo", messages=MESSAGES, max_completion_tokens=12, temperature=0)
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == ref.text
    assert out.usage.completion_tokens == len(ref.token_ids)


def test_streamed_completion_equals_unstreamed_with_usage(client):
    full = client.completions.create(model="demo", prompt=PROMPT, max_tokens=12, temperature=0)
    chunks = list(client.completions.create(model="demo", prompt=PROMPT, max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])
    assert "".join(c.choices[0].text for c in chunks[:-1]) == full.choices[0].text
    assert chunks[-2].choices[0].finish_reason == full.choices[0].finish_reason


def test_streamed_chat_with_usage(client):
    full = client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=10, temperature=0)
    chunks = list(client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=10, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == full.usage.total_tokens


def _stop_from(text: str) -> tuple[str, int]:
    """A 3-character stop string first occurring after the start of `text`."""
    for at in range(4, len(text) - 3):
        stop = text[at:at + 3]
        if text.find(stop) == at and stop.strip():
            return stop, at
    pytest.skip("greedy output too short to pick a stop string")


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string(client, offline_llm, stream):
    ref = _offline(offline_llm, max_tokens=24, ignore_eos=True)
    stop, at = _stop_from(ref.text)
    kwargs = dict(model="demo", prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop, "\x00never"],
                  extra_body={"ignore_eos": True})
    if stream:
        chunks = list(client.completions.create(stream=True, **kwargs))
        text = "".join(c.choices[0].text for c in chunks)
        finish = chunks[-1].choices[0].finish_reason
    else:
        out = client.completions.create(**kwargs)
        text, finish = out.choices[0].text, out.choices[0].finish_reason
    assert text == ref.text[:at]
    assert finish == "stop"


def test_n2_seeded_sampling(client):
    kwargs = dict(model="demo", prompt=PROMPT, max_tokens=8, temperature=1.0, seed=7, n=2)
    first = client.completions.create(**kwargs)
    again = client.completions.create(**kwargs)
    assert sorted(c.index for c in first.choices) == [0, 1]
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    assert 2 <= first.usage.completion_tokens <= 16
    streamed: dict[int, str] = {0: "", 1: ""}
    for chunk in client.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
    assert [streamed[0], streamed[1]] == [c.text for c in sorted(first.choices, key=lambda c: c.index)]


def test_completion_logprobs_equal_offline(client, offline_llm):
    ref = offline_llm.generate([PROMPT], SamplingParams(max_tokens=6, temperature=0.0, logprobs=3))[0].outputs[0]
    out = client.completions.create(model="demo", prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(ref.token_ids)
    for got, token_id, entry in zip(lp.token_logprobs, ref.token_ids, ref.logprobs):
        assert got == pytest.approx(entry[token_id].logprob, abs=1e-4)
    assert all(1 <= len(top) <= 4 for top in lp.top_logprobs)
    assert lp.text_offset[0] == 0


def test_chat_logprobs(client):
    out = client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=4, temperature=0,
                                         logprobs=True, top_logprobs=2)
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens
    assert all(len(c.top_logprobs) == 2 and c.logprob <= 0 for c in content)
    assert content[0].logprob == pytest.approx(content[0].top_logprobs[0].logprob)  # greedy: the top token


def test_token_id_prompts(client, offline_llm):
    ids = offline_llm.tokenizer.encode(PROMPT, add_special_tokens=False)
    by_text = client.completions.create(model="demo", prompt=PROMPT, max_tokens=5, temperature=0)
    by_ids = client.completions.create(model="demo", prompt=ids, max_tokens=5, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    many = client.completions.create(model="demo", prompt=[ids, ids[:3]], max_tokens=3, temperature=0, n=2)
    assert sorted(c.index for c in many.choices) == [0, 1, 2, 3]
    assert many.usage.prompt_tokens == len(ids) + 3


def test_continuous_usage_and_extra_params(client):
    chunks = list(client.completions.create(
        model="demo", prompt=PROMPT, max_tokens=6, temperature=0.5, top_p=0.9, seed=3, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body={"top_k": 20, "min_p": 0.01, "ignore_eos": True, "min_tokens": 6, "unknown_field": 1}))
    counts = [c.usage.completion_tokens for c in chunks if c.choices]
    assert counts == sorted(counts) and counts[-1] == 6
    assert chunks[-1].usage.completion_tokens == 6


def test_client_disconnect_aborts(served):
    """Closing a stream mid-way aborts the request: it is counted as aborted and stops running."""
    body = {"model": "demo", "prompt": PROMPT, "max_tokens": 200, "temperature": 0, "stream": True,
            "ignore_eos": True}
    before = _abort_count(served)
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{served.base_url}/v1/completions", json=body, headers=served.headers) as resp:
            assert resp.status_code == 200
            lines = resp.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
    for _ in range(60):
        text = httpx.get(f"{served.base_url}/metrics").text
        if _abort_count(served, text) > before and _sum(text, "hybrid_serve_requests_running{") == 0:
            break
        time.sleep(0.25)
    else:
        pytest.fail("the disconnected request was not aborted")


def _sum(text: str, prefix: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def _abort_count(served, text: str | None = None) -> float:
    text = text if text is not None else httpx.get(f"{served.base_url}/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("hybrid_serve_request_success_total{") and 'finish_reason="abort"' in line)


def test_raw_sse_format(served):
    body = {"prompt": PROMPT, "max_tokens": 3, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    resp = httpx.post(f"{served.base_url}/v1/completions", json=body, headers=served.headers, timeout=60)
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = [e for e in resp.text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    last = json.loads(events[-2][len("data: "):])
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 3
