"""hybrid-serve: serving for hybrid (attention + recurrent-state) language models.

    from hybrid_serve import LLM, SamplingParams

Lazy: `import hybrid_serve` loads nothing heavy; `LLM` pulls in the engine (torch) when
first used, `SamplingParams` and the output types stay pure Python.
"""
__version__ = "0.1.0"

_EXPORTS = {"LLM": "llm", "SamplingParams": "engine", "RequestOutput": "engine", "CompletionOutput": "engine"}


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hybrid_serve' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
