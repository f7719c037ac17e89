"""What the engine returns (the shapes vLLM users know)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Logprob:
    logprob: float
    rank: int  # 1 = most likely
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, Logprob]] | None = None  # one dict per generated token
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error" | None while running
    stop_reason: str | int | None = None  # the stop string or stop token id that matched

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """A request's timestamps (time.monotonic seconds, the engine's clock), as vLLM reports
    them: TTFT = first_token_time - arrival_time; TPOT = (finished_time - first_token_time)
    / (output tokens - 1)."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    num_cached_tokens: int = 0
    error: str | None = None  # set when the request failed (e.g. its replica lost a shard)
    metrics: RequestMetrics | None = None  # the first sequence's timestamps
