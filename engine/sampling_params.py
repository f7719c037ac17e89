"""SamplingParams: what a user asks of one prompt (mirrors vLLM's fields and defaults)."""
from __future__ import annotations

from dataclasses import dataclass, field

MAX_LOGPROBS = 20
MAX_LOGIT_BIAS = 100.0  # OpenAI's range for logit_bias values: [-100, 100]


@dataclass
class SamplingParams:
    n: int = 1
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: off
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None  # number of top logprobs per token (0: only the sampled token's)
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit before sampling
    stop_strings: list[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        def bad(name: str, value, want: str) -> ValueError:
            return ValueError(f"{name} must be {want}, got {value!r}")

        if not isinstance(self.n, int) or self.n < 1:
            raise bad("n", self.n, "an integer >= 1")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise bad("max_tokens", self.max_tokens, "an integer >= 1")
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0 or self.temperature != self.temperature:
            raise bad("temperature", self.temperature, ">= 0")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", self.top_p, "in (0, 1]")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise bad("top_k", self.top_k, "-1 (off), 0 (off) or >= 1")
        if not isinstance(self.min_p, (int, float)) or not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", self.min_p, "in [0, 1]")
        if self.seed is not None and not isinstance(self.seed, int):
            raise bad("seed", self.seed, "an integer or None")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            raise bad("min_tokens", self.min_tokens, f"an integer in [0, max_tokens={self.max_tokens}]")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise bad("logprobs", self.logprobs, f"None or an integer in [0, {MAX_LOGPROBS}]")
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not isinstance(s, str) or not s for s in stops):
            raise bad("stop", self.stop, "a non-empty string, a list of them, or None")
        self.stop_strings = stops
        ids = list(self.stop_token_ids or [])
        if any(not isinstance(t, int) or t < 0 for t in ids):
            raise bad("stop_token_ids", self.stop_token_ids, "a list of non-negative integers")
        self.stop_token_ids = ids
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise bad("logit_bias", self.logit_bias, "a dict of token id -> bias")
            for token, bias in self.logit_bias.items():
                if not isinstance(token, int) or isinstance(token, bool) or token < 0:
                    raise bad("logit_bias", self.logit_bias, f"keyed by token ids >= 0 (not {token!r})")
                if isinstance(bias, bool) or not isinstance(bias, (int, float)) or \
                        not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                    raise bad("logit_bias", self.logit_bias,
                              f"biases in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}] (token {token}: {bias!r})")
            self.logit_bias = {t: float(b) for t, b in self.logit_bias.items()} or None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
