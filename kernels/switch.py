"""The kernel switch: which implementation an op runs, read from the environment at every
call (so one test process can flip it).

    HYBRID_SERVE_KERNELS=auto|triton|ref   auto (default): Triton on CUDA tensors (when triton
                                           is installed), the torch references elsewhere;
                                           `ref` gives the reference path on a GPU too; `triton`
                                           forces the kernels (CPU tensors then need
                                           TRITON_INTERPRET=1 before the kernels are imported)
    HYBRID_SERVE_SKINNY_ROWS=N             inputs of up to N rows (default 1: batch-1 decode)
                                           stream their linear's weight through kernels/linear;
                                           0 sends every linear to cuBLAS (A/B runs)
    HYBRID_SERVE_FEW_ROWS=N                inputs of 2..N rows (default 16: a batch-1..3 verify
                                           step, a small decode batch) go to kernels/linear's
                                           tensor-core few-rows kernel; 0 or 1 sends them to
                                           cuBLAS (A/B runs)
    HYBRID_SERVE_FUSE_ADD_NORM=0|1|kinds    which projections run a decoder layer's residual add and
                                           norm inside their skinny launch at a decode row
                                           (models/layers/ops.py's PendingAddNorm): a comma-separated
                                           list of ADD_NORM_CONSUMERS (default
                                           "attention,mlp,moe"), 1 every kind, 0 none (their own
                                           launch; A/B runs)
    HYBRID_SERVE_MOE_ONE_ROW_TILES=0|1      1 (default): fused_moe skips its grouping pass when
                                           few assignments meet many experts; 0 always groups
                                           (A/B runs; the same bits either way)
"""
from __future__ import annotations

import os

import torch

from ._common import HAS_TRITON

KERNELS_ENV = "HYBRID_SERVE_KERNELS"
SKINNY_ROWS_ENV = "HYBRID_SERVE_SKINNY_ROWS"
MOE_ONE_ROW_ENV = "HYBRID_SERVE_MOE_ONE_ROW_TILES"
FUSE_ADD_NORM_ENV = "HYBRID_SERVE_FUSE_ADD_NORM"
FEW_ROWS_ENV = "HYBRID_SERVE_FEW_ROWS"
# Rows of x sent to kernels/linear by default: batch-1 decode. On an H100 (benchmarks/
# linear_sweep.py, weights cold) it streams the 2.3B model's decode weights in 1572 us against
# cuBLAS's 1754 us at one row, but loses from two rows on (1788 vs 1749 us), where cuBLAS's
# tensor-core tiles read each weight once for all rows.
SKINNY_DEFAULT_ROWS = 1
# Rows of x (above the skinny limit) sent to kernels/linear's tensor-core few-rows kernel: up to
# one 16-row MMA tile. H100, weights cold (`benchmarks/linear_sweep.py --few-rows`): the 2.3B
# step's linears at 5 rows (a batch-1 verify step) in 1,662 us against cuBLAS's 1,740.
FEW_ROWS_DEFAULT_ROWS = 16


def use_triton(t: torch.Tensor) -> bool:
    """Kernel path for `t`: Triton on CUDA (when installed), the torch reference elsewhere;
    HYBRID_SERVE_KERNELS=triton or =ref forces one (e.g. the fp32 reference on a GPU)."""
    choice = os.environ.get(KERNELS_ENV, "auto")
    if choice == "triton":
        return True  # without triton the kernel stubs raise, naming what is missing
    if choice == "ref":
        return False
    if choice != "auto":
        raise ValueError(f"{KERNELS_ENV} must be auto, triton or ref, got {choice!r}")
    return HAS_TRITON and t.is_cuda


def forced_reference() -> bool:
    """HYBRID_SERVE_KERNELS=ref: the torch references everywhere, also where a device has a
    faster torch path of its own (the CPU's attention, kernels/attention/cpu.py)."""
    return os.environ.get(KERNELS_ENV, "auto") == "ref"


def skinny_rows_limit() -> int:
    """Most rows of x that go to the weight-streaming linear kernel: SKINNY_DEFAULT_ROWS, or
    HYBRID_SERVE_SKINNY_ROWS (0 = off, at most kernels.linear's SKINNY_MAX_ROWS)."""
    value = os.environ.get(SKINNY_ROWS_ENV)
    if value is None:
        return SKINNY_DEFAULT_ROWS
    try:
        rows = int(value)
    except ValueError:
        raise ValueError(f"{SKINNY_ROWS_ENV} must be an integer, got {value!r}") from None
    from .linear import SKINNY_MAX_ROWS  # imports triton: only when the variable is set

    return max(0, min(rows, SKINNY_MAX_ROWS))


def few_rows_limit() -> int:
    """Most rows of x that go to the few-rows tensor-core linear kernel: FEW_ROWS_DEFAULT_ROWS,
    or HYBRID_SERVE_FEW_ROWS (0 or 1 = off, at most kernels.linear's FEW_ROWS_MAX_ROWS)."""
    value = os.environ.get(FEW_ROWS_ENV)
    if value is None:
        return FEW_ROWS_DEFAULT_ROWS
    try:
        rows = int(value)
    except ValueError:
        raise ValueError(f"{FEW_ROWS_ENV} must be an integer, got {value!r}") from None
    from .linear import FEW_ROWS_MAX_ROWS  # imports triton: only when the variable is set

    return max(0, min(rows, FEW_ROWS_MAX_ROWS))


def moe_one_row_tiles_allowed() -> bool:
    """HYBRID_SERVE_MOE_ONE_ROW_TILES: 1 (default) or 0."""
    value = os.environ.get(MOE_ONE_ROW_ENV, "1")
    if value not in ("0", "1"):
        raise ValueError(f"{MOE_ONE_ROW_ENV} must be 0 or 1, got {value!r}")
    return value == "1"


ADD_NORM_CONSUMERS = ("gdn", "attention", "mlp", "moe")  # the projections that may take a layer's add and norm
# The default consumers. H200, batch-1 decode graphs, PDL on (benchmarks/moe_decode_ab.py --ab
# add_norm_kinds, one call, results/issue12_s44_h200.json, call 4): the Qwen3-Next 12-layer slice
# 0.943 ms with none, 0.939 with these, 0.962 with every consumer (the GDN in-projection after a
# MoE block: +25 us over 9 layers); the 2.3B Qwen3.5 layout 1.548, 1.519, 1.508. GDN stays out.
ADD_NORM_DEFAULT = "attention,mlp,moe"


def fuse_add_norm_allowed(consumer: str) -> bool:
    """Whether `consumer` (one of ADD_NORM_CONSUMERS) runs a decoder layer's residual add and norm
    in its launch: HYBRID_SERVE_FUSE_ADD_NORM, 1 (every consumer), 0 (none) or a comma-separated
    list of kinds (default ADD_NORM_DEFAULT)."""
    value = os.environ.get(FUSE_ADD_NORM_ENV, ADD_NORM_DEFAULT)
    if value in ("0", "1"):
        return value == "1"
    kinds = value.split(",")
    bad = [k for k in kinds if k not in ADD_NORM_CONSUMERS]
    if bad:
        raise ValueError(f"{FUSE_ADD_NORM_ENV} must be 0, 1 or a list of {list(ADD_NORM_CONSUMERS)}, got {value!r}")
    return consumer in kinds
