"""hybrid-serve: serving for hybrid (attention + recurrent-state) language models."""
__version__ = "0.1.0"


def __getattr__(name):  # keep `import hybrid_serve` light; engine pulls in torch
    if name in ("LLM", "SamplingParams", "RequestOutput", "CompletionOutput"):
        from . import engine

        return getattr(engine, name)
    raise AttributeError(name)
