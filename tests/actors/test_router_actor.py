"""The Router actor with a local Ray: two HybridRequestRouters (two ingress replicas) route
from one shared index; with the actor killed they fall back to power of two choices and keep
placing, then route by prefix again once the restarted actor rebuilt the index from the
replicas' reports."""
import time
from types import SimpleNamespace

import pytest

from hybrid_serve.deploy.request_router import EVENTS_KEY, CacheEventRing, HybridRequestRouter
from hybrid_serve.mem_cache import CacheEvent
from hybrid_serve.routing import ReplicaStats, RoutingRequest

PS, INTERVAL = 4, 16


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    owns = not ray.is_initialized()
    if owns:
        ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield ray
    if owns:
        ray.shutdown()


def _router(app: str) -> HybridRequestRouter:
    router = object.__new__(HybridRequestRouter)  # the Serve-side constructor needs a running controller
    router._deployment_id = SimpleNamespace(app_name=app)
    router.initialize_state(page_size=PS, checkpoint_interval=INTERVAL, seed=0, refresh_period_s=0.05,
                            stale_after_s=0.5)
    return router


def _replica(name, ring):
    return SimpleNamespace(replica_id=SimpleNamespace(unique_id=name),
                           routing_stats={"num_free_state_slots": 4, EVENTS_KEY: ring.snapshot()})


def _wait_for(check, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s")


def _place(router, replicas, prompt):
    return router.place(RoutingRequest(prompt), [router._stats(r) for r in replicas])


def _name(router):
    from hybrid_serve.actors.router import router_name
    return router_name(router._deployment_id.app_name, PS, INTERVAL, True)


@pytest.fixture
def two_routers(ray_local, request):
    routers = [_router(request.node.name), _router(request.node.name)]
    rings = {"a": CacheEventRing(PS), "b": CacheEventRing(PS)}
    yield routers, rings
    for r in routers:
        r.client.stop()
    ray_local.kill(ray_local.get_actor(_name(routers[0]), namespace="hybrid_serve"), no_restart=True)


def test_two_routers_see_one_index(ray_local, two_routers):
    (first, second), rings = two_routers
    replicas = [_replica(n, ring) for n, ring in rings.items()]
    prompt = list(range(40))
    _wait_for(lambda: first.client.index() is not None and second.client.index() is not None)
    for router in (first, second):
        _place(router, replicas, prompt)  # the replicas' first reports reach the actor
    actor = ray_local.get_actor(_name(first), namespace="hybrid_serve")
    _wait_for(lambda: ray_local.get(actor.stats.remote())["num_replicas"] == 2)
    first.on_request_routed(SimpleNamespace(args=[SimpleNamespace(prompt_token_ids=prompt, session_id=None)]),
                            SimpleNamespace(unique_id="b"), None)
    # the second router never placed this prompt: it learns the placement from the actor
    placed = _wait_for(lambda: (p := _place(second, replicas, prompt + [7, 8])).reason == "prefix" and p)
    assert placed.replica_id == "b"
    # the replica evicted the prefix: its report (seen by the first router only) reaches both
    rings["b"].extend([CacheEvent("kv_evicted", tuple(prompt[:36]), 0)])
    replicas = [_replica(n, ring) for n, ring in rings.items()]
    _place(first, replicas, [1, 2, 3])
    _wait_for(lambda: second.client.local.match(prompt) == {})


def test_killed_actor_falls_back_then_recovers_from_replica_reports(ray_local, two_routers):
    (first, second), rings = two_routers
    prompt = list(range(40))
    rings["a"].extend([CacheEvent("checkpoint_taken", tuple(prompt[:36]))])  # what replica a holds
    replicas = [_replica(n, ring) for n, ring in rings.items()]
    _wait_for(lambda: _place(first, replicas, prompt).reason == "prefix")
    _wait_for(lambda: _place(second, replicas, prompt).replica_id == "a")
    actor = ray_local.get_actor(_name(first), namespace="hybrid_serve")
    epoch = ray_local.get(actor.stats.remote())["epoch"]
    ray_local.kill(actor, no_restart=False)
    # while it is away, every decision is power of two (and still a replica): requests succeed
    assert _wait_for(lambda: _place(first, replicas, prompt).reason == "fallback")
    assert _place(first, replicas, prompt).replica_id in rings
    # restarted empty, it rebuilds both replicas from the checkpoints the reports carry (the
    # second router's stale local copy may still answer "prefix" before the actor is back, so
    # the rebuild is read from the actor itself, asked again while it is still restarting)
    def rebuilt():
        _place(second, replicas, prompt)  # the routers keep reporting, as serving would
        try:
            stats = ray_local.get(actor.stats.remote(), timeout=5)
        except (ray_local.exceptions.ActorUnavailableError, ray_local.exceptions.GetTimeoutError):
            return None
        return stats["epoch"] != epoch and stats["num_rebuilds"] >= 2
    assert _wait_for(rebuilt, timeout_s=30)
    placed = _wait_for(lambda: (p := _place(second, replicas, prompt)).reason == "prefix" and p, timeout_s=30)
    assert placed.replica_id == "a"
    # the first router routes by prefix again once its copy has caught up with the new actor
    _wait_for(lambda: _place(first, replicas, prompt).replica_id == "a")


def test_suffix_feed_shares_finished_requests_across_replicas(ray_local):
    from hybrid_serve.actors.router import get_router
    from hybrid_serve.actors.suffix_feed import SuffixFeed

    name = "hybrid_serve_router:suffix-test"
    feeds = [SuffixFeed(lambda: get_router(name, PS, INTERVAL), refresh_period_s=0.05) for _ in range(2)]
    try:
        prompt, output = list(range(100, 140)), list(range(500, 520))
        feeds[0].add_finished(prompt, output)
        # the other replica's local copy proposes the first one's output for the same tail
        assert _wait_for(lambda: feeds[1].propose(prompt, 4)) == [500, 501, 502, 503]
        assert feeds[1].num_proposals >= 1
    finally:
        for feed in feeds:
            feed.stop()
        ray_local.kill(ray_local.get_actor(name, namespace="hybrid_serve"), no_restart=True)
