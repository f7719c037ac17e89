"""The Serve `RequestRouter` over `routing/`'s prefix-aware policy (opt-in: AppConfig
`router: "prefix"`; the default stays Serve's power of two choices).

    replicas ──record_routing_stats──▶ {load (LoadView.routing_stats), cache events (seq, event)}
                                        │ (Serve pushes each replica's latest dict to the routers)
    ingress handle ─▶ HybridRequestRouter.choose_replicas(request)
                        PrefixAwarePolicy.rank(ids, stats) ─▶ [[best], [the rest]]
                      on_request_routed ─▶ index.record_sent(replica, ids), policy.record_load
                      on_request_completed ─▶ policy.complete

The index is shared by every router through the named Router actor (actors/router.py):
fed by what each router sent and corrected by the replicas' cache events, which every
replica keeps in a ring with sequence numbers beside the checkpoints it holds
(`CacheEventRing`): the events newer than the last applied are applied, and a replica whose
events were missed (the ring moved past them, the actor restarted) is rebuilt from its live
checkpoints. Routing never waits on anything but this process's memory.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from contextlib import nullcontext
from typing import Any

import ray
from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from .. import metrics
from ..actors.router import RouterClient, get_router, router_name
from ..routing import Placement, PowerOfTwoChoices, PrefixAwarePolicy, ReplicaStats, RoutingRequest, cache_event
from ..routing.shared_index import SharedPrefixIndex

logger = logging.getLogger(__name__)

EVENTS_KEY = "cache_events"  # in a replica's routing stats: [(seq, event dict), ...]


class CacheEventRing:
    """A replica's recent cache events with sequence numbers (the last `capacity`), and the
    checkpoints it holds now (taken, not evicted since: at most its state slots, so small),
    as its routing stats carry them to every router. A router that missed events rebuilds
    the replica from those checkpoints (routing/shared_index.py)."""

    def __init__(self, page_size: int, capacity: int = 4096, max_checkpoints: int = 65536) -> None:
        self.page_size = page_size
        self.events: deque[tuple[int, dict]] = deque(maxlen=capacity)
        self.next_seq = 1
        self.max_checkpoints = max_checkpoints
        self.checkpoints: dict[int, None] = {}  # block hash ending at a live checkpoint (insertion order)

    def extend(self, events) -> None:
        """mem_cache.CacheEvent objects, as the engine took them."""
        for e in events:
            event = cache_event(e.kind, e.token_ids, self.page_size, e.start, e.positions)
            self.events.append((self.next_seq, event))
            self.next_seq += 1
            self._track(event)

    def _track(self, event: dict) -> None:
        kind, hashes = event["kind"], event.get("block_hashes") or []
        if kind == "reset":
            self.checkpoints.clear()
        elif kind == "checkpoint_taken" and hashes:
            self.checkpoints.pop(hashes[-1], None)
            self.checkpoints[hashes[-1]] = None
            if len(self.checkpoints) > self.max_checkpoints:  # (a bound only: predicts less)
                self.checkpoints.pop(next(iter(self.checkpoints)))
        else:  # checkpoint_evicted, checkpoint_skipped, kv_evicted
            for h in hashes:
                self.checkpoints.pop(h, None)

    def snapshot(self) -> dict:
        """{"seq": last event number, "events": [(seq, event), ...], "checkpoints": [hashes]}"""
        return {"seq": self.next_seq - 1, "events": list(self.events), "checkpoints": list(self.checkpoints)}


def _ingress_label() -> str:
    """The metrics' `replica` label of this process: the ingress replica the router runs in."""
    try:
        from ray import serve

        return f"ingress:{serve.get_replica_context().replica_id.unique_id}"
    except Exception:  # noqa: BLE001 - not inside a Serve replica (tests, a driver's handle)
        return "router"


class HybridRequestRouter(RequestRouter):
    """Prefix- and checkpoint-aware placement (routing.PrefixAwarePolicy) for LLMServer.

    Shared (the default where Ray runs): the index is the local copy of the named Router
    actor's (actors/router.py), so every ingress replica routes from one view; while the actor
    is unreachable, power of two choices (reason "fallback"). Otherwise (`shared_index=False`,
    or no Ray) a `SharedPrefixIndex` of this router's own."""

    STARTUP_WAIT_S = 15.0  # the first requests wait this long at most for the actor's first sync

    def initialize_state(self, page_size: int = 16, checkpoint_interval: int = 256, hybrid: bool = True,
                         seed: int | None = None, shared_index: bool = True, refresh_period_s: float = 0.2,
                         stale_after_s: float = 2.0, model_name: str | None = None, **policy_kwargs: Any) -> None:
        self.client: RouterClient | None = None
        self.started_at = time.monotonic()
        self.own: SharedPrefixIndex | None = None
        app = getattr(getattr(self, "_deployment_id", None), "app_name", "default")
        self.metrics = metrics.RouterMetrics(model_name or app, _ingress_label())
        if shared_index and ray.is_initialized():
            name = router_name(app, page_size, checkpoint_interval, hybrid)
            self.client = RouterClient(lambda: get_router(name, page_size, checkpoint_interval, hybrid),
                                       page_size, checkpoint_interval, hybrid, refresh_period_s=refresh_period_s,
                                       stale_after_s=stale_after_s)
            index = self.client.local
        else:
            self.own = SharedPrefixIndex(page_size, checkpoint_interval, hybrid, log_capacity=1)
            index = self.own.index
        self.index = index
        self.policy = PrefixAwarePolicy(index, seed=seed, **policy_kwargs)
        self.fallback = PowerOfTwoChoices(seed)
        self.lock = self.client.lock if self.client is not None else nullcontext()
        self.decisions: dict[str, int] = {}
        self.decided: dict[object, tuple[str, bool]] = {}  # request key -> (replica, new conversation) recorded
        # id(prompt ids) -> (replica, predicted hit, new conversation), until routed
        self.predicted: dict[int, tuple[str, int, bool]] = {}

    # ----- the replicas' reports ---------------------------------------------------------------
    def _stats(self, replica: RunningReplica) -> ReplicaStats:
        replica_id = replica.replica_id.unique_id
        stats = replica.routing_stats or {}
        report = stats.get(EVENTS_KEY)
        if report:
            if self.client is not None:
                self.client.report(replica_id, report)
            else:
                self.own.report(replica_id, report)
        return ReplicaStats.from_dict(replica_id, stats)

    def on_replica_actor_died(self, replica_id) -> None:
        super().on_replica_actor_died(replica_id)
        self.policy.forget(replica_id.unique_id)
        if self.client is not None:
            self.client.forget(replica_id.unique_id)
        else:
            self.own.forget(replica_id.unique_id)

    # ----- routing -------------------------------------------------------------------------------
    @staticmethod
    def _routing_request(pending_request: PendingRequest | None) -> RoutingRequest | None:
        if pending_request is None or not pending_request.args:
            return None
        request = pending_request.args[0]
        ids = getattr(request, "prompt_token_ids", None)
        if ids is None:
            return None
        return RoutingRequest(ids, getattr(request, "session_id", None))

    def place(self, request: RoutingRequest, replicas: list[ReplicaStats]) -> Placement:
        """The decision, from this process's memory only."""
        if self.client is not None and self.client.index() is None:
            return Placement(self.fallback.choose(request, replicas).replica_id, "fallback")
        with self.lock:
            return self.policy.rank(request, replicas)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        request = self._routing_request(pending_request)
        if request is None:  # e.g. model_info / check_health calls: any replica
            return [candidate_replicas]
        if self.client is not None and not self.client.ready.is_set():
            await self._await_first_sync()
        started = time.perf_counter()
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        placement = self.place(request, [self._stats(r) for r in candidate_replicas])
        self.decisions[placement.reason] = self.decisions.get(placement.reason, 0) + 1
        key = self._request_key(pending_request)
        if key is not None:
            self._record_decision(key, placement, len(request.prompt_token_ids))
        self.predicted[id(request.prompt_token_ids)] = (placement.replica_id, placement.predicted_hit_tokens,
                                                        placement.new_conversation)
        if len(self.predicted) > 4096:  # (requests Serve never routed: cancelled)
            self.predicted.pop(next(iter(self.predicted)))
        self.metrics.decision(placement.replica_id, placement.reason, placement.predicted_hit_tokens,
                              time.perf_counter() - started)
        with self.lock:  # (the sync thread may be adding a replica)
            self.metrics.index_blocks.set(self.index.num_blocks())
            self.metrics.index_replicas.set(len(self.index.replicas))
        best = by_id[placement.replica_id]
        return [[best], [r for r in candidate_replicas if r is not best]]

    @staticmethod
    def _request_key(pending_request: PendingRequest | None):
        return getattr(getattr(pending_request, "metadata", None), "internal_request_id", None)

    def _record_decision(self, key, placement: Placement, num_tokens: int) -> None:
        """The decision counts as load (and as a new conversation) on its replica at once, not
        when Serve reports the request routed: a burst's decisions all come before the first of
        them is routed, and each must see the others (recorded at routing, 3 of 4 new
        conversations arriving within 40 ms went to the one replica that looked idle). A
        request Serve asks about again (a retry) moves its record; `on_request_routed` moves it
        where Serve sent it if that is another replica."""
        previous = self.decided.pop(key, None)
        if previous is not None:
            self._unrecord_decision(key, *previous)
        self.policy.record_load(placement.replica_id, num_tokens - placement.predicted_hit_tokens, key)
        if placement.new_conversation:
            self.policy.record_new_conversation(placement.replica_id)
        self.decided[key] = (placement.replica_id, placement.new_conversation)
        if len(self.decided) > 4096:  # (requests Serve never routed: cancelled; their load expires)
            self.decided.pop(next(iter(self.decided)))

    def _unrecord_decision(self, key, replica_id: str, new_conversation: bool) -> None:
        self.policy.unrecord_load(replica_id, key)
        if new_conversation:
            self.policy.unrecord_new_conversation(replica_id)

    async def _await_first_sync(self) -> None:
        """Right after start-up the Router actor may still be coming up (created on first use):
        the first requests wait for the first sync, up to STARTUP_WAIT_S after this router
        started, rather than falling back to power-of-two and scattering the first turns of
        conversations (later, an unreachable actor means fallback at once)."""
        while not self.client.ready.is_set() and time.monotonic() < self.started_at + self.STARTUP_WAIT_S:
            await asyncio.sleep(0.02)

    def on_request_routed(self, pending_request: PendingRequest, replica_id, result) -> None:
        request = self._routing_request(pending_request)
        if request is None:
            return
        replica, ids = replica_id.unique_id, request.prompt_token_ids
        if self.client is not None:
            self.client.record_sent(replica, ids)
        else:
            self.index.record_sent(replica, ids)
        self.policy.record_session(replica, request)
        predicted_replica, hit, new_conversation = self.predicted.pop(id(ids), (None, 0, False))
        key = self._request_key(pending_request)
        decided = self.decided.pop(key, None) if key is not None else None
        if decided is not None:
            if decided[0] == replica:
                return  # recorded when decided, where Serve sent it
            self._unrecord_decision(key, *decided)  # Serve sent it elsewhere (the chosen replica was full)
        if new_conversation:  # (where Serve sent it: the replica chosen, or the next when that one was full)
            self.policy.record_new_conversation(replica)
        # its prefill is load there until the replica's report shows it or it completes (routing/policy.py)
        self.policy.record_load(replica, len(ids) - (hit if predicted_replica == replica else 0), key)

    def on_request_completed(self, replica_id, internal_request_id: str) -> None:
        self.policy.complete(replica_id.unique_id, internal_request_id)
