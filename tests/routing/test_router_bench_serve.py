"""router_bench serve's figures from per-router rows, `merge` of serve results that measured
different routers at the same time, and the check that a replica's cache can keep its share of
the conversations (benchmarks/router_bench_serve.py)."""
import pytest

from hybrid_serve.benchmarks.router_bench_figures import merge_results, router_metrics
from hybrid_serve.benchmarks.router_bench_serve import cache_shortfall


def _row(seed, ttft_p50_s, hit_tokens):
    return {"seed": seed, "ttft_p50_s": ttft_p50_s, "hit_tokens": hit_tokens}


def _part(routers, workload="32 users x 5 turns", setup="local Ray Serve"):
    return {"metric": "router_multi_turn", "workload": workload, "setup": setup, "commit": "abc1234",
            "rows": routers, "skipped": {}}


def test_figures_are_mean_p50_ratios_and_summed_hits():
    rows = {"prefix": [_row(0, 1.0, 900), _row(1, 2.0, 1000)],
            "round_robin": [_row(0, 3.0, 500), _row(1, 3.0, 600)],
            "single_replica": [_row(0, 9.0, 1000), _row(1, 9.0, 1000)]}
    figures = router_metrics(rows)
    assert figures["router_ttft_p50_vs_round_robin"] == 0.5  # mean p50s 1.5 / 3.0
    assert figures["router_hit_tokens_vs_single_replica"] == 0.95  # 1,900 / 2,000
    assert figures["router_ttft_p50_vs_ray_prefix_affinity"] is None  # not measured


def test_merge_takes_each_part_routers_and_recomputes_the_figures():
    a = _part({"prefix": [_row(0, 1.0, 900)], "round_robin": [_row(0, 2.5, 400)],
               "single_replica": [_row(0, 9.0, 1000)]}, setup="part a")
    b = _part({"ray_prefix_affinity": [_row(0, 20.0, 300)]}, setup="part b")
    b["skipped"] = {"serve_default": "stopped by SIGINT"}
    merged = merge_results([a, b])
    assert list(merged["rows"]) == ["prefix", "round_robin", "single_replica", "ray_prefix_affinity"]
    assert merged["router_ttft_p50_vs_ray_prefix_affinity"] == 0.05
    assert merged["router_ttft_p50_vs_round_robin"] == 0.4
    assert merged["router_hit_tokens_vs_single_replica"] == 0.9
    assert merged["setup"] == ["part a", "part b"]
    assert merged["skipped"] == {"serve_default": "stopped by SIGINT"}
    assert [p["routers"] for p in merged["parts"]] == [["prefix", "round_robin", "single_replica"],
                                                       ["ray_prefix_affinity"]]


def test_merge_refuses_different_workloads_and_a_router_twice():
    a = _part({"prefix": [_row(0, 1.0, 900)]})
    with pytest.raises(ValueError, match="different workloads"):
        merge_results([a, _part({"round_robin": [_row(0, 2.0, 400)]}, workload="16 users x 5 turns")])
    with pytest.raises(ValueError, match="router 'prefix' is in more than one part"):
        merge_results([a, _part({"prefix": [_row(0, 1.1, 800)]})])


def test_cache_shortfall_names_the_missing_slots_and_pages():
    # session 32's set-up mistake: 32 users on 4 replicas of 48 MiB (14 slots, 1,168 pages)
    assert cache_shortfall(14, 1168, 16, conversations=8, max_num_seqs=8, conversation_tokens=2944,
                           shared_tokens=1024) == "14 state slots, 8 conversations need 17"
    assert cache_shortfall(29, 2310, 16, 8, 8, 2944, 1024) is None  # 96 MiB
    assert cache_shortfall(14, 1168, 16, 4, 8, 2944, 1024) is None  # 16 users: 4 a replica
    # fewer running at once than conversations: a running slot for each row only
    assert cache_shortfall(13, 4096, 16, 8, 4, 2944, 1024) is None
    assert cache_shortfall(17, 101, 16, 8, 8, 2944, 1024) == \
        "100 KV pages (1600 tokens), their histories need 16384 tokens"
