"""One local Ray + Serve app for all e2e tests (session scope), on loopback and a free port.

The app: the built-in demo model, 2 ingress replicas (each routing on its own; the metrics
must add their counts) and 2 engine replicas (so per-replica metrics are real), each
with its engine in an engine process (the default on CUDA; the apps of test_replica_failure,
test_prefix_router and test_prometheus keep the CPU default, the engine on a thread of the
replica), an API key, a small cache and context (so bad input stays cheap). Ray is shut down
at the end.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest
from e2e_helpers import free_port, wait_http

API_KEY = "e2e-secret"
MAX_MODEL_LEN = 256
APP_ARGS = {
    "replicas": 2,
    "ingress_replicas": 2,
    "num_cpus_per_replica": 0.5,
    "torch_num_threads": 1,
    "engine_process": True,
    "api_key": API_KEY,
    "metrics_push_interval_s": 0.5,
    "engine_args": {"cache_memory_bytes": 64 * 1024**2, "max_model_len": MAX_MODEL_LEN, "max_num_seqs": 16},
}


@dataclass(frozen=True)
class Served:
    base_url: str  # http://127.0.0.1:PORT
    port: int
    api_key: str
    model: str
    max_model_len: int
    ingress_replicas: int = APP_ARGS["ingress_replicas"]

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}


@pytest.fixture(scope="session")
def served():
    ray = pytest.importorskip("ray")
    from ray import serve

    from hybrid_serve.deploy.app import build_app

    owns_ray = not ray.is_initialized()  # another suite's Ray in this process: reuse it, leave it up
    if owns_ray:  # address="local": never join a cluster someone else started on this machine
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(APP_ARGS), name="hybrid-serve", route_prefix="/")
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/health")
        yield Served(base, port, API_KEY, "demo", MAX_MODEL_LEN)
    finally:
        try:
            serve.shutdown()
        finally:
            if owns_ray:
                ray.shutdown()


@pytest.fixture(scope="session")
def client(served):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=f"{served.base_url}/v1", api_key=served.api_key, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def offline_llm():
    """The offline API on the same (demo) model: the reference for greedy output."""
    from hybrid_serve import LLM

    return LLM(cache_memory_bytes=64 * 1024**2)
