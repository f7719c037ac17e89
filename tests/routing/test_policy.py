"""routing/policy.py without Ray: replica stats from the replicas' report, power-of-two
choices that keep a uniform load balanced."""
import random
from dataclasses import replace
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
                    num_free_state_slots=9, num_free_kv_pages=33, max_num_seqs=8, num_checkpoint_state_slots=4,
                    num_running_prefill_tokens=900)
    stats = ReplicaStats.from_dict("r0", view.routing_stats())
    assert (stats.num_running, stats.num_waiting, stats.num_waiting_tokens, stats.num_free_state_slots,
            stats.num_free_kv_pages, stats.num_checkpoint_state_slots, stats.num_running_prefill_tokens) == \
        (2, 5, 70, 9, 33, 4, 900)
    assert stats.num_obtainable_state_slots == 13


# ----- PrefixAwarePolicy: what it scores and what it counts as load --------------------------------
def _prefix_policy(**kw):
    from hybrid_serve.routing import BlockPrefixIndex, PrefixAwarePolicy

    return PrefixAwarePolicy(BlockPrefixIndex(16, 256), seed=0, **kw)


SYSTEM = list(range(10, 10 + 1024))  # a system prompt every conversation shares


def _conversation(i: int, turns: int = 1) -> list[int]:
    return SYSTEM + [1000 + i] * 64 * turns


def test_an_idle_replica_without_a_match_beats_matches_whose_queues_cost_more():
    """The shared system prompt is predicted on r0 and r1, each with 3 requests (3,000 tokens)
    waiting; r2 is idle and never saw it. Saving 1,024 tokens is not worth waiting 3,000: r2.
    (A policy scoring only the replicas where something matches never considers r2, and a
    replica can stay idle for a whole run: benchmarks/RESULTS.md, router section.)"""
    policy = _prefix_policy()
    for r in ("r0", "r1"):
        policy.index.record_sent(r, _conversation(0))
    stats = [ReplicaStats(r, num_waiting=3, num_waiting_tokens=3000, num_free_state_slots=8) for r in ("r0", "r1")]
    stats.append(ReplicaStats("r2", num_free_state_slots=8))
    placement = policy.choose(RoutingRequest(_conversation(1)), stats)
    assert (placement.replica_id, placement.reason, placement.predicted_hit_tokens) == ("r2", "imbalance", 0)
    # the same queues, but the match saves more than they cost: the match wins
    cheap = [ReplicaStats(s.replica_id, num_running=2, num_free_state_slots=8) for s in stats]
    assert policy.choose(RoutingRequest(_conversation(2)), cheap).reason == "prefix"


def test_a_replica_in_the_middle_of_a_long_prefill_counts_what_it_still_has_to_compute():
    """Both replicas hold the system prompt and run one request; r0's is still 2,000 tokens
    into its prompt (chunked prefill), r1's decodes. Counted as one running request each, they
    tie; the prompt tokens r0 still has to compute make r1 the faster first token."""
    policy = _prefix_policy()
    for r in ("r0", "r1"):
        policy.index.record_sent(r, _conversation(0))
    stats = [ReplicaStats("r0", num_running=1, num_free_state_slots=8, num_running_prefill_tokens=2000),
             ReplicaStats("r1", num_running=1, num_free_state_slots=8)]
    for i in range(1, 4):
        assert policy.rank(RoutingRequest(_conversation(i)), stats).replica_id == "r1"


def test_a_burst_between_load_reports_spreads_over_the_replicas():
    """Reports lag (Serve pushes them every stats period): 8 new conversations arrive while
    every replica's last report says idle. Each placement counts as load on its replica until
    a report covers it, so the burst spreads instead of all going to the first replica that
    looked best in the last report."""
    policy = _prefix_policy()
    idle = [ReplicaStats(f"r{i}", num_free_state_slots=8) for i in range(4)]
    for r in idle:
        policy.index.record_sent(r.replica_id, _conversation(0))
    placed = Counter(policy.choose(RoutingRequest(_conversation(1 + i)), idle).replica_id for i in range(8))
    assert sorted(placed.values()) == [2, 2, 2, 2], placed


def test_new_conversations_at_light_load_spread_by_cache_fill_not_at_random():
    """Steady light load: each replica's report already covers what was placed there (no
    unreported load), all hold the shared system prompt, none has a free state slot (their
    caches are warm), so every new conversation scores the same everywhere. Drawn at random,
    32 conversations over 4 replicas pile up unevenly; by predicted cache fill each replica
    takes 8, which is what its state slots can keep."""
    policy = _prefix_policy()
    warm = [ReplicaStats(f"r{i}", num_running=1) for i in range(4)]
    for r in warm:
        policy.index.record_sent(r.replica_id, _conversation(0))
    placed = Counter()
    for i in range(32):
        policy.unreported.clear()  # each placement is already in the replicas' reports
        placement = policy.choose(RoutingRequest(_conversation(1 + i, turns=4)), warm)
        assert placement.reason == "prefix" and placement.predicted_hit_tokens == 1024
        placed[placement.replica_id] += 1
    assert sorted(placed.values()) == [8, 8, 8, 8], placed


def test_new_conversations_spread_although_the_first_replicas_hold_the_system_prompt():
    """Fast replicas (GPUs): every request completes before the next report, so reports look
    idle and queues never build. Scored by one request's time to a first token, the system
    prompt the first replicas computed outweighs computing it elsewhere, and those replicas
    took every new conversation (the 4-GPU bench: 16 on each of two, none on the others).
    Spread by count, each replica takes its share and computes the prompt once; a later
    turn continues its own history and is not a new conversation."""
    now = [0.0]
    policy = _prefix_policy(clock=lambda: now[0])
    idle = [ReplicaStats(f"r{i}", num_free_state_slots=8) for i in range(4)]
    placed, home = Counter(), {}
    for i in range(32):
        now[0] += 0.05
        placement = policy.choose(RoutingRequest(_conversation(i)), idle)
        assert placement.new_conversation
        policy.unreported.clear()  # completed before the next arrival
        placed[placement.replica_id] += 1
        home[i] = placement.replica_id
    assert max(placed.values()) - min(placed.values()) <= 2 and min(placed.values()) >= 7, placed
    later = policy.choose(RoutingRequest(_conversation(5, turns=2)), idle)
    assert (later.replica_id, later.new_conversation) == (home[5], False)
    # the counts decay: an hour later the imbalance of an earlier burst no longer matters
    policy.record_new_conversation("r0")
    now[0] += 3600
    assert policy.num_new_conversations("r0") < 1e-6
    with pytest.raises(ValueError, match="conversation_half_life_s"):
        _prefix_policy(conversation_half_life_s=0)


def test_placements_count_as_load_until_a_changed_report_or_the_ttl():
    now = [0.0]
    policy = _prefix_policy(clock=lambda: now[0])
    idle = [ReplicaStats(f"r{i}", num_free_state_slots=8) for i in range(2)]
    for i in range(4):
        policy.choose(RoutingRequest(_conversation(i)), idle)
    assert policy.unreported["r0"].requests == policy.unreported["r1"].requests == 2
    assert policy.unreported["r0"].tokens == 1088 + 64  # the first: no match yet; the second: 64 uncached
    reported = [ReplicaStats("r0", num_running=2, num_free_state_slots=6), idle[1]]
    policy.rank(RoutingRequest(_conversation(20)), reported)
    assert "r0" not in policy.unreported and policy.unreported["r1"].requests == 2  # r0's report covers them
    now[0] += policy.unreported_ttl_s + 0.1
    policy.rank(RoutingRequest(_conversation(21)), reported)
    assert policy.unreported["r1"].requests == 0  # not reported, but old enough to be in any report
    policy.forget("r1")  # the replica died
    assert "r1" not in policy.unreported and "r1" not in policy.last_report


def test_a_report_covers_only_the_placements_its_replica_had_received():
    """Reports lag (Serve polls them every stats period): one sampled before the latest
    placements reached the replica changes (its free KV pages moved) but counts only the
    arrivals before them. Those placements stay load: a burst does not go to a replica that
    just took one because its report looked idle (on 4 GPUs that herded 58 of 160 requests
    onto one replica; RESULTS.md, router section)."""
    policy = _prefix_policy()
    reports = [ReplicaStats(f"r{i}", num_free_state_slots=8, num_received_requests=0) for i in range(2)]
    policy.index.record_sent("r0", _conversation(0))
    policy.index.record_sent("r1", _conversation(0))
    policy.rank(RoutingRequest(_conversation(1)), reports)  # first reports seen
    for key in ("a", "b", "c"):
        policy.record_load("r0", 64, key)
    # r0's next report: the pages of its running work moved, and 1 of the 3 had arrived
    stale = [replace(reports[0], num_free_kv_pages=7, num_received_requests=1), reports[1]]
    assert policy.rank(RoutingRequest(_conversation(5)), stale).replica_id == "r1"
    assert policy.unreported["r0"].requests == 2 and list(policy.unreported["r0"].entries) == ["b", "c"]
    policy.complete("r0", "c")  # ended before any report counted its arrival
    later = [replace(stale[0], num_received_requests=3), reports[1]]
    policy.rank(RoutingRequest(_conversation(6)), later)
    assert policy.unreported["r0"].requests == 0 and policy.unreported["r0"].completed == 0
    # a replica that restarted (its count went back) or reports no count: all its placements are covered
    policy.record_load("r0", 64, "d")
    policy.rank(RoutingRequest(_conversation(7)), [replace(later[0], num_received_requests=0), reports[1]])
    assert "r0" not in policy.unreported
    assert ReplicaStats.from_dict("r9", {}).num_received_requests == -1
    assert ReplicaStats.from_dict("r9", {"num_received_requests": 5}).num_received_requests == 5


def test_a_conversation_stays_where_its_history_is_while_the_load_difference_is_small():
    """A later turn: its history beyond the shared system prompt is on r1 only (reusable up to
    turn 1's prompt-end checkpoint: 192 tokens more than elsewhere); r1 runs 2 more requests
    than the others (128 tokens of cost): it stays on r1."""
    policy = _prefix_policy()
    for r in ("r0", "r1", "r2"):
        policy.index.record_sent(r, _conversation(0))
    turn1 = _conversation(7, turns=3) + [5] * 16  # 1,232 tokens: its prompt-end checkpoint at 1,216
    policy.index.record_sent("r1", turn1)
    stats = [ReplicaStats("r0", num_free_state_slots=8), ReplicaStats("r1", num_running=2, num_free_state_slots=8),
             ReplicaStats("r2", num_free_state_slots=8)]
    placement = policy.choose(RoutingRequest(turn1 + [6] * 80), stats)
    assert (placement.replica_id, placement.reason, placement.predicted_hit_tokens) == ("r1", "prefix", 1216)


def test_a_next_turn_stays_home_unless_home_is_much_busier():
    """A conversation's next turn (its whole previous prompt is on r1: 192 tokens of history
    more than elsewhere) counts that history 4 times: it stays on r1 with 300 tokens more
    queued there (one request's time alone would move it), and moves with 1,000 more
    (1,216 + 3 x 192 - 1,000 < 1,024). A new conversation gets no such weight."""
    turn1 = _conversation(7, turns=3) + [5] * 16  # its prompt-end checkpoint at 1,216
    chosen = {}
    for waiting in (300, 1000):
        policy = _prefix_policy()
        for r in ("r0", "r1"):
            policy.index.record_sent(r, _conversation(0))
        policy.index.record_sent("r1", turn1)
        stats = [ReplicaStats("r0", num_free_state_slots=8),
                 ReplicaStats("r1", num_waiting=1, num_waiting_tokens=waiting, num_free_state_slots=8)]
        placement = policy.rank(RoutingRequest(turn1 + [6] * 80), stats)
        assert not placement.new_conversation
        chosen[waiting] = placement.replica_id
    assert chosen == {300: "r1", 1000: "r0"}
    assert policy._home_bonus([], 0, {"r0": 1024}) == {}
    with pytest.raises(ValueError, match="continuation_weight"):
        _prefix_policy(continuation_weight=0.5)


def test_saved_weight_keeps_a_conversation_on_its_history_against_a_larger_load_difference():
    """r1 holds 192 tokens of the conversation's history more than the others, and has 300
    tokens more waiting: at weight 1 (and no continuation weight) the request moves (192 <
    300); with saved_weight=2 (recomputed tokens also delay those queued behind them) it
    stays on r1."""
    turn1 = _conversation(7, turns=3) + [5] * 16  # its prompt-end checkpoint at 1,216
    stats = [ReplicaStats("r0", num_free_state_slots=8),
             ReplicaStats("r1", num_waiting=1, num_waiting_tokens=300, num_free_state_slots=8)]
    chosen = {}
    for weight in (1.0, 2.0):
        policy = _prefix_policy(saved_weight=weight, continuation_weight=1)
        for r in ("r0", "r1"):
            policy.index.record_sent(r, _conversation(0))
        policy.index.record_sent("r1", turn1)
        chosen[weight] = policy.rank(RoutingRequest(turn1 + [6] * 80), stats).replica_id
    assert chosen == {1.0: "r0", 2.0: "r1"}
    with pytest.raises(ValueError, match="saved_weight"):
        _prefix_policy(saved_weight=0)
