"""`hybrid-serve serve` as a user runs it: a new local Ray, the demo model, the URL printed
once it answers, the API key from the environment, a clean exit 0 on SIGINT."""
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from e2e_helpers import free_port

openai = pytest.importorskip("openai")


def _lines(stream, out: queue.Queue) -> None:
    for line in stream:
        out.put(line)


def test_cli_serve_demo_then_sigint(tmp_path):
    port = free_port()
    env = {**os.environ, "HYBRID_SERVE_API_KEY": "cli-key"}
    cmd = [sys.executable, "-m", "hybrid_serve.cli", "serve", "--address", "local", "--num-cpus", "2",
           "--port", str(port), "--num-cpus-per-replica", "0.5", "--max-model-len", "128"]
    stderr = open(tmp_path / "stderr.log", "w")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_lines, args=(proc.stdout, lines), daemon=True).start()
    try:
        deadline, banner = time.monotonic() + 180, None
        while banner is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                continue
            if "serving" in line:
                banner = line
        assert banner, f"no URL printed; stderr:\n{(tmp_path / 'stderr.log').read_text()[-3000:]}"
        url = f"http://127.0.0.1:{port}/v1"
        assert url in banner and "'demo'" in banner
        client = openai.OpenAI(base_url=url, api_key="cli-key", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == ["demo"]
        out = client.completions.create(model="demo", prompt="hi", max_tokens=3, temperature=0)
        assert out.usage.completion_tokens == 3
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url, api_key="nope", max_retries=0).models.list()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(120) == 0
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, "the HTTP port is still open after shutdown"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        stderr.close()
