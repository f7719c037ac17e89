"""One validation of a request, at the boundary where it enters (the HTTP ingress, `LLM`,
`AsyncLLMEngine`, `LLMEngine.add_request`); the layers below trust what passed it. Pure
Python: the ingress uses it without torch.

    limits = ModelLimits(max_model_len=4096, vocab_size=151936)
    validate_prompt(prompt_token_ids, params, limits)   # raises a PromptError (a ValueError)
"""
from __future__ import annotations

from dataclasses import dataclass

from .sampling_params import SamplingParams


@dataclass(frozen=True)
class ModelLimits:
    """What a replica's model accepts."""

    max_model_len: int  # prompt + output tokens
    vocab_size: int


class PromptError(ValueError):
    """A request the model cannot take. `param` names the offending request field."""

    param = "prompt"


class ContextLengthError(PromptError):
    """prompt + max_tokens longer than the context. `prompt_fits`: the prompt alone leaves
    room for at least one output token (only max_tokens is too large)."""

    def __init__(self, message: str, prompt_len: int, max_tokens: int, max_model_len: int) -> None:
        super().__init__(message)
        self.prompt_len, self.max_tokens, self.max_model_len = prompt_len, max_tokens, max_model_len
        self.prompt_fits = prompt_len < max_model_len
        self.param = "max_tokens" if self.prompt_fits else "prompt"


class StopTokenError(PromptError):
    param = "stop_token_ids"


class LogitBiasError(PromptError):
    param = "logit_bias"


def validate_prompt(prompt_token_ids: list[int], params: SamplingParams, limits: ModelLimits) -> None:
    """Raises a PromptError naming the problem with a prompt (empty, unknown ids, stop token
    ids outside the vocabulary, too long for the context); changes nothing."""
    if not prompt_token_ids:
        raise PromptError("prompt is empty")
    vocab = limits.vocab_size
    if not _all_in_range(prompt_token_ids, vocab):
        bad = [t for t in prompt_token_ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab]
        raise PromptError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
    bad_stops = [t for t in params.stop_token_ids if t >= vocab]
    if bad_stops:
        raise StopTokenError(f"stop_token_ids {bad_stops[:5]} are outside the vocabulary [0, {vocab})")
    if params.logit_bias and max(params.logit_bias) >= vocab:
        bad_bias = sorted(t for t in params.logit_bias if t >= vocab)
        raise LogitBiasError(f"logit_bias token ids {bad_bias[:5]} are outside the vocabulary [0, {vocab})")
    if params.min_tokens and len(set(params.stop_token_ids)) >= vocab - 1:
        raise StopTokenError("stop_token_ids with min_tokens > 0 leave no token to sample")
    total = len(prompt_token_ids) + params.max_tokens
    if total > limits.max_model_len:
        raise ContextLengthError(
            f"prompt of {len(prompt_token_ids)} tokens + max_tokens={params.max_tokens} = {total} exceeds the "
            f"context length max_model_len={limits.max_model_len}", len(prompt_token_ids), params.max_tokens,
            limits.max_model_len)


def _all_in_range(token_ids: list[int], vocab_size: int) -> bool:
    """Every id an int (not a bool) in [0, vocab_size), checked at C speed: a 32k-token
    prompt in well under a millisecond."""
    return set(map(type, token_ids)) == {int} and min(token_ids) >= 0 and max(token_ids) < vocab_size
