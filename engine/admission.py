"""Admission: admit / queue / reject, decided from one view of a replica's load.

    view = scheduler.load_view()                 # LoadView, counted once
    admission.can_start(view)                    # the scheduler: may the head of the queue run now?
    admission.on_arrival(view, queue, num_tokens, num_answered=n)  # the replica: take a new request, or refuse it?

Both answer a `Verdict` with a reason a person can read ("max_num_seqs=64 requests are
running", "80 requests are waiting for their first token (limit 80: ...)"). The same
`LoadView` is what a replica reports to the router (its load for placement). The arrival
bound is on the replica's `FirstTokenQueue` (requests and prompt tokens not yet answered
with a first token: what a new request waits behind), counted exactly at arrival and first
token, so a burst between two engine steps cannot overshoot it. Those requests include the
ones already prefilling in a batch row, so the bound on them is `max_waiting` plus the rows
that answered requests (past their first token, counted by the replica) leave free: with
Serve's cap of max_num_seqs + max_waiting calls per replica, a call Serve lets through is
never refused for the number of requests. Pure Python, no torch.
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
    # held by prefix-cache checkpoints and running requests' reply snapshots (an admission
    # evicts or takes one if it must)
    num_checkpoint_state_slots: int = 0
    # prompt tokens the running sequences still have to compute (chunked prefills in progress:
    # a replica prefilling long prompts is busy although nothing waits)
    num_running_prefill_tokens: int = 0

    def routing_stats(self) -> dict[str, int]:
        """What the replica reports to the router (Serve's `record_routing_stats`;
        `routing.ReplicaStats.from_dict` reads it)."""
        return {"num_running": self.num_running, "num_waiting": self.num_waiting,
                "num_waiting_tokens": self.num_waiting_tokens, "num_free_state_slots": self.num_free_state_slots,
                "num_free_kv_pages": self.num_free_kv_pages, "num_checkpoint_state_slots": self.num_checkpoint_state_slots,
                "num_running_prefill_tokens": self.num_running_prefill_tokens}


@dataclass(frozen=True)
class Verdict:
    decision: Literal["admit", "queue", "reject"]
    reason: str = ""

    @property
    def admitted(self) -> bool:
        return self.decision == "admit"


ADMIT = Verdict("admit")


@dataclass
class FirstTokenQueue:
    """A replica's accepted requests that have not produced their first token yet (queued
    or prefilling) and their prompt tokens. Single-threaded (the replica's event loop)."""

    num_requests: int = 0
    num_tokens: int = 0

    def enter(self, num_tokens: int) -> None:
        self.num_requests += 1
        self.num_tokens += num_tokens

    def leave(self, num_tokens: int) -> None:
        self.num_requests -= 1
        self.num_tokens -= num_tokens
        assert self.num_requests >= 0 and self.num_tokens >= 0, "first-token queue went negative"


class Admission:
    """The policy. `max_waiting` bounds the requests a new one may wait behind for a batch
    row (those without a first token beyond the rows free of answered requests), and
    `max_waiting_tokens` the prompt tokens of all without a first token (None: unbounded); an
    empty queue always takes one request, however long its prompt, so no request is refused
    forever."""

    def __init__(self, max_num_seqs: int, max_waiting: int | None = None,
                 max_waiting_tokens: int | None = None) -> None:
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        if max_waiting is not None and max_waiting < 1:
            raise ValueError(f"max_waiting must be >= 1 or None, got {max_waiting}")
        if max_waiting_tokens is not None and max_waiting_tokens < 1:
            raise ValueError(f"max_waiting_tokens must be >= 1 or None, got {max_waiting_tokens}")
        self.max_num_seqs = max_num_seqs
        self.max_waiting = max_waiting
        self.max_waiting_tokens = max_waiting_tokens

    def can_start(self, view: LoadView) -> Verdict:
        """May one more sequence start running? (The scheduler asks for the head of its queue;
        the cache manager then allocates, evicting cached prefixes when it must.)"""
        if view.num_running >= self.max_num_seqs:
            return Verdict("queue", f"max_num_seqs={self.max_num_seqs} sequences are running")
        if view.num_free_req_rows == 0:
            return Verdict("queue", "no free request row")
        return ADMIT

    def on_arrival(self, view: LoadView, queue: FirstTokenQueue, num_tokens: int, *, num_answered: int) -> Verdict:
        """Take a new request of `num_tokens` prompt tokens, or refuse it (the replica answers
        503 with Retry-After). `num_answered`: the replica's requests past their first token
        and not yet ended; each holds a batch row, and the rows they leave free
        (max_num_seqs - num_answered) are taken, or about to be, by requests of `queue`, so
        those do not count against `max_waiting`: at most max_waiting + free rows requests
        without a first token."""
        if self.max_waiting is not None:
            free_rows = max(0, self.max_num_seqs - num_answered)
            limit = self.max_waiting + free_rows
            if queue.num_requests >= limit:
                return Verdict("reject", f"{queue.num_requests} requests are waiting for their first token "
                                         f"(limit {limit}: max_waiting_requests={self.max_waiting} + {free_rows} "
                                         f"rows of max_num_seqs={self.max_num_seqs} not held by answered requests)")
        if self.max_waiting_tokens is not None and queue.num_requests and \
                queue.num_tokens + num_tokens > self.max_waiting_tokens:
            return Verdict("reject", f"{queue.num_tokens} prompt tokens are waiting and this request brings "
                                     f"{num_tokens} (limit {self.max_waiting_tokens})")
        return ADMIT if not view.num_waiting and view.num_running < self.max_num_seqs else Verdict("queue")
