"""EngineCore: an `LLMEngine`'s step loop and its per-request bookkeeping, turning each step
into one `StepReport` (the `RequestDelta`s of every request with news, the load, the stats,
the prefix cache's events). No threads, no asyncio, no metrics: the core runs either on an
engine thread of the caller's process or in an engine process of its own
(`engine/core_process.py`), and the front end (`AsyncLLMEngine`) hands the deltas to the
callers' event loops and records the metrics from the reports, the same way for both.

    core = EngineCore(llm_engine)
    run_core(core, next_commands, emit)   # until a ("stop",) command or a step raises

Commands: ("add", request_id, prompt_token_ids, params), ("abort", request_id), ("stop",), and
for the suffix drafter ("draft_source", index) and ("draft_source_extend", first_id, documents).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from .admission import LoadView
from .outputs import Logprob
from .sampling_params import SamplingParams


@dataclass
class SeqDelta:
    """What one sequence (choice `index`) produced since its previous delta."""

    index: int
    token_ids: list[int]
    text: str
    logprobs: list[dict[int, Logprob]] | None = None  # one dict per token in `token_ids`
    finish_reason: str | None = None  # "stop" | "length" | "abort" once finished
    stop_reason: str | int | None = None

    def merge(self, later: "SeqDelta") -> None:
        self.token_ids += later.token_ids
        self.text += later.text
        if later.logprobs is not None:
            self.logprobs = (self.logprobs or []) + later.logprobs
        self.finish_reason, self.stop_reason = later.finish_reason, later.stop_reason


@dataclass
class RequestDelta:
    """One step's news for a request (all its sequences). `finished`: every sequence is done."""

    request_id: str
    seqs: list[SeqDelta]
    num_prompt_tokens: int
    num_cached_tokens: int = 0
    finished: bool = False

    def num_new_tokens(self) -> int:
        """The most tokens one of its sequences carries (what a stream's pacing counts)."""
        return max((len(s.token_ids) for s in self.seqs), default=0)

    def merge(self, later: "RequestDelta") -> "RequestDelta":
        by_index = {s.index: s for s in self.seqs}
        for s in later.seqs:
            if s.index in by_index:
                by_index[s.index].merge(s)
            else:
                self.seqs.append(s)
                by_index[s.index] = s
        self.num_cached_tokens, self.finished = later.num_cached_tokens, later.finished
        return self


@dataclass
class StepReport:
    """What the front end learns from one pass of the core loop (a step, or commands applied
    while idle). Times are `time.monotonic()` (CLOCK_MONOTONIC: one clock for every process of
    a machine, so the front end compares them with its own arrival times)."""

    time: float  # when the step's outputs were ready
    deltas: list[RequestDelta] = field(default_factory=list)
    refused: list[tuple[str, BaseException]] = field(default_factory=list)  # adds refused: (request id, error)
    scheduled: list[tuple[str, float]] = field(default_factory=list)  # (request id, step start): first scheduled
    num_adds: int = 0  # add commands taken (refused or not) since the previous report
    view: LoadView | None = None
    stats: dict = field(default_factory=dict)
    cache_events: list = field(default_factory=list)

    def to_wire(self) -> tuple:
        """Plain tuples and lists (pickles several times faster than dataclasses: the engine
        process sends one report per step, with a delta for every running request)."""
        deltas = [(d.request_id, d.num_prompt_tokens, d.num_cached_tokens, d.finished,
                   [(s.index, s.token_ids, s.text, s.logprobs, s.finish_reason, s.stop_reason) for s in d.seqs])
                  for d in self.deltas]
        return (self.time, deltas, self.refused, self.scheduled, self.num_adds, self.view, self.stats,
                self.cache_events)

    @classmethod
    def from_wire(cls, wire: tuple) -> "StepReport":
        when, deltas, refused, scheduled, num_adds, view, stats, events = wire
        return cls(when, [RequestDelta(rid, [SeqDelta(*s) for s in seqs], num_prompt, cached, finished)
                          for rid, num_prompt, cached, finished, seqs in deltas],
                   refused, scheduled, num_adds, view, stats, events)


@dataclass
class _Seq:
    seq_id: str
    index: int
    request: object = None  # the engine's Request, once found
    sent_tokens: int = 0
    sent_text: int = 0  # characters of detokenizer.text already sent
    scheduled: bool = False
    done: bool = False


@dataclass
class _Group:
    request_id: str
    num_prompt_tokens: int
    seqs: list[_Seq]
    hold_chars: int  # text held back while a stop string may still be completing


class EngineCore:
    """Owns an `LLMEngine` (or anything with its interface: add_request, abort, step,
    get_request, has_unfinished, load_view; stats and take_cache_events when it has them)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self._groups: dict[str, _Group] = {}
        self._seq_owner: dict[str, tuple[_Group, _Seq]] = {}
        self._report = StepReport(time.monotonic())

    # ----- commands -------------------------------------------------------------------------
    def apply(self, commands: list[tuple]) -> bool:
        """Apply commands in order; True when one of them is ("stop",)."""
        for command in commands:
            kind = command[0]
            if kind == "add":
                self.add(*command[1:])
            elif kind == "abort":
                self.abort(command[1])
            elif kind == "stop":
                return True
            elif kind == "draft_source":  # the suffix drafter's local index (engine/spec/suffix.py)
                self._set_draft_source(command[1])
            elif kind == "draft_source_extend":
                source = self._set_draft_source(None, keep=True)
                if source is not None:
                    source.extend(command[1], command[2])
            else:
                raise ValueError(f"unknown engine command {kind!r}")
        return False

    def _set_draft_source(self, source, keep: bool = False):
        """The suffix drafter's source (an object with `propose(token_ids, k)` and `extend(first_id,
        documents)`, e.g. routing's SuffixIndex, handed in: the engine imports no routing/)."""
        drafter = getattr(getattr(self.engine, "spec", None), "drafter", None)
        if drafter is None or not hasattr(drafter, "source"):
            return None
        if not keep:
            drafter.source = source
        return drafter.source

    def add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Queue a validated request; a refusal (an id already running, the engine's own
        ValueError) goes into the report's `refused`."""
        self._report.num_adds += 1
        if request_id in self._groups:
            self._report.refused.append((request_id, ValueError(f"request id {request_id!r} is already running")))
            return
        try:
            seq_ids = self.engine.add_request(request_id, prompt_token_ids, params, validated=True)
        except ValueError as exc:
            self._report.refused.append((request_id, exc))
            return
        hold = max((len(s) for s in params.stop_strings), default=1) - 1
        group = _Group(request_id, len(prompt_token_ids), [_Seq(s, i) for i, s in enumerate(seq_ids)], hold)
        self._groups[request_id] = group
        for seq in group.seqs:
            seq.request = self.engine.get_request(seq.seq_id)
            self._seq_owner[seq.seq_id] = (group, seq)

    def abort(self, request_id: str) -> None:
        """End a request's sequences now; the report carries a final delta (finish_reason
        "abort") for every sequence not finished yet."""
        group = self._groups.pop(request_id, None)
        if group is None:
            return
        final = []
        for seq in group.seqs:
            self._seq_owner.pop(seq.seq_id, None)
            if not seq.done:
                seq.done = True
                self.engine.abort(seq.seq_id)
                final.append(SeqDelta(seq.index, [], "", None, "abort"))
        self._report.deltas.append(RequestDelta(request_id, final, group.num_prompt_tokens, _cached(group), True))

    def abort_all(self) -> None:
        for request_id in list(self._groups):
            self.abort(request_id)

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished()

    # ----- steps ------------------------------------------------------------------------------
    def step(self) -> None:
        start = time.monotonic()
        produced = self.engine.step()
        report = self._report
        for group, seq in self._seq_owner.values():
            if not seq.scheduled and getattr(seq.request, "first_scheduled_time", None) is not None:
                seq.scheduled = True
                report.scheduled.append((group.request_id, start))
        touched: dict[str, tuple[_Group, list[SeqDelta]]] = {}
        for req in produced:
            owner = self._seq_owner.get(req.request_id)
            if owner is None:
                continue  # aborted meanwhile
            group, seq = owner
            touched.setdefault(group.request_id, (group, []))[1].append(self._seq_delta(group, seq, req))
        for group, deltas in touched.values():
            done = all(s.done for s in group.seqs)
            report.deltas.append(RequestDelta(group.request_id, deltas, group.num_prompt_tokens, _cached(group), done))
            if done:
                del self._groups[group.request_id]
                for s in group.seqs:
                    self._seq_owner.pop(s.seq_id, None)

    def _seq_delta(self, group: _Group, seq: _Seq, req) -> SeqDelta:
        seq.request = req
        seq.scheduled = True
        new_ids = list(req.output_token_ids[seq.sent_tokens:])
        logprobs = None
        if req.logprobs is not None:
            logprobs = [self._decoded(entry) for entry in req.logprobs[seq.sent_tokens:]]
        seq.sent_tokens = len(req.output_token_ids)
        text = req.detokenizer.text
        finished = req.finish_reason is not None
        safe = len(text) if finished else max(seq.sent_text, len(text) - group.hold_chars)
        delta_text, seq.sent_text = text[seq.sent_text:safe], safe
        if finished:
            seq.done = True
        return SeqDelta(seq.index, new_ids, delta_text, logprobs, req.finish_reason, req.stop_reason)

    def _decoded(self, entry: dict[int, Logprob]) -> dict[int, Logprob]:
        tokenizer = getattr(self.engine, "tokenizer", None)
        if tokenizer is not None:
            for token_id, lp in entry.items():
                if lp.decoded_token is None:
                    lp.decoded_token = tokenizer.decode([token_id])
        return entry

    def take_report(self) -> StepReport:
        """The news since the previous report, with the load, stats and cache events now."""
        report, self._report = self._report, StepReport(time.monotonic())
        report.time = time.monotonic()
        report.view = self.engine.load_view()
        report.stats = self.engine.stats() if hasattr(self.engine, "stats") else {}
        take = getattr(self.engine, "take_cache_events", None)
        report.cache_events = take() if take is not None else []
        return report


def _cached(group: _Group) -> int:
    return next((getattr(s.request, "num_cached_tokens", 0) or 0 for s in group.seqs if s.request), 0)


def run_core(core: EngineCore, next_commands: Callable[[bool], list[tuple]],
             emit: Callable[[StepReport], None]) -> None:
    """The engine loop: take commands (`next_commands(block)`: blocking only while nothing is
    running), step while there is work, emit one report per pass. Returns after a ("stop",)
    command, with every open request ended (a final "abort" delta each); a step's exception
    propagates (the caller fails the open requests)."""
    while True:
        stop = core.apply(next_commands(not core.has_unfinished()))
        if stop:
            core.abort_all()
            emit(core.take_report())
            return
        if core.has_unfinished():
            core.step()
        emit(core.take_report())
