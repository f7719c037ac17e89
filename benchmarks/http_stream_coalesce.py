"""The HTTP streaming path alone, without a model: Ray Serve's proxy, the OpenAI ingress and an
LLMServer replica whose engine is a fake that steps on a timer (one token per running request
per step, posted from a thread as AsyncLLMEngine posts them). Many concurrent streamed
/v1/completions; per run: output tok/s, SSE events and HTTP chunks the client received (the
proxy sends one HTTP chunk per ASGI body message), and the CPU seconds each Serve process
spent per 1,000 tokens. Shows how far the serving path, not the engine, caps streaming.

    python benchmarks/http_stream_coalesce.py --streams 128 --tokens 64 --step-ms 10 [--stream-interval 1]
        [--prompt-len 512] [--ingress-replicas 2] [--json OUT.json]

Each run also gives how long a stream took from the client's send to the engine
(`send_to_engine_*`: the fake engine notes each arrival in a file) and when the last of a
burst arrived: the serving path's cost of taking a burst in.

Starts its own local Ray (`--num-cpus`, default all), on loopback; stops it at the end.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import threading
import time

STEP_S = 0.01
ARRIVALS_PATH = os.environ.get("HS_ARRIVALS_PATH", "")  # set by main(); read in the replica


class TimerEngine:
    """An engine client (deploy/engine_client.EngineClient) that produces one token per running
    request every `step_s`, at most `max_num_seqs` requests at once, from its own thread."""

    def __init__(self, step_s: float, max_num_seqs: int) -> None:
        from hybrid_serve.engine.async_engine import ModelInfo

        self.step_s, self.max_num_seqs = step_s, max_num_seqs
        self.info = ModelInfo("fake", 1 << 20, 1 << 16)
        self.lock = threading.Lock()
        self.groups: dict[str, list] = {}  # id -> [loop, queue, produced, max_tokens, prompt_len]
        self.waiting: list[str] = []
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        from hybrid_serve.engine.async_engine import RequestDelta, SeqDelta

        while True:
            time.sleep(self.step_s)
            with self.lock:
                running = [rid for rid in self.groups if rid not in self.waiting][: self.max_num_seqs]
                while len(running) < self.max_num_seqs and self.waiting:
                    running.append(self.waiting.pop(0))
                for rid in running:
                    g = self.groups[rid]
                    g[2] += 1
                    done = g[2] >= g[3]
                    seq = SeqDelta(0, [100 + g[2] % 1000], f" t{g[2]}", None, "length" if done else None)
                    g[0].call_soon_threadsafe(g[1].put_nowait, RequestDelta(rid, [seq], g[4], 0, done))
                    if done:
                        del self.groups[rid]

    def model_info(self):
        return self.info

    async def generate(self, prompt_token_ids, params, request_id, validated=False):
        if ARRIVALS_PATH:  # the stream's index (its prompt's first id - 10) and when it got here
            with open(ARRIVALS_PATH, "a") as f:
                f.write(f"{prompt_token_ids[0] - 10} {time.time()}\n")
        queue: asyncio.Queue = asyncio.Queue()
        with self.lock:
            self.groups[request_id] = [asyncio.get_running_loop(), queue, 0, params.max_tokens, len(prompt_token_ids)]
            self.waiting.append(request_id)
        while True:  # as AsyncLLMEngine.generate: a consumer behind gets the queued deltas merged
            item = await queue.get()
            while not queue.empty():
                item = item.merge(queue.get_nowait())
            yield item
            if item.finished:
                return

    async def abort(self, request_id):
        with self.lock:
            self.groups.pop(request_id, None)

    def load(self):
        from hybrid_serve.engine.admission import LoadView

        with self.lock:
            n = len(self.groups)
        return LoadView(num_running=min(n, self.max_num_seqs), num_waiting=max(0, n - self.max_num_seqs),
                        num_waiting_tokens=0, num_free_req_rows=max(0, self.max_num_seqs - n),
                        num_free_state_slots=1 << 16, num_free_kv_pages=1 << 16, max_num_seqs=self.max_num_seqs)

    def take_cache_events(self):
        return []

    def check_health(self):
        pass

    def shutdown(self):
        pass


def fake_engine_factory(config, replica):
    return TimerEngine(STEP_S, config.engine_config(weights=False).max_num_seqs)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_pids() -> dict[str, list[int]]:
    """The processes of Serve's proxy, the ingress replicas and the engine replicas."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    pids: dict[str, list[int]] = {}
    for line in out.splitlines()[1:]:
        pid, _, args = line.strip().partition(" ")
        for key, pattern in (("proxy", "ProxyActor"), ("ingress", "OpenAIIngress"), ("replica", "LLMServer")):
            if pattern in args:
                pids.setdefault(key, []).append(int(pid))
    return pids


def _cpu_s(pid: int) -> float:
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _idle_s() -> float:
    """Idle CPU seconds of the whole machine so far (all cores)."""
    fields = open("/proc/stat").readline().split()
    return (int(fields[4]) + int(fields[5])) / os.sysconf("SC_CLK_TCK")


async def one_stream(session, url: str, prompt: list[int], tokens: int) -> dict:
    body = {"model": "demo", "prompt": prompt, "max_tokens": tokens, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    rec = {"sent_at": time.time(), "index": prompt[0] - 10,  # the fake engine's arrival file names it so
           "events": 0, "http_chunks": 0, "tokens": 0, "ttft_s": None, "done": False, "error": None}
    buf = b""
    async with session.post(url, json=body) as resp:
        if resp.status != 200:
            rec["error"] = f"HTTP {resp.status}"
            return rec
        async for data, end_of_chunk in resp.content.iter_chunks():
            rec["http_chunks"] += bool(end_of_chunk)
            buf += data
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                payload = event.decode()[len("data: "):]
                rec["events"] += 1
                if payload == "[DONE]":
                    rec["done"] = True
                    continue
                obj = json.loads(payload)
                if obj.get("choices") and rec["ttft_s"] is None:
                    rec["ttft_s"] = time.perf_counter() - start
                if obj.get("usage"):
                    rec["tokens"] = obj["usage"]["completion_tokens"]
    return rec


async def run_load(base: str, streams: int, tokens: int, prompt_len: int = 3) -> dict:
    import aiohttp

    if ARRIVALS_PATH and os.path.exists(ARRIVALS_PATH):
        os.remove(ARRIVALS_PATH)

    conn = aiohttp.TCPConnector(limit=streams + 4)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as session:
        start = time.perf_counter()
        recs = await asyncio.gather(*(one_stream(session, f"{base}/v1/completions",
                                                 [10 + i] + [11] * (prompt_len - 1), tokens)
                                       for i in range(streams)))
        wall = time.perf_counter() - start
    ok = [r for r in recs if r["error"] is None and r["done"] and r["tokens"] == tokens]
    out_tokens = sum(r["tokens"] for r in ok)
    ttfts = sorted(r["ttft_s"] for r in ok if r["ttft_s"] is not None)
    return {"streams": streams, "ok": len(ok), "wall_s": round(wall, 3), "output_tokens": out_tokens,
            "output_tok_s": round(out_tokens / wall, 1),
            "events_per_stream": round(sum(r["events"] for r in ok) / max(1, len(ok)), 2),
            "http_chunks_per_stream": round(sum(r["http_chunks"] for r in ok) / max(1, len(ok)), 2),
            "ttft_median_ms": round(1e3 * ttfts[len(ttfts) // 2], 1) if ttfts else None,
            **_arrival_stats(recs)}


def _arrival_stats(recs: list[dict]) -> dict:
    """From the client's send to the engine's generate(), per stream (the fake engine writes
    when each stream reached it): median, p99, and the last arrival after the first send."""
    if not ARRIVALS_PATH or not os.path.exists(ARRIVALS_PATH):
        return {}
    arrived = {}
    for line in open(ARRIVALS_PATH):
        index, at = line.split()
        arrived[int(index)] = float(at)
    lat = sorted(arrived[r["index"]] - r["sent_at"] for r in recs if r["index"] in arrived)
    if not lat:
        return {}
    first_sent = min(r["sent_at"] for r in recs)
    return {"arrived": len(lat), "send_to_engine_median_ms": round(1e3 * lat[len(lat) // 2], 1),
            "send_to_engine_p99_ms": round(1e3 * lat[int(0.99 * (len(lat) - 1))], 1),
            "last_arrival_after_first_send_ms": round(1e3 * (max(arrived.values()) - first_sent), 1)}


def main() -> int:
    global STEP_S
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=128)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--step-ms", type=float, default=10.0, help="the fake engine's step time")
    p.add_argument("--max-num-seqs", type=int, default=None, help="default: --streams")
    p.add_argument("--stream-interval", type=int, default=None, help="the app's stream_interval (default: unset)")
    p.add_argument("--stream-max-messages-per-s", type=float, default=None,
                   help="the app's stream_max_messages_per_s (default: unset; 0: a message per token)")
    p.add_argument("--ingress-replicas", type=int, default=1, help="the app's ingress_replicas")
    p.add_argument("--delta-channels", action=argparse.BooleanOptionalAction, default=True,
                   help="the app's delta_channels (tokens by one connection per ingress and replica)")
    p.add_argument("--prompt-len", type=int, default=3, help="token ids in each prompt")
    p.add_argument("--repeat", type=int, default=2, help="runs after one warm-up stream")
    p.add_argument("--num-cpus", type=int, default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    STEP_S = args.step_ms / 1e3

    import ray
    from ray import serve

    from hybrid_serve.deploy.app import build_app

    seqs = args.max_num_seqs or args.streams
    app_args = {"max_waiting_requests": args.streams, "max_waiting_tokens": 1 << 24, "num_cpus_per_replica": 0,
                "engine_args": {"max_num_seqs": seqs}, "ingress_replicas": args.ingress_replicas,
                "delta_channels": args.delta_channels}
    if args.stream_interval is not None:
        app_args["stream_interval"] = args.stream_interval
    if args.stream_max_messages_per_s is not None:
        app_args["stream_max_messages_per_s"] = args.stream_max_messages_per_s
    global ARRIVALS_PATH
    ARRIVALS_PATH = f"/tmp/hs_arrivals_{os.getpid()}.txt"
    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"HS_ARRIVALS_PATH": ARRIVALS_PATH}})
    try:
        port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(app_args, engine_factory=fake_engine_factory), name="coalesce", route_prefix="/")
        base = f"http://127.0.0.1:{port}"
        asyncio.run(run_load(base, 1, 8))  # warm-up
        single = asyncio.run(run_load(base, 1, args.tokens))
        pids = _serve_pids()
        runs = []
        for _ in range(args.repeat):
            pids["client"] = [os.getpid()]
            before = {k: sum(map(_cpu_s, v)) for k, v in pids.items()}
            idle0 = _idle_s()
            row = asyncio.run(run_load(base, args.streams, args.tokens, args.prompt_len))
            cpu = {k: sum(map(_cpu_s, v)) - before[k] for k, v in pids.items()}
            cpu["machine_idle"] = _idle_s() - idle0
            row["cpu_s_per_1k_tokens"] = {k: round(1e3 * c / max(1, row["output_tokens"]), 3) for k, c in cpu.items()}
            row["cpu_busy"] = {k: round(c / row["wall_s"], 2) for k, c in cpu.items()}
            runs.append(row)
            print(json.dumps(row), flush=True)
        result = {"step_ms": args.step_ms, "tokens": args.tokens, "max_num_seqs": seqs, "prompt_len": args.prompt_len,
                  "ingress_replicas": args.ingress_replicas, "delta_channels": args.delta_channels,
                  "stream_interval": args.stream_interval,
                  "stream_max_messages_per_s": args.stream_max_messages_per_s, "engine_tok_s": round(min(seqs, args.streams) / STEP_S),
                  "single_stream": single, "runs": runs}
        print(json.dumps({"single_stream": single}), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
