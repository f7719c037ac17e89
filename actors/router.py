"""The `Router` actor: the one prefix index every Serve RequestRouter shares and the
cluster-wide suffix index (fed and copied by actors/suffix_feed.py), and `RouterClient`,
the local copy a RequestRouter routes from.

    HybridRequestRouter (ingress 1) ─┐ every refresh_period_s, from a background thread:
    HybridRequestRouter (ingress 2) ─┼─▶ Router.sync(version, placements, replica reports, forgets)
                                     │     ◀─ ops since `version` (or a snapshot), epoch
    routing decisions read the local copy only: no Ray call per decision, none on the
    token-streaming path

The actor is named (`router_name(app)`, namespace "hybrid_serve"), detached (it outlives
the ingress replica that created it) and restarts (max_restarts=-1). A restarted actor is
empty with a new epoch: the clients see the epoch change, resend every replica's report
(whose live checkpoints rebuild that replica, routing/shared_index.py) and reload. While
the actor is unreachable (no successful sync for `stale_after_s`), `RouterClient.index()`
is None and the RequestRouter places by power of two choices.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Callable, Sequence

import ray

from ..routing import BlockPrefixIndex, SuffixIndex
from ..routing.shared_index import SharedPrefixIndex, apply_ops

logger = logging.getLogger(__name__)

NAMESPACE = "hybrid_serve"


def router_name(app_name: str, page_size: int, checkpoint_interval: int, hybrid: bool) -> str:
    """One actor per application and index geometry (an index is only valid for one)."""
    return f"hybrid_serve_router:{app_name}:{page_size}:{checkpoint_interval}:{int(hybrid)}"


@ray.remote(num_cpus=0, max_restarts=-1, max_concurrency=1)
class Router:
    """Thin: a `SharedPrefixIndex`, a `SuffixIndex` and the clock. Every call is one short,
    local operation."""

    def __init__(self, page_size: int, checkpoint_interval: int, hybrid: bool = True,
                 replica_ttl_s: float = 300.0, log_capacity: int = 200_000, suffix_max_tokens: int = 1 << 22) -> None:
        self.epoch = uuid.uuid4().hex
        self.shared = SharedPrefixIndex(page_size, checkpoint_interval, hybrid, log_capacity=log_capacity)
        self.suffix = SuffixIndex(max_tokens=suffix_max_tokens)
        self.replica_ttl_s = replica_ttl_s

    def add_documents(self, documents: Sequence[Sequence[int]]) -> None:
        """Finished requests' prompt + output token ids, from any replica (fire and forget)."""
        for tokens in documents:
            self.suffix.add(tokens)

    def documents_since(self, doc_id: int) -> dict:
        """The suffix documents a copy holding ids < `doc_id` of this epoch lacks."""
        first, documents = self.suffix.documents_since(doc_id)
        return {"epoch": self.epoch, "first_id": first, "documents": documents}

    def sync(self, version: int, placements: Sequence[tuple[str, list[int]]] = (),
             reports: dict | None = None, forgets: Sequence[str] = ()) -> dict:
        """Apply a client's batch (forgets, then replica reports, then placements) and answer
        the ops after `version`, or a snapshot when the log does not reach back that far or the
        client's `version` is -1 (it knows nothing yet)."""
        now = time.monotonic()
        for replica_id in forgets:
            self.shared.forget(replica_id)
        for replica_id, report in (reports or {}).items():
            self.shared.report(replica_id, report, now)
        for replica_id, hashes in placements:
            self.shared.record_sent(replica_id, hashes, now)
        self.shared.forget_silent(now, self.replica_ttl_s)
        ops = self.shared.changes_since(version) if version >= 0 else None
        return {"epoch": self.epoch, "version": self.shared.version, "ops": ops,
                "snapshot": self.shared.snapshot() if ops is None else None,
                "last_seq": {r: self.shared.last_seq.get(r) for r in (reports or {})}}

    def stats(self) -> dict:
        return {"epoch": self.epoch, "version": self.shared.version, "num_blocks": self.shared.num_blocks(),
                "num_replicas": len(self.shared.index.replicas), "num_rebuilds": self.shared.num_rebuilds,
                "suffix_documents": len(self.suffix), "suffix_tokens": self.suffix.num_tokens}


def get_router(name: str, page_size: int, checkpoint_interval: int, hybrid: bool = True):
    """The named Router actor, created by whichever caller comes first."""
    return Router.options(name=name, namespace=NAMESPACE, lifetime="detached", get_if_exists=True).remote(
        page_size, checkpoint_interval, hybrid)


class RouterClient:
    """A RequestRouter's local copy of the shared prefix index, kept in step by a daemon thread.

    `record_sent` applies a placement locally at once (the next turn of the conversation sees
    it) and queues it for the actor; `report` keeps a replica's latest cache-event report
    (its routing stats) for the next sync; `index()` is the local `BlockPrefixIndex` to route
    from, or None while the actor is unreachable. Callers hold `lock` while they read it."""

    MAX_PENDING = 10_000  # placements queued while the actor is away (oldest dropped: predicts less)
    REPORT_EVERY_S = 10.0  # resend an unchanged report this often (the actor forgets silent replicas)

    def __init__(self, get_actor: Callable, page_size: int, checkpoint_interval: int, hybrid: bool = True,
                 refresh_period_s: float = 0.2, stale_after_s: float = 2.0, call_timeout_s: float = 2.0,
                 start: bool = True) -> None:
        self.get_actor = get_actor
        self.local = BlockPrefixIndex(page_size, checkpoint_interval, hybrid)
        self.refresh_period_s, self.stale_after_s, self.call_timeout_s = refresh_period_s, stale_after_s, call_timeout_s
        self.lock = threading.Lock()
        self.epoch: str | None = None
        self.version = -1
        self.last_ok = float("-inf")
        self.num_failures = 0
        self._actor = None
        self._placements: list[tuple[str, list[int]]] = []
        self._forgets: list[str] = []
        self._reports: dict[str, dict] = {}  # replica -> latest report
        self._sent: dict[str, tuple[int, float]] = {}  # replica -> (seq, when) last sent to this epoch
        self._acked: dict[str, int] = {}  # replica -> the actor's last applied event seq
        self.ready = threading.Event()  # set by the first successful sync
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="router-client", daemon=True)
        if start:
            self._thread.start()

    # ----- called from the routing path (cheap, local) -----------------------------------------
    def index(self) -> BlockPrefixIndex | None:
        return self.local if time.monotonic() - self.last_ok <= self.stale_after_s else None

    def record_sent(self, replica_id: str, prompt_token_ids: Sequence[int]) -> None:
        hashes = self.local.sent_hashes(prompt_token_ids)
        with self.lock:
            self.local.record_hashes(replica_id, hashes)
            self._placements.append((replica_id, hashes))
            if len(self._placements) > self.MAX_PENDING:
                del self._placements[: len(self._placements) - self.MAX_PENDING]

    def report(self, replica_id: str, report: dict | None) -> None:
        if report:
            self._reports[replica_id] = report

    def forget(self, replica_id: str) -> None:
        with self.lock:
            self.local.forget_replica(replica_id)
            self._forgets.append(replica_id)
        self._reports.pop(replica_id, None)

    # ----- the background sync -------------------------------------------------------------------
    def _outgoing_reports(self, now: float) -> dict[str, dict]:
        out = {}
        for replica_id, report in list(self._reports.items()):
            seq = int(report.get("seq", 0))
            sent = self._sent.get(replica_id)
            if sent is not None and sent[0] == seq and now - sent[1] < self.REPORT_EVERY_S:
                continue
            acked = self._acked.get(replica_id, 0)
            out[replica_id] = {"seq": seq, "checkpoints": report.get("checkpoints") or [],
                               "events": [e for e in report.get("events") or [] if e[0] > acked]}
        return out

    def sync_once(self) -> None:
        """One round trip to the actor (raises when it fails; the loop counts and retries)."""
        if self._actor is None:
            self._actor = self.get_actor()
        now = time.monotonic()
        with self.lock:
            placements, forgets = self._placements, self._forgets
            self._placements, self._forgets = [], []
        reports = self._outgoing_reports(now)
        try:
            reply = ray.get(self._actor.sync.remote(self.version, placements, reports, forgets),
                            timeout=self.call_timeout_s)
        except Exception:
            with self.lock:  # not applied (or not known to be): send again, after newer ones
                self._placements[:0] = placements
                self._forgets[:0] = forgets
            raise
        if reply["epoch"] != self.epoch:  # a new (restarted) actor: everything goes again
            self.epoch, self._sent, self._acked = reply["epoch"], {}, {}
            if reply["snapshot"] is None:  # it answered ops for our old version: ask again
                self.version = -1
                return self.sync_once()
        for replica_id, report in reports.items():
            self._sent[replica_id] = (report["seq"], now)
            if reply["last_seq"].get(replica_id) is not None:
                self._acked[replica_id] = reply["last_seq"][replica_id]
        self._apply(reply)
        self.last_ok = time.monotonic()
        self.ready.set()

    def _apply(self, reply: dict) -> None:
        with self.lock:
            if reply["snapshot"] is not None:
                self.local.load(reply["snapshot"])
                pending = self._placements  # placed since the call: keep them visible
                for replica_id, hashes in pending:
                    self.local.record_hashes(replica_id, hashes)
        ops = reply["ops"] or []
        for start in range(0, len(ops), 256):  # short lock holds: routing decisions interleave
            with self.lock:
                apply_ops(self.local, ops[start:start + 256])
        self.version = reply["version"]

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync_once()
                self.num_failures = 0
            except Exception as exc:  # noqa: BLE001 - the actor may be restarting; routing falls back
                self.num_failures += 1
                if self.num_failures in (1, 10) or self.num_failures % 100 == 0:
                    logger.warning("router actor sync failed (%d in a row): %r", self.num_failures, exc)
                if self.num_failures > 3:  # look it up again (it may have been replaced)
                    self._actor = None
            self._stop.wait(self.refresh_period_s)

    def stop(self) -> None:
        self._stop.set()
