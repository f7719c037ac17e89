"""OpenAIServing: the ingress's logic, free of FastAPI and Ray.

    body (pydantic) ─▶ prompts (token ids) + SamplingParams ─▶ backend.generate per prompt
        ─▶ first item Started | GenerateError ─▶ JSON response, or SSE chunks

A `Backend` is what reaches the replicas (`replica_calls.py`: the protocol, `LocalBackend`,
the retries on other replicas; `ServeBackend` in `ingress.py`).
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import AsyncIterator

from ..engine.async_engine import ModelInfo
from ..engine.sampling_params import SamplingParams
from ..engine.validation import ContextLengthError, PromptError, validate_prompt
from ..metrics import IngressMetrics
from . import hop_log
from . import responses as R
from .config import AppConfig
from .errors import (OVERLOADED, APIError, GenerateError, bad_request, internal, model_not_found, retry_after_from,
                     unavailable)
from .protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from .replica_calls import Backend, Job, batches, call_replicas, close, merge
from .server import GenerateRequest

logger = logging.getLogger(__name__)

GREEDY_EPS = 1e-5  # temperatures below this sample greedily (as vLLM)
MIN_TOP_P = 1e-6  # smaller top_p (e.g. 5e-324) rounds to 0 in fp32 and would mask every token
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
ROUTING_POLICY = "serve_pow2"


class OpenAIServing:
    def __init__(self, config: AppConfig, backend: Backend, tokenizer, metrics: IngressMetrics | None = None) -> None:
        self.config = config
        self.backend = backend
        self.tokenizer = tokenizer
        self.model_name = config.model_name
        self.metrics = metrics
        self._info: ModelInfo | None = None
        self.created = int(time.time())
        self.ttft_avg_s: float | None = None
        bounds = config.queue_bounds()
        self.max_in_flight = bounds["max_ingress_requests"]
        self.in_flight = 0  # generation requests (HTTP) between arrival and their response's end

    # ----- the ingress's own bound --------------------------------------------------------
    def try_enter(self) -> APIError | None:
        """A generation request arrives at this ingress: None if it may go on (then `leave()`
        when its response has ended), or the 503 to answer at once, before any work (parsing,
        tokenizing, a replica call), when `max_in_flight` are already in flight here: all that
        the replicas and Serve's queue could take (max_replicas x max_ongoing_requests +
        max_queued_requests), so waiting here would only add queue time in front of admission."""
        if self.in_flight >= self.max_in_flight:
            return unavailable(f"the server is overloaded: {self.in_flight} requests are in flight at this ingress "
                               f"(limit {self.max_in_flight}); retry later", OVERLOADED,
                               retry_after_from(self.ttft_avg_s))
        self.in_flight += 1
        return None

    def leave(self) -> None:
        self.in_flight -= 1
        assert self.in_flight >= 0, "ingress in-flight count went negative"

    def _first_token(self, seconds: float) -> None:
        """Moving average of the time to a first token seen here (the Retry-After hint when
        the ingress queue is full)."""
        a = 0.2
        self.ttft_avg_s = seconds if self.ttft_avg_s is None else (1 - a) * self.ttft_avg_s + a * seconds

    # ----- model and health -------------------------------------------------------------
    async def model_info(self) -> ModelInfo:
        if self._info is None:
            try:
                self._info = await asyncio.wait_for(self.backend.model_info(), timeout=30)
            except Exception as exc:  # noqa: BLE001 - any failure here means "not ready"
                raise unavailable(f"the model is not ready yet ({type(exc).__name__})", "not_ready") from exc
        return self._info

    async def check_health(self) -> None:
        try:
            await asyncio.wait_for(self.backend.check_health(), timeout=10)
        except Exception as exc:  # noqa: BLE001
            raise unavailable(f"no healthy replica ({type(exc).__name__}: {exc})", "not_ready") from exc

    async def models(self) -> dict:
        info = await self.model_info()
        card = {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "hybrid-serve",
                "root": self.config.model or self.model_name, "max_model_len": info.max_model_len}
        return {"object": "list", "data": [card]}

    async def model(self, model: str) -> dict:
        """GET /v1/models/{model} (OpenAI's retrieve, `client.models.retrieve`): the served
        model's card; any other name is a 404 `model_not_found`."""
        if model != self.model_name:
            raise model_not_found(model, self.model_name)
        return (await self.models())["data"][0]

    # ----- endpoints --------------------------------------------------------------------
    async def completions(self, body: CompletionRequest):
        self._check_common(body)
        if body.echo:
            raise bad_request("echo is not supported", "echo")
        if body.suffix:
            raise bad_request("suffix is not supported", "suffix")
        info = await self.model_info()
        prompts = await self._completion_prompts(body.prompt)
        params = [self._params(body, p, body.max_tokens, COMPLETIONS_DEFAULT_MAX_TOKENS, body.logprobs, info)
                  for p in prompts]
        return await self._run("text_completion", f"cmpl-{uuid.uuid4().hex}", body, prompts, params, body.logprobs)

    async def chat(self, body: ChatCompletionRequest):
        self._check_common(body)
        info = await self.model_info()
        ids = await self._chat_prompt(body)
        top_n = (body.top_logprobs or 0) if body.logprobs else None
        if body.top_logprobs and not body.logprobs:
            raise bad_request("top_logprobs needs logprobs=true", "top_logprobs")
        max_tokens = body.max_completion_tokens or body.max_tokens
        params = self._params(body, ids, max_tokens, None, top_n, info)
        return await self._run("chat.completion", f"chatcmpl-{uuid.uuid4().hex}", body, [ids], [params], top_n)

    # ----- request -> engine inputs -----------------------------------------------------
    def _check_common(self, body: SamplingFields) -> None:
        if body.model is not None and body.model != self.model_name:
            raise model_not_found(body.model, self.model_name)
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(body, name):
                raise bad_request(f"{name} is not supported (only 0)", name)

    def _need_tokenizer(self, what: str) -> None:
        if self.tokenizer is None:
            raise bad_request(f"this model has no tokenizer, so {what} are not supported: send token ids")

    async def _encode(self, text: str) -> list[int]:
        return await asyncio.to_thread(self.tokenizer.encode, text, add_special_tokens=False)

    async def _completion_prompts(self, prompt) -> list[list[int]]:
        if isinstance(prompt, str):
            prompt = [prompt]
        if not prompt:
            raise bad_request("prompt must not be empty", "prompt")
        if all(isinstance(t, int) for t in prompt):
            return [list(prompt)]
        out = []
        for p in prompt:
            if isinstance(p, str):
                self._need_tokenizer("string prompts")
                out.append(await self._encode(p))
            else:
                out.append(list(p))
        return out

    async def _chat_prompt(self, body: ChatCompletionRequest) -> list[int]:
        self._need_tokenizer("chat completions")
        messages = []
        for m in body.messages:
            msg = m.model_dump(exclude_none=True)
            if isinstance(m.content, list):
                msg["content"] = "".join(part.text for part in m.content)
            msg.setdefault("content", "")  # e.g. an assistant turn that only had tool calls
            messages.append(msg)
        kwargs = dict(body.chat_template_kwargs or {})  # (tools are refused in protocol.UNSUPPORTED)
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=body.add_generation_prompt and
                not body.continue_final_message, continue_final_message=body.continue_final_message, **kwargs)
        except Exception as exc:  # noqa: BLE001 - template errors come from the user's messages
            raise bad_request(f"the chat template failed on these messages: {exc}", "messages") from exc
        if not isinstance(text, str):
            raise bad_request("the chat template did not produce text", "messages")
        return await self._encode(text)

    def _params(self, body: SamplingFields, ids: list[int], max_tokens: int | None, default_max: int | None,
                logprobs: int | None, info: ModelInfo) -> SamplingParams:
        """The SamplingParams of one prompt, validated against the model here, once
        (`engine.validation.validate_prompt`); the replicas trust it."""
        room = max(1, info.max_model_len - len(ids))
        if max_tokens is None:
            max_tokens = min(default_max or room, room)
        temperature = 1.0 if body.temperature is None else body.temperature
        top_k = body.top_k if body.top_k not in (None, 0) else -1
        try:
            params = SamplingParams(
                n=body.n, max_tokens=max_tokens, temperature=0.0 if temperature < GREEDY_EPS else temperature,
                top_p=1.0 if body.top_p is None else max(body.top_p, MIN_TOP_P), top_k=top_k,
                min_p=0.0 if body.min_p is None else body.min_p, seed=body.seed, stop=body.stop,
                stop_token_ids=body.stop_token_ids, ignore_eos=body.ignore_eos, min_tokens=body.min_tokens,
                logprobs=logprobs, skip_special_tokens=body.skip_special_tokens,
                include_stop_str_in_output=body.include_stop_str_in_output, logit_bias=body.logit_bias_ids())
        except ValueError as exc:
            raise bad_request(str(exc), str(exc).split(" ", 1)[0]) from exc
        try:
            validate_prompt(ids, params, info.limits)
        except ContextLengthError as exc:  # 400 either way, as OpenAI and vLLM answer
            if exc.prompt_fits:
                raise bad_request(str(exc), "max_tokens", "context_length_exceeded") from exc
            raise bad_request(f"{exc}: the prompt leaves no room for an output token", "prompt",
                              "context_length_exceeded") from exc
        except PromptError as exc:
            raise bad_request(str(exc), exc.param) from exc
        return params

    # ----- running -----------------------------------------------------------------------
    async def _run(self, obj: str, rid: str, body: SamplingFields, prompts: list[list[int]],
                   params: list[SamplingParams], top_n: int | None):
        hop_log.mark("ingress", "in", rid)
        jobs = await self._start(rid, prompts, params, body.user)
        hop_log.mark("ingress", "started", rid)
        if body.stream:
            return self._stream(obj, rid, body, jobs, top_n)
        try:
            response = await self._collect(obj, rid, body, jobs, top_n)
            hop_log.mark("ingress", "last", rid)
            return response
        finally:
            await close(jobs)

    async def _start(self, rid: str, prompts: list[list[int]], params: list[SamplingParams],
                     session_id: str | None = None) -> list[Job]:
        jobs: list[Job] = []
        try:
            for i, (ids, p) in enumerate(zip(prompts, params)):
                stream = call_replicas(self.backend, GenerateRequest(f"{rid}-{i}", ids, p, session_id),
                                       self.config.max_replicas, self._first_token)
                jobs.append(Job(i, len(ids), stream))
                first = await stream.__anext__()
                if isinstance(first, GenerateError):
                    if first.status_code == 503 and first.retry_after_s is None:  # the ingress queue was full
                        first.retry_after_s = retry_after_from(self.ttft_avg_s)
                    raise first.to_api_error()
                if self.metrics is not None:
                    self.metrics.router_decision(first.replica, ROUTING_POLICY)
        except BaseException:
            await close(jobs)
            raise
        return jobs

    async def _collect(self, obj: str, rid: str, body: SamplingFields, jobs: list[Job], top_n: int | None) -> dict:
        n = body.n
        choices = [R.Choice(j.prompt_index * n + i) for j in jobs for i in range(n)]
        async for job, delta in merge(jobs):
            job.num_cached_tokens = delta.num_cached_tokens
            for seq in delta.seqs:
                choices[job.prompt_index * n + seq.index].add(seq)
        use = self._usage(jobs, sum(len(c.token_ids) for c in choices))
        build = R.completion_response if obj == "text_completion" else R.chat_response
        return build(rid, int(time.time()), self.model_name, choices, top_n, use)

    def _usage(self, jobs: list[Job], completion_tokens: int) -> dict:
        return R.usage(sum(j.num_prompt_tokens for j in jobs), completion_tokens,
                       sum(j.num_cached_tokens for j in jobs))

    async def _stream(self, obj: str, rid: str, body: SamplingFields, jobs: list[Job],
                      top_n: int | None) -> AsyncIterator[str]:
        """The SSE events of a streamed response, each OpenAI event its own `data: ...` line.
        Events that are ready together go out as one chunk (one string, so one ASGI message
        and one relay by Serve's proxy): a delta that arrives while the stream writer is idle
        goes out at once and alone, and the deltas that queued up while it was busy (under
        load) go out together when it comes back (`replica_calls.batches`); the last deltas,
        the usage event and [DONE] share a chunk."""
        created, n, chat = int(time.time()), body.n, obj == "chat.completion"
        opts = body.stream_options
        include_usage = bool(opts and opts.include_usage)
        continuous = bool(opts and opts.continuous_usage_stats)
        offsets: dict[int, int] = {}
        completion_tokens = 0
        events: list[str] = []
        unfinished = len(jobs)
        answered = False
        try:
            if chat:
                yield "".join(R.sse(R.chat_chunk(rid, created, self.model_name, index, None, top_n))
                              for index in range(len(jobs) * n))
            async for batch in batches(jobs):
                if not answered:
                    answered = True
                    hop_log.mark("ingress", "first", rid)
                for job, delta in batch:
                    job.num_cached_tokens = delta.num_cached_tokens
                    unfinished -= delta.finished
                    for seq in delta.seqs:
                        index = job.prompt_index * n + seq.index
                        completion_tokens += len(seq.token_ids)
                        if not (seq.text or seq.finish_reason or (top_n is not None and seq.logprobs)):
                            continue
                        if chat:
                            chunk = R.chat_chunk(rid, created, self.model_name, index, seq, top_n)
                        else:
                            chunk = R.completion_chunk(rid, created, self.model_name, index, seq, top_n,
                                                       offsets.get(index, 0))
                            offsets[index] = offsets.get(index, 0) + len(seq.text)
                        if continuous:
                            chunk["usage"] = self._usage(jobs, completion_tokens)
                        events.append(R.sse(chunk))
                if events and unfinished > 0:  # the last ones go out with the usage event and [DONE]
                    yield "".join(events)
                    events = []
            if include_usage:
                events.append(R.sse(R.usage_chunk(rid, created, self.model_name, f"{obj}.chunk" if chat else obj,
                                                  self._usage(jobs, completion_tokens))))
        except APIError as exc:
            events.append(R.sse(exc.body()))
        except Exception as exc:  # noqa: BLE001 - the stream has started: report in-band
            logger.exception("stream %s failed", rid)
            events.append(R.sse(internal(f"generation failed: {type(exc).__name__}: {exc}").body()))
        finally:
            await close(jobs)
        events.append(R.DONE)
        hop_log.mark("ingress", "last", rid)
        yield "".join(events)
