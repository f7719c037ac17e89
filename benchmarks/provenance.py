"""Where a benchmark result came from: the tree's commit (marked when the serving code differs
from it) and the CPU it ran on. Results quote both beside their figures (benchmarks/RESULTS.md)."""
from __future__ import annotations

import os
import platform
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository (= package) root
SERVING_CODE = ("deploy", "engine", "models", "kernels", "mem_cache", "routing")


def git_commit() -> str:
    """HEAD's short hash, with a marker when the serving code has uncommitted changes; "unknown"
    outside a git checkout (a device copy's HEAD can be stale: check it against the tree)."""
    try:
        sha = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                                      stderr=subprocess.DEVNULL).strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", *SERVING_CODE], cwd=ROOT,
                               check=False).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + (f"+uncommitted changes ({', '.join(SERVING_CODE)})" if dirty else "")


def cpu_device(torch_threads: int | None = None) -> str:
    """The CPU as results name it, e.g. "cpu (2 cores, 1 torch thread), x86_64"."""
    threads = "" if torch_threads is None else f", {torch_threads} torch thread{'s' if torch_threads != 1 else ''}"
    return f"cpu ({os.cpu_count()} cores{threads}), {platform.processor() or platform.machine()}"
