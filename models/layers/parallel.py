"""Tensor-parallel context of this process (one process = one shard).

tp_size=1 unless `set_tp_group` was called (by the shard worker at start-up).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class TPContext:
    rank: int = 0
    size: int = 1
    group: object | None = None


_TP = TPContext()


def set_tp_group(rank: int, size: int, group: object | None) -> None:
    global _TP
    _TP = TPContext(rank=rank, size=size, group=group)


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
