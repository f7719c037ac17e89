"""The Serve `RequestRouter` over `routing/`'s prefix-aware policy (opt-in: AppConfig
`router: "prefix"`; the default stays Serve's power of two choices).

    replicas ──record_routing_stats──▶ {load (LoadView.routing_stats), cache events (seq, event)}
                                        │ (Serve pushes each replica's latest dict to the routers)
    ingress handle ─▶ HybridRequestRouter.choose_replicas(request)
                        PrefixAwarePolicy.rank(ids, stats) ─▶ [[best], [the rest]]
                      on_request_routed ─▶ index.record_sent(replica, ids)

Each router keeps its own `BlockPrefixIndex` (one per ingress replica), fed by what it sent
and corrected by the replicas' cache events, which every replica keeps in a ring with
sequence numbers (`CacheEventRing`): a router applies the events newer than the last it
saw, and forgets a replica when it missed some (the ring moved past it) or the replica
died. Routing never waits on anything but this process's memory.
"""
from __future__ import annotations

import logging
from collections import deque
from typing import Any

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from ..routing import BlockPrefixIndex, PrefixAwarePolicy, ReplicaStats, RoutingRequest, cache_event

logger = logging.getLogger(__name__)

EVENTS_KEY = "cache_events"  # in a replica's routing stats: [(seq, event dict), ...]


class CacheEventRing:
    """A replica's recent cache events with sequence numbers (the last `capacity`), as its
    routing stats carry them to every router."""

    def __init__(self, page_size: int, capacity: int = 4096) -> None:
        self.page_size = page_size
        self.events: deque[tuple[int, dict]] = deque(maxlen=capacity)
        self.next_seq = 1

    def extend(self, events) -> None:
        """mem_cache.CacheEvent objects, as the engine took them."""
        for e in events:
            self.events.append((self.next_seq, cache_event(e.kind, e.token_ids, self.page_size, e.start)))
            self.next_seq += 1

    def snapshot(self) -> list[tuple[int, dict]]:
        return list(self.events)


class HybridRequestRouter(RequestRouter):
    """Prefix- and checkpoint-aware placement (routing.PrefixAwarePolicy) for LLMServer."""

    def initialize_state(self, page_size: int = 16, checkpoint_interval: int = 256, hybrid: bool = True,
                         seed: int | None = None, **policy_kwargs: Any) -> None:
        self.index = BlockPrefixIndex(page_size, checkpoint_interval, hybrid)
        self.policy = PrefixAwarePolicy(self.index, seed=seed, **policy_kwargs)
        self.last_seq: dict[str, int] = {}
        self.decisions: dict[str, int] = {}

    # ----- the replicas' reports ---------------------------------------------------------------
    def _apply_events(self, replica_id: str, events: list) -> None:
        if not events:
            return
        last = self.last_seq.get(replica_id, 0)
        if events[0][0] > last + 1 and last:  # the ring moved past what we saw: resync from scratch
            self.index.forget_replica(replica_id)
        for seq, event in events:
            if seq > last:
                self.index.apply_event(replica_id, event)
        self.last_seq[replica_id] = max(last, events[-1][0])

    def _stats(self, replica: RunningReplica) -> ReplicaStats:
        replica_id = replica.replica_id.unique_id
        stats = replica.routing_stats or {}
        self._apply_events(replica_id, stats.get(EVENTS_KEY) or [])
        return ReplicaStats.from_dict(replica_id, stats)

    def on_replica_actor_died(self, replica_id) -> None:
        super().on_replica_actor_died(replica_id)
        self.index.forget_replica(replica_id.unique_id)
        self.last_seq.pop(replica_id.unique_id, None)

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

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        request = self._routing_request(pending_request)
        if request is None:  # e.g. model_info / check_health calls: any replica
            return [candidate_replicas]
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        placement = self.policy.rank(request, [self._stats(r) for r in candidate_replicas])
        self.decisions[placement.reason] = self.decisions.get(placement.reason, 0) + 1
        best = by_id[placement.replica_id]
        return [[best], [r for r in candidate_replicas if r is not best]]

    def on_request_routed(self, pending_request: PendingRequest, replica_id, result) -> None:
        request = self._routing_request(pending_request)
        if request is not None:
            self.policy.record(replica_id.unique_id, request)
