"""Online serving benchmark through the OpenAI HTTP API, in the style of `sglang.bench_serving`
and `vllm bench serve`: random token-id prompts of fixed (or ranged) length, a fixed output
length (`ignore_eos`), streamed `/v1/completions` at a bounded concurrency. Per request: TTFT
(first streamed token), TPOT = (latency - TTFT) / (output tokens - 1) as both tools compute
it, and the gaps between chunks (ITL); per run: output and input tok/s over the run's wall
time. Several concurrencies run one after the other against the same server.

    python benchmarks/serve_bench.py --base-url http://127.0.0.1:8000 --model NAME \
        --input-len 1000 --output-len 1000 --range-ratio 1.0 --concurrency 1,4 \
        --num-prompts 5,20 [--warmup 1] [--vocab 4000] [--json OUT.json]

`--range-ratio` follows sglang's meaning (1.0: every length exactly as given; r < 1: uniform in
[len * r, len]). Prompt ids are drawn from [10, vocab) with a seed, so a run is repeatable.
`--start-server "CMD"` starts the server itself (a shell command), times start-up to the first
answering `/health`, runs the benchmark and stops it (SIGINT, then SIGKILL).

Where a request's TTFT goes: around each level the server's `/metrics` is scraped (once more
after the replicas' next push) and the level's rows get `replica_ttft_mean_ms` (arrival at
the engine replica to its first token, the replicas' own histogram) and
`replica_queue_mean_ms` (arrival to first scheduled); the client's TTFT mean minus the
replica's is the time before the replica (client, HTTP proxy, ingress, Serve's routing) plus
the first chunk's way back. Omitted when the server has no hybrid_serve metrics.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request


def make_prompts(num: int, input_len: int, output_len: int, ratio: float, vocab: int, seed: int):
    """[(prompt ids, output length)]: lengths uniform in [len * ratio, len] (sglang's range ratio)."""
    rng = random.Random(seed)

    def length(n: int) -> int:
        return n if ratio >= 1.0 else rng.randint(max(1, int(n * ratio)), n)

    return [([rng.randrange(10, vocab) for _ in range(length(input_len))], length(output_len)) for _ in range(num)]


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def summarize(records: list[dict], wall_s: float, concurrency: int) -> dict:
    """sglang/vLLM bench figures from per-request records (times in seconds)."""
    ok = [r for r in records if r["error"] is None]
    out_tokens = sum(r["output_tokens"] for r in ok)
    in_tokens = sum(r["input_tokens"] for r in ok)
    ttft = [r["ttft_s"] * 1e3 for r in ok]
    tpot = [(r["latency_s"] - r["ttft_s"]) / (r["output_tokens"] - 1) * 1e3 for r in ok if r["output_tokens"] > 1]
    itl = [g * 1e3 for r in ok for g in r["itl_s"]]
    stat = lambda xs: ({"mean": statistics.mean(xs), "median": _pct(xs, 0.5), "p99": _pct(xs, 0.99)}  # noqa: E731
                       if xs else None)
    return {"max_concurrency": concurrency, "requests": len(records), "failed": len(records) - len(ok),
            "wall_s": wall_s, "input_tokens": in_tokens, "output_tokens": out_tokens,
            "input_tok_s": in_tokens / wall_s, "output_tok_s": out_tokens / wall_s,
            "per_user_output_tok_s": out_tokens / wall_s / concurrency,
            "ttft_ms": stat(ttft), "tpot_ms": stat(tpot), "itl_ms": stat(itl),
            # streamed chunks per output token: 1.0 when every token reaches the client as it is made
            "tokens_per_chunk": out_tokens / max(1, sum(len(r["itl_s"]) + 1 for r in ok)),
            "errors": sorted({r["error"] for r in records if r["error"]})[:5]}


async def one_request(session, url: str, model: str, prompt: list[int], output_len: int, timeout_s: float) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": output_len, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    rec = {"input_tokens": len(prompt), "output_tokens": 0, "ttft_s": None, "latency_s": None, "itl_s": [],
           "error": None}
    start = last = time.perf_counter()
    rec["send_monotonic_s"] = time.monotonic()  # (the hop log's clock)
    chunks = 0
    try:
        async with session.post(url, json=body, timeout=timeout_s) as resp:
            if resp.status != 200:
                rec["error"] = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return rec
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                rec.setdefault("id", event.get("id"))
                if "error" in event:
                    rec["error"] = f"stream error: {event['error']}"
                    break
                if event.get("usage"):
                    rec["output_tokens"] = event["usage"]["completion_tokens"]
                if not event.get("choices"):
                    continue
                now = time.perf_counter()
                if chunks == 0:
                    rec["ttft_s"] = now - start
                    rec["first_monotonic_s"] = time.monotonic()
                else:
                    rec["itl_s"].append(now - last)
                last = now
                chunks += 1
    except Exception as exc:  # noqa: BLE001 - a failed request is a record, not a crash
        rec["error"] = f"{type(exc).__name__}: {exc}"
        return rec
    rec["latency_s"] = time.perf_counter() - start
    rec["last_monotonic_s"] = time.monotonic()
    if rec["error"] is None and (rec["ttft_s"] is None or rec["output_tokens"] != output_len):
        rec["error"] = f"expected {output_len} tokens, got {rec['output_tokens']} in {chunks} chunks"
    return rec


async def run_level(base_url: str, model: str, prompts, concurrency: int, timeout_s: float,
                    hop_log: str | None = None) -> dict:
    import aiohttp

    url = f"{base_url}/v1/completions"
    sem = asyncio.Semaphore(concurrency)
    conn = aiohttp.TCPConnector(limit=concurrency + 4)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as session:
        async def bounded(p, n):
            async with sem:
                return await one_request(session, url, model, p, n, timeout_s)

        start, start_monotonic = time.perf_counter(), time.monotonic()
        records = await asyncio.gather(*(bounded(p, n) for p, n in prompts))
        wall = time.perf_counter() - start
    # CLOCK_MONOTONIC is one clock for every process of a machine: these place the level on
    # the engine's own timeline (its step log, HYBRID_SERVE_STEP_LOG)
    if hop_log:  # the client's marks beside the server's (deploy/hop_log.py's format)
        with open(f"{hop_log}.client", "a") as f:
            for rec in records:
                for event in ("send", "first", "last"):
                    if rec.get("id") and rec.get(f"{event}_monotonic_s") is not None:
                        f.write(f"{rec[f'{event}_monotonic_s']:.6f} client {event} {rec['id']}\n")
    return {**summarize(list(records), wall, concurrency), "start_monotonic_s": start_monotonic,
            "end_monotonic_s": start_monotonic + wall}


def wait_healthy(base_url: str, timeout_s: float, proc=None) -> float | None:
    """Seconds until GET /health answers 200 (None on timeout or if `proc` exited)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if proc is not None and proc.poll() is not None:
            return None
        try:
            with urllib.request.urlopen(f"{base_url}/health", timeout=5) as resp:
                if resp.status == 200:
                    return time.monotonic() - start
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    return None


def served_model(base_url: str) -> str:
    with urllib.request.urlopen(f"{base_url}/v1/models", timeout=10) as resp:
        return json.load(resp)["data"][0]["id"]


SERVER_HISTOGRAMS = {"replica_ttft": "hybrid_serve_time_to_first_token_seconds",
                     "replica_queue": "hybrid_serve_queue_time_seconds"}


def scrape_sums(base_url: str) -> dict[str, tuple[float, float]] | None:
    """(sum, count) over all label sets of each SERVER_HISTOGRAMS series in GET /metrics, or
    None where the server has none (another server, or its metrics unreachable)."""
    try:
        with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    except (urllib.error.URLError, OSError):
        return None
    sums = {key: [0.0, 0.0] for key in SERVER_HISTOGRAMS}
    seen = False
    for line in text.splitlines():
        for key, name in SERVER_HISTOGRAMS.items():
            for part, i in (("_sum", 0), ("_count", 1)):
                if line.startswith(name + part + "{") or line.startswith(name + part + " "):
                    sums[key][i] += float(line.rsplit(" ", 1)[1])
                    seen = True
    return {k: (v[0], v[1]) for k, v in sums.items()} if seen else None


def server_side(before, after) -> dict:
    """The level's mean of each server histogram, in ms, from two scrapes."""
    out = {}
    if before is None or after is None:
        return out
    for key in SERVER_HISTOGRAMS:
        total, count = after[key][0] - before[key][0], after[key][1] - before[key][1]
        if count > 0:
            out[f"{key}_mean_ms"] = 1e3 * total / count
            out[f"{key}_count"] = int(count)
    return out


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default=None, help="model id (default: the server's first)")
    ap.add_argument("--input-len", type=int, default=1000)
    ap.add_argument("--output-len", type=int, default=1000)
    ap.add_argument("--range-ratio", type=float, default=1.0)
    ap.add_argument("--concurrency", type=_ints, default=[1, 4], help="comma-separated levels")
    ap.add_argument("--num-prompts", type=_ints, default=None, help="per level (default: 5 x concurrency)")
    ap.add_argument("--warmup", type=int, default=1, help="requests sent alone before each run (not counted)")
    ap.add_argument("--vocab", type=int, default=4000, help="prompt ids are drawn from [10, vocab)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--request-timeout", type=float, default=600.0)
    ap.add_argument("--start-server", default=None, help="shell command that serves at --base-url")
    ap.add_argument("--startup-timeout", type=float, default=900.0)
    ap.add_argument("--json", default=None, help="write the result here")
    ap.add_argument("--label", default="", help="free text stored with the result")
    ap.add_argument("--metrics-settle", type=float, default=2.5,
                    help="seconds to wait after a level for the replicas' metrics push before scraping")
    ap.add_argument("--hop-log", default=None, metavar="PREFIX",
                    help="append the client's marks (send, first, last; not the warm-up's) to PREFIX.client, "
                         "beside the server's HYBRID_SERVE_HOP_LOG=PREFIX files (benchmarks/hop_report.py)")
    args = ap.parse_args(argv)
    num_prompts = args.num_prompts or [5 * c for c in args.concurrency]
    if len(num_prompts) != len(args.concurrency):
        ap.error("--num-prompts needs one value per --concurrency level")
    result: dict = {"label": args.label, "workload": {
        "input_len": args.input_len, "output_len": args.output_len, "range_ratio": args.range_ratio,
        "concurrency": args.concurrency, "num_prompts": num_prompts, "warmup": args.warmup, "seed": args.seed,
        "api": "/v1/completions, streaming, token-id prompts, temperature 0, ignore_eos"}}
    proc = None
    if args.start_server:
        proc = subprocess.Popen(args.start_server, shell=True, start_new_session=True)
        startup = wait_healthy(args.base_url, args.startup_timeout, proc)
        result["startup_to_health_s"] = startup
        print(f"server start-up to /health: {startup} s", flush=True)
        if startup is None:
            _stop(proc)
            print("error: the server did not become healthy", file=sys.stderr)
            return 1
    try:
        model = args.model or served_model(args.base_url)
        result["model"] = model
        levels = []
        for i, (conc, num) in enumerate(zip(args.concurrency, num_prompts)):
            prompts = make_prompts(num + args.warmup, args.input_len, args.output_len, args.range_ratio, args.vocab,
                                   args.seed + 1000 * i)
            if args.warmup:
                asyncio.run(run_level(args.base_url, model, prompts[: args.warmup], 1, args.request_timeout))
            time.sleep(args.metrics_settle if args.warmup else 0.0)  # the warm-up's push, before the scrape
            before = scrape_sums(args.base_url)
            row = asyncio.run(run_level(args.base_url, model, prompts[args.warmup:], conc, args.request_timeout,
                                        args.hop_log))
            if before is not None:
                time.sleep(args.metrics_settle)
                row.update(server_side(before, scrape_sums(args.base_url)))
            levels.append(row)
            tp = row["tpot_ms"] or {}
            tt = row["ttft_ms"] or {}
            print(f"c={conc:<3} n={num:<4} out {row['output_tok_s']:9.1f} tok/s  TTFT mean {tt.get('mean', 0):8.1f} "
                  f"ms  TPOT mean {tp.get('mean', 0):7.2f} ms (p99 {tp.get('p99', 0):7.2f})  tokens/chunk "
                  f"{row['tokens_per_chunk']:.2f}  failed {row['failed']}"
                  + (f"  replica TTFT mean {row['replica_ttft_mean_ms']:.1f} ms, queue {row.get('replica_queue_mean_ms', 0):.1f} ms"
                     if "replica_ttft_mean_ms" in row else "")
                  + (f"  {row['errors']}" if row["errors"] else ""), flush=True)
        result["levels"] = levels
    finally:
        if proc is not None:
            _stop(proc)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if all(row["failed"] == 0 for row in result.get("levels", [])) else 1


def _stop(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    except Exception:  # noqa: BLE001
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except Exception:  # noqa: BLE001
            pass


if __name__ == "__main__":
    sys.exit(main())
