"""Tensor-parallel context of this process (one process = one shard of a replica).

tp_size is 1 unless `set_tp_group` was called (by `cluster.process_group.init_tp_group`
at start-up). `tp_context` sets a context for a block and restores the previous one, for
code that builds a model as another rank would (the loader's meta-device passes)::

    with tp_context(rank=0, size=4):
        model = cls(hf_config)   # rank 0's shapes of a tp=4 model, no group needed

Collectives are no-ops at tp_size 1, so layers call them unconditionally.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TPContext:
    rank: int = 0
    size: int = 1
    group: object | None = None


_TP = TPContext()


def set_tp_group(rank: int, size: int, group: object | None) -> None:
    global _TP
    if not 0 <= rank < size:
        raise ValueError(f"tp rank {rank} outside [0, {size})")
    _TP = TPContext(rank=rank, size=size, group=group)


def current_tp_context() -> TPContext:
    return _TP


@contextmanager
def tp_context(rank: int, size: int, group: object | None = None) -> Iterator[TPContext]:
    """Run a block under another TP context (rank, size, group); the previous one is
    restored afterwards, also when the block raises."""
    saved = _TP
    set_tp_group(rank, size, group)
    try:
        yield _TP
    finally:
        set_tp_group(saved.rank, saved.size, saved.group)


def tp_rank() -> int:
    return _TP.rank


def tp_size() -> int:
    return _TP.size


def divide(numerator: int, denominator: int, what: str) -> int:
    if numerator % denominator:
        raise ValueError(f"{what}={numerator} is not divisible by tp_size={denominator}")
    return numerator // denominator


def partial_sum_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a rank's partial sum travels in through the all-reduce: fp32 for bf16/fp16
    models under tensor parallelism, so the sum is rounded once, as tp=1's single GEMM
    rounds its fp32 accumulator once (tp=N then differs from tp=1 only by fp32 summation
    order); the model dtype otherwise."""
    return torch.float32 if _TP.size > 1 and dtype in (torch.bfloat16, torch.float16) else dtype


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    if _TP.size > 1:
        dist.all_reduce(x, group=_TP.group)
    return x


def broadcast_from_rank0(x: torch.Tensor) -> torch.Tensor:
    """Every rank's x becomes rank 0's (in place); a no-op without tensor parallelism."""
    if _TP.size > 1:
        dist.broadcast(x, src=dist.get_global_rank(_TP.group, 0) if _TP.group is not None else 0, group=_TP.group)
    return x


def all_gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    if _TP.size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(_TP.size)]
    dist.all_gather(parts, x.contiguous(), group=_TP.group)
    return torch.cat(parts, dim=-1)
