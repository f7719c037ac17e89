"""Set-ups the benchmarks share (benchmarks/ and the replica actor's timed decode)."""
from __future__ import annotations

import torch

from .engine import LLMEngine
from .sampling_params import SamplingParams


def start_decode_batch(engine: LLMEngine, batch: int, prompt_len: int, max_tokens: int, token_high: int,
                       seed: int, prefix: str = "bench") -> list[str]:
    """Queue `batch` greedy requests of random prompts (token ids in [10, token_high)), run
    their prefill and 3 warm-up decode steps (graph capture), so that every following step
    is a pure decode step of the whole batch. Returns the sequence ids."""
    gen = torch.Generator().manual_seed(seed)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request(f"{prefix}{i}", torch.randint(10, token_high, (prompt_len,), generator=gen).tolist(),
                              params)[0] for i in range(batch)]
    while engine.scheduler.waiting or any(r.num_computed_tokens < r.prompt_len for r in engine.scheduler.running):
        engine.step()
    for _ in range(3):
        engine.step()
    return ids
