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
        assert all(hit >= 128 for hit in later_turn_hits), str(later_turn_hits)
    finally:
        serve.delete(name)


def test_suffix_drafts_from_earlier_traffic_of_the_cluster(served):
    """Speculative method "suffix" behind the prefix router: a finished request's prompt and
    output reach the Router actor's suffix index through its replica's feed; a later request
    repeating it drafts from the index's local copy (accepted drafts counted), and its output
    is the same."""
    import time

    import httpx2 as httpx
    from e2e_helpers import wait_http
    from ray import serve

    from hybrid_serve.deploy.app import build_app

    name, prefix = "suffix-draft-test", "/suffixed"
    args = {"replicas": 2, "num_cpus_per_replica": 0.5, "torch_num_threads": 1, "router": "prefix",
            "metrics_push_interval_s": 0.5,
            "engine_args": {"cache_memory_bytes": 64 * 1024**2, "max_model_len": 512, "max_num_seqs": 8,
                            "speculative_config": {"method": "suffix", "num_speculative_tokens": 4,
                                                   "adaptive": False}}}
    serve.run(build_app(args), name=name, route_prefix=prefix)
    try:
        base = f"http://127.0.0.1:{served.port}{prefix}"
        wait_http(f"{base}/health")
        body = {"prompt": "def parse_header(line):\n", "max_tokens": 32, "temperature": 0}
        first = httpx.post(f"{base}/v1/completions", timeout=120, json=body)
        assert first.status_code == 200, first.text
        accepted, deadline = 0.0, time.monotonic() + 60
        while accepted == 0 and time.monotonic() < deadline:
            time.sleep(1.5)  # the feeds' batches and local copies refresh every 0.5 s
            again = httpx.post(f"{base}/v1/completions", timeout=120, json=body)
            assert again.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
            time.sleep(1.0)  # metrics push
            metrics = httpx.get(f"{base}/metrics", timeout=30).text
            accepted = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                           if line.startswith("hybrid_serve_spec_decode_num_accepted_tokens_total"))
        assert accepted > 0
    finally:
        serve.delete(name)
