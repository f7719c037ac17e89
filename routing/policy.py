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
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Callable, Protocol, Sequence


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
    num_received_requests: int = -1  # requests the replica ever received (-1: not reported)
    # state slots held by prefix-cache checkpoints: a new request evicts one when none is free
    num_checkpoint_state_slots: int = 0
    num_running_prefill_tokens: int = 0  # prompt tokens its running requests still have to compute

    @classmethod
    def from_dict(cls, replica_id: str, stats: dict) -> "ReplicaStats":
        """From a replica's routing stats (missing keys count as 0: a replica not yet reporting;
        a missing arrival counter as -1)."""
        return cls(replica_id, *(int(stats.get(k, 0)) for k in (
            "num_running", "num_waiting", "num_waiting_tokens", "num_free_state_slots", "num_free_kv_pages")),
            num_received_requests=int(stats.get("num_received_requests", -1)),
            num_checkpoint_state_slots=int(stats.get("num_checkpoint_state_slots", 0)),
            num_running_prefill_tokens=int(stats.get("num_running_prefill_tokens", 0)))

    @property
    def num_obtainable_state_slots(self) -> int:
        """Slots a new request can get: free ones, and those a checkpoint holds (the engine's
        admission evicts one when none is free)."""
        return self.num_free_state_slots + self.num_checkpoint_state_slots

    @property
    def queue_len(self) -> int:
        return self.num_running + self.num_waiting


@dataclass(frozen=True)
class Placement:
    replica_id: str
    reason: str  # e.g. "pow2", "prefix", "session": a label for the decisions metric
    predicted_hit_tokens: int = field(default=0, compare=False)  # the reusable prefix predicted there
    # the request continues no earlier prompt (a new conversation over a shared prefix, or no
    # match): where it goes is where a new conversation will live
    new_conversation: bool = field(default=False, compare=False)


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


class _Unreported:
    """What a policy placed on one replica that the replica's load reports do not show yet:
    requests and the prefill tokens they bring (prompt minus predicted hit), by key, oldest
    first."""

    def __init__(self) -> None:
        self.entries: OrderedDict[object, tuple[float, int]] = OrderedDict()  # key -> (when placed, tokens)
        self.requests = 0
        self.tokens = 0
        self.completed = 0  # entries that completed before a report acknowledged their arrival

    def add(self, key: object, now: float, tokens: int) -> None:
        self.remove(key)
        self.entries[key] = (now, tokens)
        self.requests += 1
        self.tokens += tokens

    def remove(self, key: object) -> bool:
        entry = self.entries.pop(key, None)
        if entry is not None:
            self.requests -= 1
            self.tokens -= entry[1]
        return entry is not None

    def complete(self, key: object) -> None:
        if self.remove(key):
            self.completed += 1  # its arrival is still in a later report's count

    def acknowledge(self, arrivals: int) -> None:
        """A report counts `arrivals` more requests received: the oldest entries are in it now
        (first those that already completed). Arrivals from other routers make this drop more
        of ours than arrived: the load is then undercounted until the next report, never doubled."""
        done = min(arrivals, self.completed)
        self.completed -= done
        for _ in range(min(arrivals - done, len(self.entries))):
            self.remove(next(iter(self.entries)))

    def expire(self, before: float) -> None:
        while self.entries:
            key, (when, _) = next(iter(self.entries.items()))
            if when >= before:
                return
            self.remove(key)


class PrefixAwarePolicy:
    """Placement by predicted saved prefill against load, for hybrid models.

    Every replica is scored, those where nothing matches too (saved 0): saved = the reusable
    prefix the index predicts there (ending at a state checkpoint on a hybrid model), cost =
    its waiting tokens + the prompt tokens its running requests still have to compute (a long
    chunked prefill in progress) + `running_cost_tokens` per running request, + `no_slot_cost_tokens`
    when no state slot can be had (a hybrid replica's concurrency is capped by them, not by
    KV): none free and, with `checkpoint_slots_obtainable` (default), none held by a
    prefix-cache checkpoint either, since the engine's admission evicts one (counting free
    slots only, a warm replica's cache full of checkpoints reads as full, and flickers to one
    free slot as requests end: on 4 GPUs, 42 of 128 later turns left the replica holding
    their history for the replica that had just freed one),
    + what this policy placed there since the replica's last load report (reports lag by up to
    the stats period: without this a burst goes wholly to the replica that looked best in the
    last one). A placement counts until the replica's next report (one whose load changed),
    its completion (`complete`, where the caller learns of it) or `unreported_ttl_s`. The best
    `saved_weight x saved - cost` wins (ties at random), unless it is out of balance (`imbalance_ratio` x the
    least queue, and `imbalance_min` more): then the less loaded of two random replicas, as
    when nothing matches anywhere. A request with a session id goes where the session went
    last while that replica is in balance. Placements are recorded in the index (`record`), so
    the next request of the conversation finds them.

    Decision reasons (the metric's label): "prefix" (placed where a prefix matches),
    "session", "pow2" (nothing matches anywhere), "imbalance" (a prefix matches somewhere,
    but its replicas were overloaded: by score or out of balance).

    New conversations are spread by count. A request whose best predicted prefix is no whole
    earlier prompt (`index.ends_a_prompt`: it shares a system prompt inside other prompts, or
    matches nothing) continues no conversation: it goes to one of the replicas that recently
    took the fewest new conversations (within
    `conversation_slack`; counts decay with `conversation_half_life_s`), by score among those.
    Scored as one request's time to a first token instead, a system prompt held by the first
    replicas to compute it outweighs a few requests of queue, so those replicas took every
    new conversation while the others idled (on 4 GPUs: 16 conversations on each of two
    replicas, none on the others, then later turns moved away from their histories as the
    two evicted them). A new conversation's later turns come back to where it went: its
    placement is load for the conversation's life, which a queue cannot show.

    A conversation's next turn (its best prefix is its whole previous prompt, on its home
    replica) counts the history only its home holds `continuation_weight` times (default 4):
    moving it recomputes that history now, and the copy left behind on the new replica takes
    state slots the conversations living there need (on 4 GPUs, 65-74 of 128 later turns
    moved for a few hundred queued tokens, scored as one request's time to a first token, and
    lost 82-113k tokens).

    `saved_weight` (default 1: saved and queued tokens weigh the same, this request's own time
    to a first token): > 1 also counts that tokens recomputed on a busy replica delay the
    requests queued behind them there, so a conversation leaves the replica holding its
    history only for a larger load difference.
    """

    def __init__(self, index, seed: int | None = None, running_cost_tokens: int = 64,
                 no_slot_cost_tokens: int = 4096, imbalance_ratio: float = 2.0, imbalance_min: int = 8,
                 max_sessions: int = 100_000, unreported_ttl_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic, saved_weight: float = 1.0,
                 conversation_half_life_s: float = 60.0, conversation_slack: float = 1.0,
                 continuation_weight: float = 4.0, checkpoint_slots_obtainable: bool = True) -> None:
        if not saved_weight > 0:
            raise ValueError(f"saved_weight must be > 0, got {saved_weight!r}")
        if not conversation_half_life_s > 0:
            raise ValueError(f"conversation_half_life_s must be > 0, got {conversation_half_life_s!r}")
        if not conversation_slack >= 0:
            raise ValueError(f"conversation_slack must be >= 0, got {conversation_slack!r}")
        if not continuation_weight >= 1:
            raise ValueError(f"continuation_weight must be >= 1, got {continuation_weight!r}")
        self.continuation_weight = continuation_weight
        self.checkpoint_slots_obtainable = checkpoint_slots_obtainable
        self.index = index
        self.fallback = PowerOfTwoChoices(seed)
        self._rng = random.Random(seed)
        self.running_cost_tokens = running_cost_tokens
        self.no_slot_cost_tokens = no_slot_cost_tokens
        self.imbalance_ratio = imbalance_ratio
        self.imbalance_min = imbalance_min
        self.saved_weight = saved_weight
        self.max_sessions = max_sessions
        self.unreported_ttl_s = unreported_ttl_s
        self.clock = clock
        self.sessions: dict[str, str] = {}  # session id -> replica id (insertion order: oldest first)
        self.unreported: dict[str, _Unreported] = {}
        self.last_report: dict[str, ReplicaStats] = {}
        self.conversation_half_life_s = conversation_half_life_s
        self.conversation_slack = conversation_slack
        self.new_conversations: dict[str, tuple[float, float]] = {}  # replica -> (decayed count, as of when)

    def _cost(self, r: ReplicaStats, extra: _Unreported | None) -> int:
        slots = r.num_obtainable_state_slots if self.checkpoint_slots_obtainable else r.num_free_state_slots
        return (r.num_waiting_tokens + r.num_running_prefill_tokens + (extra.tokens if extra else 0)
                + self.running_cost_tokens * r.num_running
                + (self.no_slot_cost_tokens if slots == 0 else 0))

    def _balanced(self, queue_len: int, least_queue: int) -> bool:
        return queue_len <= max(self.imbalance_ratio * least_queue, least_queue + self.imbalance_min)

    def choose(self, request: RoutingRequest, replicas: Sequence[ReplicaStats]) -> Placement:
        """`rank`, then `record` the placement (when the caller places it where ranked)."""
        placement = self.rank(request, replicas)
        self.record(placement.replica_id, request, placement.predicted_hit_tokens)
        if placement.new_conversation:
            self.record_new_conversation(placement.replica_id)
        return placement

    def num_new_conversations(self, replica_id: str) -> float:
        """New conversations placed on `replica_id`, each weighing half as much every
        `conversation_half_life_s`."""
        count, when = self.new_conversations.get(replica_id, (0.0, 0.0))
        return count * 0.5 ** ((self.clock() - when) / self.conversation_half_life_s) if count else 0.0

    def record_new_conversation(self, replica_id: str) -> None:
        """A request of a `Placement.new_conversation` went to `replica_id`."""
        self.new_conversations[replica_id] = (self.num_new_conversations(replica_id) + 1.0, self.clock())

    def unrecord_new_conversation(self, replica_id: str) -> None:
        """Take back a `record_new_conversation` (the request went elsewhere after all)."""
        count = self.num_new_conversations(replica_id)
        if count:
            self.new_conversations[replica_id] = (max(0.0, count - 1.0), self.clock())

    def record(self, replica_id: str, request: RoutingRequest, predicted_hit_tokens: int = 0) -> None:
        """The request went to `replica_id`: its blocks will be cached there, its session lives
        there, its uncached prompt tokens are load there until the replica reports them."""
        self.index.record_sent(replica_id, request.prompt_token_ids)
        self.record_session(replica_id, request)
        self.record_load(replica_id, len(request.prompt_token_ids) - predicted_hit_tokens)

    def record_session(self, replica_id: str, request: RoutingRequest) -> None:
        if request.session_id:
            self.sessions.pop(request.session_id, None)
            self.sessions[request.session_id] = replica_id
            if len(self.sessions) > self.max_sessions:
                self.sessions.pop(next(iter(self.sessions)))

    def record_load(self, replica_id: str, tokens: int, key: object = None) -> None:
        """A request of `tokens` prefill tokens placed on `replica_id` (not in its reports yet);
        `key` names it for `complete`."""
        if replica_id not in self.unreported:
            self.unreported[replica_id] = _Unreported()
        self.unreported[replica_id].add(object() if key is None else key, self.clock(), max(tokens, 0))

    def unrecord_load(self, replica_id: str, key: object) -> None:
        """Take back a `record_load` named `key` (the request went elsewhere after all)."""
        if replica_id in self.unreported:
            self.unreported[replica_id].remove(key)

    def complete(self, replica_id: str, key: object) -> None:
        """The request `record_load` named `key` finished on `replica_id`: no longer its load."""
        if replica_id in self.unreported:
            self.unreported[replica_id].complete(key)

    def forget(self, replica_id: str) -> None:
        """The replica is gone: drop its load bookkeeping (its index entries go with the index's)."""
        self.unreported.pop(replica_id, None)
        self.last_report.pop(replica_id, None)
        self.new_conversations.pop(replica_id, None)

    def _unreported_load(self, replicas: Sequence[ReplicaStats]) -> dict[str, _Unreported]:
        """Each replica's placements not in its load report yet. A changed report that counts
        the requests its replica received covers as many of the oldest placements as it
        received since the last report (a report sampled before the latest placements reached
        the replica covers only the earlier ones: taking it to cover all of them made a
        replica that had just taken a burst look idle, and the next burst went there too); one
        without that count (or whose count went back: a restart) covers all of them."""
        horizon = self.clock() - self.unreported_ttl_s
        out = {}
        for r in replicas:
            last = self.last_report.get(r.replica_id)
            if last != r:
                self.last_report[r.replica_id] = r
                extra = self.unreported.get(r.replica_id)
                if (extra is not None and last is not None and last.num_received_requests >= 0
                        and r.num_received_requests >= last.num_received_requests):
                    extra.acknowledge(r.num_received_requests - last.num_received_requests)
                else:
                    self.unreported.pop(r.replica_id, None)
            extra = self.unreported.get(r.replica_id)
            if extra is not None:
                extra.expire(horizon)
                out[r.replica_id] = extra
        return out

    @staticmethod
    def _with_unreported(replicas: Sequence[ReplicaStats], extra: dict[str, _Unreported]) -> Sequence[ReplicaStats]:
        """The stats with the unreported placements as waiting requests (for power of two)."""
        if not extra:
            return replicas
        return [replace(r, num_waiting=r.num_waiting + extra[r.replica_id].requests,
                        num_waiting_tokens=r.num_waiting_tokens + extra[r.replica_id].tokens)
                if r.replica_id in extra else r for r in replicas]

    def _least_filled(self, tied: list[str]) -> str:
        """Of replicas scoring the same, the one whose cache the index predicts least full
        (ties at random). New conversations over a shared prefix every replica holds score
        the same on lightly loaded replicas; drawn at random they pile up unevenly (32 over 4:
        up to 11 on one), and a replica holding more conversations than its state slots keep
        evicts their histories (a hybrid replica's checkpoints are large: its slots, not its
        KV, bound how many conversations it keeps). Spread by fill, each keeps its share."""
        if len(tied) == 1:
            return tied[0]
        fill = {r: self.index.num_blocks_of(r) for r in tied}
        least = min(fill.values())
        return self._rng.choice([r for r in tied if fill[r] == least])

    def _home_bonus(self, homes: list[str], home_saved: int, saved: dict[str, int]) -> dict[str, float]:
        """A conversation's next turn: the replicas holding its whole previous prompt (its
        home, `home_saved` reusable there) count the history only they hold
        (`continuation_weight` - 1) times more."""
        if not homes or self.continuation_weight == 1:
            return {}
        elsewhere = max((n for r, n in saved.items() if r not in homes), default=0)
        extra = (self.continuation_weight - 1) * self.saved_weight * (home_saved - elsewhere)
        return {r: extra for r in homes}

    def rank(self, request: RoutingRequest, replicas: Sequence[ReplicaStats]) -> Placement:
        """The best replica for `request` (nothing recorded)."""
        if not replicas:
            raise ValueError("no replica to choose from")
        extra = self._unreported_load(replicas)
        queue = {r.replica_id: r.queue_len + (extra[r.replica_id].requests if r.replica_id in extra else 0)
                 for r in replicas}
        least_queue = min(queue.values())
        saved = self.index.match(request.prompt_token_ids)
        session = self.sessions.get(request.session_id) if request.session_id else None
        top_saved = max(saved.values(), default=0)
        homes = [r for r, n in saved.items()
                 if n == top_saved and self.index.ends_a_prompt(r, request.prompt_token_ids, top_saved)]
        new_conversation = not homes
        if session in queue and self._balanced(queue[session], least_queue):
            replica_id, reason, new_conversation = session, "session", False
        elif not saved:
            loads = self._with_unreported(replicas, extra)
            replica_id, reason = self.fallback.choose(request, loads).replica_id, "pow2"
        else:
            candidates = replicas
            if new_conversation:  # the fewest recent new conversations (within the slack), then by score
                counts = {r.replica_id: self.num_new_conversations(r.replica_id) for r in replicas}
                fewest = min(counts.values())
                candidates = [r for r in replicas if counts[r.replica_id] <= fewest + self.conversation_slack]
            bonus = self._home_bonus(homes, top_saved, saved)
            scores = [(self.saved_weight * saved.get(r.replica_id, 0) + bonus.get(r.replica_id, 0)
                       - self._cost(r, extra.get(r.replica_id)), r.replica_id)
                      for r in candidates]
            top = max(score for score, _ in scores)
            best = self._least_filled([replica_id for score, replica_id in scores if score == top])
            if not self._balanced(queue[best], least_queue):
                loads = self._with_unreported(replicas, extra)
                replica_id, reason = self.fallback.choose(request, loads).replica_id, "imbalance"
            else:
                replica_id, reason = best, "prefix" if saved.get(best) else "imbalance"
        return Placement(replica_id, reason, saved.get(replica_id, 0), new_conversation)
