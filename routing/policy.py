"""Placement policies: which replica takes a request.

    policy = PowerOfTwoChoices(seed=0)
    placement = policy.choose(RoutingRequest(prompt_token_ids=ids), [ReplicaStats.from_dict("r0", stats), ...])
    placement.replica_id, placement.reason

A replica's load arrives as the dict its engine reports (`LoadView.routing_stats()`, which
the Serve replica returns from `record_routing_stats`); `ReplicaStats.from_dict` reads it, so
this package depends on no other part of hybrid_serve.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Protocol, Sequence


@dataclass(frozen=True)
class RoutingRequest:
    """What placement sees of a request: token ids after the chat template (as the engine
    will see them), and an optional session key for affinity."""

    prompt_token_ids: Sequence[int]
    session_id: str | None = None


@dataclass(frozen=True)
class ReplicaStats:
    replica_id: str
    num_running: int = 0
    num_waiting: int = 0
    num_waiting_tokens: int = 0
    num_free_state_slots: int = 0
    num_free_kv_pages: int = 0

    @classmethod
    def from_dict(cls, replica_id: str, stats: dict) -> "ReplicaStats":
        """From a replica's routing stats (missing keys count as 0: a replica not yet reporting)."""
        return cls(replica_id, *(int(stats.get(k, 0)) for k in (
            "num_running", "num_waiting", "num_waiting_tokens", "num_free_state_slots", "num_free_kv_pages")))

    @property
    def queue_len(self) -> int:
        return self.num_running + self.num_waiting


@dataclass(frozen=True)
class Placement:
    replica_id: str
    reason: str  # e.g. "pow2", "prefix", "session": a label for the decisions metric
    predicted_hit_tokens: int = field(default=0, compare=False)  # the reusable prefix predicted there


class PlacementPolicy(Protocol):
    """Contract: `choose` picks one of `replicas` (never an empty list) in well under a
    millisecond, without I/O; it may keep state (an index, a random generator)."""

    def choose(self, request: RoutingRequest, replicas: Sequence[ReplicaStats]) -> Placement: ...


class PowerOfTwoChoices:
    """The less loaded of two replicas drawn at random (queue length, then waiting tokens):
    load balance without herding onto one replica (the fallback when prefix routing has
    nothing better)."""

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def choose(self, request: RoutingRequest, replicas: Sequence[ReplicaStats]) -> Placement:
        if not replicas:
            raise ValueError("no replica to choose from")
        pair = self._rng.sample(list(replicas), 2) if len(replicas) > 1 else [replicas[0]]
        best = min(pair, key=lambda r: (r.queue_len, r.num_waiting_tokens))
        return Placement(best.replica_id, "pow2")


class PrefixAwarePolicy:
    """Placement by predicted saved prefill against load, for hybrid models.

    For each replica: saved = the reusable prefix the index predicts there (ending at a state
    checkpoint on a hybrid model), cost = its waiting tokens + `running_cost_tokens` per
    running request; a replica with no free state slot (a hybrid replica's concurrency is
    capped by them, not by KV) pays `no_slot_cost_tokens` more. The best `saved - cost` wins,
    unless it is out of balance (`imbalance_ratio` x the least queue, and `imbalance_min`
    more), or nothing matches: then the less loaded of two random replicas. A request with
    a session id goes where the session went last while that replica is in balance. Every
    placement is recorded in the index (`record_sent`), so the next request of the same
    conversation finds it.

    Decision reasons (the metric's label): "prefix", "session", "pow2" (no match),
    "imbalance" (the best match was overloaded).
    """

    def __init__(self, index, seed: int | None = None, running_cost_tokens: int = 64,
                 no_slot_cost_tokens: int = 4096, imbalance_ratio: float = 2.0, imbalance_min: int = 8,
                 max_sessions: int = 100_000) -> None:
        self.index = index
        self.fallback = PowerOfTwoChoices(seed)
        self.running_cost_tokens = running_cost_tokens
        self.no_slot_cost_tokens = no_slot_cost_tokens
        self.imbalance_ratio = imbalance_ratio
        self.imbalance_min = imbalance_min
        self.max_sessions = max_sessions
        self.sessions: dict[str, str] = {}  # session id -> replica id (insertion order: oldest first)

    def _cost(self, r: ReplicaStats) -> int:
        return (r.num_waiting_tokens + self.running_cost_tokens * r.num_running
                + (self.no_slot_cost_tokens if r.num_free_state_slots == 0 else 0))

    def _balanced(self, r: ReplicaStats, least_queue: int) -> bool:
        return r.queue_len <= max(self.imbalance_ratio * least_queue, least_queue + self.imbalance_min)

    def choose(self, request: RoutingRequest, replicas: Sequence[ReplicaStats]) -> Placement:
        """`rank`, then `record` the placement (when the caller places it where ranked)."""
        placement = self.rank(request, replicas)
        self.record(placement.replica_id, request)
        return placement

    def record(self, replica_id: str, request: RoutingRequest) -> None:
        """The request went to `replica_id`: its blocks will be cached there, its session lives there."""
        self.index.record_sent(replica_id, request.prompt_token_ids)
        self.record_session(replica_id, request)

    def record_session(self, replica_id: str, request: RoutingRequest) -> None:
        if request.session_id:
            self.sessions.pop(request.session_id, None)
            self.sessions[request.session_id] = replica_id
            if len(self.sessions) > self.max_sessions:
                self.sessions.pop(next(iter(self.sessions)))

    def rank(self, request: RoutingRequest, replicas: Sequence[ReplicaStats]) -> Placement:
        """The best replica for `request` (nothing recorded)."""
        if not replicas:
            raise ValueError("no replica to choose from")
        least_queue = min(r.queue_len for r in replicas)
        by_id = {r.replica_id: r for r in replicas}
        saved = self.index.match(request.prompt_token_ids)
        session = by_id.get(self.sessions.get(request.session_id, "")) if request.session_id else None
        if session is not None and self._balanced(session, least_queue):
            replica_id, reason = session.replica_id, "session"
        else:
            scored = [(saved.get(r.replica_id, 0) - self._cost(r), r) for r in replicas if saved.get(r.replica_id)]
            if not scored:
                replica_id, reason = self.fallback.choose(request, replicas).replica_id, "pow2"
            else:
                best = max(scored, key=lambda sr: sr[0])[1]
                if self._balanced(best, least_queue):
                    replica_id, reason = best.replica_id, "prefix"
                else:
                    replica_id, reason = self.fallback.choose(request, replicas).replica_id, "imbalance"
        return Placement(replica_id, reason, saved.get(replica_id, 0))
