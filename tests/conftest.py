import gc
import os
import sys

import torch

if not torch.cuda.is_available():  # kernels read it when first imported: set it before any test module
    os.environ.setdefault("TRITON_INTERPRET", "1")
# one thread per pytest-xdist worker (the README runs two on CI's two cores), two otherwise
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)
# Serve kills an HTTP proxy not ready within 5 s (10 s, 15 s... on its retries) and serve.start
# gives up after 60 s: on a loaded 2-core machine a worker process alone can take longer than
# 5 s to start. The Ray clusters the tests start (their raylet and workers inherit this) wait 30 s.
os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "30")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "models"))
sys.path.insert(0, os.path.dirname(__file__))

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def reference_models(tmp_path_factory):
    """family -> (model_dir, transformers model), built once per session."""
    from hf_reference import build_reference

    cache = {}

    def get(family: str):
        if family not in cache:
            out_dir = str(tmp_path_factory.mktemp(f"ref_{family}"))
            cache[family] = (out_dir, build_reference(family, out_dir))
        return cache[family]

    return get


@pytest.fixture(autouse=True)
def _return_gpu_memory():
    """After each test on a GPU machine: the memory of the engines it built goes back to the
    driver. An engine sizes its pools from the card's free memory, and torch's caching
    allocator keeps what a finished test freed, so a later engine in a child process (the
    no-compile-after-ready tests) can find the card full. In session 49 those 5 tests failed
    when run after tests/models/test_prefix_cache.py in one pytest process and passed alone
    (this is the likely cause; the failures' stderr was not kept). A no-op without CUDA (CI)."""
    yield
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        gc.collect()
        torch.cuda.empty_cache()


# Test files whose tests start or join Ray in the pytest process itself (not in a child process),
# or check that none is running there: under xdist they share one group, so they run on one
# worker in collection order, as in a serial run (the e2e app's session-scoped Ray stays up once
# started, and comes last).
IN_PROCESS_RAY = ("actors/", "cluster/", "deploy/test_ray_connect.py")
APP_FIXTURES = {"served", "client"}  # tests/e2e/conftest.py: the session's Serve app


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """Groups for `pytest -n N --dist loadgroup` (the README's command): each test file runs
    on one worker (its module fixtures built once); the tests that use Ray in the pytest
    process (IN_PROCESS_RAY, and the e2e app's) share one group."""
    root = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        path = os.path.relpath(str(item.path), root)
        in_process_ray = path.startswith(IN_PROCESS_RAY) or APP_FIXTURES & set(getattr(item, "fixturenames", ()))
        item.add_marker(pytest.mark.xdist_group("in-process-ray" if in_process_ray else path))
