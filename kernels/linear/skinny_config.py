"""The one-row (skinny) linear kernel's launch configuration (kernels/linear/triton_linear.py):
its tile, warps and K-loop stages for a shape, and the two experiment variables that change
them (HYBRID_SERVE_SKINNY_PIPELINE, HYBRID_SERVE_SKINNY_PREFETCH), read at every launch and
parsed once per value. Host-side only: no Triton needed to import it."""
from __future__ import annotations

import functools
import os

from .._common import next_pow2

SKINNY_PIPELINE_ENV = "HYBRID_SERVE_SKINNY_PIPELINE"


def skinny_pipeline() -> tuple[int, int | None]:
    """HYBRID_SERVE_SKINNY_PIPELINE = "S" or "S,BK": the skinny kernel's K loop pipelined S stages
    deep (1, the default: not pipelined), optionally with K tiles of BK inputs (a power of two
    >= 16). Read at every launch (A/B runs: benchmarks/moe_decode_ab.py --ab skinny_pipeline),
    parsed once per value. Not the default until measured on a card: compiled for sm_90, the GDN
    in-projection keeps 48 registers a thread at S = 3 (40 at 3,512) where the plain loop keeps 72,
    with 2-3 weight tiles a program in flight (benchmarks/skinny_compile_check.py)."""
    return _parse_skinny_pipeline(os.environ.get(SKINNY_PIPELINE_ENV, "1"))


@functools.lru_cache(maxsize=8)
def _parse_skinny_pipeline(value: str) -> tuple[int, int | None]:
    parts = value.split(",")
    if len(parts) in (1, 2) and all(p.strip().isdigit() for p in parts):
        stages = int(parts[0])
        block_k = int(parts[1]) if len(parts) == 2 else None
        if 1 <= stages <= 8 and (block_k is None or (block_k >= 16 and block_k == next_pow2(block_k))):
            return stages, block_k
    raise ValueError(f"{SKINNY_PIPELINE_ENV} must be S or S,BK (1 <= S <= 8, BK a power of two >= 16), got {value!r}")


SKINNY_PREFETCH_ENV = "HYBRID_SERVE_SKINNY_PREFETCH"
SKINNY_PREFETCH_MAX_TILES = 4  # the kernel's PRE_TILES: 1 to 4
SKINNY_PREFETCH_PROGRAMS = 1024  # default P of "T,P"


def skinny_prefetch() -> tuple[int, int]:
    """HYBRID_SERVE_SKINNY_PREFETCH = "T" or "T,P": launches of at most P programs (default
    1024) load up to T K tiles of their weight (1 <= T <= 4) before `pdl_enter`, and read
    those tiles' activations before any arithmetic; others, and T = 1 (the default), the first
    tile only. Read at every launch (A/B runs: benchmarks/moe_decode_ab.py --ab skinny_prefetch),
    parsed once per value. Not the default until measured on a card: the aim is the small
    projections that follow a latency-bound kernel (GDN recurrence, attention: the out projection
    streams its 16.8 MB while they run), at the price of registers (out_proj with the gated norm,
    T = 4: 78 a thread instead of 48 on sm_90, 3 programs an SM instead of 5)."""
    return _parse_skinny_prefetch(os.environ.get(SKINNY_PREFETCH_ENV, "1"))


@functools.lru_cache(maxsize=8)
def _parse_skinny_prefetch(value: str) -> tuple[int, int]:
    parts = value.split(",")
    if len(parts) in (1, 2) and all(p.strip().isdigit() for p in parts):
        tiles = int(parts[0])
        programs = int(parts[1]) if len(parts) == 2 else SKINNY_PREFETCH_PROGRAMS
        if 1 <= tiles <= SKINNY_PREFETCH_MAX_TILES and programs >= 1:
            return tiles, programs
    raise ValueError(f"{SKINNY_PREFETCH_ENV} must be T or T,P (1 <= T <= {SKINNY_PREFETCH_MAX_TILES}, P >= 1), "
                     f"got {value!r}")


def skinny_pre_tiles(num_programs: int, k: int, block_k: int) -> int:
    """K tiles a skinny launch of num_programs programs over K inputs loads before `pdl_enter`
    (`skinny_prefetch`; never more tiles than K has)."""
    tiles, max_programs = skinny_prefetch()
    return min(tiles, -(-k // block_k)) if num_programs <= max_programs else 1


def skinny_config(m: int, k: int) -> dict:
    """Tile, warps and K-loop stages for M rows and K inputs (H200 sweep, `benchmarks/linear_sweep.py`):
    4 output features per program, the widest K tile that keeps the fp32 accumulator at <= 64
    registers a thread, 8 warps for the K-heavy projections; `skinny_pipeline` may pipeline the
    K loop and narrow its tile."""
    block_m = next_pow2(max(m, 1))
    num_warps = 8 if k >= 4096 or block_m >= 4 else 4
    block_k = min(1024, next_pow2(k), max(16, 64 * 32 * num_warps // (block_m * 4)))
    stages, pipeline_k = skinny_pipeline()
    if pipeline_k is not None:
        block_k = min(block_k, pipeline_k)
    return dict(block_n=4, block_k=block_k, num_warps=num_warps, loop_stages=stages)
