"""The one-row (skinny) linear kernel's launch configuration (kernels/linear/triton_linear.py):
its tile and warps for a shape. Host-side only: no Triton needed to import it.

Two variables that changed it were measured and removed (session 47, H200, Qwen3-Next slice at
batch 1, RESULTS "Issue 12, session 47"): a software-pipelined K loop (3 stages: 0.954 ms a
step against 0.928; 3 stages with 512-input tiles: 0.994) and up to 4 weight tiles loaded
before `pdl_enter` (2 tiles: 0.934; 4: 0.935)."""
from __future__ import annotations

from .._common import next_pow2


def skinny_config(m: int, k: int) -> dict:
    """Tile and warps for M rows and K inputs (H200 sweep, `benchmarks/linear_sweep.py`): 4
    output features per program, the widest K tile that keeps the fp32 accumulator at <= 64
    registers a thread, 8 warps for the K-heavy projections."""
    block_m = next_pow2(max(m, 1))
    num_warps = 8 if k >= 4096 or block_m >= 4 else 4
    block_k = min(1024, next_pow2(k), max(16, 64 * 32 * num_warps // (block_m * 4)))
    return dict(block_n=4, block_k=block_k, num_warps=num_warps)
