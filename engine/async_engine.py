"""AsyncLLMEngine: an engine stepping apart from the caller's event loop, fed and read from asyncio.

    engine = AsyncLLMEngine.from_config(EngineConfig(model=...), model_name="demo", replica="r0")
    async for delta in engine.generate(prompt_token_ids, SamplingParams(max_tokens=8), "req-1"):
        delta.seqs[0].token_ids, delta.seqs[0].text, delta.seqs[0].finish_reason   # new since last delta

Where the engine runs (`engine_process`):
- an engine thread of this process (`AsyncLLMEngine(llm_engine)`, the default on CPU): only
  that thread touches the `LLMEngine`;
- an engine process of its own (`from_config(..., engine_process=True)`, the default for a
  served replica on CUDA; `engine/core_process.py`): the step loop's Python never waits for
  the GIL behind the replica's event loop, Serve and Ray (in one process, every torch op and
  kernel launch of a host-bound step gives the GIL up and waits to get it back, so a busy
  event loop stretches each step by about the loop's own work; vLLM's V1 engine core runs
  apart for the same reason). One report per step crosses a socket pair.

Either way the `EngineCore` (engine/engine_core.py) turns each step into one `StepReport`;
this front end hands its deltas to each caller loop in one `call_soon_threadsafe` and
records the metrics (`hybrid_serve.metrics`) from it. A consumer that falls behind gets the
queued deltas merged into one; one that paces its stream (`StreamPace`: the served replica's
message budget) is woken only when its next message is due. Closing or cancelling the iterator (a client disconnect)
aborts the request.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import AsyncIterator, Callable

from ..metrics import EngineMetrics, engine_counters, observe_many
from .admission import LoadView
from .config import EngineConfig
from .engine_core import EngineCore, RequestDelta, SeqDelta, StepReport, run_core
from .request_stream import RequestStream, StreamPace, deliver
from .sampling_params import SamplingParams
from .validation import ModelLimits, validate_prompt

__all__ = ["AsyncLLMEngine", "EngineDeadError", "ModelInfo", "RequestDelta", "SeqDelta", "StreamPace"]

logger = logging.getLogger(__name__)


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


MAX_PENDING_CACHE_EVENTS = 4096  # a reader further behind gets one "reset" instead (and resyncs)


class EngineThread:
    """Runs an `EngineCore` on a thread of this process (the engine-client back end for an
    engine in the caller's process; `engine/core_process.EngineProcess` is the other)."""

    def __init__(self, engine, on_report: Callable[[StepReport], None],
                 on_exit: Callable[[BaseException | None], None]) -> None:
        self.core = EngineCore(engine)
        self.limits: ModelLimits = engine.limits
        self.on_report, self.on_exit = on_report, on_exit
        self._inbox: list[tuple] = []
        self._lock = threading.Lock()
        self._wakeup = threading.Event()
        self._stopping = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="hybrid-serve-engine", daemon=True)
        self._thread.start()

    def send(self, command: tuple) -> bool:
        """Queue a command for the engine thread; False once it has stopped taking them."""
        with self._lock:
            if self._closed:
                return False
            self._inbox.append(command)
        self._wakeup.set()
        return True

    def _next_commands(self, block: bool) -> list[tuple]:
        while block and not self._stopping and not self._inbox:
            self._wakeup.wait()
            self._wakeup.clear()
        with self._lock:
            commands, self._inbox = self._inbox, []
            if self._stopping:
                self._closed = True  # commands queued before the stop are applied first
                commands.append(("stop",))
        return commands

    def _run(self) -> None:
        try:
            run_core(self.core, self._next_commands, self.on_report)
            error = None
        except BaseException as exc:  # noqa: BLE001 - any step failure kills this engine
            logger.exception("engine step failed; failing all requests")
            error = exc
        with self._lock:
            self._closed = True
        self.on_exit(error)

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout_s: float) -> None:
        self._stopping = True
        self._wakeup.set()
        self._thread.join(timeout_s)


class AsyncLLMEngine:
    """Implements the replica's engine-client interface (`hybrid_serve.deploy.engine_client`).

    `AsyncLLMEngine(llm_engine)` steps `llm_engine` on a thread of this process;
    `AsyncLLMEngine.from_config(config, engine_process=True)` starts an engine process."""

    def __init__(self, engine=None, model_name: str = "", replica: str = "", metrics: EngineMetrics | None = None,
                 backend_factory: Callable | None = None) -> None:
        self.metrics = metrics or EngineMetrics(model_name, replica)
        self._streams: dict[str, RequestStream] = {}  # written by caller loops (add) and the report thread (end)
        self._lock = threading.Lock()
        self._counters: dict[str, int] | None = None
        self._view: LoadView | None = None
        self._cache_events: list = []  # from the reports, handed out by take_cache_events
        self._adds_sent = self._adds_taken = 0
        # the last report's load and the adds the engine had taken by then, as one pair (read
        # from the replica's thread while the report thread writes)
        self._reported: tuple[LoadView, int] | None = None
        self._error: BaseException | None = None
        self._exited = False
        if backend_factory is None:
            self.backend = EngineThread(engine, self._on_report, self._on_exit)
            self._view = engine.load_view()
            self._counters = engine_counters(engine.stats() if hasattr(engine, "stats") else {})
        else:  # (engine/core_process.py: the load and counters at the start come with "ready")
            self.backend = backend_factory(self._on_report, self._on_exit)
            first = self.backend.first_report
            self._view, self._counters = first.view, engine_counters(first.stats)
        limits = self.backend.limits
        self.info = ModelInfo(model_name, limits.max_model_len, limits.vocab_size)
        self.engine = engine  # the in-process LLMEngine (None with an engine process)

    @classmethod
    def from_config(cls, config: EngineConfig, model_name: str = "", replica: str = "",
                    engine_process: bool = False, tp_setup=None, on_shard_loaded: Callable[[], None] | None = None,
                    torch_num_threads: int | None = None) -> "AsyncLLMEngine":
        """An engine for `config`: in this process (a thread), or in an engine process of its
        own (`engine_process`; with tp > 1 it is rank 0: `tp_setup` and `on_shard_loaded` as
        `core_process.EngineProcess` takes them)."""
        if engine_process:
            from .core_process import EngineProcess

            def factory(on_report, on_exit):
                return EngineProcess(config, on_report, on_exit, tp_setup=tp_setup, on_shard_loaded=on_shard_loaded,
                                     torch_num_threads=torch_num_threads)
            return cls(model_name=model_name, replica=replica, backend_factory=factory)
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

    paces_streams = True  # generate takes `pace` (deploy/engine_client.py)

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str,
                       validated: bool = False, pace: StreamPace | None = None) -> AsyncIterator[RequestDelta]:
        """Deltas until every sequence finished: each one all that the engine made since the
        previous one was taken, as soon as it is made, or as `pace` spaces them. Raises
        ValueError for bad input (before the first delta) unless the caller validated it
        (`validated=True`: the HTTP ingress does), EngineDeadError if the engine stopped
        (after the deltas made before it)."""
        self.check_health()
        if not validated:
            self.validate(prompt_token_ids, params)
        stream = RequestStream(request_id, params.n, asyncio.get_running_loop(), time.monotonic())
        with self._lock:
            if request_id in self._streams:
                raise ValueError(f"request id {request_id!r} is already running")
            self._streams[request_id] = stream
            self._adds_sent += 1
        if not self.backend.send(("add", request_id, list(prompt_token_ids), params)):
            with self._lock:
                self._streams.pop(request_id, None)
            raise EngineDeadError(f"the engine is not running: {self._error!r}")
        self.metrics.prompt_tokens.inc(len(prompt_token_ids))
        finished = False
        try:
            while True:
                await stream.wait()
                item, stream.pending = stream.pending, None
                if item is None:  # the error, after every delta that came before it
                    finished = True
                    raise stream.error
                finished = item.finished
                yield item
                if finished:
                    return
                if pace is not None:
                    stream.hold_until = time.monotonic() + pace.gap_s()
                    stream.min_tokens = pace.min_tokens
        finally:
            if not finished:
                self.backend.send(("abort", request_id))

    async def abort(self, request_id: str) -> None:
        self.backend.send(("abort", request_id))

    def load(self) -> LoadView:
        """The engine's load as of its last report, for admission: requests not yet taken by
        the engine count as waiting requests (their uncached tokens are unknown here: a later
        turn's history may be cached). The router reads `reported_load` instead."""
        view = self._view or LoadView(0, 0, 0, 0, 0, 0, 0)
        pending = self._adds_sent - self._adds_taken
        return replace(view, num_waiting=view.num_waiting + pending) if pending > 0 else view

    def reported_load(self) -> tuple[LoadView, int]:
        """For the router: the engine's last reported load, and how many requests (adds) the
        engine had taken when it reported it, i.e. how many of the requests sent here that
        load accounts for. Requests sent but not taken yet are in neither: the router counts
        them itself, with the prefill tokens it predicts for them (routing/policy.py), until
        this count covers them. (Counting them as waiting requests without tokens, as `load`
        does for admission, made a replica whose engine was busy in a long step look idle.)"""
        reported = self._reported
        if reported is None:
            return self._view or LoadView(0, 0, 0, 0, 0, 0, 0), self._adds_taken
        return reported

    def check_health(self) -> None:
        if self._error is not None or self._exited or not self.backend.alive():
            raise EngineDeadError(f"the engine stopped: {self._error!r}")

    on_shutdown = None  # e.g. stop the replica's shard workers

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the engine. Every open stream ends with a final delta (finish_reason "abort")
        within one step; later `generate` calls raise EngineDeadError."""
        self.backend.stop(timeout_s)
        if self.on_shutdown is not None:
            self.on_shutdown()

    def attach_draft_source(self, feed) -> None:
        """Speculative method "suffix": the drafter looks drafts up in `feed`'s local copy of the
        cluster-wide index (actors/suffix_feed.SuffixFeed). An engine process keeps a copy of
        its own, fed with what the feed's copy takes (one message per refresh)."""
        if self.engine is not None:
            drafter = getattr(getattr(self.engine, "spec", None), "drafter", None)
            if drafter is not None and getattr(drafter, "name", None) == "suffix":
                drafter.source = feed
            return
        self.backend.send(("draft_source", feed.new_copy()))

        def forward(first_id, documents) -> None:
            if first_id is None:
                self.backend.send(("draft_source", feed.new_copy()))
            else:
                self.backend.send(("draft_source_extend", first_id, documents))
        feed.listeners.append(forward)

    def take_cache_events(self) -> list:
        """The prefix cache's events (mem_cache.CacheEvent) since the last call, from any thread."""
        with self._lock:
            events, self._cache_events = self._cache_events, []
        return events

    # ----- reports (on the back end's thread) ---------------------------------------------
    def _on_report(self, report: StepReport) -> None:
        m, now = self.metrics, report.time
        streams = self._streams
        for request_id, exc in report.refused:
            with self._lock:
                stream = streams.pop(request_id, None)
            if stream is not None:
                stream.post(exc)
        for request_id, start in report.scheduled:
            stream = streams.get(request_id)
            if stream is not None:
                m.queue_time.observe(max(0.0, start - stream.arrival))
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[RequestStream, RequestDelta]]] = {}
        itls: list[float] = []  # recorded once per report (hundreds of streams: a few distinct values)
        tokens = 0
        for delta in report.deltas:
            stream = streams.get(delta.request_id)
            if stream is None:
                continue
            produced = False
            for seq in delta.seqs:
                if seq.finish_reason == "abort" and not seq.token_ids:
                    m.finished("abort")
                    stream.num_done += 1
                    continue
                produced = True
                last = stream.last_token_time.get(seq.index)
                if last is not None:
                    itls.append(now - last)
                stream.last_token_time[seq.index] = now
                tokens += len(seq.token_ids)
                if seq.finish_reason is not None:
                    m.finished(seq.finish_reason)
                    stream.num_done += 1
            if produced and not stream.first_token:
                stream.first_token = True
                m.ttft.observe(now - stream.arrival)
            by_loop.setdefault(stream.loop, []).append((stream, delta))
            if delta.finished:
                if produced:
                    m.e2e.observe(now - stream.arrival)
                with self._lock:
                    streams.pop(delta.request_id, None)
        observe_many(m.itl, itls)
        if tokens:
            m.generation_tokens.inc(tokens)
        for loop, items in by_loop.items():  # one hand-over per caller loop per report, not one per request
            try:
                loop.call_soon_threadsafe(deliver, items)
            except RuntimeError:  # the callers' loop is closed: nobody listens any more
                pass
        with self._lock:
            self._adds_taken += report.num_adds
            if report.cache_events:  # a reader this far behind gets one "reset" and resyncs
                from ..mem_cache import CacheEvent

                self._cache_events = self._cache_events + report.cache_events if len(self._cache_events) + \
                    len(report.cache_events) <= MAX_PENDING_CACHE_EVENTS else [CacheEvent("reset")]
        if report.view is not None:
            self._view = view = report.view
            self._reported = (view, self._adds_taken)
            m.running.set(view.num_running)
            m.waiting.set(view.num_waiting)
        m.kv_usage.set(report.stats.get("kv_cache_usage_ratio", 0.0))
        m.state_usage.set(report.stats.get("state_pool_usage_ratio", 0.0))
        m.kv_prefix_cached.set(report.stats.get("kv_cache_prefix_cached_ratio", 0.0))
        m.state_prefix_cached.set(report.stats.get("state_pool_prefix_cached_ratio", 0.0))
        counters = engine_counters(report.stats)
        if self._counters is not None:
            m.add_counters({k: max(0, counters[k] - self._counters.get(k, 0)) for k in counters})
        self._counters = counters

    def _on_exit(self, error: BaseException | None) -> None:
        """The engine stopped: shut down (`error` None; every stream had its final delta), a
        step raised, or the engine process died. Open streams get EngineDeadError."""
        self._error = error if error is not None else EngineDeadError("the engine was shut down")
        self._exited = True
        dead = self._error if isinstance(self._error, EngineDeadError) else \
            EngineDeadError(f"engine step failed: {self._error!r}")
        with self._lock:
            streams, self._streams = self._streams, {}
        for stream in streams.values():
            for _ in range(stream.num_seqs - stream.num_done):
                self.metrics.finished("error")
            stream.post(dead)

