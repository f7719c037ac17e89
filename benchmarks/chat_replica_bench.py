"""One replica's share of the router's chat workload, driven at the engine on one CPU thread:
where a later turn's TTFT goes, under engine settings that alternate in one process run.

The workload is `router_bench serve`'s, cut to one replica: conversations (8: a replica's share of
32 users on 4 replicas) share a 1,024-token system prompt; each turn adds a 256-token user message,
generates a 128-token reply (greedy, EOS ignored) that the next turn sends back, and the user
thinks 2-4 s before it. Arrivals are real time: a turn due during a step joins the next step,
as the engine thread takes new requests between steps. A turn's TTFT runs from when it was due
to the end of the step that hands its first token out; its TPOT from then to its last token.

    python -m hybrid_serve.benchmarks.chat_replica_bench [--seeds 0 1 2] \\
        [--variants '{}' '{"async_scheduling": true, "chunked_prefill_size": 256}']
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time

import torch

from .provenance import cpu_device, git_commit


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[round(q * (len(ordered) - 1))]


def run_conversations(llm, seed: int, conversations: int = 8, turns: int = 5, system_tokens: int = 1024,
                      user_tokens: int = 256, reply_tokens: int = 128, think_s: tuple[float, float] = (2.0, 4.0),
                      arrivals_s: float = 2.0, unseen_history_fraction: float = 0.0) -> dict:
    """Drive `llm.engine` with the chat workload; per-turn TTFT / TPOT and the steps run.

    `unseen_history_fraction`: the share of later turns whose history this replica never saw
    (round-robin over 4 replicas: 0.75). Such a turn brings a history of the same length that
    shares only the system prompt with anything cached, so the replica computes it whole."""
    from hybrid_serve import SamplingParams

    engine = llm.engine
    rng = random.Random(seed)
    # 4000 for the 30M model, as in the recorded runs; a test model's vocabulary may be smaller
    vocab = min(4000, int(engine.hf_config.vocab_size))

    def tokens(n: int) -> list[int]:
        return [rng.randrange(10, vocab) for _ in range(n)]

    system = tokens(system_tokens)
    history = {c: list(system) for c in range(conversations)}
    turn = {c: 0 for c in range(conversations)}
    start = time.monotonic()
    due = {c: start + rng.uniform(0, arrivals_s) for c in range(conversations)}
    live: dict[str, tuple[int, list[int], float]] = {}  # request id -> conversation, prompt, due time
    first_token: dict[str, float] = {}
    turns_done: list[dict] = []
    params = SamplingParams(max_tokens=reply_tokens, temperature=0.0, ignore_eos=True)
    num_steps = 0
    while due or live:
        now = time.monotonic()
        for c in [c for c, t in due.items() if t <= now]:
            past = history[c]
            if turn[c] > 0 and unseen_history_fraction and rng.random() < unseen_history_fraction:
                past = system + tokens(len(past) - len(system))
            prompt = past + tokens(user_tokens)
            request_id = f"c{c}-t{turn[c]}"
            engine.add_request(request_id, prompt, params)
            live[request_id] = (c, prompt, due.pop(c))
        if not engine.has_unfinished():
            time.sleep(max(0.0, min(due.values()) - time.monotonic()))
            continue
        produced = engine.step()
        num_steps += 1
        end = time.monotonic()
        for req in produced:
            if req.request_id not in live:
                continue
            first_token.setdefault(req.request_id, end)
            if not req.finished:
                continue
            c, prompt, due_at = live.pop(req.request_id)
            first = first_token.pop(req.request_id)
            turns_done.append({"turn": turn[c], "ttft_s": first - due_at,
                               "tpot_s": (end - first) / max(1, len(req.output_token_ids) - 1),
                               "computed_tokens": len(prompt) - (req.num_cached_tokens or 0)})
            history[c] = prompt + list(req.output_token_ids)
            turn[c] += 1
            if turn[c] < turns:
                due[c] = time.monotonic() + rng.uniform(*think_s)
    later = [t for t in turns_done if t["turn"] > 0]
    return {"seed": seed, "wall_s": round(time.monotonic() - start, 1), "steps": num_steps, "turns": len(turns_done),
            "later_turn_ttft_p50_s": round(_quantile([t["ttft_s"] for t in later], 0.5), 3),
            "later_turn_ttft_mean_s": round(statistics.mean(t["ttft_s"] for t in later), 3),
            "ttft_p50_s": round(_quantile([t["ttft_s"] for t in turns_done], 0.5), 3),
            "ttft_p99_s": round(_quantile([t["ttft_s"] for t in turns_done], 0.99), 3),
            "tpot_p50_ms": round(1e3 * _quantile([t["tpot_s"] for t in turns_done], 0.5), 1),
            "later_turn_computed_tokens_mean": round(statistics.mean(t["computed_tokens"] for t in later), 1)}


def main() -> int:
    from hybrid_serve import LLM
    from hybrid_serve.engine.config import DEVICE_DEFAULTS

    from .model_configs import write_model_dir
    from .synthetic_tokenizer import write_tokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--variants", nargs="+", default=[
        "{}", '{"async_scheduling": true, "chunked_prefill_size": 256}',
        '{"async_scheduling": true}', '{"chunked_prefill_size": 256}'],
        help="engine settings (JSON) over the CPU defaults; '{}' is the defaults")
    ap.add_argument("--cache-mib", type=int, default=128)
    ap.add_argument("--unseen-history-fraction", type=float, default=0.0,
                    help="later turns whose history this replica never saw (round-robin over 4 replicas: 0.75)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "chat_replica.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp()
    model = write_model_dir("qwen3_5_30m_cpu", tmp)
    tokenizer = write_tokenizer(os.path.join(tmp, "tok"), 4096)
    rows = []
    for seed in args.seeds:  # variants alternate within each seed (the machine's speed drifts)
        for variant in args.variants:
            llm = LLM(model=model, load_format="dummy", dtype="float32", tokenizer=tokenizer, max_model_len=4096,
                      max_num_seqs=8, cache_memory_bytes=args.cache_mib << 20, **json.loads(variant))
            row = {"variant": variant,
                   **run_conversations(llm, seed, unseen_history_fraction=args.unseen_history_fraction)}
            llm.engine.cache.check_empty()
            print(row, flush=True)
            rows.append(row)
            del llm
    summary = {v: {k: round(statistics.median(r[k] for r in rows if r["variant"] == v), 3)
                   for k in ("later_turn_ttft_p50_s", "ttft_p99_s", "tpot_p50_ms", "wall_s")}
               for v in args.variants}
    print(json.dumps(summary, indent=1))
    result = {"metric": "one replica's chat turns at the engine: TTFT / TPOT by engine settings",
              "date": time.strftime("%Y-%m-%d"),
              "commit": git_commit(),
              "device": cpu_device(torch_threads=1),
              "workload": "30M model (qwen3_5_30m_cpu, fp32 dummy weights), max_num_seqs 8, "
                          f"{args.cache_mib} MiB cache; 8 conversations x 5 turns, 1,024-token system prompt, "
                          "256-token user turns, 128-token generated replies sent back, think 2-4 s, arrivals "
                          f"over 2 s, unseen history fraction {args.unseen_history_fraction}; variants alternate "
                          "within each seed",
              "cpu_defaults": DEVICE_DEFAULTS["cpu"],
              "baseline": "the variants in the same process (the settings before session 33: async_scheduling "
                          "on, chunked_prefill_size 256)",
              "summary_medians_over_seeds": summary, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
