"""A request inside the engine: its tokens, progress, cache holdings and output state."""
from __future__ import annotations

import enum
import time

import torch

from ..mem_cache import RequestAlloc
from .detokenizer import IncrementalDetokenizer
from .outputs import Logprob
from .sampling_params import SamplingParams


def sequence_ids(request_id: str, n: int) -> list[str]:
    """The ids of a request's n samples (one sequence each): `request_id`, `request_id#1`, ..."""
    return [request_id] + [f"{request_id}#{i}" for i in range(1, n)]


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Request:
    """One sequence. `num_computed_tokens` counts tokens whose KV/state are in the pools;
    the request still needs `len(token_ids) - num_computed_tokens` tokens computed, and
    samples a token whenever a step brings it to the end of its tokens."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 detokenizer: IncrementalDetokenizer, eos_token_ids: set[int], seed: int | None,
                 device: torch.device | str = "cpu") -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.params = params
        self.detokenizer = detokenizer
        self.eos_token_ids = set() if params.ignore_eos else set(eos_token_ids)
        self._stop_ids: set[int] | None = None
        self.output_token_ids: list[int] = []
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_computed_tokens = 0
        # tokens sampled by a step already queued on the device but not yet read back (0 or 1):
        # the request's next input is the device's copy (engine.py, "overlap")
        self.num_pending_tokens = 0
        self.num_cached_tokens: int | None = None  # prefix-cache hit at first admission
        self.status = RequestStatus.WAITING
        self.alloc: RequestAlloc | None = None
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.logprobs: list[dict[int, Logprob]] | None = [] if params.logprobs is not None else None
        self.cumulative_logprob = 0.0
        self.seed = seed  # per-request randomness: the host generator below, or (seed, token index) on GPU
        self.generator: torch.Generator | None = None
        if not params.greedy:
            self.generator = torch.Generator(device=device)
            if seed is None:
                self.generator.seed()
            else:
                self.generator.manual_seed(seed)
        self.arrival_time = time.monotonic()
        self.first_scheduled_time: float | None = None  # set by the scheduler at first admission
        self.first_token_time: float | None = None
        self.finished_time: float | None = None  # set when the last token is appended

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens_to_compute(self) -> int:
        return len(self.token_ids) + self.num_pending_tokens - self.num_computed_tokens

    @property
    def num_output_tokens(self) -> int:
        """Output tokens sampled so far, pending ones included."""
        return len(self.output_token_ids) + self.num_pending_tokens

    @property
    def sampled_last_token(self) -> bool:
        """Its last output token is sampled (pending): it needs no more steps."""
        return self.num_output_tokens >= self.params.max_tokens

    @property
    def finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    def stop_token_set(self) -> set[int]:
        if self._stop_ids is None:
            self._stop_ids = self.eos_token_ids | set(self.params.stop_token_ids)
        return self._stop_ids

    def append_token(self, token_id: int) -> None:
        """Record a sampled token and decide whether the request is done."""
        now = time.monotonic()
        if self.first_token_time is None:
            self.first_token_time = now
        self._append(token_id)
        if self.finish_reason is not None:
            self.finished_time = now

    def _append(self, token_id: int) -> None:
        """Append a token and set finish_reason if it ends the request (stop token or string,
        max_tokens)."""
        self.output_token_ids.append(token_id)
        self.token_ids.append(token_id)
        num_out = len(self.output_token_ids)
        if token_id in self.stop_token_set() and num_out >= self.params.min_tokens:
            self.finish_reason, self.stop_reason = "stop", token_id
            if token_id in self.eos_token_ids:
                self.stop_reason = None
            return
        stop = self.detokenizer.push(token_id)
        if stop is not None and num_out >= self.params.min_tokens:
            self.finish_reason, self.stop_reason = "stop", stop
            return
        if num_out >= self.params.max_tokens:
            self.finish_reason = "length"
            self.detokenizer.flush()
