"""What every scenario of benchmarks/reliability.py shares: a local Ray + Serve app of the demo
model on loopback (`LocalApp`: its replicas, processes, /metrics and engine state), an aiohttp
client that records each request's status, stream and timings (`call`), small helpers and the
results' JSON."""
from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import sys
import time
import urllib.request

from hybrid_serve.benchmarks.provenance import cpu_device


HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
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
    out = {"scenario": scenario, "date": time.strftime("%Y-%m-%d"), "commit": commit,
           "device": cpu_device(),
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
                "kv_prefix_cached": pick("hybrid_serve_kv_cache_prefix_cached_ratio"),
                "state_prefix_cached": pick("hybrid_serve_state_pool_prefix_cached_ratio"),
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

