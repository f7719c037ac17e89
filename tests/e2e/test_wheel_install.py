"""The package as a user installs it: `pip wheel .`, the wheel installed (not editable) into a
fresh virtual environment, then `hybrid-serve generate` and `hybrid-serve serve` from it.
The venv sees this interpreter's site-packages for the heavy dependencies (torch, ray), but
hybrid_serve itself must come from the wheel (checked), so a module missing from the wheel
fails here."""
import os
import re
import shutil
import subprocess
import sys

import pytest
from e2e_helpers import serve_cli_round_trip

ACCESS_LINE = re.compile(r" -- (GET|POST) /\S* \d{3} ")  # Serve's: "... -- POST /v1/completions 200 68.6ms"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"  # a clean copy: no build/ left over from an earlier wheel in the checkout
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", "build", "*.egg-info", "__pycache__", ".*cache",
                                                                "bench_out", ".devcache", ".whl", ".venv"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp / "dist"), str(source)],
                   check=True, timeout=600)
    wheels = list((tmp / "dist").glob("hybrid_serve-*.whl"))
    assert len(wheels) == 1, wheels
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(tmp / "venv")], check=True, timeout=300)
    python = str(tmp / "venv" / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheels[0])], check=True,
                   timeout=300)
    return tmp / "venv", tmp


@pytest.mark.slow
def test_wheel_holds_every_module_and_no_build_files(venv):
    env_dir, tmp = venv
    code = ("import hybrid_serve, os, pkgutil; print(hybrid_serve.__file__); "
            "print(' '.join(m.name for m in pkgutil.walk_packages(hybrid_serve.__path__, 'hybrid_serve.')))")
    out = subprocess.run([str(env_dir / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(tmp), timeout=120).stdout.split("\n")
    assert out[0].startswith(str(env_dir)), f"hybrid_serve was imported from {out[0]}, not the wheel"
    shipped = set(out[1].split())
    for module in ("hybrid_serve.kernels.linear", "hybrid_serve.kernels.activation", "hybrid_serve.engine.runner",
                   "hybrid_serve.engine.spec", "hybrid_serve.routing", "hybrid_serve.demo", "hybrid_serve.llm"):
        assert module in shipped, module
    assert not {m for m in shipped if m.endswith((".setup", ".tests")) or ".tests." in m or "benchmarks" in m}


@pytest.mark.slow
def test_wheel_generate(venv):
    env_dir, tmp = venv
    result = subprocess.run([str(env_dir / "bin" / "hybrid-serve"), "generate", "def fibonacci(n):",
                             "--max-tokens", "4"], capture_output=True, text=True, cwd=str(tmp), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "4 tokens" in result.stderr and "finish_reason=length" in result.stderr


@pytest.mark.slow
def test_wheel_serve(venv, tmp_path):
    """The installed `hybrid-serve serve` with Serve's default proxy: the round trip, SIGINT,
    and no access log lines (Serve's, one per request per hop) unless --enable-log-requests."""
    env_dir, tmp = venv
    log = tmp_path / "serve.log"
    serve_cli_round_trip([str(env_dir / "bin" / "hybrid-serve"), "serve"], log, cwd=str(tmp))
    assert not ACCESS_LINE.search(log.read_text()), "access log lines by default"
