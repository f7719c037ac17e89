"""LLMServer: one engine replica as a Ray Serve deployment replica.

It holds one engine client (`deploy/engine_client.py`: an `AsyncLLMEngine`, whose engine runs
in an engine process of its own or on a thread of this one, `AppConfig.engine_process`) and
streams `RequestDelta`s back to the ingress. The first item of every `generate` stream is
either a `Started` (the request is queued) or a `GenerateError` (refused: bad input,
overloaded), so the ingress can answer with a proper status code before it starts an HTTP
stream. With tp > 1 the replica's shard actors live in its placement group
(`placement_group_bundles`).
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from typing import AsyncIterator, Callable

import ray
from ray import serve

from ..engine.admission import Admission, FirstTokenQueue, LoadView
from ..engine.async_engine import EngineDeadError, ModelInfo, RequestDelta, StreamPace
from ..engine.sampling_params import SamplingParams
from . import hop_log
from .config import AppConfig
from .delta_channel import ChannelAddress, ChannelServer
from .engine_client import EngineClient, EngineFactory, make_engine_client
from .errors import ENGINE_DEAD, OVERLOADED, GenerateError, retry_after_from
from .metrics_hub import MetricsPusher, get_hub
from .request_router import EVENTS_KEY, CacheEventRing

logger = logging.getLogger(__name__)


@dataclass
class GenerateRequest:
    """What the ingress sends a replica: one prompt, already tokenized and validated
    (`engine.validation.validate_prompt`, once, at the ingress)."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    session_id: str | None = None  # the request's `user` field: session affinity for the router
    channel: tuple[str, int] | None = None  # (ingress channel id, stream key): tokens by delta channel


@dataclass(frozen=True)
class Started:
    replica: str
    channel: ChannelAddress | None = None  # where the request's tokens come from (a channel request)


class LLMServerImpl:
    """The replica's logic without Serve (tests build it with a fake engine factory).

    Admission: a request joins the replica's `FirstTokenQueue` at arrival and leaves it with
    its first token (or its end); from its first token to its end it is counted in
    `num_answered` (it holds a batch row). Past `max_waiting_requests` + the rows answered
    requests leave free (max_num_seqs - num_answered) requests in the queue, or
    `max_waiting_tokens` prompt tokens, a new one is refused at once with 503 ("overloaded",
    which the ingress tries on another replica) and a Retry-After of about how long the queue
    now takes to reach a first token (a moving average).

    Streaming: each message to the ingress (a Ray object, then an SSE chunk through Serve's
    HTTP proxy: ~0.5 ms of a core at each hop, whatever it holds) carries all of a stream's
    tokens not sent yet. A request's first token and its end go out at once; in between its
    tokens wait until there are `stream_interval` of them and (the streams this replica is
    sending / `stream_max_messages_per_s`) seconds have passed since its previous message:
    a lone stream sends every token as it is made (1 ms at the default 1,000/s; engine steps
    take longer), 256 streams send ~every 256 ms (about one message per stream per 15 steps
    of 17 ms), so the replica's messages stay near the budget however many streams it has,
    instead of one per token per stream. (Waiting for the ingress to fall behind cannot be
    seen from here: Serve does not backpressure a streaming call, and unread items queue in
    Ray, not in this process.) An engine that paces its streams (`paces_streams`:
    AsyncLLMEngine, `StreamPace`) applies that rule itself and merges the deltas in between
    without waking this generator: a stream costs this process a wake-up per message, not
    one per engine step. With another engine the rule is applied here, delta by delta.

    Delta channels (`delta_channel.py`, a request with `channel` set, when this replica has a
    `channel_server`): the call yields `Started` with the channel's address and stays open until
    the request ends, and the request's deltas (and an engine error after `Started`) go to the
    ingress's channel: one frame per ingress per pass of this replica's loop.

    A dead engine (before or during a request) is answered as an item, not raised: a
    `GenerateError` with code `engine_dead` naming this replica, which the ingress retries on
    another replica while the request has no token; `on_engine_dead` is then called once."""

    TTFT_SMOOTHING = 0.2  # weight of the newest time-to-first-token in the average

    def __init__(self, config: AppConfig, replica: str, engine_factory: EngineFactory | None = None) -> None:
        self.config = config
        self.replica = replica
        self.engine: EngineClient = (engine_factory or make_engine_client)(config, replica)
        load = self.engine.load()
        bounds = config.queue_bounds()
        self.admission = Admission(load.max_num_seqs, max_waiting=bounds["max_waiting_requests"],
                                   max_waiting_tokens=bounds["max_waiting_tokens"])
        self.queue = FirstTokenQueue()
        self.num_answered = 0  # requests past their first token, not yet ended
        self.num_received = 0  # requests ever routed here
        self.num_refused = 0  # of those, refused before reaching the engine (admission, a dead engine)
        self.ttft_avg_s: float | None = None  # moving average, from arrival here to the first delta
        self.cache_events = CacheEventRing(config.engine_config().page_size)
        self.on_engine_dead: Callable[[], None] | None = None  # the Serve replica leaves (`LLMServer`)
        self.engine_dead = False
        self.suffix_feed = None  # speculative method "suffix": the cluster-wide index's feed (attach_suffix_feed)
        self.channel_server: ChannelServer | None = None  # delta channels (start_channel_server)

    async def start_channel_server(self, host: str) -> ChannelAddress:
        """Serve requests' tokens by delta channel (to ingresses that ask for it) from `host`."""
        self.channel_server = ChannelServer()
        return await self.channel_server.start(host)

    def attach_suffix_feed(self, feed) -> None:
        """Speculative method "suffix": finished requests (prompt + output ids) go to `feed`
        (actors/suffix_feed.SuffixFeed: batched, fire-and-forget to the Router actor), and the
        engine's SuffixDrafter looks drafts up in the feed's local copy of the index."""
        self.suffix_feed = feed
        attach = getattr(self.engine, "attach_draft_source", None)
        if attach is not None:
            attach(feed)

    def routing_stats(self) -> dict:
        """What Serve hands the request router: the load admission sees, and the recent cache
        events (`deploy/request_router.py`)."""
        take = getattr(self.engine, "take_cache_events", None)
        if take is not None:
            self.cache_events.extend(take())
        view, received = self.reported_load()
        return {**view.routing_stats(), "num_received_requests": received, EVENTS_KEY: self.cache_events.snapshot()}

    def reported_load(self) -> tuple[LoadView, int]:
        """The load to report to the router and how many of the requests routed here it
        accounts for (`num_received_requests`: the router matches its placements to it and
        counts the rest itself, with the prefill tokens it predicts for them). Those the
        engine has taken, and those refused here; a request on its way to the engine is in
        neither (its tokens are not in the engine's waiting tokens yet)."""
        reported = getattr(self.engine, "reported_load", None)
        if reported is None:  # an engine client without the count: everything received
            return self.engine.load(), self.num_received
        view, taken = reported()
        return view, self.num_refused + taken

    def model_info(self) -> ModelInfo:
        return self.engine.model_info()

    def retry_after_s(self) -> int:
        return retry_after_from(self.ttft_avg_s)

    def _first_token(self, seconds: float) -> None:
        a = self.TTFT_SMOOTHING
        self.ttft_avg_s = seconds if self.ttft_avg_s is None else (1 - a) * self.ttft_avg_s + a * seconds

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Started | GenerateError | RequestDelta]:
        """The request was validated by the ingress; this asks admission whether to take it."""
        hop_log.mark("replica", "in", request.request_id)
        num_tokens = len(request.prompt_token_ids)
        self.num_received += 1
        verdict = self.admission.on_arrival(self.engine.load(), self.queue, num_tokens,
                                            num_answered=self.num_answered)
        if verdict.decision == "reject":
            self.num_refused += 1
            yield GenerateError(503, f"replica {self.replica} is overloaded ({verdict.reason}); retry later",
                                code=OVERLOADED, retry_after_s=self.retry_after_s(), replica=self.replica)
            return
        try:
            self.engine.check_health()
        except EngineDeadError as exc:
            self.num_refused += 1
            yield self._dead(exc)
            return
        arrived, answered = time.monotonic(), False
        self.queue.enter(num_tokens)
        channel = self.channel_server if request.channel is not None else None
        try:
            yield Started(self.replica, channel.address if channel is not None else None)
            batching = self.config.stream_interval > 1 or bool(self.config.stream_max_messages_per_s)
            pace = StreamPace(self.config.stream_interval, self.stream_gap_s) if batching else None
            # an engine that paces its streams (AsyncLLMEngine) wakes this one only when a message
            # is due; with another, the pace is applied here, delta by delta
            paced = pace is not None and getattr(self.engine, "paces_streams", False)
            stream = self.engine.generate(request.prompt_token_ids, request.params, request.request_id,
                                          validated=True, **({"pace": pace} if paced else {}))
            output_ids: list[int] = []  # the first sequence's, for the suffix index
            held: RequestDelta | None = None  # tokens not sent yet (batching)
            last_sent: float | None = None  # when this stream's last message went out
            try:
                async for delta in stream:  # each delta: all the engine made since the last one taken
                    if not answered:
                        answered = True
                        hop_log.mark("replica", "first", request.request_id)
                        self.queue.leave(num_tokens)
                        self.num_answered += 1
                        self._first_token(time.monotonic() - arrived)
                    if self.suffix_feed is not None and delta.seqs:
                        output_ids += delta.seqs[0].token_ids
                        if delta.finished:
                            self.suffix_feed.add_finished(request.prompt_token_ids, output_ids)
                    if pace is not None and not paced:
                        if held is not None:
                            delta, held = held.merge(delta), None
                        now = time.monotonic()
                        if last_sent is not None and not delta.finished and not pace.due(delta, now - last_sent):
                            held = delta
                            continue
                        last_sent = now
                    if delta.finished:
                        hop_log.mark("replica", "last", request.request_id)
                    if channel is not None:
                        channel.post(*request.channel, delta)
                    else:
                        yield delta
                if held is not None:  # (a stream ends with a finished delta: only a safeguard)
                    if channel is not None:
                        channel.post(*request.channel, held)
                    else:
                        yield held
            except EngineDeadError as exc:  # the engine died under this request
                for item in ([held] if held is not None else []) + [self._dead(exc)]:
                    if channel is not None:
                        channel.post(*request.channel, item)
                    else:
                        yield item
            finally:
                await stream.aclose()
        finally:  # finished, aborted (the caller closed the stream) or failed
            if answered:
                self.num_answered -= 1
            else:
                self.queue.leave(num_tokens)

    def stream_gap_s(self) -> float:
        """The least time between two messages of one stream: the streams this replica is
        sending (`num_answered`) share `stream_max_messages_per_s` (0 with no budget)."""
        rate = self.config.stream_max_messages_per_s
        return self.num_answered / rate if rate else 0.0

    def _dead(self, exc: EngineDeadError) -> GenerateError:
        if not self.engine_dead:
            self.engine_dead = True
            logger.error("replica %s: its engine is dead (%s)", self.replica, exc)
            if self.on_engine_dead is not None:
                self.on_engine_dead()
        return GenerateError(503, f"replica {self.replica} cannot serve: {exc}", code=ENGINE_DEAD,
                             replica=self.replica)

    def check_health(self) -> None:
        self.engine.check_health()

    def shutdown(self) -> None:
        self.engine.shutdown()


def suffix_feed(app_name: str, page_size: int, checkpoint_interval: int, model_name: str, replica: str):
    """This replica's feed of the app's Router actor's suffix index (the actor the prefix
    request router uses: same name), with a local copy refreshed in the background; its
    proposals and index size are this replica's `hybrid_serve_suffix_*` series."""
    from .. import metrics
    from ..actors.router import get_router, router_name
    from ..actors.suffix_feed import SuffixFeed

    name = router_name(app_name, page_size, checkpoint_interval, True)
    return SuffixFeed(lambda: get_router(name, page_size, checkpoint_interval, True),
                      metrics=metrics.RouterMetrics(model_name, replica))


ENGINE_DEAD_EXIT_DELAY_S = 0.25  # a replica whose engine died exits this long after it first says so (time
# for its engine_dead answers to go out; one that does not reaches the ingress as replica_failed, retried the same)


@serve.deployment(name="LLMServer", health_check_period_s=10, health_check_timeout_s=30,
                  graceful_shutdown_timeout_s=20)
class LLMServer:
    """Serve replica wrapper: metrics push, health checks, shutdown.

    A replica whose engine died leaves (its process exits, ENGINE_DEAD_EXIT_DELAY_S after its
    first `engine_dead` answer has gone out), so that Serve replaces it and stops routing to
    it at once, not after 3 failed health checks (30 s) during which its router would prefer
    it: it answers at once, so it looks the least loaded."""

    async def __init__(self, config: AppConfig, engine_factory: EngineFactory | None = None) -> None:
        ctx = serve.get_replica_context()
        replica = ctx.replica_id.unique_id
        self.impl = LLMServerImpl(config, replica, engine_factory)
        loop = asyncio.get_running_loop()
        self.impl.on_engine_dead = lambda: loop.call_later(ENGINE_DEAD_EXIT_DELAY_S, os._exit, 1)
        engine = config.engine_config()
        if engine.speculative_config is not None and engine.speculative_config.method == "suffix":
            self.impl.attach_suffix_feed(suffix_feed(ctx.app_name, engine.page_size, engine.state_checkpoint_interval,
                                                     config.model_name, replica))
        if config.delta_channels:
            await self.impl.start_channel_server(ray.util.get_node_ip_address())
        self.pusher = MetricsPusher(get_hub(ctx.app_name), f"server:{replica}", config.metrics_push_interval_s)
        self.pusher.start()

    async def model_info(self) -> ModelInfo:
        return self.impl.model_info()

    async def generate(self, request: GenerateRequest):
        async for item in self.impl.generate(request):
            yield item

    async def load(self) -> LoadView:
        return self.impl.engine.load()

    def record_routing_stats(self) -> dict:
        """Serve asks each replica for this periodically and hands it to the request router
        (its engine's last reported load, `LoadView.routing_stats`, the requests that load
        accounts for, and its cache events)."""
        return self.impl.routing_stats()

    async def check_health(self) -> None:
        self.impl.check_health()

    async def __del__(self) -> None:
        if getattr(self, "pusher", None) is not None:  # absent when __init__ failed (it raised the cause)
            await self.pusher.stop()
        if getattr(self, "impl", None) is not None:
            if self.impl.channel_server is not None:
                await self.impl.channel_server.close()
            self.impl.shutdown()
