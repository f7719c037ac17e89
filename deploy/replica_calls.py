"""Calls from the ingress to the replicas: the `Backend` protocol, `LocalBackend`, one
request's call with failures and refusals hidden while they can be (`call_replicas`), and
the streams of a request's prompts (`Job`, `merge`, `close`).

    call_replicas(backend, request) ─▶ Started ─▶ RequestDelta ... (or one GenerateError)
        attempt 1: backend.generate ─▶ refused "overloaded" / failed before a token ─▶ attempt 2 ...

A `Backend` is what reaches the replicas: `ServeBackend` (a Serve handle, in `ingress.py`)
or `LocalBackend` (an in-process `LLMServerImpl`, for tests and tools).
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from contextlib import suppress
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Protocol

from ..engine.async_engine import ModelInfo, RequestDelta
from .errors import OVERLOADED, REPLICA_FAILURES, APIError, GenerateError
from .server import GenerateRequest, LLMServerImpl, Started

logger = logging.getLogger(__name__)

REPLICA_ATTEMPTS = 4  # tries of one request on replicas that fail or refuse it before its first token
REPLICA_RETRY_WINDOW_S = 30.0  # ... all within this long (Serve drops a dead replica within seconds)
REPLICA_RETRY_BACKOFF_S = 0.25  # times the attempt number, between tries after a failure (none after a refusal)


class Backend(Protocol):
    async def model_info(self) -> ModelInfo: ...

    def generate(self, request: GenerateRequest) -> AsyncIterator[Started | GenerateError | RequestDelta]: ...

    async def check_health(self) -> None: ...


class LocalBackend:
    """Calls one in-process replica directly (no Ray)."""

    def __init__(self, server: LLMServerImpl) -> None:
        self.server = server

    async def model_info(self) -> ModelInfo:
        return self.server.model_info()

    def generate(self, request: GenerateRequest):
        return self.server.generate(request)

    async def check_health(self) -> None:
        self.server.check_health()


async def call_replicas(backend: Backend, request: GenerateRequest, max_replicas: int,
                        on_first_token: Callable[[float], None] | None = None
                        ) -> AsyncIterator[Started | GenerateError | RequestDelta]:
    """`backend.generate`, with replica failures and refusals hidden while they can be: a
    replica that dies, cannot be reached or whose engine died (`errors.REPLICA_FAILURES`)
    before this request's first token is replaced by another (up to REPLICA_ATTEMPTS tries
    within REPLICA_RETRY_WINDOW_S, a short back-off between them), and so is one
    that refuses it as overloaded, at once, until as many replicas as there can be
    (`max_replicas`) have refused (then 503 + the smallest Retry-After they gave); after a
    token has gone out a failure is raised (503 with its code, or an SSE error event).
    `on_first_token(seconds since the first try)` is called once, at the first delta."""
    begin = time.monotonic()
    deadline = begin + REPLICA_RETRY_WINDOW_S
    started, answered = False, False
    refused_by: set[str] = set()
    soonest: int | None = None  # the smallest Retry-After of the refusals
    for attempt in range(1, REPLICA_ATTEMPTS + 1):
        produced, retry, refused = False, False, False
        # a retry has an id of its own: the attempt it replaces may still be aborting on the same
        # replica (".": the hop log maps a replica's id to the ingress's by its last "-")
        stream = backend.generate(request if attempt == 1 else
                                  dataclasses.replace(request, request_id=f"{request.request_id}.{attempt}"))
        try:
            async for item in stream:
                if isinstance(item, Started):
                    if not started:
                        started = True
                        yield item
                    continue
                if isinstance(item, GenerateError):
                    more = attempt < REPLICA_ATTEMPTS and time.monotonic() < deadline
                    if item.code == OVERLOADED and item.replica is not None:  # a replica's own refusal
                        refused = True
                        refused_by.add(item.replica)
                        if item.retry_after_s is not None:
                            soonest = item.retry_after_s if soonest is None else min(soonest, item.retry_after_s)
                            item.retry_after_s = soonest
                        retry = more and len(refused_by) < max_replicas
                    else:
                        retry = item.code in REPLICA_FAILURES and more and not produced
                    if retry:
                        break
                    if started:  # after a token, or a refusal after another replica took the request
                        raise item.to_api_error()
                    yield item
                    return
                produced = True
                if not answered:
                    answered = True
                    if on_first_token is not None:
                        on_first_token(time.monotonic() - begin)
                yield item
        except APIError as exc:
            if exc.code not in REPLICA_FAILURES or produced or attempt == REPLICA_ATTEMPTS or \
                    time.monotonic() >= deadline:
                raise
            retry = True
        finally:
            with suppress(Exception):
                await stream.aclose()
        if not retry:
            return
        if refused:  # another replica may have room now: no wait
            logger.debug("request %s: refused by an overloaded replica; trying another (attempt %d)",
                         request.request_id, attempt + 1)
            continue
        logger.warning("request %s: replica failed before its first token; retrying (attempt %d)",
                       request.request_id, attempt + 1)
        await asyncio.sleep(REPLICA_RETRY_BACKOFF_S * attempt)


@dataclass
class Job:
    """One prompt's generation on one replica."""

    prompt_index: int
    num_prompt_tokens: int
    stream: AsyncIterator
    num_cached_tokens: int = 0
    draining: bool = False  # its final delta came; the rest of its stream is consumed in the background


_DRAINS: set[asyncio.Task] = set()  # (the loop holds tasks weakly)


def _drain_in_background(job: Job) -> None:
    """The rest of a stream whose final delta has come: the end of the replica's call (one more
    message from a replica that, at the end of a burst, is sending hundreds of final deltas),
    consumed without holding the response for it."""
    async def drain() -> None:
        with suppress(Exception):
            async for _ in job.stream:
                pass

    job.draining = True
    task = asyncio.get_running_loop().create_task(drain())
    _DRAINS.add(task)
    task.add_done_callback(_DRAINS.discard)


async def merge(jobs: list[Job]) -> AsyncIterator[tuple[Job, RequestDelta]]:
    """Deltas of all jobs as they come."""
    if len(jobs) == 1:
        async for delta in jobs[0].stream:
            yield jobs[0], delta
        return
    async for batch in batches(jobs):
        for item in batch:
            yield item


async def batches(jobs: list[Job]) -> AsyncIterator[list[tuple[Job, RequestDelta]]]:
    """Deltas of all jobs, in batches: each batch is every delta that had arrived, in arrival
    order, when the consumer asked for the next one (at least one: it waits only while none
    has). A consumer that keeps up gets each delta alone as soon as it arrives; one that falls
    behind (a stream writer under load) gets the backlog at once, so it can send it as one
    message. A job's failure is raised after the deltas that arrived before it. A job ends
    with its finished delta: the end of its stream (the replica call's) is consumed in the
    background, so the response's last chunk does not wait for it."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(job: Job) -> None:
        try:
            async for delta in job.stream:
                queue.put_nowait((job, delta))
                if delta.finished:  # the job's end: its stream's own end is not waited for
                    _drain_in_background(job)
                    break
        except Exception as exc:  # noqa: BLE001 - handed to the consumer
            queue.put_nowait((job, exc))
        queue.put_nowait((job, None))

    tasks = [asyncio.create_task(pump(j)) for j in jobs]
    try:
        remaining = len(jobs)
        while remaining:
            batch: list[tuple[Job, RequestDelta]] = []
            item = await queue.get()
            while True:
                job, value = item
                if value is None:
                    remaining -= 1
                elif isinstance(value, Exception):
                    if batch:
                        yield batch
                    raise value
                else:
                    batch.append((job, value))
                if queue.empty():
                    break
                item = queue.get_nowait()
            if batch:
                yield batch
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def close(jobs: list[Job]) -> None:
    for job in jobs:
        if not job.draining:
            with suppress(Exception):
                await job.stream.aclose()
