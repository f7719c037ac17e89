"""The HTTP ingress: a FastAPI app over `OpenAIServing`, and its Serve deployment.

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /v1/models/{model}, GET /health,
GET /metrics (the whole application's hybrid_serve_* metrics), GET /openapi.json (needs the
API key when one is set; /docs and /redoc are served only without one). `create_app` needs no Ray,
so tests can drive it with a `LocalBackend` (`replica_calls.py`). Past the ingress's bound on generation requests
in flight (`InFlightLimit`) a request gets 503 + Retry-After before any work is done for it.
"""
from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
import time
from typing import Awaitable, Callable

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import metrics
from ..engine.tokenizer import load_tokenizer
from .config import AppConfig
from .delta_channel import ChannelClient, ChannelLost, ChannelUnreachable
from .errors import (OVERLOADED, REPLICA_FAILED, APIError, GenerateError, internal, replica_failed, too_large,
                     unauthorized, unavailable)
from .metrics_hub import HubReader, MetricsPusher, get_hub
from .protocol import ERROR_RESPONSES, ChatCompletionRequest, CompletionRequest, ModelCard, ModelList, UnsupportedField
from .server import GenerateRequest, Started
from .serving import OpenAIServing

logger = logging.getLogger(__name__)

MetricsSource = Callable[[], Awaitable[bytes]]
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class BodyLimit:
    """ASGI middleware: 413 (OpenAI shape) for a body over `max_bytes`, by header or as read."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await self._reject(send)
        seen, rejected = 0, False

        async def limited_receive():
            nonlocal seen, rejected
            if rejected:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    rejected = True
                    await self._reject(send)
                    return {"type": "http.disconnect"}  # the app stops reading and answers no one
            return message

        async def guarded_send(message):
            if not rejected:
                await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not rejected:
                raise

    async def _reject(self, send) -> None:
        err = too_large(f"the request body is larger than {self.max_bytes} bytes", None, "request_too_large")
        await JSONResponse(err.body(), status_code=413)({"type": "http"}, None, send)


class CountRequests:
    """ASGI middleware: counts /v1/* responses by route and status code."""

    ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models")

    def __init__(self, app, ingress_metrics: metrics.IngressMetrics) -> None:
        self.app, self.metrics = app, ingress_metrics

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] != "http" or path not in self.ROUTES:
            return await self.app(scope, receive, send)

        async def counting_send(message):
            if message["type"] == "http.response.start":
                self.metrics.http_request(path, message["status"])
            await send(message)

        await self.app(scope, receive, counting_send)


class InFlightLimit:
    """ASGI middleware: the ingress's own bound (`OpenAIServing.try_enter`). A generation
    request (POST /v1/completions, /v1/chat/completions) counts from its arrival until its
    response has been sent (a stream to its end, or the client gone); past the bound it gets
    503 + Retry-After at once, before its body is read, parsed or tokenized."""

    ROUTES = ("/v1/completions", "/v1/chat/completions")

    def __init__(self, app, serving: OpenAIServing) -> None:
        self.app, self.serving = app, serving

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") not in self.ROUTES:
            return await self.app(scope, receive, send)
        refusal = self.serving.try_enter()
        if refusal is not None:
            return await _error_response(refusal)(scope, receive, send)
        try:
            await self.app(scope, receive, send)
        finally:
            self.serving.leave()


def _error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status_code, headers=err.headers())


def create_app(serving: OpenAIServing, metrics_source: MetricsSource | None = None) -> FastAPI:
    config = serving.config
    keyed = config.api_key is not None  # then the spec needs the key too, and the browser docs are off
    app = FastAPI(title="hybrid-serve", version="0.1.0",
                  description="OpenAI-compatible API of hybrid-serve (hybrid attention + recurrent-state models).",
                  openapi_url=None if keyed else "/openapi.json", docs_url=None if keyed else "/docs",
                  redoc_url=None if keyed else "/redoc")

    async def check_api_key(request: Request) -> None:
        if config.api_key is None:
            return
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), config.api_key.encode()):
            raise unauthorized()

    @app.exception_handler(APIError)
    async def on_api_error(request: Request, exc: APIError):
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        # a union (e.g. content: str | list of parts) reports one error per branch: a value
        # error (our own check, e.g. a lone surrogate) says more than "not a valid string"
        first = next((e for e in errors if e.get("type") == "value_error"), errors[0] if errors else {})
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        if first.get("type") == "json_invalid":
            loc = []
        msg = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
        cause = (first.get("ctx") or {}).get("error")
        if isinstance(cause, UnsupportedField):  # a whole-body check naming its field
            loc, msg = [cause.param], str(cause)
        message = f"{'.'.join(loc) or 'body'}: {msg}"
        param = loc[0] if loc else None  # the request field (deeper parts name union branches)
        return JSONResponse({"error": {"message": message, "type": "invalid_request_error",
                                       "param": param, "code": None}}, status_code=400)

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception):
        logger.exception("unhandled error on %s", request.url.path)
        return _error_response(internal(f"internal error: {type(exc).__name__}: {exc}"))

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException):
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return JSONResponse({"error": {"message": str(exc.detail), "type": kind, "param": None, "code": None}},
                            status_code=exc.status_code)

    def respond(result):
        if isinstance(result, dict):
            return JSONResponse(result)
        return StreamingResponse(result, media_type="text/event-stream", headers=SSE_HEADERS)

    @app.post("/v1/completions", dependencies=[Depends(check_api_key)], responses=ERROR_RESPONSES)
    async def completions(body: CompletionRequest):
        return respond(await serving.completions(body))

    @app.post("/v1/chat/completions", dependencies=[Depends(check_api_key)], responses=ERROR_RESPONSES)
    async def chat_completions(body: ChatCompletionRequest):
        return respond(await serving.chat(body))

    @app.get("/v1/models", dependencies=[Depends(check_api_key)], response_model=ModelList,
             responses=ERROR_RESPONSES)
    async def models():
        return JSONResponse(await serving.models())

    # `:path`: a Hub id served under its own name has a slash (Qwen/Qwen3.5-0.8B)
    @app.get("/v1/models/{model:path}", dependencies=[Depends(check_api_key)], response_model=ModelCard,
             responses=ERROR_RESPONSES)
    async def model_card(model: str):
        return JSONResponse(await serving.model(model))

    if keyed:
        @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(check_api_key)])
        async def openapi_spec():
            return JSONResponse(app.openapi())

    @app.get("/health", responses={503: ERROR_RESPONSES[503]})
    async def health():
        await serving.check_health()
        return Response(status_code=200)

    @app.get("/metrics", response_class=Response)
    async def prometheus_metrics():
        body = await metrics_source() if metrics_source else metrics.render([metrics.snapshot()])
        return Response(body, media_type=metrics.CONTENT_TYPE)

    app.add_middleware(InFlightLimit, serving=serving)  # inside CountRequests: its 503s are counted
    if serving.metrics is not None:
        app.add_middleware(CountRequests, ingress_metrics=serving.metrics)
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes)
    return app


class ServeBackend:
    """Reaches the LLMServer replicas through a Serve handle (Serve's own load-aware routing).
    A replica that dies or cannot be reached surfaces as `errors.replica_failed` (raised
    mid-stream, a `GenerateError` before it), which `OpenAIServing` retries elsewhere.

    With `channels` (`delta_channel.ChannelClient`), a request's tokens come by the delta
    channel the replica names in `Started`, and its Serve call only starts it and ends with it;
    a replica that names none (`delta_channels` off there) streams them in the call as before.
    If the first channel this ingress opens cannot be reached (a firewall between nodes that
    lets Ray's ports through but not the replicas' channel ports), it stops asking for channels
    and says so once; that request is retried like one whose replica failed."""

    HEALTH_ATTEMPTS = 3  # a dead replica Serve has not dropped yet may take a health call
    CALL_END_GRACE_S = 10.0  # the call ended, but the request's last tokens have not come by the channel

    def __init__(self, handle, channels: ChannelClient | None = None) -> None:
        self.handle = handle
        self.channels = channels

    async def model_info(self):
        return await self.handle.model_info.remote()

    async def check_health(self) -> None:
        """Healthy if a replica answers: the call is routed again when one is unreachable."""
        for attempt in range(self.HEALTH_ATTEMPTS):
            try:
                await self.handle.check_health.remote()
                return
            except Exception as exc:
                if not _is_unavailable(exc) or attempt == self.HEALTH_ATTEMPTS - 1:
                    raise

    async def generate(self, request: GenerateRequest):
        from ray.serve.exceptions import BackPressureError

        channels = self.channels
        key, queue = channels.register() if channels is not None else (None, None)
        if key is not None:
            request = dataclasses.replace(request, channel=(channels.channel_id, key))
        gen = self.handle.options(stream=True).generate.remote(request)
        started, finished = False, False
        call_end: asyncio.Task | None = None  # a channel request's: the rest of its Serve call
        try:
            async for item in gen:
                started = True
                if isinstance(item, Started) and item.channel is not None and key is not None:
                    try:
                        await channels.attach(key, item.channel)
                    except ChannelUnreachable:
                        if not channels.ever_connected and self.channels is not None:
                            self.channels = None
                            logger.warning("the replicas' delta channels cannot be reached from this ingress "
                                           "(%s:%d); streaming tokens through Serve's calls instead",
                                           item.channel.host, item.channel.port)
                        raise
                    yield item
                    call_end = asyncio.get_running_loop().create_task(_call_end(gen, queue))
                    _CALL_ENDS.add(call_end)  # (the loop holds tasks weakly; it may outlive this stream)
                    call_end.add_done_callback(_CALL_ENDS.discard)
                    break
                yield item
            if call_end is not None:  # its tokens come by the channel
                async for item in _channel_items(queue, self.CALL_END_GRACE_S):
                    finished = getattr(item, "finished", False)
                    yield item
        except BackPressureError as exc:
            yield GenerateError(503, f"every replica is busy and the ingress queue is full "
                                     f"({exc.args[0] if exc.args else '?'} queued); retry later", code=OVERLOADED)
        except Exception as exc:
            if not (isinstance(exc, ChannelLost) or _is_unavailable(exc)):
                raise
            message = f"the replica failed ({exc if isinstance(exc, ChannelLost) else type(exc).__name__})"
            if started:
                raise replica_failed(message) from exc
            yield GenerateError(503, message, code=REPLICA_FAILED)
        finally:
            if key is not None:
                channels.unregister(key)
            # a finished request's call ends on its own (`call_end` takes its end); any other
            # is cancelled, which aborts the request on its replica
            if call_end is None or not (finished or call_end.done()):
                if call_end is not None:
                    call_end.cancel()
                gen.cancel()


_CALL_ENDED = object()  # a channel request's Serve call ended (without an item after `Started`)
_CALL_ENDS: set[asyncio.Task] = set()  # the `_call_end` tasks running


async def _call_end(gen, queue: asyncio.Queue) -> None:
    """The rest of a channel request's Serve call after `Started`: its end, or its failure (or
    an item a replica sent in the call after all), put on the request's queue."""
    try:
        async for item in gen:
            queue.put_nowait(item)
        queue.put_nowait(_CALL_ENDED)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - handed to the stream's reader
        queue.put_nowait(exc)


async def _channel_items(queue: asyncio.Queue, grace_s: float):
    """A channel request's deltas and errors from its queue, to its finished delta or its
    error; the call's failure or a lost channel is raised. Once the call has ended, its last
    tokens (written to the channel before the replica ended the call) get `grace_s` to come."""
    deadline = None
    while True:
        if deadline is None:
            item = await queue.get()
        else:
            try:
                item = await asyncio.wait_for(queue.get(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                raise replica_failed("the replica ended the request without its last tokens") from None
        if item is _CALL_ENDED:
            deadline = time.monotonic() + grace_s
            continue
        if isinstance(item, BaseException):
            raise item
        yield item
        if isinstance(item, GenerateError) or getattr(item, "finished", False):
            return


def _is_unavailable(exc: Exception) -> bool:
    import ray.exceptions as rex

    kinds = tuple(getattr(rex, n) for n in ("RayActorError", "ActorUnavailableError", "ActorDiedError")
                  if hasattr(rex, n))
    serve_kinds = tuple(getattr(serve.exceptions, n) for n in ("DeploymentUnavailableError",)
                        if hasattr(serve.exceptions, n))
    return isinstance(exc, kinds + serve_kinds)


@serve.deployment(name="OpenAIIngress", ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1024)
@serve.ingress()
class OpenAIIngress:
    async def __init__(self, config: AppConfig, llm_server) -> None:
        ctx = serve.get_replica_context()
        self.replica = ctx.replica_id.unique_id
        tokenizer = load_tokenizer(config.tokenizer_path())
        ingress_metrics = metrics.IngressMetrics(config.model_name, f"ingress:{self.replica}")
        channels = ChannelClient(f"ingress:{self.replica}") if config.delta_channels else None
        self.serving = OpenAIServing(config, ServeBackend(llm_server, channels), tokenizer, ingress_metrics)
        self.hub = get_hub(ctx.app_name)
        self.source = f"ingress:{self.replica}"
        self.hub_reader = HubReader(self.hub, self.source)
        self.pusher = MetricsPusher(self.hub, self.source, config.metrics_push_interval_s)
        self.pusher.start()

    async def _metrics(self) -> bytes:
        return metrics.render([metrics.snapshot()] + await self.hub_reader.collect())

    def __serve_build_asgi_app__(self):
        return create_app(self.serving, self._metrics)

    async def __del__(self) -> None:
        await self.pusher.stop()
        channels = self.serving.backend.channels
        if channels is not None:  # (None also after falling back to Serve's calls)
            await channels.close()


__all__ = ["OpenAIIngress", "ServeBackend", "create_app", "unavailable"]
