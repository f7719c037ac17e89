"""One prefix index for every router: the authoritative copy (in the Router actor) and the
operations that keep local copies (in each Serve RequestRouter) equal to it. Plain classes.

    routers ──placements (replica, block hashes)──▶ SharedPrefixIndex ◀──replica reports── routers
               (batched, asynchronously)              │ ops log (version)   (each replica's cache
                                                      ▼                     events + live checkpoints,
    routers ◀── ops since their version, or a snapshot ┘                     from record_routing_stats)

A replica report is what its `CacheEventRing.snapshot()` carries: ``{"seq": last event number,
"events": [(seq, event), ...] (the recent ones), "checkpoints": [block hashes of the
checkpoints it holds now]}``. The index applies the events it has not seen, in order. When it
cannot (it never saw this replica, or the ring moved past the last event it applied, or the
replica's numbering went back: it restarted) it rebuilds that replica from its live
checkpoints (`BlockPrefixIndex.restore_checkpoints`), forgetting every prediction made for
it: a router that missed events predicts less, never more, than the replica holds.
"""
from __future__ import annotations

from collections import deque
from typing import Sequence

from .prefix_index import BlockPrefixIndex

# ops, as the log holds them and local copies apply them:
#   ("sent", replica_id, hashes)       a placement (BlockPrefixIndex.record_hashes)
#   ("event", replica_id, event)       a cache event the replica published
#   ("restore", replica_id, hashes)    rebuilt from the replica's live checkpoints
#   ("forget", replica_id, None)       the replica died or went silent


def apply_ops(index: BlockPrefixIndex, ops: Sequence[tuple]) -> None:
    for kind, replica_id, arg in ops:
        if kind == "sent":
            index.record_hashes(replica_id, arg)
        elif kind == "event":
            index.apply_event(replica_id, arg)
        elif kind == "restore":
            index.restore_checkpoints(replica_id, arg)
        elif kind == "forget":
            index.forget_replica(replica_id)
        else:
            raise ValueError(f"unknown index op {kind!r}")


class SharedPrefixIndex:
    """The index every router shares, with a bounded log of the ops that changed it.

    `version` counts ops ever applied; `changes_since(v)` gives the ops after version v, or
    None when the log no longer reaches back that far (then a router loads `snapshot()`).
    `last_seq[replica]` is the last cache event applied per replica."""

    def __init__(self, page_size: int, checkpoint_interval: int, hybrid: bool = True,
                 max_blocks_per_replica: int = 1 << 20, log_capacity: int = 200_000) -> None:
        self.index = BlockPrefixIndex(page_size, checkpoint_interval, hybrid, max_blocks_per_replica)
        self.log: deque[tuple] = deque(maxlen=log_capacity)
        self.version = 0
        self.last_seq: dict[str, int] = {}
        self.last_heard: dict[str, float] = {}  # replica -> time of its last report or placement
        self.num_rebuilds = 0

    def _apply(self, op: tuple) -> None:
        apply_ops(self.index, [op])
        self.log.append(op)
        self.version += 1

    def record_sent(self, replica_id: str, hashes: Sequence[int], now: float = 0.0) -> None:
        self._apply(("sent", replica_id, list(hashes)))
        self.last_heard[replica_id] = max(now, self.last_heard.get(replica_id, now))

    def report(self, replica_id: str, report: dict, now: float = 0.0) -> None:
        """A replica's cache-event report (module docstring); events already applied are skipped."""
        self.last_heard[replica_id] = now
        events = report.get("events") or []
        seq = int(report.get("seq", events[-1][0] if events else 0))
        last = self.last_seq.get(replica_id)
        if last is not None and seq == last:
            return
        first = events[0][0] if events else seq + 1
        if last is None or seq < last or first > last + 1:  # never seen, restarted, or missed events
            self._apply(("restore", replica_id, list(report.get("checkpoints") or [])))
            self.num_rebuilds += 1
        else:
            for event_seq, event in events:
                if event_seq > last:
                    self._apply(("event", replica_id, event))
        self.last_seq[replica_id] = seq

    def forget(self, replica_id: str) -> None:
        self._apply(("forget", replica_id, None))
        self.last_seq.pop(replica_id, None)
        self.last_heard.pop(replica_id, None)

    def forget_silent(self, now: float, ttl_s: float) -> list[str]:
        """Forget replicas not heard of for `ttl_s` (dead ones no router told us about)."""
        silent = [r for r, t in self.last_heard.items() if now - t > ttl_s]
        for replica_id in silent:
            self.forget(replica_id)
        return silent

    def changes_since(self, version: int) -> list[tuple] | None:
        if version > self.version:
            return None
        missing = self.version - version
        if missing > len(self.log):
            return None
        n = len(self.log)
        return [self.log[i] for i in range(n - missing, n)]  # from the right end: O(missing)

    def snapshot(self) -> dict:
        return self.index.snapshot()

    def num_blocks(self) -> int:
        return self.index.num_blocks()
