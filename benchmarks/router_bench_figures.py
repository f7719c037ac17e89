"""What router_bench serve's results are made of: an app's /metrics text read for our router's
decisions and each replica's share (`metrics_text` .. `replica_split`), the issue's figures from
per-router rows (`router_metrics`), and one result from parts that measured different routers
at the same time (`merge_results`, router_bench.py's `merge` mode)."""
from __future__ import annotations

import statistics
import urllib.request
from collections import Counter

from .serve_bench import SERVER_HISTOGRAMS


def metrics_text(base: str) -> str:
    with urllib.request.urlopen(f"{base}/metrics", timeout=30) as resp:
        return resp.read().decode()


def decision_reasons(metrics: str) -> Counter:
    """Our router's decisions by reason so far (from the app's /metrics text; zero for other routers)."""
    out: Counter = Counter()
    for line in metrics.splitlines():
        if line.startswith("hybrid_serve_routerdecision_reasons_total{"):
            out[line.split('reason="', 1)[1].split('"', 1)[0]] += float(line.rsplit(" ", 1)[1])
    return out


def decision_time(metrics: str) -> float | None:
    """Our router's mean decision time (ms) over the app's life (its histogram in /metrics)."""
    total = count = 0.0
    for line in metrics.splitlines():
        if line.startswith("hybrid_serve_router_decision_seconds_sum"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith("hybrid_serve_router_decision_seconds_count"):
            count += float(line.rsplit(" ", 1)[1])
    return round(1e3 * total / count, 3) if count else None


def replica_sums(metrics: str) -> dict[str, dict[str, list[float]]]:
    """{replica label: {series key: [sum s, count]}} of serve_bench's SERVER_HISTOGRAMS (the
    replicas' TTFT and queue time) in the app's /metrics text: the time each request spent at
    its replica, so a run's client TTFT splits into routing + ingress (before the replica) and
    the replica's own queue + prefill."""
    out: dict[str, dict[str, list[float]]] = {}
    for line in metrics.splitlines():
        for key, name in SERVER_HISTOGRAMS.items():
            for part, i in (("_sum{", 0), ("_count{", 1)):
                if line.startswith(name + part) and 'replica="' in line:
                    replica = line.split('replica="', 1)[1].split('"', 1)[0]
                    out.setdefault(replica, {k: [0.0, 0.0] for k in SERVER_HISTOGRAMS})[key][i] += \
                        float(line.rsplit(" ", 1)[1])
    return out


def replica_split(before: dict, after: dict) -> dict:
    """Requests per replica and the replicas' mean TTFT / queue time (ms) between two scrapes."""
    per, totals = {}, {k: [0.0, 0.0] for k in SERVER_HISTOGRAMS}
    for replica, series in after.items():
        old = before.get(replica, {k: [0.0, 0.0] for k in SERVER_HISTOGRAMS})
        delta = {k: [series[k][0] - old[k][0], series[k][1] - old[k][1]] for k in SERVER_HISTOGRAMS}
        if delta["replica_ttft"][1] > 0:
            per[replica] = int(delta["replica_ttft"][1])
        for k in SERVER_HISTOGRAMS:
            totals[k][0] += delta[k][0]
            totals[k][1] += delta[k][1]
    out = {"requests_per_replica": sorted(per.values(), reverse=True)}
    for k, (total, count) in totals.items():
        if count:
            out[f"{k}_mean_ms"] = round(1e3 * total / count, 2)
    return out


def router_metrics(rows: dict[str, list[dict]]) -> dict:
    """The issue's figures from per-router rows (router -> one row per seed): TTFT p50 ratios
    (the mean of the seeds' p50s) and hit-token ratios (summed over seeds); None where a router
    is missing."""
    def p50(router):
        return statistics.mean(r["ttft_p50_s"] for r in rows[router]) if router in rows else None

    def ratio(a, b):
        return round(a / b, 3) if a is not None and b else None

    hits = {k: sum(r["hit_tokens"] for r in v) for k, v in rows.items()}
    return {
        "router_hit_tokens_vs_single_replica": ratio(hits.get("prefix"), hits.get("single_replica")),
        "router_ttft_p50_vs_round_robin": ratio(p50("prefix"), p50("round_robin")),
        "router_ttft_p50_vs_serve_default": ratio(p50("prefix"), p50("serve_default")),
        "router_ttft_p50_vs_ray_prefix_affinity": ratio(p50("prefix"), p50("ray_prefix_affinity")),
        "router_hit_tokens_2_ingress_vs_1": ratio(hits.get("prefix@2"), hits.get("prefix")),
        "router_hit_tokens_2_ingress_unshared_vs_1": ratio(hits.get("prefix_unshared@2"), hits.get("prefix")),
    }


def merge_results(parts: list[dict]) -> dict:
    """One result from `router_bench serve` runs of the same workload and seeds that measured
    different routers at the same time on one machine, each in its own local Ray cluster
    (benchmarks/device_router_cpu16.sh with PARALLEL=1). Refuses parts whose workloads differ
    or that measured the same router."""
    if len({p["workload"] for p in parts}) != 1:
        raise ValueError(f"parts measured different workloads: {sorted({p['workload'] for p in parts})}")
    rows, skipped = {}, {}
    for part in parts:
        for router, router_rows in part["rows"].items():
            if router in rows:
                raise ValueError(f"router {router!r} is in more than one part")
            rows[router] = router_rows
        skipped.update(part.get("skipped", {}))
    first = parts[0]
    return {**{k: v for k, v in first.items() if k not in ("rows", "skipped", "setup")},
            "setup": [p["setup"] for p in parts],
            "parts": [{"routers": list(p["rows"]), "commit": p.get("commit"),
                       "load_average_1_5_15_before": p.get("load_average_1_5_15_before"),
                       "load_average_1_5_15_after": p.get("load_average_1_5_15_after")} for p in parts],
            "concurrent": "the parts ran at the same time, each in its own local Ray cluster",
            **router_metrics(rows), "skipped": skipped, "rows": rows}
