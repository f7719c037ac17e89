"""AsyncLLMEngine: an `LLMEngine` stepping in a background thread, fed and read from asyncio.

    engine = AsyncLLMEngine.from_config(EngineConfig(model=...), model_name="demo", replica="r0")
    async for delta in engine.generate(prompt_token_ids, SamplingParams(max_tokens=8), "req-1"):
        delta.seqs[0].token_ids, delta.seqs[0].text, delta.seqs[0].finish_reason   # new since last delta

Threads: only the engine thread touches the `LLMEngine` (add, abort, step); callers post
commands to an inbox and receive `RequestDelta`s on their own event loop's queue. A
consumer that falls behind gets the queued deltas merged into one. Closing or cancelling
the iterator (a client disconnect) aborts the request. Metrics (`hybrid_serve.metrics`)
are recorded here, per step and per request.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from typing import AsyncIterator

from ..metrics import EngineMetrics, engine_counters
from .admission import LoadView
from .config import EngineConfig
from .outputs import Logprob
from .sampling_params import SamplingParams
from .validation import ModelLimits, validate_prompt

logger = logging.getLogger(__name__)


# ----- what callers receive ---------------------------------------------------------------
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


@dataclass(frozen=True)
class ModelInfo:
    model_name: str
    max_model_len: int
    vocab_size: int

    @property
    def limits(self) -> ModelLimits:
        return ModelLimits(self.max_model_len, self.vocab_size)


class EngineDeadError(RuntimeError):
    """The engine thread stopped (a step raised); the replica must be restarted."""


def _deliver(items: list[tuple[asyncio.Queue, "RequestDelta"]]) -> None:
    """On the callers' event loop: a step's deltas into their requests' queues (the engine
    thread hands a whole step over in one `call_soon_threadsafe`: with hundreds of streams,
    one wake-up of the loop and one pass of the GIL per step instead of one per request)."""
    for queue, item in items:
        queue.put_nowait(item)


# ----- bookkeeping inside the engine thread ----------------------------------------------
@dataclass
class _Seq:
    seq_id: str
    index: int
    request: object = None  # the engine's Request, once found
    sent_tokens: int = 0
    sent_text: int = 0  # characters of detokenizer.text already sent
    last_token_time: float | None = None
    scheduled: bool = False
    done: bool = False


@dataclass
class _Group:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    arrival: float = field(default_factory=time.monotonic)
    seqs: list[_Seq] = field(default_factory=list)
    first_token: bool = False
    hold_chars: int = 0  # text held back while a stop string may still be completing

    def post(self, item) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the caller's loop is closed: nobody listens any more
            pass


MAX_PENDING_CACHE_EVENTS = 4096  # a reader further behind gets one "reset" instead (and resyncs)

class AsyncLLMEngine:
    """Implements the replica's engine-client interface (`hybrid_serve.deploy.engine_client`)."""

    def __init__(self, engine, model_name: str = "", replica: str = "", metrics: EngineMetrics | None = None) -> None:
        self.engine = engine
        self.info = ModelInfo(model_name, engine.limits.max_model_len, engine.limits.vocab_size)
        self.metrics = metrics or EngineMetrics(model_name, replica)
        self._tokenizer = getattr(engine, "tokenizer", None)
        self._inbox: list[tuple[str, object]] = []
        self._inbox_lock = threading.Lock()
        self._wakeup = threading.Event()
        self._groups: dict[str, _Group] = {}  # engine thread only
        self._seq_owner: dict[str, tuple[_Group, _Seq]] = {}  # engine thread only
        self._counters = engine_counters(engine.stats() if hasattr(engine, "stats") else {})
        self._view: LoadView = engine.load_view()  # as of the last step, written by the engine thread
        self._cache_events: list = []  # taken from the engine each step, handed out by take_cache_events
        self._stopping = False
        self._closed = False  # the engine thread has exited (set under the inbox lock)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="hybrid-serve-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: EngineConfig, model_name: str = "", replica: str = "") -> "AsyncLLMEngine":
        from .engine import LLMEngine
        from .tokenizer import load_tokenizer

        tokenizer = load_tokenizer(config.tokenizer or config.model)
        return cls(LLMEngine(config, tokenizer), model_name=model_name, replica=replica)

    # ----- the client interface -------------------------------------------------------
    def model_info(self) -> ModelInfo:
        return self.info

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raises ValueError naming the problem (safe from any thread: reads constants)."""
        validate_prompt(prompt_token_ids, params, self.info.limits)

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str,
                       validated: bool = False) -> AsyncIterator[RequestDelta]:
        """Deltas until every sequence finished. Raises ValueError for bad input (before the
        first delta) unless the caller validated it (`validated=True`: the HTTP ingress
        does), EngineDeadError if the engine thread died."""
        self.check_health()
        if not validated:
            self.validate(prompt_token_ids, params)
        group = _Group(request_id, list(prompt_token_ids), params, asyncio.get_running_loop(), asyncio.Queue())
        self._post("add", group)
        finished = False
        try:
            while True:
                item = await group.queue.get()
                while not isinstance(item, BaseException) and not group.queue.empty():
                    nxt = group.queue.get_nowait()
                    if isinstance(nxt, BaseException):
                        item = nxt
                        break
                    item = item.merge(nxt)
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished:
                self._post("abort", request_id)

    async def abort(self, request_id: str) -> None:
        self._post("abort", request_id)

    def load(self) -> LoadView:
        """The engine's load as of the last step; requests not yet handed over count as waiting."""
        view = self._view
        return replace(view, num_waiting=view.num_waiting + len(self._inbox)) if self._inbox else view

    def check_health(self) -> None:
        if self._error is not None or not self._thread.is_alive():
            raise EngineDeadError(f"the engine thread stopped: {self._error!r}")

    on_shutdown = None  # e.g. stop the replica's shard workers

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the engine thread. Every open stream ends with a final delta (finish_reason
        "abort") within one step; later `generate` calls raise EngineDeadError."""
        self._stopping = True
        self._wakeup.set()
        self._thread.join(timeout_s)
        if self.on_shutdown is not None:
            self.on_shutdown()

    # ----- engine thread ----------------------------------------------------------------
    def _post(self, kind: str, payload) -> None:
        with self._inbox_lock:
            if self._closed:  # the engine thread has exited: nobody would read the inbox
                if kind == "add":
                    payload.post(EngineDeadError(f"the engine is not running: {self._error!r}"))
                return
            self._inbox.append((kind, payload))
        self._wakeup.set()

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._wakeup.clear()
                self._drain_inbox()
                if not self.engine.has_unfinished():
                    self._update_gauges()
                    self._wakeup.wait()
                    continue
                start = time.monotonic()
                produced = self.engine.step()
                self._after_step(start, produced)
            self._error = EngineDeadError("the engine was shut down")
            self._close_inbox()
            for request_id in list(self._groups):  # every open stream gets its final delta
                self._abort(request_id)
        except BaseException as exc:  # noqa: BLE001 - any step failure kills this engine
            logger.exception("engine step failed; failing all requests")
            self._error = exc
            dead = EngineDeadError(f"engine step failed: {exc!r}")
            self._close_inbox()
            for group in self._groups.values():
                for seq in group.seqs:
                    if not seq.done:
                        self.metrics.finished("error")
                group.post(dead)
            self._groups.clear()

    def _close_inbox(self) -> None:
        """No more commands: adds still queued join the groups (and end with them), later
        posts answer at once (`_post`)."""
        with self._inbox_lock:
            self._closed = True
        try:
            self._drain_inbox()
        except Exception:  # noqa: BLE001 - a dead engine may refuse; its groups still end below
            logger.exception("draining the inbox of a stopped engine")

    def _drain_inbox(self) -> None:
        with self._inbox_lock:
            inbox, self._inbox = self._inbox, []
        for kind, payload in inbox:
            if kind == "add":
                self._add(payload)
            else:
                self._abort(payload)

    def _add(self, group: _Group) -> None:
        if group.request_id in self._groups:
            group.post(ValueError(f"request id {group.request_id!r} is already running"))
            return
        try:
            seq_ids = self.engine.add_request(group.request_id, group.prompt_token_ids, group.params, validated=True)
        except ValueError as exc:
            group.post(exc)
            return
        group.seqs = [_Seq(seq_id, i) for i, seq_id in enumerate(seq_ids)]
        stops = group.params.stop_strings
        group.hold_chars = max((len(s) for s in stops), default=1) - 1
        self._groups[group.request_id] = group
        for seq in group.seqs:
            seq.request = self.engine.get_request(seq.seq_id)
            self._seq_owner[seq.seq_id] = (group, seq)
        self.metrics.prompt_tokens.inc(len(group.prompt_token_ids))

    def _abort(self, request_id: str) -> None:
        """End a request's sequences now; its stream gets a final delta (finish_reason "abort")
        for every sequence not finished yet, so a caller still iterating returns."""
        group = self._groups.pop(request_id, None)
        if group is None:
            return
        final = []
        for seq in group.seqs:
            self._seq_owner.pop(seq.seq_id, None)
            if not seq.done:
                seq.done = True
                self.engine.abort(seq.seq_id)
                self.metrics.finished("abort")
                final.append(SeqDelta(seq.index, [], "", None, "abort"))
        cached = next((getattr(s.request, "num_cached_tokens", 0) or 0 for s in group.seqs if s.request), 0)
        group.post(RequestDelta(group.request_id, final, len(group.prompt_token_ids), cached, finished=True))

    def _after_step(self, start: float, produced: list) -> None:
        now = time.monotonic()
        for group, seq in list(self._seq_owner.values()):
            if not seq.scheduled and getattr(seq.request, "first_scheduled_time", None) is not None:
                seq.scheduled = True
                self.metrics.queue_time.observe(max(0.0, start - group.arrival))
        touched: dict[str, tuple[_Group, list[SeqDelta]]] = {}
        for req in produced:
            owner = self._seq_owner.get(req.request_id)
            if owner is None:
                continue  # aborted meanwhile
            group, seq = owner
            delta = self._seq_delta(group, seq, req, now)
            touched.setdefault(group.request_id, (group, []))[1].append(delta)
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, RequestDelta]]] = {}
        for group, deltas in touched.values():
            done = all(s.done for s in group.seqs)
            cached = next((getattr(s.request, "num_cached_tokens", 0) or 0 for s in group.seqs if s.request), 0)
            by_loop.setdefault(group.loop, []).append(
                (group.queue, RequestDelta(group.request_id, deltas, len(group.prompt_token_ids), cached, done)))
            if done:
                self.metrics.e2e.observe(now - group.arrival)
                del self._groups[group.request_id]
                for s in group.seqs:
                    self._seq_owner.pop(s.seq_id, None)
        for loop, items in by_loop.items():  # one hand-over per caller loop per step, not one per request
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # the callers' loop is closed: nobody listens any more
                pass
        self._update_gauges()
        self._update_counters()

    def _seq_delta(self, group: _Group, seq: _Seq, req, now: float) -> SeqDelta:
        seq.request = req
        seq.scheduled = True
        new_ids = list(req.output_token_ids[seq.sent_tokens:])
        logprobs = None
        if req.logprobs is not None:
            logprobs = [self._decoded(entry) for entry in req.logprobs[seq.sent_tokens:]]
        seq.sent_tokens = len(req.output_token_ids)
        if not group.first_token:
            group.first_token = True
            self.metrics.ttft.observe(now - group.arrival)
        if seq.last_token_time is not None:
            self.metrics.itl.observe(now - seq.last_token_time)
        seq.last_token_time = now
        self.metrics.generation_tokens.inc(len(new_ids))
        text = req.detokenizer.text
        finished = req.finish_reason is not None
        safe = len(text) if finished else max(seq.sent_text, len(text) - group.hold_chars)
        delta_text, seq.sent_text = text[seq.sent_text:safe], safe
        if finished:
            seq.done = True
            self.metrics.finished(req.finish_reason)
        return SeqDelta(seq.index, new_ids, delta_text, logprobs, req.finish_reason, req.stop_reason)

    def _decoded(self, entry: dict[int, Logprob]) -> dict[int, Logprob]:
        if self._tokenizer is not None:
            for token_id, lp in entry.items():
                if lp.decoded_token is None:
                    lp.decoded_token = self._tokenizer.decode([token_id])
        return entry

    def take_cache_events(self) -> list:
        """The prefix cache's events (mem_cache.CacheEvent) since the last call, from any thread."""
        with self._inbox_lock:
            events, self._cache_events = self._cache_events, []
        return events

    def _update_gauges(self) -> None:
        events = self.engine.take_cache_events() if hasattr(self.engine, "take_cache_events") else None
        if events:  # (engine thread: the cache is its own; torch is loaded here already)
            from ..mem_cache import CacheEvent

            with self._inbox_lock:  # a reader this far behind gets one "reset" and resyncs
                self._cache_events = self._cache_events + events if len(self._cache_events) + len(events) <= \
                    MAX_PENDING_CACHE_EVENTS else [CacheEvent("reset")]
        stats = self.engine.stats() if hasattr(self.engine, "stats") else {}
        self._view = view = self.engine.load_view()
        self.metrics.running.set(view.num_running)
        self.metrics.waiting.set(view.num_waiting)
        self.metrics.kv_usage.set(stats.get("kv_cache_usage_ratio", 0.0))
        self.metrics.state_usage.set(stats.get("state_pool_usage_ratio", 0.0))

    def _update_counters(self) -> None:
        now = engine_counters(self.engine.stats() if hasattr(self.engine, "stats") else {})
        self.metrics.add_counters({k: max(0, now[k] - self._counters.get(k, 0)) for k in now})
        self._counters = now
