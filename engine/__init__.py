"""The engine of one replica: config, requests and sampling parameters, scheduler, the step
loop (`engine.LLMEngine`), the async engine, and `runner/` (what every TP rank runs).

This facade is lazy: `from hybrid_serve.engine import SamplingParams` imports only the pure
Python modules it needs, so the HTTP ingress, which owns no GPU, never loads torch.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "EngineConfig": ".config",
    "SamplingParams": ".sampling_params",
    "CompletionOutput": ".outputs",
    "Logprob": ".outputs",
    "RequestOutput": ".outputs",
    "ModelLimits": ".validation",
    "validate_prompt": ".validation",
    "LLMEngine": ".engine",
    "AsyncLLMEngine": ".async_engine",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
