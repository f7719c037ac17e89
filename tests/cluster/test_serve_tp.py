"""A Serve replica of tp=2 with its engine in an engine process (the default on CUDA): that
process is rank 0, its ShardWorker sits in the replica's placement group, started by the
replica process; greedy output over HTTP equals the offline API (tp=1). (The engine on a
thread of the replica, rank 0 there, is the offline API's ReplicaActor path, tested in
test_tensor_parallel.py.)"""
import sys

import pytest
import ray
from ray import serve

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/e2e")
from e2e_helpers import free_port, wait_http  # noqa: E402

from hybrid_serve import LLM, SamplingParams  # noqa: E402


@pytest.mark.slow
def test_serve_tp2_matches_offline():
    openai = pytest.importorskip("openai")
    from hybrid_serve.deploy.app import build_app

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        args = {"tp": 2, "replicas": 1, "num_cpus_per_replica": 1, "torch_num_threads": 1, "engine_process": True,
                "engine_args": {"cache_memory_bytes": 64 * 1024**2, "max_model_len": 256}}
        serve.run(build_app(args), name="hybrid-serve-tp", route_prefix="/")
        wait_http(f"http://127.0.0.1:{port}/health", timeout_s=180)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
        prompt = "The state of a recurrent layer"
        got = client.completions.create(model="demo", prompt=prompt, max_tokens=12, temperature=0)
        want = LLM(cache_memory_bytes=64 * 1024**2).generate([prompt], SamplingParams(max_tokens=12, temperature=0))
        assert got.choices[0].text == want[0].outputs[0].text
        bundles = [pg["bundles"] for pg in ray.util.placement_group_table().values() if pg["state"] == "CREATED"]
        assert any(len(b) == 2 for b in bundles), bundles  # the replica's group holds both ranks
    finally:
        serve.shutdown()
        ray.shutdown()
