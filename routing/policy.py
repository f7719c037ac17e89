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
from dataclasses import dataclass
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
