"""A request's stream of deltas on its caller's event loop (`AsyncLLMEngine.generate`): the
deltas the engine's reports hand over are merged into one pending delta, and the consumer is
woken when it is due: at once, or as a `StreamPace` spaces them (the served replica's message
budget), so that hundreds of streams cost their consumers a wake-up per message, not one per
engine step.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Callable

from .engine_core import RequestDelta


def deliver(items: list[tuple["RequestStream", RequestDelta]]) -> None:
    """On the callers' event loop: a step's deltas into their requests' streams (the engine
    thread hands a whole step over in one `call_soon_threadsafe`: with hundreds of streams,
    one wake-up of the loop and one pass of the GIL per step instead of one per request)."""
    for stream, item in items:
        stream.put(item)


def _no_gap() -> float:
    return 0.0


@dataclass
class StreamPace:
    """How often a consumer takes a request's deltas (`generate(pace=...)`: the replica's
    stream message budget, deploy/server.py). The first delta and the last are taken at once;
    in between, one once a sequence has at least `min_tokens` new tokens waiting and `gap_s()`
    seconds have passed since the previous one was taken. The deltas in between are merged
    without waking the consumer: with hundreds of streams, one wake-up of a consumer per
    message it sends instead of one per engine step."""

    min_tokens: int = 1
    gap_s: Callable[[], float] = _no_gap

    def due(self, delta: RequestDelta, since_last_s: float) -> bool:
        """Whether a delta that does not end its stream is taken `since_last_s` after the
        previous one (for a consumer that applies the pace itself, delta by delta)."""
        return delta.num_new_tokens() >= self.min_tokens and since_last_s >= self.gap_s()


@dataclass
class RequestStream:
    """A caller's request, as the front end sees it. The fields from `pending` on belong to
    the caller's loop: the deltas not taken yet (merged into one), the error that ends the
    stream after them, and when the consumer wants to be woken (`ready`)."""

    request_id: str
    num_seqs: int
    loop: asyncio.AbstractEventLoop
    arrival: float
    first_token: bool = False
    last_token_time: dict[int, float] = field(default_factory=dict)  # per sequence index
    num_done: int = 0  # sequences finished
    pending: RequestDelta | None = None
    error: BaseException | None = None
    hold_until: float | None = None  # (time.monotonic()) a delta that does not end the stream waits till then
    min_tokens: int = 0  # ... and until a sequence has this many new tokens
    waiter: asyncio.Future | None = None
    timer: asyncio.TimerHandle | None = None

    def post(self, item) -> None:
        """From any thread: a delta or the error that ends the stream."""
        try:
            self.loop.call_soon_threadsafe(self.put, item)
        except RuntimeError:  # the caller's loop is closed: nobody listens any more
            pass

    def put(self, item) -> None:
        """On the caller's loop: merges a delta into the pending one (or records the error) and
        wakes the consumer if what is pending is now due."""
        if isinstance(item, BaseException):
            if self.error is None:
                self.error = item
        elif self.pending is None:
            self.pending = item
        else:
            self.pending = self.pending.merge(item)
        if self.waiter is not None and self.ready():
            self._wake()

    def ready(self) -> bool:
        if self.error is not None:
            return True
        p = self.pending
        if p is None:
            return False
        if p.finished or self.hold_until is None and self.min_tokens <= 0:
            return True
        return ((self.hold_until is None or time.monotonic() >= self.hold_until)
                and p.num_new_tokens() >= self.min_tokens)

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _on_hold_end(self) -> None:
        self.timer = None
        if self.waiter is None:
            return
        if self.ready():
            self._wake()
        elif self.hold_until is not None and (left := self.hold_until - time.monotonic()) > 0:
            self.timer = self.loop.call_later(left, self._on_hold_end)  # (a timer may fire a little early)

    async def wait(self) -> None:
        """Until what is pending is due, or the stream ended."""
        while not self.ready():
            self.waiter = self.loop.create_future()
            if self.hold_until is not None and (left := self.hold_until - time.monotonic()) > 0:
                self.timer = self.loop.call_later(left, self._on_hold_end)
            try:
                await self.waiter
            finally:
                self.waiter = None
                if self.timer is not None:
                    self.timer.cancel()
                    self.timer = None
