"""The per-replica prefix index's contract (the router issue builds it).

For each replica the index keeps page-sized token blocks of the prompts sent there, which
of those positions hold a recurrent-state checkpoint on the replica, and forgets what the
replica forgot, from the cache events the replicas publish (checkpoint taken or evicted,
KV pages evicted, replica restarted). For a hybrid model the reusable prefix is the last
checkpoint inside the KV match: KV past the last saved state is worthless (DESIGN.md,
"Prefix cache"), so a match is reported in tokens up to that checkpoint.
"""
from __future__ import annotations

from typing import Protocol, Sequence


class PrefixIndex(Protocol):
    def record_sent(self, replica_id: str, prompt_token_ids: Sequence[int]) -> None:
        """A request was placed on `replica_id` (its blocks will be cached there)."""

    def apply_event(self, replica_id: str, event: dict) -> None:
        """A cache event the replica published: {"kind": "checkpoint_taken" | "checkpoint_evicted"
        | "kv_evicted" | "restarted", ...}."""

    def match(self, prompt_token_ids: Sequence[int]) -> dict[str, int]:
        """replica_id -> predicted reusable prefix tokens (ending at a checkpoint for hybrid
        models) for every replica with a non-zero match."""
