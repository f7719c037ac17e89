"""OpenAI-compatible request and response schemas: pydantic, at the HTTP boundary only.

Unknown fields are accepted (and ignored). Field constraints here are the ones that need
no model knowledge; `deploy/serving.py` checks the rest (context length, vocabulary) and
turns a request into dataclasses (`SamplingParams`, token ids) for the engine.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

MAX_N = 128
MAX_TEMPERATURE = 100.0  # already uniform sampling; larger values overflow fp32 in the sampler
MAX_LOGPROBS = 20  # engine.sampling_params.MAX_LOGPROBS
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

TokenId = Annotated[int, Field(ge=0)]
Finite = dict(allow_inf_nan=False)


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="allow")


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
    user: Optional[str] = None


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


ERROR_RESPONSES = {code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 503)}
