"""Helpers shared by the e2e tests (importable: pytest puts this folder on sys.path)."""
from __future__ import annotations

import socket
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.25)
    raise TimeoutError(f"{url} did not answer 200 within {timeout_s} s")


def serve_cli_round_trip(command: list[str], log_path, cwd: str | None = None, api_key: str = "cli-key",
                         extra_args: tuple[str, ...] = ()) -> str:
    """Run `hybrid-serve serve` (`command` up to and including "serve", then `extra_args`) as a
    user does: a new local Ray, the demo model, the API key from the environment. Waits for the
    printed URL, checks /v1/models, one completion and a refused key, then SIGINT: exit code 0
    and the port closed. Returns the banner line."""
    import os
    import queue
    import signal
    import subprocess
    import threading

    import openai

    port = free_port()
    cmd = command + ["--address", "local", "--num-cpus", "2", "--port", str(port), "--num-cpus-per-replica", "0.5",
                     "--max-model-len", "128", *extra_args]
    env = {**os.environ, "HYBRID_SERVE_API_KEY": api_key}
    lines: queue.Queue = queue.Queue()
    with open(log_path, "w") as stderr:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, cwd=cwd)
        threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
        try:
            deadline, banner = time.monotonic() + 180, None
            while banner is None and time.monotonic() < deadline and proc.poll() is None:
                try:
                    line = lines.get(timeout=1)
                except queue.Empty:
                    continue
                if "serving" in line:
                    banner = line
            assert banner, f"no URL printed; stderr:\n{open(log_path).read()[-3000:]}"
            url = f"http://127.0.0.1:{port}/v1"
            assert url in banner and "'demo'" in banner
            client = openai.OpenAI(base_url=url, api_key=api_key, max_retries=0, timeout=60)
            assert [m.id for m in client.models.list().data] == ["demo"]
            out = client.completions.create(model="demo", prompt="hi", max_tokens=3, temperature=0)
            assert out.usage.completion_tokens == 3
            try:
                openai.OpenAI(base_url=url, api_key="nope", max_retries=0).models.list()
                raise AssertionError("a wrong API key was accepted")
            except openai.AuthenticationError:
                pass
            proc.send_signal(signal.SIGINT)
            assert proc.wait(120) == 0
            with socket.socket() as s:
                assert s.connect_ex(("127.0.0.1", port)) != 0, "the HTTP port is still open after shutdown"
            return banner
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
