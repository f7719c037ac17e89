"""routing/policy.py without Ray: replica stats from the replicas' report, power-of-two
choices that keep a uniform load balanced."""
import random
from collections import Counter

import pytest

from hybrid_serve.routing import PowerOfTwoChoices, ReplicaStats, RoutingRequest


def test_stats_from_a_replica_report():
    stats = ReplicaStats.from_dict("r1", {"num_running": 3, "num_waiting": 2, "num_waiting_tokens": 40})
    assert (stats.replica_id, stats.queue_len, stats.num_waiting_tokens, stats.num_free_kv_pages) == ("r1", 5, 40, 0)


def test_pow2_takes_the_less_loaded_of_two():
    policy = PowerOfTwoChoices(seed=0)
    busy, idle = ReplicaStats("busy", num_running=9), ReplicaStats("idle", num_running=1)
    assert {policy.choose(RoutingRequest([1, 2]), [busy, idle]).replica_id for _ in range(20)} == {"idle"}
    assert policy.choose(RoutingRequest([1]), [busy]).replica_id == "busy"
    with pytest.raises(ValueError, match="no replica"):
        policy.choose(RoutingRequest([1]), [])


def test_pow2_balances_a_uniform_stream():
    """Requests that each stay for a while: the per-replica counts stay within 1.5x."""
    policy, rng = PowerOfTwoChoices(seed=1), random.Random(2)
    load = Counter({f"r{i}": 0 for i in range(4)})
    placed = Counter()
    for _ in range(2000):
        stats = [ReplicaStats(r, num_running=n) for r, n in load.items()]
        chosen = policy.choose(RoutingRequest([rng.randrange(100)]), stats).replica_id
        load[chosen] += 1
        placed[chosen] += 1
        done = rng.choice([r for r, n in load.items() if n])  # one request somewhere finishes
        load[done] -= 1
    assert max(placed.values()) / min(placed.values()) <= 1.5


def test_stats_round_trip_from_the_engine_view():
    from hybrid_serve.engine.admission import LoadView

    view = LoadView(num_running=2, num_waiting=5, num_waiting_tokens=70, num_free_req_rows=6,
                    num_free_state_slots=9, num_free_kv_pages=33, max_num_seqs=8)
    stats = ReplicaStats.from_dict("r0", view.routing_stats())
    assert (stats.num_running, stats.num_waiting, stats.num_waiting_tokens, stats.num_free_state_slots,
            stats.num_free_kv_pages) == (2, 5, 70, 9, 33)
