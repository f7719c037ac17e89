"""Sparse MoE on the GPU: top-k softmax routing and a grouped expert matmul (Triton).

Grouping, with A = T*K (token, slot) assignments, a = t*K + k, and tiles of BLOCK_M rows::

    counts[e]          assignments routed to expert e
    expert e's rows    padded to a multiple of BLOCK_M, laid out back to back in expert order
    sorted_rows[i]     assignment index in padded row i (A = padding)
    tile_expert[m]     expert of tile m (E = past the end: the program exits)

All of it is built with device ops from shapes only (no host sync): the tile count is
bounded by min(cdiv(A, BLOCK_M) + E, A). With few assignments over many experts (4A <= E,
decode) the grouping is skipped: tile m holds assignment m alone. Then, one program per (tile, block of output columns):

    GEMM 1: h[a]   = silu(x[t] @ gate_e^T) * (x[t] @ up_e^T)        h: [A, I] in x's dtype
            (activation "relu2": h[a] = relu(x[t] @ up_e^T)^2, Nemotron-H's non-gated experts)
    GEMM 2: y[a]   = weights[a] * (h[a] @ down_e^T)                 y: [A, H] fp32
    out[t] = sum_k y[t*K + k]                                        (k in order, one program per
                                                                     token and column block)

The last sum is ours rather than torch's `sum(dim=1)`: torch's reduction splits the K terms
across threads depending on how many outputs the call has, so a token's sum (and, at a near
tie, its next token) changed with the step's row count (an eager decode step of 5 rows vs the
CUDA graph padded to 8). Here every token adds its K terms in slot order, whatever T is.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _interpreter_compat  # noqa: F401  (interpreter under NumPy >= 2.4)
from ..switch import moe_one_row_tiles_allowed
from .._common import FLOAT_DTYPES, INDEX_DTYPES, check_index_range, check_launch_device, check_tensor, next_pow2
from .._launch import install_fast_launch
from .._triton_common import TL_DTYPE, pdl_enter


# per-step sizes and metadata not specialized: one compiled variant (kernels/__init__.py)
@triton.jit(do_not_specialize=["num_tokens"])
def _topk_softmax_kernel(logits_ptr, w_ptr, ids_ptr, num_tokens, num_experts, stride_l,
                         TOP_K: tl.constexpr, KP: tl.constexpr, BE: tl.constexpr, BT: tl.constexpr,
                         RENORMALIZE: tl.constexpr, PDL: tl.constexpr = False):
    """BT tokens' rows [BT, BE] in registers: fp32 softmax, then TOP_K rounds of one max over
    packed int64 keys (prob bits << 32 | BE-1-expert: the highest prob, the lowest id among equal
    probs, in a single reduction), the winner struck out. Weights and ids stay in registers
    ([BT, KP]) and are stored once, weights in w_ptr's dtype (the logits')."""
    pdl_enter(PDL)
    rows = tl.program_id(0) * BT + tl.arange(0, BT)
    offs_e = tl.arange(0, BE)
    row_ok = rows < num_tokens
    col_ok = offs_e < num_experts
    mask = row_ok[:, None] & col_ok[None, :]
    logits = tl.load(logits_ptr + rows[:, None].to(tl.int64) * stride_l + offs_e[None, :], mask=mask,
                     other=float("-inf")).to(tl.float32)
    logits = tl.where(row_ok[:, None], logits, 0.0)  # padding rows: finite, never stored
    probs = tl.exp(logits - tl.max(logits, axis=1)[:, None])
    probs = probs / tl.sum(probs, axis=1)[:, None]
    # probs >= +0, so their fp32 bits order as int32 like the values do
    bits = probs.to(tl.int32, bitcast=True).to(tl.int64)
    keys = (bits << 32) | (BE - 1 - offs_e).to(tl.int64)[None, :]
    keys = tl.where(col_ok[None, :], keys, -1)  # below every expert, a zero prob included
    offs_k = tl.arange(0, KP)
    w_out = tl.zeros([BT, KP], dtype=tl.float32)
    id_out = tl.zeros([BT, KP], dtype=tl.int64)
    total = tl.zeros([BT], dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        best = tl.max(keys, axis=1)  # [BT]
        w = (best >> 32).to(tl.int32).to(tl.float32, bitcast=True)
        total += w  # slot order, as before
        w_out = tl.where(offs_k[None, :] == k, w[:, None], w_out)
        id_out = tl.where(offs_k[None, :] == k, (BE - 1 - (best & 0xFFFFFFFF))[:, None], id_out)
        keys = tl.where(keys == best[:, None], -1, keys)
    if RENORMALIZE:
        w_out = w_out / total[:, None]
    out_mask = row_ok[:, None] & (offs_k < TOP_K)[None, :]
    out_offs = rows[:, None].to(tl.int64) * TOP_K + offs_k[None, :]
    tl.store(w_ptr + out_offs, w_out.to(w_ptr.dtype.element_ty), mask=out_mask)
    tl.store(ids_ptr + out_offs, id_out, mask=out_mask)


def topk_softmax_launch_config(num_experts: int) -> tuple[int, int]:
    """(tokens per program, warps) of moe_topk_softmax: one token per program whatever the
    token count (no per-step variant), about 4 experts per thread. H100, 512 experts top-10
    (benchmarks/moe_topk_bench.py, bf16 logits): 3.6 us a call at 1-16 tokens (the kernel
    before took 14.3 us plus a 1.1 us cast alone, 46 us inside the decode step), 26 us at
    4096. One warp measured 3.7 us / 15 us: not yet run end to end, so not the default."""
    return 1, max(1, min(8, next_pow2(num_experts) // 128))


# per-step sizes and metadata not specialized: one compiled variant (kernels/__init__.py)
@triton.jit(do_not_specialize=["sorted_rows_ptr", "tile_expert_ptr", "num_assign"])
def _moe_gemm_kernel(a_ptr, w_ptr, out_ptr, sorted_rows_ptr, tile_expert_ptr, weights_ptr,
                     num_assign, num_experts, n_out, k_in, stride_a, stride_we, stride_wn, stride_out,
                     A_ROW_DIV: tl.constexpr, GATED: tl.constexpr, RELU2: tl.constexpr, SCALE_ROWS: tl.constexpr,
                     ONE_ROW_TILES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, DOT_PREC: tl.constexpr, PDL: tl.constexpr = False):
    """out[a, n] = act(A[a // A_ROW_DIV] @ W_e[n]^T) for the rows of one expert tile.
    GATED: W_e rows [gate (n_out) | up (n_out)], act = silu(gate) * up. RELU2: act = relu(.)^2.
    SCALE_ROWS: * weights[a]. ONE_ROW_TILES: tile m is assignment m alone, its expert
    tile_expert[m] (the flat top-k ids; sorted_rows unused): no grouping pass. A row's values
    do not depend on the other rows of its tile, so both layouts give the same bits."""
    pdl_enter(PDL)
    tile, pid_n = tl.program_id(0), tl.program_id(1)
    if ONE_ROW_TILES:
        expert = tl.load(tile_expert_ptr + tile)
        rows = tl.where(tl.arange(0, BLOCK_M) == 0, tile, num_assign)  # [BM]: row 0 only
    else:
        expert = tl.load(tile_expert_ptr + tile)
        if expert >= num_experts:
            return
        rows = tl.load(sorted_rows_ptr + tile * BLOCK_M + tl.arange(0, BLOCK_M))  # [BM] assignment ids
    row_ok = rows < num_assign
    a_rows = (rows // A_ROW_DIV).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < n_out
    w_base = w_ptr + expert.to(tl.int64) * stride_we
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, k_in, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < k_in
        a = tl.load(a_ptr + a_rows[:, None] * stride_a + offs_k[None, :], mask=row_ok[:, None] & mask_k[None, :],
                    other=0.0)
        w_ptrs = w_base + offs_n[None, :] * stride_wn + offs_k[:, None]  # [BK, BN] = W_e[n, k]^T
        w = tl.load(w_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        acc = tl.dot(a, w.to(a.dtype), acc, input_precision=DOT_PREC)
        if GATED:
            w_up = tl.load(w_ptrs + n_out * stride_wn, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
            acc_up = tl.dot(a, w_up.to(a.dtype), acc_up, input_precision=DOT_PREC)
    if GATED:
        gate = acc.to(out_ptr.dtype.element_ty).to(tl.float32)  # F.linear rounds to x's dtype first
        up = acc_up.to(out_ptr.dtype.element_ty).to(tl.float32)
        acc = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32) * up
    if RELU2:
        h = tl.maximum(acc.to(out_ptr.dtype.element_ty).to(tl.float32), 0.0)  # F.linear rounds first
        acc = h * h
    if SCALE_ROWS:
        acc = acc * tl.load(weights_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)[:, None]
    out_ptrs = out_ptr + rows[:, None].to(tl.int64) * stride_out + offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & mask_n[None, :])


def moe_topk_softmax(router_logits: torch.Tensor, top_k: int, renormalize: bool,
                     out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits: [T, E] (row stride free) -> (weights [T, K] in out_dtype, default the
    logits' dtype; expert ids [T, K] int64). Softmax in fp32 over all experts, top k (lowest id
    first on ties), optional renormalise (in fp32, then one rounding to out_dtype)."""
    check_launch_device("moe_topk_softmax", router_logits)
    check_tensor("router_logits", router_logits, ndim=2, dtypes=FLOAT_DTYPES)
    num_tokens, num_experts = router_logits.shape
    if not 0 < top_k <= num_experts:
        raise ValueError(f"top_k={top_k} must be in [1, num_experts={num_experts}]")
    out_dtype = out_dtype or router_logits.dtype
    if out_dtype not in FLOAT_DTYPES:
        raise ValueError(f"out_dtype must be one of {[str(d) for d in FLOAT_DTYPES]}, got {out_dtype}")
    weights = torch.empty(num_tokens, top_k, dtype=out_dtype, device=router_logits.device)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int64, device=router_logits.device)
    if num_tokens:
        block_t, num_warps = topk_softmax_launch_config(num_experts)
        _topk_softmax_kernel[(triton.cdiv(num_tokens, block_t),)](
            router_logits, weights, ids, num_tokens, num_experts, router_logits.stride(0),
            TOP_K=top_k, KP=next_pow2(top_k), BE=next_pow2(num_experts), BT=block_t, RENORMALIZE=renormalize,
            num_warps=num_warps)
    return weights, ids


@triton.jit
def _combine_topk_kernel(y_ptr, out_ptr, shared_ptr, gate_ptr, hidden, stride_shared, stride_gate,
                         TOP_K: tl.constexpr, BLOCK_H: tl.constexpr, HAS_SHARED: tl.constexpr,
                         HAS_GATE: tl.constexpr, GATE_DTYPE: tl.constexpr, PDL: tl.constexpr = False):
    """out[t, cols] = sum_{k = 0..K-1} y[t*K + k, cols], added in slot order (fp32), then
    HAS_SHARED: + g[t] * shared[t, cols], g = sigmoid(gate[t]) with the logit and the sigmoid
    each rounded to GATE_DTYPE (the model's dtype, as its own linear and sigmoid would), or
    g = 1 without HAS_GATE. One rounding to out's dtype at the end."""
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = cols < hidden
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        acc += tl.load(y_ptr + (t * TOP_K + k) * hidden + cols, mask=mask, other=0.0)
    if HAS_SHARED:
        shared = tl.load(shared_ptr + t * stride_shared + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_GATE:
            logit = tl.load(gate_ptr + t * stride_gate).to(GATE_DTYPE).to(tl.float32)
            g = (1.0 / (1.0 + tl.exp(-logit))).to(GATE_DTYPE).to(tl.float32)
            shared = shared * g
        acc += shared
    tl.store(out_ptr + t * hidden + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


def _align(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> sorted_rows [max_tiles*BM] (assignment ids, A = padding), tile_expert [max_tiles]."""
    flat = topk_ids.flatten()  # [A]
    num_assign, device = flat.numel(), flat.device
    # every tile holding rows holds >= 1 assignment, so there are at most A of them: at decode
    # (A = 10 of 512 experts) 10 tiles instead of 513, most of whose programs would only exit
    max_tiles = min(triton.cdiv(num_assign, block_m) + num_experts, num_assign)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    pad_end = torch.cumsum(padded, 0)  # [E]
    pad_start, cnt_start = pad_end - padded, torch.cumsum(counts, 0) - counts
    order = torch.argsort(flat, stable=True)  # assignments grouped by expert
    expert_of = flat[order]
    dest = pad_start[expert_of] + torch.arange(num_assign, device=device) - cnt_start[expert_of]
    sorted_rows = torch.full((max_tiles * block_m,), num_assign, dtype=torch.int64, device=device)
    sorted_rows.scatter_(0, dest, order)
    tile_start = torch.arange(max_tiles, device=device) * block_m
    tile_expert = torch.searchsorted(pad_end, tile_start, right=True)  # E past the end
    return sorted_rows, tile_expert


def one_row_tiles(num_assign: int, num_experts: int) -> bool:
    """A tile per assignment (no grouping) when 4A <= E: an expert is then read twice for
    about A / 2E of the assignments (two tokens picking it), under 1/8."""
    return 4 * num_assign <= num_experts and moe_one_row_tiles_allowed()


def fused_moe(x: torch.Tensor, gate_up_proj: torch.Tensor, down_proj: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, activation: str = "silu", out_dtype: torch.dtype | None = None,
              shared: torch.Tensor | None = None, shared_gate: torch.Tensor | None = None,
              combine: bool = True) -> torch.Tensor:
    """Routed experts: out[t] = sum_k topk_weights[t, k] * expert_{topk_ids[t, k]}(x[t])
    (+ g[t] * shared[t]).

    x: [T, H] (row stride free, last dim contiguous); gate_up_proj: [E, 2I, H] rows [gate | up]
    for activation "silu" (gated SiLU), or the up projection [E, I, H] for "relu2"
    (`relu(x @ up^T)^2`, not gated); down_proj: [E, H, I]; topk_weights: [T, K] float;
    topk_ids: [T, K] int32/int64 in [0, E).
    shared: an optional [T, H] float term added to the sum (a shared expert's output, e.g. its
    rank-local partial sum), scaled by g = sigmoid(shared_gate) when shared_gate [T, 1] (logits,
    row stride free) is given; the logit and g are rounded to x's dtype as the model's own gate
    linear and sigmoid round them.
    Returns [T, H] in out_dtype (default x's dtype; the sum stays fp32 until then), the
    rank-local partial sum under tensor parallelism.
    combine=False: no sum, the weighted expert rows [T * K, H] fp32 (row t * K + k), for a
    later launch that adds them in slot order (kernels/linear's skinny_linear with topk_rows:
    the shared expert's down projection); no shared term then.
    """
    if not combine and shared is not None:
        raise ValueError("combine=False returns the expert rows alone: shared joins the sum it skips")
    if activation not in ("silu", "relu2"):
        raise ValueError(f"unsupported activation {activation!r} (supported: 'silu', 'relu2')")
    gated = activation == "silu"
    check_launch_device("fused_moe", x)
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    num_tokens, hidden = x.shape
    check_tensor("gate_up_proj", gate_up_proj, ndim=3, dtypes=FLOAT_DTYPES, shape=(None, None, hidden),
                 device=x.device)
    num_experts, inter = gate_up_proj.shape[0], gate_up_proj.shape[1] // (2 if gated else 1)
    if gated and gate_up_proj.shape[1] != 2 * inter:
        raise ValueError(f"gate_up_proj rows {gate_up_proj.shape[1]} must be even ([gate | up])")
    check_tensor("down_proj", down_proj, ndim=3, dtypes=FLOAT_DTYPES, shape=(num_experts, hidden, inter),
                 device=x.device)
    check_tensor("topk_ids", topk_ids, ndim=2, dtypes=INDEX_DTYPES, shape=(num_tokens, None), device=x.device)
    top_k = topk_ids.shape[1]
    check_tensor("topk_weights", topk_weights, ndim=2, dtypes=FLOAT_DTYPES, shape=(num_tokens, top_k),
                 device=x.device, last_contiguous=False)
    check_index_range("topk_ids", topk_ids, 0, num_experts)
    if shared is not None:
        check_tensor("shared", shared, ndim=2, dtypes=FLOAT_DTYPES, shape=(num_tokens, hidden), device=x.device)
    if shared_gate is not None:
        if shared is None:
            raise ValueError("shared_gate needs shared (the term it gates)")
        check_tensor("shared_gate", shared_gate, ndim=2, dtypes=FLOAT_DTYPES, shape=(num_tokens, 1),
                     device=x.device)
    out_dtype = out_dtype or x.dtype
    if num_tokens == 0:
        if not combine:
            return torch.zeros(0, hidden, dtype=torch.float32, device=x.device)
        return torch.zeros(x.shape, dtype=out_dtype, device=x.device)
    num_assign = num_tokens * top_k
    block_m = 16 if num_assign <= 4 * num_experts * 16 else 64
    # Few assignments over many experts (decode): a tile per assignment, no grouping pass (its
    # dozen small launches cost more than the rare expert read twice: ~A / 2E of the reads).
    one_row = one_row_tiles(num_assign, num_experts)
    if one_row:
        flat_ids = topk_ids.reshape(-1).long()
        sorted_rows, tile_expert = flat_ids, flat_ids
    else:
        sorted_rows, tile_expert = _align(topk_ids.long(), num_experts, block_m)
    weights = topk_weights.reshape(-1).contiguous()
    h = torch.empty(num_assign, inter, dtype=x.dtype, device=x.device)
    y = torch.empty(num_assign, hidden, dtype=torch.float32, device=x.device)
    prec = "ieee" if x.dtype == torch.float32 else "tf32"
    for out, a, w, n_out, k_in, div, first in ((h, x, gate_up_proj, inter, hidden, top_k, True),
                                              (y, h, down_proj, hidden, inter, 1, False)):
        block_n, block_k, warps, stages = gemm_tiles(one_row, first, x.dtype)
        grid = (tile_expert.shape[0], triton.cdiv(n_out, block_n))
        _moe_gemm_kernel[grid](
            a, w, out, sorted_rows, tile_expert, weights, num_assign, num_experts, n_out, k_in,
            a.stride(0), w.stride(0), w.stride(1), out.stride(0),
            A_ROW_DIV=div, GATED=first and gated, RELU2=first and not gated, SCALE_ROWS=not first,
            ONE_ROW_TILES=one_row, BLOCK_M=block_m, BLOCK_N=block_n,
            BLOCK_K=block_k, DOT_PREC=prec, num_warps=warps, num_stages=stages)
    if not combine:
        return y
    out = torch.empty(num_tokens, hidden, dtype=out_dtype, device=x.device)
    block_h = min(1024, next_pow2(hidden))
    _combine_topk_kernel[(num_tokens, triton.cdiv(hidden, block_h))](
        y, out, shared if shared is not None else y, shared_gate if shared_gate is not None else y, hidden,
        shared.stride(0) if shared is not None else 0, shared_gate.stride(0) if shared_gate is not None else 0,
        TOP_K=top_k, BLOCK_H=block_h, HAS_SHARED=shared is not None, HAS_GATE=shared_gate is not None,
        GATE_DTYPE=TL_DTYPE[x.dtype])
    return out


# (BLOCK_N, BLOCK_K, warps, stages) of the two expert GEMMs: [one-row tiles][first GEMM].
# benchmarks/moe_gemm_tune.py, H200, 512 experts top-10, hidden 2048, intermediate 512, bf16,
# one token (us per fused_moe call, weights streamed from HBM; floor 14.8 us): (64, 64, 4, 3)
# for both 28.3 us; the first GEMM at (32, 128, 2, 4) 23.4 us: twice the programs (160 for 10
# experts), each with deeper loads. The second GEMM's best is within noise of the others
# (64, 128, 2, 3, also best at 4 tokens). Grouped tiles (prefill) keep the measured defaults.
GEMM_TILES = {
    (True, True): (32, 128, 2, 4), (True, False): (64, 128, 2, 3),
    (False, True): (64, 64, 4, 3), (False, False): (64, 64, 4, 3),
}


def gemm_tiles(one_row: bool, first: bool, dtype: torch.dtype) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps, num_stages) of an expert GEMM (BLOCK_K 32 in fp32)."""
    block_n, block_k, warps, stages = GEMM_TILES[(one_row, first)]
    return block_n, (block_k if dtype != torch.float32 else min(block_k, 32)), warps, stages


install_fast_launch(__name__)  # HYBRID_SERVE_TRITON_FAST_LAUNCH=1: kernels/_launch.py
