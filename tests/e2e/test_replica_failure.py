"""A replica's process killed under streaming load (issue 15): no HTTP 500, every stream ends
with [DONE] (an SSE error event before it is allowed), a new request right after the kill
succeeds, and Serve has the replica serving again within 60 s. And a replica whose engine
stops while its process lives: it answers `engine_dead`, which the ingress retries elsewhere,
and leaves within seconds (not after Serve's 3 failed health checks, 30 s).

The app runs in a child process with its own local Ray (this file run as a script), so it
neither shares nor disturbs the session's `served` app; the child answers one-line commands
on stdin (`replicas`: the LLMServer replicas and their worker pids; `running`: Serve's count
of RUNNING ones; `quit`). `benchmarks/reliability.py kill` is the longer measurement.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

API_KEY = "replica-failure-key"
APP = "replica-failure"
TAG = "@@ "  # the child's protocol lines (Ray may print other things on stdout)


# ----- the child: a 2-replica app on its own local Ray --------------------------------------
def _engine_stopped_by(marker: str):
    """An engine factory: the real engine client of each replica, and a watcher thread; the
    first replica to take `marker` (a file the test creates) shuts its engine down, its process
    left running (later `generate` calls and health checks raise EngineDeadError)."""
    def factory(config, replica):
        from hybrid_serve.deploy.engine_client import make_engine_client

        client = make_engine_client(config, replica)

        def watch() -> None:
            while True:
                time.sleep(0.1)
                try:
                    os.remove(marker)  # only one replica gets it
                except FileNotFoundError:
                    continue
                client.shutdown()
                return

        threading.Thread(target=watch, daemon=True).start()
        return client

    return factory


def _child(marker: str | None) -> None:
    import ray
    from e2e_helpers import free_port, wait_http
    from hybrid_serve.deploy.app import build_app
    from ray import serve

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    port = free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app({"replicas": 2, "num_cpus_per_replica": 0.5, "torch_num_threads": 1, "api_key": API_KEY,
                             "metrics_push_interval_s": 0.5,
                             "engine_args": {"max_num_seqs": 8, "max_model_len": 256,
                                             "cache_memory_bytes": 64 * 1024**2}},
                            engine_factory=None if marker is None else _engine_stopped_by(marker)),
                  name=APP, route_prefix="/")
        wait_http(f"http://127.0.0.1:{port}/health")
        print(f"{TAG}{json.dumps({'port': port})}", flush=True)
        for line in sys.stdin:
            cmd = line.strip()
            if cmd == "replicas":
                actors = ray._private.state.actors().values()  # the GCS actor table (pids included)
                out = sorted(({"replica": a["Name"].rsplit("#", 1)[-1], "pid": a["Pid"]} for a in actors
                              if a.get("State") == "ALIVE" and a.get("ActorClassName") == f"ServeReplica:{APP}:LLMServer"),
                             key=lambda r: r["replica"])
            elif cmd == "running":
                try:
                    out = serve.status().applications[APP].deployments["LLMServer"].replica_states.get("RUNNING", 0)
                except Exception:  # noqa: BLE001 - an app being repaired may not list the deployment
                    out = 0
            elif cmd == "quit":
                break
            else:
                out = f"unknown command {cmd!r}"
            print(f"{TAG}{json.dumps(out)}", flush=True)
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


class Child:
    def __init__(self, log_path, marker: str | None = None) -> None:
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in close()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen([sys.executable, __file__, *([marker] if marker else [])], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        self.lock = threading.Lock()

    def read(self, timeout_s: float = 240.0):
        box: list = []

        def reader():
            for line in self.proc.stdout:
                if line.startswith(TAG):
                    box.append(json.loads(line[len(TAG):]))
                    return

        t = threading.Thread(target=reader, daemon=True)
        t.start()
        t.join(timeout_s)
        if not box:
            raise TimeoutError(f"no answer from the app process (exit {self.proc.poll()}); see {self.log.name}")
        return box[0]

    def ask(self, cmd: str):
        with self.lock:
            self.proc.stdin.write(cmd + "\n")
            self.proc.stdin.flush()
            return self.read(60)

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.send_signal(signal.SIGINT)  # its `finally` still stops Serve and Ray
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


# ----- the test ----------------------------------------------------------------------------
def _stream(http, base: str, prompt: str) -> dict:
    """One streaming completion: status, Retry-After, whether a token, an error event and
    [DONE] came."""
    out = {"status": None, "tokens": 0, "error": None, "done": False, "retry_after": None, "exc": None}
    body = {"prompt": prompt, "max_tokens": 48, "temperature": 0, "ignore_eos": True, "stream": True}
    try:
        with http.stream("POST", f"{base}/v1/completions", json=body, timeout=120,
                         headers={"Authorization": f"Bearer {API_KEY}"}) as resp:
            out["status"] = resp.status_code
            out["retry_after"] = resp.headers.get("retry-after")
            if resp.status_code != 200:
                resp.read()
                out["body"] = resp.text[:300]
                return out
            for line in resp.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    out["done"] = True
                    break
                event = json.loads(data)
                if "error" in event:
                    out["error"] = event["error"]
                elif event["choices"][0].get("text"):
                    out["tokens"] += 1
    except Exception as exc:  # noqa: BLE001 - recorded, asserted on below
        out["exc"] = f"{type(exc).__name__}: {exc}"
    return out


@pytest.mark.slow
def test_replica_killed_under_streaming_load(tmp_path):
    httpx = pytest.importorskip("httpx2")
    t_start = time.monotonic()
    results: list[dict] = []
    stop = threading.Event()
    child = Child(tmp_path / "app.log")
    try:
        base = f"http://127.0.0.1:{child.read()['port']}"
        replicas = child.ask("replicas")
        assert len(replicas) == 2, replicas

        threads = _looping_clients(httpx, base, results, stop)
        time.sleep(4)
        victim = replicas[0]
        os.kill(victim["pid"], signal.SIGKILL)
        t_kill = time.monotonic()
        with httpx.Client() as http:
            _completes(http, base, "right after the kill")

        new_id, recovered_s = None, None  # Serve has 2 RUNNING replicas again, then the new one takes requests
        with httpx.Client() as http:
            while time.monotonic() - t_kill < 75 and recovered_s is None:
                time.sleep(0.5)
                if new_id is None:
                    ids = {r["replica"] for r in child.ask("replicas")} - {r["replica"] for r in replicas}
                    if len(ids) == 1 and child.ask("running") == 2:
                        (new_id,) = ids
                    continue
                metrics = http.get(f"{base}/metrics", timeout=30).text
                if any(line.startswith("hybrid_serve_router_decisions_total") and f'replica="{new_id}"' in line
                       and float(line.rsplit(" ", 1)[-1]) > 0 for line in metrics.splitlines()):
                    recovered_s = time.monotonic() - t_kill
            health = _wind_down(http, base, stop, threads)
    finally:
        stop.set()
        child.close()

    errors = _check_outcomes(results, {"replica_failed"})
    assert new_id is not None, "Serve did not bring a second replica back within 75 s"
    assert recovered_s is not None and recovered_s <= 60, f"the new replica {new_id} took no request within 60 s"
    assert health == 200
    print(f"{len(results)} streams ({len(errors)} ended by an error event), recovered in {recovered_s:.1f} s, "
          f"{time.monotonic() - t_start:.0f} s in all")


def _looping_clients(httpx, base: str, results: list, stop: threading.Event, n: int = 6) -> list[threading.Thread]:
    def client(i: int) -> None:
        with httpx.Client() as http:
            k = 0
            while not stop.is_set():
                results.append(_stream(http, base, f"client {i} request {k} tell me a story"))
                k += 1

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    return threads


def _completes(http, base: str, prompt: str) -> None:
    """One non-streaming request of 4 tokens succeeds."""
    resp = http.post(f"{base}/v1/completions", headers={"Authorization": f"Bearer {API_KEY}"},
                     json={"prompt": prompt, "max_tokens": 4}, timeout=120)
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] == 4


def _wind_down(http, base: str, stop: threading.Event, threads: list[threading.Thread]) -> int:
    """Stops the looping clients; /health's status after."""
    stop.set()
    for t in threads:
        t.join(150)
    return http.get(f"{base}/health", timeout=30).status_code


def _check_outcomes(results: list[dict], codes: set[str]) -> list[dict]:
    """No 500, no client error, every 200 stream ended with [DONE], error events only with
    `codes`, every other answer a 503 with Retry-After. Returns the error events."""
    statuses = [r["status"] for r in results]
    assert 500 not in statuses, [r for r in results if r["status"] == 500][:3]
    assert not [r for r in results if r["exc"]], [r["exc"] for r in results if r["exc"]][:3]
    streams = [r for r in results if r["status"] == 200]
    assert all(r["done"] for r in streams), [r for r in streams if not r["done"]][:3]
    errors = [r["error"] for r in streams if r["error"]]
    assert all(e["type"] and e["code"] in codes for e in errors), errors
    others = [r for r in results if r["status"] != 200]
    assert all(r["status"] == 503 and r["retry_after"] for r in others), others[:3]
    return errors


@pytest.mark.slow
def test_a_replica_whose_engine_stopped_leaves_and_its_requests_go_elsewhere(tmp_path):
    """One replica's engine shuts down under streaming load (the process lives on): requests
    routed to it get `engine_dead`, tried on the other replica by the ingress; it exits within
    a few seconds of its first such answer (Serve would take 3 failed health checks, 30 s),
    Serve replaces it, and no client sees a 500."""
    httpx = pytest.importorskip("httpx2")
    marker = str(tmp_path / "stop-an-engine")
    results: list[dict] = []
    stop = threading.Event()
    child = Child(tmp_path / "app.log", marker)
    try:
        base = f"http://127.0.0.1:{child.read()['port']}"
        replicas = child.ask("replicas")
        assert len(replicas) == 2, replicas
        threads = _looping_clients(httpx, base, results, stop)
        time.sleep(4)
        open(marker, "w").close()
        t_stop = time.monotonic()
        while os.path.exists(marker) and time.monotonic() - t_stop < 10:
            time.sleep(0.05)
        assert not os.path.exists(marker), "no replica took the marker"
        gone_s = None
        while gone_s is None and time.monotonic() - t_stop < 25:
            time.sleep(0.25)
            pids = {r["pid"] for r in child.ask("replicas")}
            if not {r["pid"] for r in replicas} <= pids:
                gone_s = time.monotonic() - t_stop
        with httpx.Client() as http:
            _completes(http, base, "right after the engine stopped")
            running_s = None
            while running_s is None and time.monotonic() - t_stop < 75:
                time.sleep(0.5)
                if len(child.ask("replicas")) == 2 and child.ask("running") == 2:
                    running_s = time.monotonic() - t_stop
            health = _wind_down(http, base, stop, threads)
    finally:
        stop.set()
        child.close()

    assert gone_s is not None and gone_s < 20, "the replica whose engine stopped did not leave within 20 s"
    errors = _check_outcomes(results, {"engine_dead", "replica_failed"})
    assert running_s is not None and running_s <= 60, "Serve did not have 2 replicas running again within 60 s"
    assert health == 200
    print(f"{len(results)} streams ({len(errors)} ended by an error event); the replica left after {gone_s:.1f} s, "
          f"2 running after {running_s:.1f} s")


if __name__ == "__main__":
    _child(sys.argv[1] if len(sys.argv) > 1 else None)
