"""`reliability.py fuzz`: schemathesis over the app's own OpenAPI schema and hypothesis over
prompts; no 5xx, no in-band server_error, healthy afterwards."""
from __future__ import annotations

import json
import os
import time
from collections import Counter

from hybrid_serve.benchmarks.reliability_harness import LocalApp, table


FUZZ_CAPS = {"max_tokens": 4, "max_completion_tokens": 4, "n": 3, "min_tokens": 4, "logprobs": 5, "top_logprobs": 5}


def _cap(body) -> None:
    if isinstance(body, dict):
        for key, limit in FUZZ_CAPS.items():
            if type(body.get(key)) is int and body[key] > limit:
                body[key] = limit


def _sse_server_error(text: str) -> bool:
    for line in text.splitlines():
        if line.startswith("data:") and '"error"' in line:
            try:
                err = json.loads(line[5:]).get("error") or {}
            except ValueError:
                continue
            if err.get("type") == "server_error" or str(err.get("code")) in ("internal_error",):
                return True
    return False


def run_fuzz(args) -> dict:
    import requests
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st
    from schemathesis import GenerationMode

    engine_args = {"max_num_seqs": 16, "max_model_len": 256, "cache_memory_bytes": 64 * 2**20}
    app_args = {"replicas": 2, "num_cpus_per_replica": 0.5, "torch_num_threads": 1, "engine_args": engine_args}
    load_at_start = os.getloadavg()
    with LocalApp(app_args) as app:
        spec = requests.get(f"{app.base}/openapi.json", headers=app.headers, timeout=30).json()
        schema = schemathesis.openapi.from_dict(spec)
        http = requests.Session()
        counts: Counter = Counter()
        server_errors: list[str] = []
        ops = [r.ok() for r in schema.get_all_operations()]
        posts = [op for op in ops if op.method.upper() == "POST"]
        get_examples = 5
        per_post = -(-args.cases // (2 * len(posts))) + 2  # hypothesis may stop a few short of max_examples
        t = time.monotonic()
        def fuzz(op, mode, examples: int) -> None:
            @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                      phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy(generation_mode=mode))
            def one(case):
                _cap(case.body)
                resp = case.call(base_url=app.base, session=http, headers=app.headers, timeout=120)
                counts[(op.label, mode.value, resp.status_code)] += 1
                if resp.status_code >= 500 or (resp.status_code == 200 and _sse_server_error(resp.text)):
                    server_errors.append(f"{op.label} {str(case.body)[:300]} -> {resp.status_code} {resp.text[:300]}")
            one()

        for op in ops:
            post = op.method.upper() == "POST"
            for mode in ([GenerationMode.POSITIVE, GenerationMode.NEGATIVE] if post else [GenerationMode.POSITIVE]):
                fuzz(op, mode, per_post if post else get_examples)
        schema_s = time.monotonic() - t
        # hypothesis over prompts, raw JSON (ensure_ascii: a lone surrogate travels as "\udXXX")
        vocab = 4096
        text = st.text(alphabet=st.characters(codec=None, categories=None), max_size=40)
        edge = st.sampled_from(["", "\ud800", "a\udfffb", "\udc00\ud800", "\x00", "\u200b\u200d", "\U0001F600" * 3,
                                "\ufeff", "e\u0301", "\r\n\t", "\uffff", "\U0010FFFF", "<|im_end|>", "<|endoftext|>"])
        texts = st.one_of(text, edge, st.builds(lambda a, b, c: a + b + c, text, edge, text))
        ids = st.lists(st.integers(min_value=-3, max_value=vocab + 10), min_size=0, max_size=24)
        big_ids = st.lists(st.sampled_from([vocab - 1, vocab, 2**31 - 1, 2**63, -1]), min_size=1, max_size=3)
        prompt = st.one_of(texts, st.lists(texts, min_size=0, max_size=3), ids, big_ids,
                           st.lists(ids, min_size=0, max_size=3))
        stop = st.one_of(st.none(), texts, st.lists(texts, max_size=4))
        common = {"max_tokens": st.integers(1, 4), "stream": st.booleans(), "stop": stop,
                  "stop_token_ids": st.one_of(st.none(), ids), "temperature": st.sampled_from([0, 0.7, 1.0])}
        completion = st.fixed_dictionaries({"prompt": prompt}, optional=common)
        message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", "x"]),
                                         "content": st.one_of(texts, st.lists(st.fixed_dictionaries(
                                             {"type": st.just("text"), "text": texts}), max_size=2))})
        chat = st.fixed_dictionaries({"messages": st.lists(message, min_size=0, max_size=3)}, optional=common)
        pcounts: Counter = Counter()

        @settings(max_examples=args.prompt_cases, deadline=None, database=None, derandomize=True,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck))
        @given(case=st.one_of(st.tuples(st.just("/v1/completions"), completion),
                              st.tuples(st.just("/v1/chat/completions"), chat)))
        def prompts(case):
            path, body = case
            raw = json.dumps(body, ensure_ascii=True).encode()
            resp = http.post(app.base + path, data=raw, timeout=120,
                             headers={**app.headers, "Content-Type": "application/json"})
            pcounts[(path, resp.status_code)] += 1
            if resp.status_code >= 500 or (resp.status_code == 200 and _sse_server_error(resp.text)):
                server_errors.append(f"{path} {raw[:300]!r} -> {resp.status_code} {resp.text[:300]}")

        t = time.monotonic()
        prompts()
        prompts_s = time.monotonic() - t
        health = requests.get(f"{app.base}/health", timeout=30).status_code
        alive = requests.post(f"{app.base}/v1/completions", headers=app.headers, timeout=60,
                              json={"prompt": "still alive?", "max_tokens": 2})
        _, state = app.wait_idle()
        config = app.config_record()
    by_status = Counter()
    for (_, _, status), n in counts.items():
        by_status[str(status)] += n
    pby_status = Counter()
    for (_, status), n in pcounts.items():
        pby_status[str(status)] += n
    figures = {
        "schemathesis_cases": sum(counts.values()), "schemathesis_by_status": dict(sorted(by_status.items())),
        "schemathesis_by_operation": {f"{op} {mode} {status}": n for (op, mode, status), n in sorted(counts.items())},
        "schemathesis_s": round(schema_s, 1),
        "hypothesis_prompt_cases": sum(pcounts.values()), "hypothesis_by_status": dict(sorted(pby_status.items())),
        "hypothesis_by_route": {f"{p} {s}": n for (p, s), n in sorted(pcounts.items())},
        "hypothesis_s": round(prompts_s, 1),
        "server_errors": len(server_errors), "first_server_errors": server_errors[:5],
        "health_after": health, "completion_after": alive.status_code,
        "invariant_violations": sum(state["invariant_violations"].values()),
        "load_average_at_start": [round(x, 2) for x in load_at_start],
    }
    checks = {"no_5xx": not server_errors, "schemathesis_cases_ge_1000": figures["schemathesis_cases"] >= 1000,
              "healthy_after": health == 200 and alive.status_code == 200,
              "no_invariant_violation": figures["invariant_violations"] == 0}
    table([("schemathesis", f"{figures['schemathesis_cases']} cases {figures['schemathesis_by_status']}"),
           ("hypothesis prompts", f"{figures['hypothesis_prompt_cases']} cases {figures['hypothesis_by_status']}"),
           ("5xx", len(server_errors)), ("health / completion after", f"{health} / {alive.status_code}"),
           ("checks", checks)], "fuzz")
    workload = (f"schemathesis {schemathesis.__version__} over /openapi.json (fetched with the API key): every "
                f"operation, POSTs positive and negative, {per_post} examples per POST operation and mode, "
                f"{get_examples} per GET, derandomized; max_tokens/n/logprobs capped to keep CPU cost low. "
                f"hypothesis: {args.prompt_cases} raw JSON bodies (ensure_ascii, so lone surrogates go as \\udXXX "
                f"escapes) to /v1/completions and /v1/chat/completions: random and edge-case unicode text, "
                f"stop strings, token-id lists with ids < 0 and >= vocab ({vocab}), streaming on and off")
    return {"workload": workload, "config": config, "figures": figures, "checks": checks}
