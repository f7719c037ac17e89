"""`reliability.py burst`: the app's capacity in a closed loop, then open-loop bursts at a multiple
of it; statuses and Retry-After, accepted outputs against the same requests sent alone, TTFT
against the queues' bound, the front end's own delay (a probe process), the Serve processes' RSS."""
from __future__ import annotations

import asyncio
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from collections import Counter

from hybrid_serve.benchmarks.reliability_harness import (API_KEY, LocalApp, call, completion_body, good_retry_after,
                                                        ms, pct, prompt_pool, session, table)


def classify_burst(rec: dict) -> str:
    if rec["exc"] is not None:
        return "client_error"
    if rec["status"] == 200:
        if rec["stream"] and (not rec["done"] or rec["error_event"] is not None):
            return "stream_broken"
        return "accepted"
    if rec["status"] in (503, 429):
        return f"{rec['status']}_retry_after" if good_retry_after(rec) else f"{rec['status']}_no_retry_after"
    return f"other_{rec['status']}"


# ----- burst ----------------------------------------------------------------------------------
async def closed_loop(app: LocalApp, prompts: list[str], concurrency: int, seconds: float, seed: int,
                      max_tokens: int) -> list[dict]:
    rng = random.Random(seed)
    out: list[dict] = []
    stop = time.monotonic() + seconds
    async with session() as http:
        async def worker():
            while time.monotonic() < stop:
                out.append(await call(http, app, completion_body(rng.choice(prompts), rng.random() < 0.5,
                                                                 max_tokens)))
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


async def open_loop(app: LocalApp, prompts: list[str], rate: float, seconds: float, seed: int,
                    max_tokens: int) -> tuple[list[dict], float, list[float]]:
    """Poisson arrivals at `rate` for `seconds`; each request's record gets `t_sched` (its planned
    send time, relative to the start); returns the records, how long sending took, and how late
    each was sent (the client's own lag)."""
    rng = random.Random(seed)
    tasks: list[asyncio.Task] = []
    lags: list[float] = []

    async def one(http, body, t_rel):
        rec = await call(http, app, body)
        rec["t_sched"] = t_rel
        return rec

    async with session() as http:
        start = time.monotonic()
        t = start
        while True:
            t += rng.expovariate(rate)
            if t >= start + seconds:
                break
            delay = t - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            lags.append(max(0.0, -delay))
            body = completion_body(rng.choice(prompts), rng.random() < 0.5, max_tokens)
            tasks.append(asyncio.create_task(one(http, body, t - start)))
        sent_s = time.monotonic() - start
        recs = await asyncio.gather(*tasks)
    return list(recs), sent_s, lags


PROBE = """
import json, sys, time, urllib.request
url, key, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
out, end = [], time.monotonic() + seconds
while time.monotonic() < end:
    t = time.monotonic()
    try:
        req = urllib.request.Request(url, headers={"Authorization": "Bearer " + key})
        with urllib.request.urlopen(req, timeout=120) as r:
            r.read()
        out.append(time.monotonic() - t)
    except Exception:
        out.append(None)
    time.sleep(max(0.0, 0.5 - (time.monotonic() - t)))
print(json.dumps(out))
"""


def start_probe(app: LocalApp, seconds: float) -> subprocess.Popen:
    """GET /v1/models every 0.5 s from another process: the HTTP front end's own delay (proxy and
    ingress; no replica involved), free of the load generator's event loop."""
    return subprocess.Popen([sys.executable, "-c", PROBE, f"{app.base}/v1/models", API_KEY, str(seconds)],
                            stdout=subprocess.PIPE, text=True)


def probe_figures(proc: subprocess.Popen) -> dict:
    out, _ = proc.communicate(timeout=300)
    lat = json.loads(out)
    ok = [x for x in lat if x is not None]
    return {"n": len(lat), "failed": len(lat) - len(ok), "p50": ms(pct(ok, 0.5)), "p99": ms(pct(ok, 0.99)),
            "max": ms(max(ok) if ok else None)}


def hist_quantiles(after, before, name: str, qs=(0.5, 0.9, 0.99)) -> dict:
    """Quantiles (upper bucket bounds, ms) of a histogram's observations between two /metrics
    reads, summed over replicas."""
    def buckets(samples):
        out: dict[float, float] = {}
        for n, lab, v in samples:
            if n == name + "_bucket":
                le = float(lab["le"])
                out[le] = out.get(le, 0.0) + v
        return out

    hi, lo = buckets(after), buckets(before)
    cum = sorted((le, hi[le] - lo.get(le, 0.0)) for le in hi)
    total = cum[-1][1] if cum else 0
    res = {"n": int(total)}
    for q in qs:
        i = next((i for i, (_, c) in enumerate(cum) if total and c >= q * total), None)
        key = f"p{int(q * 100)}"
        if i is None:
            res[key], res[f"{key}_le"], res[f"{key}_from"] = None, None, None
            continue
        le, c = cum[i]
        prev_le, prev_c = cum[i - 1] if i else (0.0, 0.0)
        res[f"{key}_le"] = round(le * 1e3, 1) if le != float("inf") else "inf"
        res[f"{key}_from"] = round(prev_le * 1e3, 1)  # the bucket's lower edge
        if le == float("inf"):
            res[key] = round(prev_le * 1e3, 1)
        else:  # linear within the bucket, as Prometheus' histogram_quantile
            res[key] = round((prev_le + (le - prev_le) * (q * total - prev_c) / max(c - prev_c, 1e-9)) * 1e3, 1)
    return res


def _burst_figures(recs: list[dict], sent_s: float, lags: list[float], t_start: float, burst_s: float,
                   duration: float, m_before, m_after, max_tokens: int) -> dict:
    classes = Counter(classify_burst(r) for r in recs)
    accepted = [r for r in recs if classify_burst(r) == "accepted"]
    ttft = [r["ttft"] for r in accepted if r["stream"] and r["ttft"] is not None]
    rejected = [r for r in recs if r["status"] in (503, 429)]
    in_window = [r for r in accepted if r["t_end"] - t_start <= duration]

    def sliced(rs, lo, hi, f):
        return ms(pct([f(r) for r in rs if lo <= r["t_sched"] < hi], 0.5))

    ttft_f = lambda r: r["ttft"]
    lat_f = lambda r: r["t_end"] - r["t0"]
    streamed = [r for r in accepted if r["stream"] and r["ttft"] is not None]
    return {
        "requests": len(recs), "arrivals_sent_s": round(sent_s, 1), "last_answer_after_s": round(burst_s, 1),
        "client_send_lag_ms": {"p50": ms(pct(lags, 0.5)), "p99": ms(pct(lags, 0.99)), "max": ms(max(lags))},
        "by_class": dict(classes),
        "by_status": dict(Counter(str(r["status"]) if r["exc"] is None else "exception" for r in recs)),
        "failures": sum(v for k, v in classes.items() if k not in ("accepted", "503_retry_after", "429_retry_after")),
        "retry_after_values": dict(sorted(Counter(r["retry_after"] for r in rejected).items(),
                                          key=lambda kv: int(kv[0]) if (kv[0] or "").isdigit() else -1)),
        "reject_reasons": dict(Counter(_reason(r.get("body", "")) for r in rejected)),
        "accepted": len(accepted), "accepted_rps_during_burst": round(len(in_window) / duration, 2),
        "accepted_ttft_ms": {"n": len(ttft), "p50": ms(pct(ttft, 0.5)), "p90": ms(pct(ttft, 0.9)),
                             "p99": ms(pct(ttft, 0.99)), "max": ms(max(ttft) if ttft else None)},
        "accepted_ttft_p50_ms_by_arrival": {"first_10s": sliced(streamed, 0, 10, ttft_f),
                                            "last_10s": sliced(streamed, duration - 10, duration, ttft_f)},
        "accepted_time_per_output_token_ms": {
            "p50": ms(pct([(r["t_last"] - r["t_first"]) / max(1, max_tokens - 1) for r in streamed], 0.5)),
            "p99": ms(pct([(r["t_last"] - r["t_first"]) / max(1, max_tokens - 1) for r in streamed], 0.99))},
        "accepted_inter_token_ms": {"n": sum(len(r["gaps"]) for r in streamed),
                                    "p50": ms(pct([g for r in streamed for g in r["gaps"]], 0.5)),
                                    "p99": ms(pct([g for r in streamed for g in r["gaps"]], 0.99))},
        "accepted_nonstream_latency_ms": {"n": sum(not r["stream"] for r in accepted),
                                          "p50": ms(pct([lat_f(r) for r in accepted if not r["stream"]], 0.5)),
                                          "p99": ms(pct([lat_f(r) for r in accepted if not r["stream"]], 0.99))},
        "rejected_latency_ms": {"n": len(rejected), "p50": ms(pct([lat_f(r) for r in rejected], 0.5)),
                                "p99": ms(pct([lat_f(r) for r in rejected], 0.99))},
        "rejected_latency_p50_ms_by_arrival": {"first_10s": sliced(rejected, 0, 10, lat_f),
                                               "last_10s": sliced(rejected, duration - 10, duration, lat_f)},
        "replica_ttft_ms": hist_quantiles(m_after, m_before, "hybrid_serve_time_to_first_token_seconds"),
        "replica_queue_time_ms": hist_quantiles(m_after, m_before, "hybrid_serve_queue_time_seconds"),
    }


def _reason(body: str) -> str:
    if "waiting for their first token" in body:
        return "replica first-token queue full (requests)"
    if "prompt tokens are waiting" in body:
        return "replica first-token queue full (tokens)"
    if "ingress queue is full" in body:
        return "ingress queue full (Serve max_queued_requests)"
    if "in flight at this ingress" in body:
        return "ingress in-flight bound (before any work)"
    return body[:80] or "?"


def run_burst(args) -> dict:
    engine_args = {"max_num_seqs": args.max_num_seqs, "max_model_len": 256, "cache_memory_bytes": 64 * 2**20}
    app_args = {"replicas": args.replicas, "num_cpus_per_replica": 2 / args.replicas / 2,
                "torch_num_threads": args.threads, "engine_args": engine_args}
    if args.max_waiting_requests:
        app_args["max_waiting_requests"] = args.max_waiting_requests
    if args.max_queued_requests:
        app_args["max_queued_requests"] = args.max_queued_requests
    prompts = prompt_pool(args.pool, args.seed)
    load_at_start = os.getloadavg()
    with LocalApp(app_args) as app:
        b = app.bounds
        print(f"app up in {app.startup_s:.1f} s; queue bounds {b}", flush=True)
        asyncio.run(closed_loop(app, prompts, 2, 5, args.seed + 1, args.max_tokens))  # warm-up
        t = time.monotonic()
        cap = asyncio.run(closed_loop(app, prompts, args.capacity_concurrency, args.capacity_seconds, args.seed + 2,
                                      args.max_tokens))
        cap_s = time.monotonic() - t
        cap_ok = [r for r in cap if classify_burst(r) == "accepted"]
        capacity = len(cap_ok) / cap_s
        cap_ttft = [r["ttft"] for r in cap_ok if r["stream"] and r["ttft"] is not None]
        cap_lat = [r["t_end"] - r["t0"] for r in cap_ok]
        print(f"capacity: {capacity:.2f} req/s at concurrency {args.capacity_concurrency} "
              f"({len(cap_ok)}/{len(cap)} ok in {cap_s:.1f} s)", flush=True)
        app.wait_idle()
        idle_probe = probe_figures(start_probe(app, 10))
        rss = {"before": app.rss_mib()}
        rate = args.multiplier * capacity
        bursts, all_accepted = [], []
        for i in range(args.bursts):
            print(f"burst {i + 1}: {rate:.1f} req/s for {args.duration} s ...", flush=True)
            m_before = app.metrics()
            probe = start_probe(app, args.duration)
            t = time.monotonic()
            recs, sent_s, lags = asyncio.run(open_loop(app, prompts, rate, args.duration, args.seed + 3 + i,
                                                       args.max_tokens))
            burst_s = time.monotonic() - t
            rss[f"right_after_burst_{i + 1}"] = app.rss_mib()
            idle_s, _ = app.wait_idle()
            m_after = app.metrics()
            time.sleep(max(0.0, 30 - idle_s))
            rss[f"30s_after_burst_{i + 1}"] = app.rss_mib()
            fig = _burst_figures(recs, sent_s, lags, t, burst_s, args.duration, m_before, m_after, args.max_tokens)
            fig["front_end_probe_ms"] = probe_figures(probe)  # GET /v1/models during the burst
            fig["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
            fig["engine_30s_after"] = app.engine_state()
            bursts.append(fig)
            all_accepted += [r for r in recs if classify_burst(r) == "accepted"]
            print(f"  {fig['by_class']}, accepted TTFT {fig['accepted_ttft_ms']}", flush=True)
        # identity: each sampled prompt's accepted outputs vs the same request alone, afterwards
        rng = random.Random(args.seed + 4)
        outputs: dict[str, list[tuple[bool, str]]] = {}
        for r in all_accepted:
            outputs.setdefault(r["prompt"], []).append((r["stream"], r["text"]))
        sample = sorted(outputs)
        rng.shuffle(sample)
        sample = sample[:args.identity_sample]
        mismatches, compared = [], 0

        async def alone():
            nonlocal compared
            async with session() as http:
                for p in sample:
                    ref = await call(http, app, completion_body(p, False, args.max_tokens))
                    for stream, text in outputs[p]:
                        compared += 1
                        if ref["status"] != 200 or text != ref["text"]:
                            mismatches.append({"prompt": p, "stream": stream, "burst": text, "alone": ref["text"],
                                               "alone_status": ref["status"]})
        asyncio.run(alone())
        config = app.config_record()
    # The configured queues as a time, worst case: an accepted request waits behind at most
    # W = max_waiting_requests others at its replica and Q = max_queued_requests at the ingress
    # (ceil(Q / replicas) per replica) for one of the B = max_num_seqs rows of its replica. A
    # row frees within max_tokens engine steps of being taken (the prefill step gives the
    # first token, then a step per token), so it has a row within T = ceil((W + ceil(Q /
    # replicas)) / B) turns of max_tokens steps (ceil(W / B) counted from the replica); one
    # step more for the step under way when it arrives, one for its own prefill: (T x
    # max_tokens + 2) steps. A step: the burst's own p99 of the gaps between two tokens of the
    # accepted streams (client-side, so the way back is in it). At the client add the HTTP
    # front end's own delay (GET /v1/models p99 during the burst: no queue of ours in it).
    w, q, seqs = b["max_waiting_requests"], b["max_queued_requests"], args.max_num_seqs
    turns_replica = math.ceil(w / seqs)
    turns_e2e = math.ceil((w + math.ceil(q / args.replicas)) / seqs)
    ttft_alone = statistics.median(cap_ttft) if cap_ttft else 0.0
    for x in bursts:
        step_s = (x["accepted_inter_token_ms"]["p99"] or 0.0) / 1e3
        front_s = (x["front_end_probe_ms"]["p99"] or 0.0) / 1e3
        x["queue_bound_s"] = {"replica": round((turns_replica * args.max_tokens + 2) * step_s, 2),
                              "end_to_end": round((turns_e2e * args.max_tokens + 2) * step_s + front_s, 2)}
    last_rss = rss[f"30s_after_burst_{args.bursts}"]
    growth_first = {k: round(rss["30s_after_burst_1"].get(k, 0) - v, 1) for k, v in rss["before"].items()}
    growth_last = ({k: round(last_rss.get(k, 0) - v, 1) for k, v in rss["30s_after_burst_1"].items()}
                   if args.bursts > 1 else None)
    figures = {
        "capacity_rps": round(capacity, 2), "capacity_concurrency": args.capacity_concurrency,
        "capacity_seconds": round(cap_s, 1), "capacity_ttft_p50_ms": ms(ttft_alone),
        "capacity_latency_p50_ms": ms(pct(cap_lat, 0.5)), "front_end_probe_idle_ms": idle_probe,
        "burst_rate_rps": round(rate, 1), "burst_seconds": args.duration, "bursts": bursts,
        "queue_bound_formula": (f"(T x max_tokens + 2) steps, T = ceil((max_waiting_requests + "
                                f"ceil(max_queued_requests / replicas)) / max_num_seqs) = {turns_e2e} turn(s) "
                                f"at the client, + the front end's p99 (GET /v1/models during the burst); T = "
                                f"ceil(max_waiting_requests / max_num_seqs) = {turns_replica} at the replica; a "
                                f"step = the burst's p99 gap between two tokens of accepted streams"),
        "identity": {"prompts_checked": len(sample), "outputs_compared": compared, "mismatches": len(mismatches),
                     "first_mismatches": mismatches[:3], "distinct_accepted_prompts": len(outputs)},
        "rss_mib": rss, "rss_growth_burst_1_mib": growth_first, "rss_growth_burst_2_mib": growth_last,
        "load_average_at_start": [round(x, 2) for x in load_at_start],
    }
    flat = growth_last if growth_last is not None else growth_first
    checks = {
        "every_answer_200_or_503_429_with_retry_after": all(x["failures"] == 0 for x in bursts),
        "greedy_outputs_identical_to_alone": not mismatches and compared >= 50,
        # the engine's histogram resolves the p99 only to its bucket: the bucket holding it starts
        # at or below the bound
        "replica_p99_ttft_bucket_within_replica_queue_bound": all(
            x["replica_ttft_ms"]["p99_from"] is not None and x["replica_ttft_ms"]["p99_from"] <=
            x["queue_bound_s"]["replica"] * 1e3 for x in bursts),
        "client_p99_ttft_within_end_to_end_queue_bound": all(
            x["accepted_ttft_ms"]["p99"] is not None and x["accepted_ttft_ms"]["p99"] <=
            x["queue_bound_s"]["end_to_end"] * 1e3 for x in bursts),
        "memory_flat": all(v <= args.rss_tolerance_mib for v in flat.values()),
    }
    table([("capacity", (f"{capacity:.2f} req/s (concurrency {args.capacity_concurrency}), TTFT p50 "
                        f"{ms(ttft_alone)} ms")),
           *[(f"burst {i + 1}", f"{rate:.1f} req/s x {args.duration} s = {x['requests']} requests {x['by_class']}")
             for i, x in enumerate(bursts)],
           ("accepted TTFT p50/p99 (client)", [(x["accepted_ttft_ms"]["p50"], x["accepted_ttft_ms"]["p99"])
                                               for x in bursts]),
           ("replica TTFT p50/p99 (histogram)", [(x["replica_ttft_ms"]["p50"], x["replica_ttft_ms"]["p99"])
                                                 for x in bursts]),
           ("client TTFT p50 first/last 10 s", [tuple(x["accepted_ttft_p50_ms_by_arrival"].values())
                                                for x in bursts]),
           ("503 latency p50 first/last 10 s", [tuple(x["rejected_latency_p50_ms_by_arrival"].values())
                                                for x in bursts]),
           ("GET /v1/models p50/p99 idle, bursts", [(idle_probe["p50"], idle_probe["p99"])] +
            [(x["front_end_probe_ms"]["p50"], x["front_end_probe_ms"]["p99"]) for x in bursts]),
           ("queue bounds replica / end to end (s)", [tuple(x["queue_bound_s"].values()) for x in bursts]),
           ("identity", f"{compared} outputs of {len(sample)} prompts, {len(mismatches)} differ"),
           ("RSS MiB", rss), ("checks", checks)], "burst")
    workload = (f"demo model, {args.replicas} LLMServer replica(s) x torch_num_threads={args.threads}, "
                f"max_num_seqs={args.max_num_seqs}; /v1/completions, greedy, ignore_eos, max_tokens="
                f"{args.max_tokens}, 50% streaming, prompts: {args.pool} seeded 3-12-word prompts (seed {args.seed}); "
                f"capacity: closed loop, concurrency {args.capacity_concurrency}, {args.capacity_seconds} s; "
                f"{args.bursts} bursts of Poisson arrivals at {args.multiplier}x capacity for {args.duration} s "
                f"(30 s apart), one aiohttp client process, and GET /v1/models every 0.5 s from another process (the "
                f"front end's own delay); identity: {args.identity_sample} distinct accepted "
                f"prompts re-sent alone (non-streaming) after the bursts, compared with every accepted output of "
                f"them; TTFT client-side = first streamed text, replica-side = the engine's histogram")
    return {"workload": workload, "config": config, "figures": figures, "checks": checks}
