"""OpenAI-compatible request and response schemas: pydantic, at the HTTP boundary only.

Unknown fields are accepted and ignored, except those that would change the output and are
not implemented (`UNSUPPORTED`): those get a 400 naming the field rather than being silently
dropped. Types are strict (`"stream": "yes"` is not a boolean, `"max_tokens": "5"` not an
integer) and text must be valid Unicode (a lone surrogate such as "\ud800" is a 400, not a
tokenizer crash). Field constraints here are the ones that need no model knowledge;
`deploy/serving.py` checks the rest (context length, vocabulary) and turns a request into
dataclasses (`SamplingParams`, token ids) for the engine.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_N = 128
MAX_TEMPERATURE = 100.0  # already uniform sampling; larger values overflow fp32 in the sampler
MAX_LOGPROBS = 20  # engine.sampling_params.MAX_LOGPROBS
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

TokenId = Annotated[int, Field(ge=0)]
Finite = dict(allow_inf_nan=False)


def check_unicode(value: Any, path: str = "") -> None:
    """Raise ValueError if any string in `value` (nested lists and dicts too) holds a lone
    surrogate: JSON can carry one ("\\ud800"), but it is not text and cannot be tokenized."""
    if isinstance(value, str):
        if value.isascii():
            return
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            where = f" in {path}" if path else ""
            raise ValueError(f"invalid Unicode{where}: lone surrogate {value[exc.start]!r} at character "
                             f"{exc.start}") from None
    elif isinstance(value, (list, tuple)):
        if value and isinstance(value[0], (int, float)):
            return  # token ids (typed before this runs: a list of ints holds nothing else)
        for i, item in enumerate(value):
            check_unicode(item, f"{path}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            check_unicode(key, path)
            check_unicode(item, f"{path}.{key}" if path else str(key))


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    @field_validator("*", mode="after")
    @classmethod
    def _valid_unicode(cls, value: Any) -> Any:
        check_unicode(value)
        return value


class StreamOptions(OpenAIModel):
    include_usage: Optional[bool] = False
    continuous_usage_stats: Optional[bool] = False


class SamplingFields(OpenAIModel):
    """Fields shared by completions and chat completions (OpenAI's, plus vLLM's extras)."""

    model: Optional[str] = None
    max_tokens: Optional[int] = Field(None, ge=1)
    n: int = Field(1, ge=1, le=MAX_N)
    temperature: Optional[float] = Field(None, ge=0.0, le=MAX_TEMPERATURE, **Finite)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0, **Finite)
    top_k: Optional[int] = Field(None, ge=-1)
    min_p: Optional[float] = Field(None, ge=0.0, le=1.0, **Finite)
    seed: Optional[int] = Field(None, ge=INT64_MIN, le=INT64_MAX)
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[list[TokenId]] = None
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    presence_penalty: Optional[float] = Field(None, **Finite)
    frequency_penalty: Optional[float] = Field(None, **Finite)
    logit_bias: Optional[dict[str, Annotated[float, Field(ge=-100.0, le=100.0, **Finite)]]] = None
    user: Optional[str] = None

    @field_validator("logit_bias", mode="after")
    @classmethod
    def _token_id_keys(cls, value: Optional[dict[str, float]]) -> Optional[dict[str, float]]:
        for key in value or {}:
            if not key.isdigit() or not key.isascii():
                raise ValueError(f"keys must be token ids (non-negative integers as strings), got {key!r}")
        return value

    @model_validator(mode="after")
    def _no_unsupported_fields(self):
        extra = self.model_extra or {}
        for name, (is_noop, why) in UNSUPPORTED.items():
            if name in extra and not is_noop(extra[name], self):
                raise UnsupportedField(name, why)
        return self

    def logit_bias_ids(self) -> Optional[dict[int, float]]:
        return {int(k): v for k, v in self.logit_bias.items()} if self.logit_bias else None


class UnsupportedField(ValueError):
    """A known OpenAI/vLLM field, with a value that would change the output, that this server
    does not implement (a 400 naming the field: never silently ignored)."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"{name} is not supported: {why}")
        self.param = name


def _absent(value, body) -> bool:
    return value is None or value == [] or value == {}


_STRUCTURED = "structured output (JSON schema, regex, grammar, choice) is not implemented yet"
# field -> (is its value a no-op?, why it is refused otherwise)
UNSUPPORTED: dict[str, tuple[Any, str]] = {
    "best_of": (lambda v, body: v is None or v == getattr(body, "n", 1),
                "best_of > n (ranking extra samples) is not implemented; use n"),
    "response_format": (lambda v, body: v is None or (isinstance(v, dict) and v.get("type") == "text"),
                        f"only {{'type': 'text'}}; {_STRUCTURED}"),
    "tools": (_absent, "tool calling is not implemented yet (no tool-call parsing)"),
    "tool_choice": (lambda v, body: v is None or v == "none", "tool calling is not implemented yet"),
    "functions": (_absent, "function calling is not implemented"),
    "function_call": (lambda v, body: v is None or v == "none", "function calling is not implemented"),
    "guided_json": (_absent, _STRUCTURED),
    "guided_regex": (_absent, _STRUCTURED),
    "guided_choice": (_absent, _STRUCTURED),
    "guided_grammar": (_absent, _STRUCTURED),
    "structured_outputs": (_absent, _STRUCTURED),
    "repetition_penalty": (lambda v, body: v is None or v == 1 or v == 1.0, "only 1.0"),
    "use_beam_search": (lambda v, body: v is None or v is False, "beam search is not implemented"),
    "prompt_logprobs": (lambda v, body: v is None, "prompt logprobs are not implemented"),
    "audio": (lambda v, body: v is None, "audio output is not implemented"),
    "modalities": (lambda v, body: v is None or v == ["text"], "only ['text']"),
}


class CompletionRequest(SamplingFields):
    prompt: Union[str, list[str], list[TokenId], list[list[TokenId]]]
    logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: Optional[bool] = False
    suffix: Optional[str] = None


class TextPart(OpenAIModel):
    type: Literal["text"]
    text: str


class ChatMessage(OpenAIModel):
    role: str
    content: Optional[Union[str, list[TextPart]]] = None
    name: Optional[str] = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    logprobs: Optional[bool] = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: Optional[dict[str, Any]] = None


# ----- responses: errors and /v1/models (completion bodies are built as dicts in responses.py) ------
class ErrorInfo(BaseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: Optional[str] = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "hybrid-serve"
    root: Optional[str] = None
    max_model_len: Optional[int] = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


ERROR_RESPONSES = {code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 429, 503)}
