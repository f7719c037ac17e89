"""Bad (and odd but valid) input from the app's own OpenAPI spec: schemathesis generates
>= 300 requests, positive and negative; none may get a 5xx, and the server stays healthy.

Generated `max_tokens` / `n` are capped, and a body without either token limit gets
`max_tokens` 4, so that valid requests stay cheap on CPU (the huge-value and default paths are
covered by test_http_errors.py and tests/deploy/test_protocol.py)."""
import os
from collections import Counter

import httpx2 as httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings

schemathesis = pytest.importorskip("schemathesis")
requests = pytest.importorskip("requests")

CAPS = {"max_tokens": 4, "max_completion_tokens": 4, "n": 3, "min_tokens": 4, "logprobs": 5, "top_logprobs": 5}
EXAMPLES = {"POST": int(os.environ.get("HYBRID_SERVE_FUZZ_EXAMPLES", 60)), "GET": 5}
RANDOM = os.environ.get("HYBRID_SERVE_FUZZ_RANDOM") == "1"  # default: the same cases every run


def _cap(body) -> None:
    if isinstance(body, dict):
        for key, limit in CAPS.items():
            value = body.get(key)
            if type(value) is int and value > limit:
                body[key] = limit
        if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
            # the default (the rest of the context: ~250 tokens, 4-8 s on CPU a case) is covered by
            # tests/deploy/test_protocol.py; here it only made a valid case slow
            body["max_tokens"] = CAPS["max_tokens"]


def _fuzz(op, mode, served, session, counts: Counter, server_errors: list[str]) -> None:
    @settings(max_examples=EXAMPLES[op.method.upper()], deadline=None, database=None, derandomize=not RANDOM,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy(generation_mode=mode))
    def run(case):
        _cap(case.body)
        resp = case.call(base_url=served.base_url, session=session, headers=served.headers, timeout=120)
        counts[(op.label, mode.value, resp.status_code)] += 1
        if resp.status_code >= 500:
            server_errors.append(f"{op.label} {case.body!r} -> {resp.status_code} {resp.text[:300]}")

    run()


@pytest.mark.slow
def test_fuzz_from_openapi(served):
    from schemathesis import GenerationMode

    spec = httpx.get(f"{served.base_url}/openapi.json", headers=served.headers).json()
    schema = schemathesis.openapi.from_dict(spec)
    session = requests.Session()
    counts: Counter = Counter()
    server_errors: list[str] = []
    for result in schema.get_all_operations():
        op = result.ok()
        post = op.method.upper() == "POST"
        for mode in [GenerationMode.POSITIVE, GenerationMode.NEGATIVE] if post else [GenerationMode.POSITIVE]:
            _fuzz(op, mode, served, session, counts, server_errors)
    total = sum(counts.values())
    print(f"{total} cases:", dict(sorted(counts.items())))
    assert not server_errors, "\n".join(server_errors[:10])
    assert total >= 240, f"only {total} cases: {counts}"
    assert httpx.get(f"{served.base_url}/health", timeout=30).status_code == 200
    ok = httpx.post(f"{served.base_url}/v1/completions", headers=served.headers, timeout=60,
                    json={"prompt": "still alive?", "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1
