"""deploy/request_router.py without a Serve cluster: the replica's event ring, the router
applying events in order and resyncing when it missed some, ranking by prefix."""
from types import SimpleNamespace

from hybrid_serve.deploy.request_router import EVENTS_KEY, CacheEventRing, HybridRequestRouter
from hybrid_serve.mem_cache import CacheEvent
from hybrid_serve.routing import block_hashes

PS = 4


def _router() -> HybridRequestRouter:
    router = object.__new__(HybridRequestRouter)  # the Serve-side constructor needs a running controller
    router.initialize_state(page_size=PS, checkpoint_interval=16, seed=0, shared_index=False)
    return router


def _replica(name: str, stats: dict):
    return SimpleNamespace(replica_id=SimpleNamespace(unique_id=name), routing_stats=stats)


def _pending(ids, user=None, request_id=None):
    return SimpleNamespace(args=[SimpleNamespace(prompt_token_ids=ids, session_id=user)],
                           metadata=SimpleNamespace(internal_request_id=request_id))


def test_ring_numbers_events_and_keeps_the_last_ones():
    ring = CacheEventRing(PS, capacity=3)
    ring.extend([CacheEvent("checkpoint_taken", tuple(range(16)), 12), CacheEvent("reset")])
    ring.extend([CacheEvent("kv_evicted", tuple(range(16)), 8)] * 3)
    snap = ring.snapshot()
    assert snap["seq"] == 5 and [seq for seq, _ in snap["events"]] == [3, 4, 5]
    assert len(snap["events"][0][1]["block_hashes"]) == 2  # blocks 2..3 of the evicted span


def test_ring_keeps_the_live_checkpoints():
    ring = CacheEventRing(PS)
    ring.extend([CacheEvent("checkpoint_taken", tuple(range(16))), CacheEvent("checkpoint_taken", tuple(range(32)))])
    ring.extend([CacheEvent("checkpoint_taken", tuple(range(100, 116)))])
    assert len(ring.snapshot()["checkpoints"]) == 3
    ring.extend([CacheEvent("checkpoint_evicted", tuple(range(16)))])
    ring.extend([CacheEvent("kv_evicted", tuple(range(32)), 16)])  # blocks 4..7: the one at 32 goes too
    assert ring.snapshot()["checkpoints"] == [block_hashes(list(range(100, 116)), PS)[-1]]
    ring.extend([CacheEvent("reset")])
    assert ring.snapshot()["checkpoints"] == []


def test_router_places_by_prefix_and_forgets_what_replicas_evicted():
    import asyncio

    router = _router()
    prompt = list(range(40))
    ring = CacheEventRing(PS)
    a, b = _replica("a", {"num_free_state_slots": 4}), _replica("b", {"num_free_state_slots": 4, EVENTS_KEY: {}})
    first = asyncio.run(router.choose_replicas([a, b], _pending(prompt)))
    chosen = first[0][0]
    router.on_request_routed(_pending(prompt, request_id="t1"), chosen.replica_id, None)
    router.on_request_completed(chosen.replica_id, "t1")  # the next turn comes after this one finished
    again = asyncio.run(router.choose_replicas([a, b], _pending(prompt + [1, 2, 3])))
    assert again[0] == [chosen] and again[1] == [b if chosen is a else a]
    # the replica evicted the whole prefix: its events reach the router with its stats
    ring.extend([CacheEvent("kv_evicted", tuple(prompt[:36]), 0)])
    chosen.routing_stats = {"num_free_state_slots": 4, EVENTS_KEY: ring.snapshot()}
    assert router.index.match(prompt + [1]) != {}
    asyncio.run(router.choose_replicas([a, b], _pending(prompt + [1])))
    assert router.index.match(prompt + [1]) == {}
    assert router.decisions["prefix"] >= 1


def test_router_rebuilds_a_replica_whose_events_it_missed_from_its_checkpoints():
    router = _router()
    prompt = list(range(40))
    hashes = block_hashes(prompt, PS)
    router.own.report("a", {"seq": 1, "events": [(1, {"kind": "checkpoint_taken", "block_hashes": [1]})]})
    router.index.record_sent("a", prompt)
    assert router.index.match(prompt) == {"a": 36}
    missed = {"seq": 7, "events": [(7, {"kind": "checkpoint_taken", "block_hashes": [2]})],  # 2..6 missed
              "checkpoints": [hashes[3]]}  # what the replica still holds: the checkpoint at 16
    router.own.report("a", missed)
    assert router.index.match(prompt) == {"a": 16} and router.own.last_seq["a"] == 7
    router.own.report("a", {"seq": 7, "events": [(7, {"kind": "reset"})]})  # already seen: not applied again
    assert router.index.match(prompt) == {"a": 16}


def test_router_metrics_record_reasons_predicted_hits_and_index_size():
    import asyncio

    from hybrid_serve import metrics

    router = _router()
    prompt = list(range(40))
    a, b = _replica("ma", {"num_free_state_slots": 4}), _replica("mb", {"num_free_state_slots": 4})

    def value(name, **labels):
        return metrics.REGISTRY.get_sample_value(name, {"model_name": "default", **labels}) or 0.0

    before = value("hybrid_serve_router_decision_seconds_count", replica="router")
    first = asyncio.run(router.choose_replicas([a, b], _pending(prompt)))[0][0]
    router.on_request_routed(_pending(prompt, request_id="m1"), first.replica_id, None)
    router.on_request_completed(first.replica_id, "m1")
    asyncio.run(router.choose_replicas([a, b], _pending(prompt + [1])))
    chosen = first.replica_id.unique_id
    assert value("hybrid_serve_router_decision_reasons_total", replica=chosen, reason="prefix") == 1
    assert value("hybrid_serve_router_predicted_hit_tokens_total", replica=chosen) == 36
    assert value("hybrid_serve_router_decision_seconds_count", replica="router") == before + 2
    assert value("hybrid_serve_router_index_blocks", replica="router") == router.index.num_blocks() > 0


def test_a_routed_request_is_load_on_its_replica_until_it_completes_or_is_reported():
    """on_request_routed counts the request's uncached prompt tokens (prompt minus the hit
    predicted there) as load on the replica Serve sent it to, until it completes or the
    replica's report changes; meanwhile other requests go elsewhere."""
    import asyncio

    router = _router()
    prompt = list(range(40))
    a, b = _replica("la", {"num_free_state_slots": 4}), _replica("lb", {"num_free_state_slots": 4})
    first = asyncio.run(router.choose_replicas([a, b], _pending(prompt)))[0][0]
    other = b if first is a else a
    router.on_request_routed(_pending(prompt, request_id="q1"), first.replica_id, None)
    name = first.replica_id.unique_id
    assert router.policy.unreported[name].tokens == 40  # nothing predicted yet
    unrelated = list(range(100, 140))
    assert asyncio.run(router.choose_replicas([a, b], _pending(unrelated)))[0][0] is other  # q1 still there
    router.on_request_completed(first.replica_id, "q1")
    assert router.policy.unreported[name].requests == 0
    longer = prompt + [1, 2, 3]
    assert asyncio.run(router.choose_replicas([a, b], _pending(longer)))[0][0] is first
    router.on_request_routed(_pending(longer, request_id="q2"), first.replica_id, None)
    assert router.policy.unreported[name].tokens == 7  # 36 of 43 predicted there
    first.routing_stats = {"num_running": 1, "num_free_state_slots": 3}  # its report now shows q2
    asyncio.run(router.choose_replicas([a, b], _pending(unrelated)))
    assert name not in router.policy.unreported


def test_decisions_of_a_burst_see_each_other_before_serve_routes_any():
    """Serve asks for several requests' replicas before it reports the first routed: each
    decision counts as load (and a new conversation) on its replica at once, so a burst of
    new conversations over a system prompt one replica holds spreads (recorded when routed,
    all four went to that replica); a retry moves its record, and a request Serve sends
    elsewhere moves it there."""
    import asyncio
    from collections import Counter

    router = _router()
    system = list(range(64))
    replicas = [_replica(f"b{i}", {"num_free_state_slots": 8}) for i in range(4)]
    router.index.record_sent("b0", system + [999] * 8)  # an earlier conversation there
    pending = [_pending(system + [1000 + i] * 8, request_id=f"n{i}") for i in range(4)]
    chosen = [asyncio.run(router.choose_replicas(replicas, p))[0][0].replica_id.unique_id for p in pending]
    assert max(Counter(chosen).values()) <= 2 and len(set(chosen)) >= 3  # new conversations' slack: 1

    def entries():
        return {key: name for name, e in router.policy.unreported.items() for key in e.entries}

    assert entries() == {f"n{i}": chosen[i] for i in range(4)}
    again = asyncio.run(router.choose_replicas(replicas, pending[0]))[0][0].replica_id.unique_id  # a retry
    assert entries() == {"n0": again, **{f"n{i}": chosen[i] for i in range(1, 4)}}
    elsewhere = next(r for r in replicas if r.replica_id.unique_id != chosen[3])
    router.on_request_routed(pending[3], elsewhere.replica_id, None)  # Serve found chosen[3] full
    for i in (1, 2):
        router.on_request_routed(pending[i], SimpleNamespace(unique_id=chosen[i]), None)
    assert entries() == {"n0": again, "n1": chosen[1], "n2": chosen[2], "n3": elsewhere.replica_id.unique_id}
    assert sum(e.requests for e in router.policy.unreported.values()) == 4  # no double count
