"""Reliability of the served app on the CPU demo (issue 15's acceptance): overload, client
disconnects, replica failure, bad input. Each scenario starts its own local Ray + Serve app
on loopback (the built-in demo model), drives it over HTTP, prints a short table and writes
`benchmarks/results/reliability_<scenario>.json`.

    python benchmarks/reliability.py burst        [--replicas 1] [--duration 60] [--multiplier 10] [--bursts 2]
    python benchmarks/reliability.py disconnects  [--clients 100]
    python benchmarks/reliability.py kill         [--kills 5] [--clients 10] [--nonstream-clients 2]
    python benchmarks/reliability.py fuzz         [--cases 1000] [--prompt-cases 500]
    python benchmarks/reliability.py all

burst        capacity first (closed loop, small concurrency), then `bursts` x open-loop Poisson
             arrivals at `multiplier` x that rate for `duration` s (streaming and non-streaming
             mixed, greedy, short seeded prompts, 16 tokens), 30 s apart: every answer 200 or
             503/429 with a Retry-After; accepted greedy outputs == the same request sent alone
             afterwards; TTFT of the accepted (client-side, and the replicas' histogram) vs the
             bound the configured queues imply; the front end's own delay (GET /v1/models from
             another process); RSS of the Serve processes before, right after and 30 s after.
disconnects  `clients` streaming requests that hang up after 1-3 chunks, twice, after the same
             prompts ran to completion: afterwards nothing running or waiting, no pool
             invariant violation, and no page or slot held per aborted request (what stays in
             use is the prefix tree's).
kill         a 2-replica app under looping streaming (and a few non-streaming) clients;
             SIGKILL one LLMServer replica's worker process `kills` times, waiting for Serve
             to have 2 replicas serving again between kills: HTTP statuses, streams ended by
             an SSE error event + [DONE], retries before the first token, recovery times,
             aborted / failed sequences on the surviving replica.
fuzz         schemathesis over the app's own /openapi.json (`cases` cases, positive and
             negative) and hypothesis over prompts (unicode edge cases, lone surrogates sent
             as JSON escapes, stop strings, token-id lists with out-of-vocabulary ids):
             statuses counted, no 5xx (nor an in-band server_error), healthy afterwards.

Figures depend on the machine and on what else runs on it (2 shared cores here): the JSON
records the load average at the start.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections import Counter

from hybrid_serve.benchmarks.provenance import git_commit

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
DATE = "2026-11-26"
DEVICE = "CPU (2 cores)"
API_KEY = "reliability-key"
APP_NAME = "hybrid-serve"
WORDS = ["the", "a", "of", "to", "and", "in", "is", "it", "you", "that", "he", "was", "for", "on", "are", "with", "as", "his", "they", "be", "at", "one", "have", "this", "from", "or", "had", "by", "hot", "word", "but", "what", "some", "we", "can", "out", "other", "were", "all", "there", "when", "up", "use", "your", "how", "said", "an", "each", "she", "which", "do", "their", "time", "if", "will", "way", "about", "many", "then", "them", "write", "would", "like", "so", "these", "her", "long", "make", "thing", "see", "him", "two", "has", "look", "more", "day", "could", "go", "come", "did", "number", "sound", "no", "most", "people", "my", "over", "know", "water", "than", "call", "first", "who", "may", "down", "side", "been", "now", "find", "river", "garden", "stone", "light", "engine", "cloud"]


# ----- small helpers ------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1e3, 1)


def prompt_pool(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    pool: list[str] = []
    while len(pool) < n:
        p = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))
        if p not in pool:
            pool.append(p)
    return pool


def write_json(scenario: str, payload: dict, commit: str) -> str:
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"reliability_{scenario}.json")
    out = {"scenario": scenario, "date": DATE, "commit": commit, "device": DEVICE,
           "command": "python benchmarks/reliability.py " + " ".join(sys.argv[1:]), **payload}
    with open(path, "w") as f:
        json.dump(out, f, indent=1, sort_keys=False)
        f.write("\n")
    return path


def table(rows: list[tuple[str, object]], title: str) -> None:
    print(f"\n== {title}")
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")


# ----- the app -------------------------------------------------------------------------------
class LocalApp:
    """A local Ray (its own, never a cluster already running here) with the dashboard (the
    state API), Serve on 127.0.0.1:<free port>, the demo app built from `app_args`."""

    def __init__(self, app_args: dict, num_cpus: int = 2) -> None:
        self.app_args = {"api_key": API_KEY, "metrics_push_interval_s": 0.5, **app_args}
        self.num_cpus = num_cpus
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.headers = {"Authorization": f"Bearer {API_KEY}"}

    def __enter__(self):
        import ray
        from hybrid_serve.deploy.app import build_app
        from hybrid_serve.deploy.config import AppConfig
        from ray import serve

        ctx = ray.init(address="local", num_cpus=self.num_cpus, include_dashboard=True,
                       dashboard_port=free_port(), log_to_driver=False)
        self.dashboard = "http://" + ctx.dashboard_url
        self.session_dir = ray._private.worker._global_node.get_session_dir_path()
        serve.start(http_options={"host": "127.0.0.1", "port": self.port})
        t = time.monotonic()
        serve.run(build_app(self.app_args), name=APP_NAME, route_prefix="/")
        self.wait_health()
        self.startup_s = time.monotonic() - t
        self.bounds = AppConfig.from_args(self.app_args).queue_bounds()
        return self

    def __exit__(self, *exc) -> None:
        import ray
        from ray import serve

        try:
            serve.shutdown()
        finally:
            ray.shutdown()

    def wait_health(self, timeout_s: float = 180.0) -> float:
        t = time.monotonic()
        while time.monotonic() - t < timeout_s:
            try:
                with urllib.request.urlopen(f"{self.base}/health", timeout=5) as r:
                    if r.status == 200:
                        return time.monotonic() - t
            except OSError:
                pass
            time.sleep(0.25)
        raise TimeoutError("/health did not answer 200")

    def config_record(self) -> dict:
        return {"app_args": {k: v for k, v in self.app_args.items() if k != "api_key"},
                "resolved_queue_bounds": self.bounds, "ray_num_cpus": self.num_cpus}

    # ----- replicas -----
    def replicas(self) -> list[dict]:
        """ALIVE LLMServer replica actors: replica id (the metrics' `replica` label), worker pid."""
        try:
            from ray.util.state import list_actors

            actors = [{"name": a.name, "pid": a.pid, "class_name": a.class_name}
                      for a in list_actors(address=self.dashboard, filters=[("state", "=", "ALIVE")], limit=10000)]
        except Exception:  # noqa: BLE001 - the state API is unavailable: read the GCS actor table
            import ray

            actors = [{"name": a.get("Name"), "pid": a.get("Pid"), "class_name": a.get("ActorClassName")}
                      for a in ray._private.state.actors().values() if a.get("State") == "ALIVE"]
        out = []
        for a in actors:
            if (a["class_name"] or "") == f"ServeReplica:{APP_NAME}:LLMServer":
                out.append({"replica": (a["name"] or "").rsplit("#", 1)[-1], "pid": a["pid"]})
        return sorted(out, key=lambda r: r["replica"])

    def serve_processes(self) -> dict[str, int]:
        """pid of every Serve replica actor of this app plus the proxy, by a short label."""
        from ray.util.state import list_actors

        out = {}
        for a in list_actors(address=self.dashboard, filters=[("state", "=", "ALIVE")], limit=10000):
            cls = a.class_name or ""
            if cls.startswith(f"ServeReplica:{APP_NAME}:"):
                out[f"{cls.rsplit(':', 1)[-1]}#{(a.name or '').rsplit('#', 1)[-1]}"] = a.pid
            elif cls == "ProxyActor":
                out["ProxyActor"] = a.pid
        return out

    def rss_mib(self) -> dict[str, float]:
        import psutil

        out = {}
        for label, pid in sorted(self.serve_processes().items()):
            try:
                out[label] = round(psutil.Process(pid).memory_info().rss / 2**20, 1)
            except psutil.Error:
                pass
        return out

    def running_llm_replicas(self) -> int:
        from ray import serve

        try:
            app = serve.status().applications[APP_NAME]
            return app.deployments["LLMServer"].replica_states.get("RUNNING", 0)
        except Exception:  # noqa: BLE001
            return 0

    # ----- metrics -----
    def metrics(self) -> list[tuple[str, dict, float]]:
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(f"{self.base}/metrics", timeout=30) as r:
            text = r.read().decode()
        return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]

    @staticmethod
    def by_replica(samples, name: str, **labels) -> dict[str, float]:
        out: dict[str, float] = {}
        for n, lab, v in samples:
            if n == name and all(lab.get(k) == val for k, val in labels.items()):
                out[lab.get("replica", "")] = out.get(lab.get("replica", ""), 0.0) + v
        return out

    def engine_state(self, only: set[str] | None = None) -> dict:
        s = self.metrics()
        pick = lambda name, **kw: {r: v for r, v in self.by_replica(s, name, **kw).items()
                                   if only is None or r in only}
        return {"running": pick("hybrid_serve_requests_running"), "waiting": pick("hybrid_serve_requests_waiting"),
                "kv_usage": pick("hybrid_serve_kv_cache_usage_ratio"),
                "state_usage": pick("hybrid_serve_state_pool_usage_ratio"),
                "invariant_violations": pick("hybrid_serve_pool_invariant_violations_total"),
                "aborted": pick("hybrid_serve_request_success_total", finish_reason="abort"),
                "errored": pick("hybrid_serve_request_success_total", finish_reason="error"),
                "finished_length": pick("hybrid_serve_request_success_total", finish_reason="length")}

    def wait_idle(self, timeout_s: float = 60.0, only: set[str] | None = None) -> tuple[float, dict]:
        """Until every (current) replica reports 0 running and 0 waiting for 2 pushes in a row."""
        t, calm = time.monotonic(), 0
        state = {}
        while time.monotonic() - t < timeout_s:
            state = self.engine_state(only)
            live = only or {r["replica"] for r in self.replicas()}
            running = sum(v for r, v in state["running"].items() if r in live)
            waiting = sum(v for r, v in state["waiting"].items() if r in live)
            calm = calm + 1 if running == 0 and waiting == 0 and live <= set(state["running"]) else 0
            if calm >= 3:
                return time.monotonic() - t, state
            time.sleep(0.5)
        return float("inf"), state


# ----- HTTP clients (aiohttp) -------------------------------------------------------------------
def session(limit: int = 0):
    import aiohttp

    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit), timeout=aiohttp.ClientTimeout(total=None))


def completion_body(prompt: str, stream: bool, max_tokens: int = 16) -> dict:
    return {"model": "demo", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": stream}


async def call(http, app: LocalApp, body: dict, timeout_s: float = 300.0, hang_up_after: int | None = None,
               path: str = "/v1/completions") -> dict:
    """One request; what came back. Streaming: text of the chunks, TTFT = first chunk with
    text, the in-band error event if any, whether [DONE] came."""
    stream = bool(body.get("stream"))
    rec = {"stream": stream, "t0": time.monotonic(), "status": None, "retry_after": None, "ttft": None,
           "t_first": None, "t_last": None, "t_end": None, "text": "", "chunks": 0, "done": False, "gaps": [],
           "error_event": None, "finish": None, "exc": None, "hung_up": False, "prompt": body.get("prompt")}

    async def go():
        async with http.post(app.base + path, json=body, headers=app.headers) as resp:
            rec["status"] = resp.status
            rec["retry_after"] = resp.headers.get("Retry-After")
            if resp.status != 200:
                rec["body"] = (await resp.text())[:400]
                return
            if not stream:
                data = await resp.json()
                ch = data["choices"][0]
                rec["text"] = ch.get("text") if "text" in ch else (ch.get("message") or {}).get("content", "")
                rec["finish"] = ch.get("finish_reason")
                rec["t_first"] = rec["t_last"] = time.monotonic()
                return
            async for raw in resp.content:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    rec["done"] = True
                    break
                obj = json.loads(payload)
                if "error" in obj:
                    rec["error_event"] = obj["error"]
                    rec["t_error"] = time.monotonic()
                    continue
                ch = (obj.get("choices") or [{}])[0]
                text = ch.get("text") if "text" in ch else ((ch.get("delta") or {}).get("content") or "")
                now = time.monotonic()
                if text and rec["t_first"] is None:
                    rec["t_first"] = now
                elif text:
                    rec["gaps"].append(now - rec["t_last"])  # one engine step (and the way back)
                if text:
                    rec["t_last"] = now
                rec["text"] += text or ""
                rec["chunks"] += 1
                rec["finish"] = ch.get("finish_reason") or rec["finish"]
                if hang_up_after is not None and rec["chunks"] >= hang_up_after:
                    rec["hung_up"] = True
                    resp.close()  # drop the connection mid-stream
                    return

    try:
        await asyncio.wait_for(go(), timeout_s)
    except asyncio.TimeoutError:
        rec["exc"] = f"timeout after {timeout_s} s"
    except Exception as exc:  # noqa: BLE001 - a failed request is a figure, not a crash
        rec["exc"] = f"{type(exc).__name__}: {exc}"[:300]
    rec["t_end"] = time.monotonic()
    if rec["t_first"] is not None:
        rec["ttft"] = rec["t_first"] - rec["t0"]
    return rec


def good_retry_after(rec: dict) -> bool:
    v = rec.get("retry_after")
    return v is not None and v.strip().isdigit() and int(v) >= 1


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


# ----- disconnects ----------------------------------------------------------------------------
def run_disconnects(args) -> dict:
    # a first-token queue of 64 per replica: all `clients` arrive at once and are admitted (with the
    # default, max_num_seqs // 2 = 16, a replica answers 503 to those past 32 + 16 without a first token)
    engine_args = {"max_num_seqs": 32, "max_model_len": 256, "cache_memory_bytes": 64 * 2**20}
    app_args = {"replicas": 2, "num_cpus_per_replica": 0.5, "torch_num_threads": 1, "engine_args": engine_args,
                "max_waiting_requests": 64}
    prompts = prompt_pool(args.clients, args.seed + 10)
    rng = random.Random(args.seed + 11)
    hang_after = [rng.randint(1, 3) for _ in prompts]
    load_at_start = os.getloadavg()
    pages, slots = pool_sizes(engine_args)  # per replica: usage ratios -> counts
    with LocalApp(app_args) as app:
        fresh = app.engine_state()

        async def run(hang: bool):
            async with session() as http:
                return await asyncio.gather(*(call(http, app, completion_body(p, True, args.max_tokens),
                                                   hang_up_after=h if hang else None)
                                              for p, h in zip(prompts, hang_after)))

        def settle() -> dict:
            """Idle, then a step on every replica (the engine checks its pools when a step leaves
            it idle: an abort alone runs no step), idle again; the engines' state."""
            app.wait_idle()
            before = app.engine_state()["finished_length"]
            for _ in range(20):
                asyncio.run(_many(app, [f"settle {i}" for i in range(8)], 2))
                if all(v > before.get(r, 0) for r, v in app.engine_state()["finished_length"].items()):
                    break
            _, state = app.wait_idle()
            return state

        # 0: the same prompts to completion: what the prefix cache keeps of them
        full = asyncio.run(run(False))
        after_full = settle()
        rounds = []
        for _ in range(2):  # 1, 2: every client hangs up after 1-3 chunks (twice: a leak would grow)
            t = time.monotonic()
            hung = asyncio.run(run(True))
            hang_s = time.monotonic() - t
            idle_s, at_idle = app.wait_idle()
            rounds.append({"records": hung, "hang_s": hang_s, "idle_s": idle_s, "at_idle": at_idle,
                           "settled": settle()})
        ok_after = asyncio.run(_one(app, "after the disconnects", 4))
        config = app.config_record()
    if args.dump:
        with open(args.dump, "w") as f:
            f.writelines(json.dumps(r) + "\n" for rnd in rounds for r in rnd["records"])
    sums = lambda d: round(sum(d.values()), 5)
    outcome = lambda r: ("hung_up" if r["hung_up"] else "done" if r["done"] else
                         f"status_{r['status']}" if r["status"] != 200 else "other")
    per_round = [{
        "outcomes": dict(Counter(outcome(r) for r in rnd["records"])),
        "hung_up_after_chunks": dict(Counter(r["chunks"] for r in rnd["records"] if r["hung_up"])),
        "hang_up_phase_s": round(rnd["hang_s"], 1), "seconds_to_idle": round(rnd["idle_s"], 1),
        "running_at_idle": sums(rnd["at_idle"]["running"]), "waiting_at_idle": sums(rnd["at_idle"]["waiting"]),
        "kv_usage": sums(rnd["settled"]["kv_usage"]), "state_usage": sums(rnd["settled"]["state_usage"]),
        "invariant_violations": sums(rnd["settled"]["invariant_violations"]),
        # (a stream can finish before the server sees its client gone: then it ends "length", not "abort")
        "aborted_total": sums(rnd["settled"]["aborted"]),
    } for rnd in rounds]
    last = rounds[-1]["settled"]
    figures = {
        "clients_per_round": len(prompts), "rounds": per_round,
        "completed_in_baseline": sum(r["status"] == 200 and r["done"] for r in full),
        "baseline_outcomes": dict(Counter("done" if r["done"] else str(r["status"]) if r["exc"] is None else "exception"
                                          for r in full)),
        "fresh": {k: sums(v) for k, v in fresh.items()},
        "baseline_completed": {"kv_usage": sums(after_full["kv_usage"]),
                               "state_usage": sums(after_full["state_usage"])},
        "after": last, "invariant_violations": sums(last["invariant_violations"]),
        "request_after_status": ok_after["status"],
        "load_average_at_start": [round(x, 2) for x in load_at_start],
    }
    hung_total = sum(r["hung_up"] for rnd in rounds for r in rnd["records"])
    # in use, summed over both replicas, as counts: the prefix tree's pages and checkpoints
    held = [(round(figures["baseline_completed"]["kv_usage"] * pages), round(figures["baseline_completed"]
                                                                              ["state_usage"] * slots))]
    held += [(round(r["kv_usage"] * pages), round(r["state_usage"] * slots)) for r in per_round]
    for r, (p, sl) in zip(per_round, held[1:]):
        r["kv_pages_in_use"], r["state_slots_in_use"] = p, sl
    figures["pool_size_per_replica"] = {"kv_pages": pages, "state_slots": slots}
    figures["baseline_completed"].update(kv_pages_in_use=held[0][0], state_slots_in_use=held[0][1])
    growth = [(b[0] - a[0], b[1] - a[1]) for a, b in itertools.pairwise(held)]
    figures["in_use_growth_per_round_pages_slots"] = growth
    hung_per_round = [sum(r["hung_up"] for r in rnd["records"]) for rnd in rounds]
    checks = {
        "every_client_hung_up_mid_stream": hung_total == 2 * len(prompts),
        "nothing_running_or_waiting": all(r["running_at_idle"] == 0 and r["waiting_at_idle"] == 0
                                          for r in per_round),
        "no_pool_invariant_violation": figures["invariant_violations"] == 0,
        # a leak holds >= 1 page and 1 slot per aborted request (100 a round); the prefix tree
        # may cache a few new pages / checkpoints (the aborts end at other positions)
        "no_page_or_slot_held_per_aborted_request": all(g[0] < 0.05 * n and g[1] < 0.05 * n
                                                        for g, n in zip(growth, hung_per_round)),
        "serves_after": ok_after["status"] == 200,
    }
    table([("clients hung up", f"{hung_total}/{2 * len(prompts)} in 2 rounds"),
           ("seconds to idle", [r["seconds_to_idle"] for r in per_round]),
           ("running / waiting at idle", [(r["running_at_idle"], r["waiting_at_idle"]) for r in per_round]),
           ("KV pages in use baseline / round 1 / round 2", f"{[h[0] for h in held]} of {2 * pages}"),
           ("state slots in use baseline / round 1 / round 2", f"{[h[1] for h in held]} of {2 * slots}"),
           ("invariant violations", figures["invariant_violations"]),
           ("aborted sequences", per_round[-1]["aborted_total"]), ("checks", checks)], "disconnects")
    workload = (f"demo model, 2 LLMServer replicas x 1 thread, max_num_seqs=32, max_waiting_requests=64; "
                f"{args.clients} distinct seeded "
                f"prompts streamed concurrently (/v1/completions, greedy, ignore_eos, max_tokens={args.max_tokens}) "
                f"to completion first (what the prefix cache keeps of them: the baseline), then the same "
                f"{args.clients} twice more, each client closing its connection after 1-3 chunks (seeded); after "
                f"each phase: idle, then small requests until both replicas ran a step (the idle pool check), idle "
                f"again, usage summed over both replicas from /metrics (ratios x pool sizes = counts)")
    return {"workload": workload, "config": config, "figures": figures, "checks": checks}


def pool_sizes(engine_args: dict) -> tuple[int, int]:
    """KV pages and state slots of one demo engine with these args (built here, offline)."""
    from hybrid_serve import LLM

    cache = LLM(**engine_args).engine.cache
    return cache.pages.num_ids, cache.state_slots.num_ids


async def _many(app: LocalApp, prompts: list[str], max_tokens: int) -> list[dict]:
    async with session() as http:
        return await asyncio.gather(*(call(http, app, completion_body(p, False, max_tokens), timeout_s=120)
                                      for p in prompts))


async def _one(app: LocalApp, prompt: str, max_tokens: int) -> dict:
    async with session() as http:
        return await call(http, app, completion_body(prompt, False, max_tokens), timeout_s=120)


# ----- kill -----------------------------------------------------------------------------------
def grep_logs(folder: str, needle: str) -> int:
    """Lines containing `needle` in `folder` (a file, or the files under a folder: a Ray session's logs)."""
    paths = [folder] if os.path.isfile(folder) else [os.path.join(r, f) for r, _, fs in os.walk(folder) for f in fs]
    n = 0
    for path in paths:
        try:
            with open(path, errors="replace") as fh:
                n += sum(needle in line for line in fh)
        except OSError:
            pass
    return n


def run_kill(args) -> dict:
    # small batches and a deeper first-token queue, so that each replica has requests without a
    # token yet when it is killed (the retry path) and the survivor can take them all without a 503
    engine_args = {"max_num_seqs": args.kill_max_num_seqs, "max_model_len": 256, "cache_memory_bytes": 64 * 2**20}
    app_args = {"replicas": 2, "num_cpus_per_replica": 0.5, "torch_num_threads": 1, "engine_args": engine_args,
                "max_waiting_requests": args.kill_max_waiting}
    prompts = prompt_pool(200, args.seed + 20)
    load_at_start = os.getloadavg()
    with LocalApp(app_args) as app:
        result = asyncio.run(_kill_loop(app, prompts, args))
        logs = os.path.join(app.session_dir, "logs")
        retries_logged = grep_logs(logs, "replica failed before its first token; retrying")
        # our processes' logs (Serve's controller logs a traceback when a dead replica's routing
        # stats cannot be read: Serve's own, expected after a kill, counted apart)
        tracebacks = sum(grep_logs(os.path.join(logs, "serve", f), "Traceback (most recent call last)")
                         for f in os.listdir(os.path.join(logs, "serve")) if f.startswith("replica_"))
        controller_tracebacks = sum(grep_logs(os.path.join(logs, "serve", f), "Traceback (most recent call last)")
                                    for f in os.listdir(os.path.join(logs, "serve")) if f.startswith("controller"))
        for k in result["kills"]:  # Serve's router logs this once per call that failed on the dead replica
            k["calls_lost_with_killed_replica"] = grep_logs(
                os.path.join(logs, "serve"),
                f"Replica(id='{k['killed_replica']}', deployment='LLMServer', app='{APP_NAME}') will not be "
                f"considered for future requests because it has died")  # (logs/serve/: each line once)
        after = app.engine_state()
        config = app.config_record()
    recs, kills, health = result["records"], result["kills"], result["health"]
    if args.dump:
        with open(args.dump, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in recs)
    cls = Counter(r["class"] for r in recs)
    statuses = Counter(str(r["status"]) if r["exc"] is None else "exception" for r in recs)
    in_flight = [r for r in recs if r["at_kill"] is not None]
    # had no token at the kill and succeeded anyway (either replica: the killed one's were retried)
    no_token_ok = [r for r in in_flight if r["token_before_kill"] is False and r["class"] == "ok"]
    figures = {
        "kills": len(kills), "requests": len(recs), "by_class": dict(cls), "by_status": dict(statuses),
        "http_500": statuses.get("500", 0),
        "in_flight_at_a_kill": len(in_flight),
        "in_flight_with_token_at_kill": sum(r["token_before_kill"] is True for r in in_flight),
        "in_flight_without_token_at_kill_succeeded": len(no_token_ok),
        "in_flight_without_token_at_kill_failed": sum(r["token_before_kill"] is False and r["class"] != "ok"
                                                      for r in in_flight),
        "retries_logged_by_ingress": retries_logged,
        "streams_ended_error_event_then_done": cls.get("stream_error_done", 0),
        "nonstream_503_with_retry_after": cls.get("503_retry_after", 0),
        "error_event_codes": dict(Counter((r["error_event"] or {}).get("code") for r in recs if r["error_event"])),
        "per_kill": kills,
        "recovery_s": {"serve_2_running_max": max((k["serve_running_s"] for k in kills), default=None),
                       "new_replica_serving_max": max((k["new_replica_serving_s"] for k in kills), default=None)},
        "health_non_200": health,
        "ttft_ms_overall": {"p50": ms(pct([r["ttft"] for r in recs if r["ttft"]], 0.5)),
                            "p99": ms(pct([r["ttft"] for r in recs if r["ttft"]], 0.99)),
                            "max": ms(max([r["ttft"] for r in recs if r["ttft"]], default=None))},
        "tracebacks_in_replica_logs": tracebacks, "tracebacks_in_serve_controller_log": controller_tracebacks,
        "engine_after": after,
        "load_average_at_start": [round(x, 2) for x in load_at_start],
    }
    failed_other = [k for k in kills if k["survivor_failed_or_aborted"] > 0]
    checks = {
        "no_http_500": statuses.get("500", 0) == 0,
        "no_unexpected_outcome": all(c in ("ok", "stream_error_done", "503_retry_after") for c in cls),
        "requests_without_token_succeeded": figures["in_flight_without_token_at_kill_failed"] == 0,
        "started_streams_ended_with_error_event_and_done": cls.get("stream_broken", 0) == 0,
        "replica_serves_again_within_60s": all(k["new_replica_serving_s"] is not None and
                                               k["new_replica_serving_s"] <= 60 for k in kills),
        "surviving_replica_requests_all_succeeded": not failed_other and all(
            k["failed_requests"] <= k["calls_lost_with_killed_replica"] for k in kills),
    }
    table([("kills", len(kills)), ("requests", len(recs)), ("by class", dict(cls)), ("by status", dict(statuses)),
           ("no token at kill -> ok", f"{len(no_token_ok)} (retries logged: {retries_logged})"),
           ("recovery (2 RUNNING / new serving)", [(k["serve_running_s"], k["new_replica_serving_s"]) for k in kills]),
           ("per kill: failed / calls lost with the killed replica",
            [(k["failed_requests"], k["calls_lost_with_killed_replica"]) for k in kills]),
           ("health non-200", health), ("checks", checks)], "kill")
    workload = (f"demo model, 2 LLMServer replicas x 1 thread (max_num_seqs={args.kill_max_num_seqs}, "
                f"max_waiting_requests={args.kill_max_waiting}); {args.clients} streaming and "
                f"{args.nonstream_clients} non-streaming clients looping /v1/completions (greedy, ignore_eos, "
                f"max_tokens={args.max_tokens}); {args.kills} SIGKILLs of one LLMServer replica's worker pid (alternating), "
                f"each once Serve reports 2 RUNNING replicas and the new one has taken requests, plus "
                f"{args.settle} s; /health polled every 0.5 s")
    return {"workload": workload, "config": config, "figures": figures, "checks": checks}


def _classify_kill(rec: dict) -> str:
    if rec["exc"] is not None:
        return "client_error"
    if rec["status"] == 200:
        if not rec["stream"]:
            return "ok"
        if rec["done"] and rec["error_event"] is None and rec["finish"] is not None:
            return "ok"
        if rec["done"] and rec["error_event"] is not None:
            return "stream_error_done"
        return "stream_broken"
    if rec["status"] == 503:
        return "503_retry_after" if good_retry_after(rec) else "503_no_retry_after"
    return f"http_{rec['status']}"


async def _kill_loop(app: LocalApp, prompts: list[str], args) -> dict:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    records: list[dict] = []
    kill_times: list[float] = []
    health: list[dict] = []

    async def client(i: int, http):
        rng = random.Random(args.seed + 100 + i)
        stream = i >= args.nonstream_clients  # clients 0..nonstream_clients-1 are non-streaming
        while not stop.is_set():
            body = completion_body(rng.choice(prompts), stream, args.max_tokens)
            rec = await call(http, app, body, timeout_s=180)
            rec["at_kill"] = None
            rec["token_before_kill"] = None
            for tk in kill_times:
                if rec["t0"] < tk < rec["t_end"]:
                    rec["at_kill"] = tk
                    if stream:  # (a non-streaming client cannot tell)
                        rec["token_before_kill"] = rec["t_first"] is not None and rec["t_first"] < tk
            rec["class"] = _classify_kill(rec)
            records.append(rec)
            if rec["status"] == 503:  # as a client should: wait as long as Retry-After says (at most 5 s here)
                await asyncio.sleep(min(5, int(rec["retry_after"]) if good_retry_after(rec) else 1))
            elif rec["error_event"] is not None:
                await asyncio.sleep(1)

    async def poll_health(http):
        while not stop.is_set():
            t = time.monotonic()
            try:
                async with http.get(app.base + "/health") as resp:
                    status = resp.status
            except Exception as exc:  # noqa: BLE001
                status = type(exc).__name__
            if status != 200:
                health.append({"t_since_last_kill": round(t - kill_times[-1], 1) if kill_times else None,
                               "status": status})
            await asyncio.sleep(0.5)

    kills: list[dict] = []
    async with session() as http:
        tasks = [asyncio.create_task(client(i, http)) for i in range(args.clients + args.nonstream_clients)]
        tasks.append(asyncio.create_task(poll_health(http)))
        await asyncio.sleep(args.settle)
        for k in range(args.kills):
            reps = await loop.run_in_executor(None, app.replicas)
            if len(reps) < 2:
                raise RuntimeError(f"expected 2 LLMServer replicas, found {reps}")
            victim, survivor = reps[k % 2], reps[1 - k % 2]
            state = await loop.run_in_executor(None, app.engine_state)
            before_surv = (state["aborted"].get(survivor["replica"], 0) + state["errored"].get(survivor["replica"], 0))
            n_before = len(records)
            t_kill = time.monotonic()
            os.kill(victim["pid"], signal.SIGKILL)
            kill_times.append(t_kill)
            print(f"kill {k + 1}: replica {victim['replica']} pid {victim['pid']} "
                  f"(running {state['running'].get(victim['replica'])})", flush=True)
            running_s = serving_s = None
            new_id = None
            while time.monotonic() - t_kill < 120:
                await asyncio.sleep(0.5)
                now = time.monotonic() - t_kill
                if running_s is None:
                    reps_now = await loop.run_in_executor(None, app.replicas)
                    ids = {r["replica"] for r in reps_now}
                    n_running = await loop.run_in_executor(None, app.running_llm_replicas)
                    if len(ids - {victim["replica"]}) == 2 and n_running == 2:
                        running_s = round(now, 1)
                        new_id = next(iter(ids - {victim["replica"], survivor["replica"]}))
                if new_id is not None:
                    s = await loop.run_in_executor(None, app.metrics)
                    routed = app.by_replica(s, "hybrid_serve_router_decisions_total").get(new_id, 0)
                    if routed > 0:
                        serving_s = round(time.monotonic() - t_kill, 1)
                        break
            await asyncio.sleep(args.settle)
            state2 = await loop.run_in_executor(None, app.engine_state)
            after_surv = (state2["aborted"].get(survivor["replica"], 0) + state2["errored"].get(survivor["replica"], 0))
            window = [r for r in records[n_before:] if r["at_kill"] == t_kill]
            kills.append({
                "killed_replica": victim["replica"], "killed_pid": victim["pid"],
                "killed_replica_running_metric": int(state["running"].get(victim["replica"], 0)),
                "in_flight_at_kill": len(window),
                "failed_requests": sum(r["class"] != "ok" for r in window),
                "outcomes": dict(Counter(r["class"] for r in window)),
                "survivor_failed_or_aborted": int(after_surv - before_surv),
                "serve_running_s": running_s, "new_replica_serving_s": serving_s, "new_replica": new_id,
            })
            print(f"  -> {kills[-1]}", flush=True)
        stop.set()
        await asyncio.gather(*tasks)
    return {"records": records, "kills": kills, "health": health}


# ----- fuzz -----------------------------------------------------------------------------------
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


# ----- main -----------------------------------------------------------------------------------
SCENARIOS = {"burst": run_burst, "disconnects": run_disconnects, "kill": run_kill, "fuzz": run_fuzz}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", choices=[*SCENARIOS, "all"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--no-json", action="store_true", help="print only; do not write benchmarks/results/")
    p.add_argument("--dump", default=None, help="kill: every request's record, as JSON lines, to this file")
    g = p.add_argument_group("burst")
    g.add_argument("--replicas", type=int, default=1)
    g.add_argument("--threads", type=int, default=1, help="torch_num_threads per replica")
    g.add_argument("--max-num-seqs", type=int, default=16)
    g.add_argument("--max-waiting-requests", type=int, default=None, help="default: the app's")
    g.add_argument("--max-queued-requests", type=int, default=None, help="default: the app's")
    g.add_argument("--pool", type=int, default=300, help="distinct prompts the requests draw from")
    g.add_argument("--capacity-concurrency", type=int, default=4)
    g.add_argument("--capacity-seconds", type=float, default=20.0)
    g.add_argument("--multiplier", type=float, default=10.0)
    g.add_argument("--duration", type=float, default=60.0)
    g.add_argument("--identity-sample", type=int, default=100)
    g.add_argument("--bursts", type=int, default=2, help="bursts in a row (memory: does a second one grow it?)")
    g.add_argument("--rss-tolerance-mib", type=float, default=64.0)
    g = p.add_argument_group("disconnects")
    g.add_argument("--clients", type=int, default=None, help="disconnects: 100; kill: 10 (streaming)")
    g = p.add_argument_group("kill")
    g.add_argument("--kills", type=int, default=5)
    g.add_argument("--nonstream-clients", type=int, default=2, help="more clients, non-streaming")
    g.add_argument("--kill-max-num-seqs", type=int, default=4)
    g.add_argument("--kill-max-waiting", type=int, default=12, help="max_waiting_requests of the kill app")
    g.add_argument("--settle", type=float, default=5.0, help="seconds of steady load before each kill / after recovery")
    g = p.add_argument_group("fuzz")
    g.add_argument("--cases", type=int, default=1000)
    g.add_argument("--prompt-cases", type=int, default=500)
    args = p.parse_args()
    failed = False
    for name in (SCENARIOS if args.scenario == "all" else [args.scenario]):
        a = argparse.Namespace(**vars(args))
        if a.clients is None:
            a.clients = 100 if name == "disconnects" else 10
        if name == "kill" and args.max_tokens == 16 and "--max-tokens" not in sys.argv:
            a.max_tokens = 48  # streams long enough to be cut mid-way
        commit = git_commit()  # the tree the scenario runs on (as it starts)
        out = SCENARIOS[name](a)
        failed |= not all(out["checks"].values())
        if not args.no_json:
            print("wrote", write_json(name, out, commit))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
