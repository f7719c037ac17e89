"""Admission: admit / queue / reject, decided from one view of a replica's load.

    view = scheduler.load_view()                 # LoadView, counted once
    admission.can_start(view)                    # the scheduler: may the head of the queue run now?
    admission.on_arrival(view)                   # the server: take a new request, or refuse it?

Both answer a `Verdict` with a reason a person can read ("max_num_seqs=64 requests are
running", "256 requests are waiting"). The same `LoadView` is what a replica reports to the
router (its load for placement). Pure Python, no torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class LoadView:
    """A replica's load as of the last step (sequences: an n=2 request counts twice)."""

    num_running: int  # sequences holding a request row
    num_waiting: int  # sequences queued, not yet admitted (preempted ones included)
    num_waiting_tokens: int  # tokens those still have to compute
    num_free_req_rows: int
    num_free_state_slots: int  # free now (prefix-cache checkpoints could be evicted for more)
    num_free_kv_pages: int  # free now (cached prefixes could be evicted for more)
    max_num_seqs: int

    def routing_stats(self) -> dict[str, int]:
        """What the replica reports to the router (Serve's `record_routing_stats`;
        `routing.ReplicaStats.from_dict` reads it)."""
        return {"num_running": self.num_running, "num_waiting": self.num_waiting,
                "num_waiting_tokens": self.num_waiting_tokens, "num_free_state_slots": self.num_free_state_slots,
                "num_free_kv_pages": self.num_free_kv_pages}


@dataclass(frozen=True)
class Verdict:
    decision: Literal["admit", "queue", "reject"]
    reason: str = ""

    @property
    def admitted(self) -> bool:
        return self.decision == "admit"


ADMIT = Verdict("admit")


class Admission:
    """The policy. `max_waiting` bounds the queue a new request may join (None: unbounded)."""

    def __init__(self, max_num_seqs: int, max_waiting: int | None = None) -> None:
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        if max_waiting is not None and max_waiting < 1:
            raise ValueError(f"max_waiting must be >= 1 or None, got {max_waiting}")
        self.max_num_seqs = max_num_seqs
        self.max_waiting = max_waiting

    def can_start(self, view: LoadView) -> Verdict:
        """May one more sequence start running? (The scheduler asks for the head of its queue;
        the cache manager then allocates, evicting cached prefixes when it must.)"""
        if view.num_running >= self.max_num_seqs:
            return Verdict("queue", f"max_num_seqs={self.max_num_seqs} sequences are running")
        if view.num_free_req_rows == 0:
            return Verdict("queue", "no free request row")
        return ADMIT

    def on_arrival(self, view: LoadView) -> Verdict:
        """Take a new request into the queue, or refuse it (the server answers 503)."""
        if self.max_waiting is not None and view.num_waiting >= self.max_waiting:
            return Verdict("reject", f"{view.num_waiting} requests are waiting (limit {self.max_waiting})")
        return ADMIT if not view.num_waiting and view.num_running < self.max_num_seqs else Verdict("queue")
