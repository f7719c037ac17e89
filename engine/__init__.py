from .config import EngineConfig
from .llm import LLM
from .outputs import CompletionOutput, Logprob, RequestOutput
from .sampling_params import SamplingParams

__all__ = ["CompletionOutput", "EngineConfig", "LLM", "Logprob", "RequestOutput", "SamplingParams"]
