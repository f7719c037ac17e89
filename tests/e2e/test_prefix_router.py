"""The prefix-aware Serve router on a real local cluster: two replicas, multi-turn
conversations; every later turn lands where its history is cached (a prompt-cache hit),
which Serve's default power-of-two routing gets only about half the time."""
import pytest

pytestmark = pytest.mark.slow


def test_later_turns_hit_the_replica_holding_their_history(served):
    """(Deployed beside the session's app, on the same Serve HTTP port, under its own prefix.)"""
    import httpx2 as httpx
    from e2e_helpers import wait_http
    from ray import serve

    from hybrid_serve.deploy.app import build_app

    name, prefix = "prefix-router-test", "/routed"
    args = {"replicas": 2, "num_cpus_per_replica": 0.5, "torch_num_threads": 1, "router": "prefix",
            "engine_args": {"cache_memory_bytes": 64 * 1024**2, "max_model_len": 512, "max_num_seqs": 8,
                            "state_checkpoint_interval": 64}}
    serve.run(build_app(args), name=name, route_prefix=prefix)
    try:
        base = f"http://127.0.0.1:{served.port}{prefix}"
        wait_http(f"{base}/health")
        later_turn_hits = []
        for user in range(6):
            history = [(user * 37 + i) % 200 + 10 for i in range(150)]
            for turn in range(3):
                history = history + [(user + turn * 5 + i) % 200 + 10 for i in range(20)]
                resp = httpx.post(f"{base}/v1/completions", timeout=120,
                                  json={"prompt": history, "max_tokens": 2, "temperature": 0})
                assert resp.status_code == 200, resp.text
                if turn:
                    later_turn_hits.append(resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
        assert all(hit >= 128 for hit in later_turn_hits), later_turn_hits
    finally:
        serve.delete(name)
