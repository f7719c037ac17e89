"""Batched sampling on the device without a host sync: torch masking + a Triton Gumbel-max.

    masked_logits    temperature, top-k, top-p, min-p for all rows at once (sort-based, batched
                     torch ops; skipped entirely when no row asks for them)
    _gumbel_argmax   one program per row, over V in blocks:
                     token = argmax_v( l[v] / T + G[v] ),  G = -log(-log(U)),
                     U = philox(seeds[b]; counter = (v, offsets[b])) uniform in [0, 1)
                     greedy rows (T == 0) take argmax_v l[v] (first index on ties)

    greedy_argmax    all-greedy batches: torch.argmax's token (first index of the max, NaN
                     above every number) in two launches over many programs: each program's
                     best packed key of a block of V, then each row's best of those

argmax(l + Gumbel) is distributed as softmax(l). Each row's stream is fixed by its own
(seed, offset): the same request, seed and step give the same token whatever else is in the
batch. Callers advance `offsets` per step (e.g. the number of tokens generated so far).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.random import philox, uint_to_uniform_float

from .. import _interpreter_compat  # noqa: F401  (interpreter under NumPy >= 2.4)
from .._common import FLOAT_DTYPES, INDEX_DTYPES, check_launch_device, check_tensor, next_pow2
from .._launch import install_fast_launch
from .._triton_common import pdl_enter


# per-step sizes and metadata not specialized: one compiled variant (kernels/__init__.py)
@triton.jit(do_not_specialize=["temp_ptr", "seeds_ptr", "offsets_ptr"])
def _gumbel_argmax_kernel(logits_ptr, temp_ptr, seeds_ptr, offsets_ptr, out_ptr, vocab, stride_l,
                          APPLY_TEMPERATURE: tl.constexpr, BLOCK_V: tl.constexpr, PDL: tl.constexpr = False):
    pdl_enter(PDL)
    b = tl.program_id(0)
    temp = tl.load(temp_ptr + b).to(tl.float32)
    greedy = temp <= 0.0
    if APPLY_TEMPERATURE:
        inv_temp = 1.0 / tl.where(greedy, 1.0, temp)
    else:
        inv_temp = 1.0
    seed = tl.load(seeds_ptr + b).to(tl.int64)
    offset = tl.load(offsets_ptr + b).to(tl.int64)
    off_lo = (offset & 0xFFFFFFFF).to(tl.uint32)
    off_hi = ((offset >> 32) & 0xFFFFFFFF).to(tl.uint32)
    row = logits_ptr + b.to(tl.int64) * stride_l
    best_val = tl.full([1], float("-inf"), dtype=tl.float32)
    best_idx = tl.full([1], 0, dtype=tl.int32)
    for v0 in range(0, vocab, BLOCK_V):
        offs = v0 + tl.arange(0, BLOCK_V)
        mask = offs < vocab
        score = tl.load(row + offs, mask=mask, other=float("-inf")).to(tl.float32) * inv_temp
        zero = tl.zeros([BLOCK_V], dtype=tl.uint32)
        bits, _, _, _ = philox(seed, offs.to(tl.uint32), zero + off_lo, zero + off_hi, zero)
        u = uint_to_uniform_float(bits)
        gumbel = -tl.log(-tl.log(tl.maximum(u, 1e-30)))
        score = tl.where(greedy, score, score + gumbel)
        score = tl.where(mask, score, float("-inf"))
        blk_val = tl.max(score, axis=0)
        blk_idx = tl.argmax(score, axis=0, tie_break_left=True)
        better = blk_val > best_val  # strict: earlier blocks win ties
        best_idx = tl.where(better, v0 + blk_idx, best_idx)
        best_val = tl.where(better, blk_val, best_val)
    tl.store(out_ptr + b + tl.arange(0, 1), best_idx.to(tl.int64))


@triton.jit
def _argmax_keys(x, offs, mask):
    """int64 keys that order like (value, -index), torch.argmax's order: the fp32 value's bits
    made monotonic (negative values' low 31 bits flipped, -0.0 added to +0.0 first, every NaN the
    largest), then 2^32 - 1 - index below them; masked lanes the smallest int64."""
    bits = (x + 0.0).to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    ordered = tl.where(x != x, 0x7FFFFFFF, ordered)
    key = (ordered.to(tl.int64) << 32) | (4294967295 - offs.to(tl.int64))
    lowest = tl.full(key.shape, -2147483648, tl.int32).to(tl.int64) << 32
    return tl.where(mask, key, lowest)


# vocab and strides not specialized: one compiled variant whatever the model (warmed up once)
@triton.jit(do_not_specialize=["vocab", "stride_l", "num_parts"])
def _argmax_partial_kernel(logits_ptr, part_ptr, vocab, stride_l, num_parts, BLOCK_V: tl.constexpr,
                           PDL: tl.constexpr = False):
    """Program (b, p): the best key of row b's values p * BLOCK_V ..., stored at part[b, p]."""
    pdl_enter(PDL)
    b, p = tl.program_id(0), tl.program_id(1)
    offs = p * BLOCK_V + tl.arange(0, BLOCK_V)
    mask = offs < vocab
    x = tl.load(logits_ptr + b.to(tl.int64) * stride_l + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(part_ptr + b.to(tl.int64) * num_parts + p, tl.max(_argmax_keys(x, offs, mask), axis=0))


@triton.jit(do_not_specialize=["num_parts"])
def _argmax_final_kernel(part_ptr, out_ptr, num_parts, BLOCK_P: tl.constexpr, PDL: tl.constexpr = False):
    """Row b's best key of its num_parts partial keys -> its token id (int64)."""
    pdl_enter(PDL)
    b = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_P)
    lowest = tl.full([BLOCK_P], -2147483648, tl.int32).to(tl.int64) << 32
    keys = tl.load(part_ptr + b * num_parts + offs, mask=offs < num_parts, other=0)
    best = tl.max(tl.where(offs < num_parts, keys, lowest), axis=0)
    tl.store(out_ptr + b, 4294967295 - (best & 4294967295))


ARGMAX_BLOCK_V = 4096  # values of a row per program of greedy_argmax (38 programs a row at V = 151,936)
# Partial keys a row's final program reads: one compile-time tile for every vocabulary up to
# ARGMAX_MAX_PARTS * block_v (4M ids at 4,096), so the variant the engine's warm-up compiles (a
# [1, 16] probe) is the one serving meets. A tile that followed V (16 below 64k ids, 64 at 152k)
# compiled a second variant after ready on an H200 (benchmarks/step_breakdown.py's first-step
# sweep, 2.3B model, session 45).
ARGMAX_MAX_PARTS = 1024


def argmax_final_config(num_parts: int) -> dict:
    """greedy_argmax's final launch for rows of num_parts partial keys: the same compile-time
    configuration for every num_parts <= ARGMAX_MAX_PARTS; ValueError beyond."""
    if not 1 <= num_parts <= ARGMAX_MAX_PARTS:
        raise ValueError(f"greedy_argmax: {num_parts} partial keys a row, at most {ARGMAX_MAX_PARTS} "
                         f"(a vocabulary over {ARGMAX_MAX_PARTS} x block_v ids)")
    return dict(BLOCK_P=ARGMAX_MAX_PARTS, num_warps=4)


def greedy_argmax(logits: torch.Tensor, block_v: int = ARGMAX_BLOCK_V) -> torch.Tensor:
    """torch.argmax(logits, dim=-1) for logits [B, V] (float, row stride free, last dim
    contiguous): the first index of each row's largest value, a NaN counting as the largest
    (-0.0 and +0.0 equal). Returns [B] int64 without a host sync. V <= ARGMAX_MAX_PARTS * block_v.
    One compiled variant of each launch for every V (`argmax_final_config`)."""
    check_launch_device("greedy_argmax", logits)
    check_tensor("logits", logits, ndim=2, dtypes=FLOAT_DTYPES)
    batch, vocab = logits.shape
    if vocab == 0:
        raise ValueError("greedy_argmax: logits have no columns (V = 0)")
    if block_v < 16 or block_v != next_pow2(block_v):
        raise ValueError(f"greedy_argmax: block_v must be a power of two >= 16, got {block_v}")
    tokens = torch.empty(batch, dtype=torch.int64, device=logits.device)
    if batch == 0:
        return tokens
    num_parts = triton.cdiv(vocab, block_v)
    final = argmax_final_config(num_parts)
    parts = torch.empty(batch, num_parts, dtype=torch.int64, device=logits.device)
    _argmax_partial_kernel[(batch, num_parts)](logits, parts, vocab, logits.stride(0), num_parts, BLOCK_V=block_v,
                                               num_warps=8 if block_v >= 2048 else 4)
    _argmax_final_kernel[(batch,)](parts, tokens, num_parts, **final)
    return tokens


def masked_logits(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                  min_p: torch.Tensor, use_top_k_top_p: bool = True, use_min_p: bool = True) -> torch.Tensor:
    """Batched form of ref.masked_logits_row_ref for every row (device ops, no host sync).

    logits: [B, V]; temperature, top_p, min_p: [B] float; top_k: [B] int (<= 0 or >= V: off).
    Returns [B, V] fp32 temperature-scaled logits with dropped tokens at -inf; greedy rows
    (temperature 0) are returned raw. The sort runs only if use_top_k_top_p (a host flag:
    some row uses them).
    """
    vocab = logits.shape[1]
    sampled = (temperature > 0)[:, None]  # [B, 1]; greedy rows are never masked
    temp = torch.where(temperature > 0, temperature.float(), torch.ones_like(temperature, dtype=torch.float32))
    scaled = logits.float() / temp[:, None]  # [B, V]
    if use_top_k_top_p:
        sorted_l, order = torch.sort(scaled, dim=-1, descending=True)  # [B, V]
        k = torch.where((top_k > 0) & (top_k < vocab), top_k, torch.full_like(top_k, vocab)).long()
        kth = sorted_l.gather(1, (k - 1)[:, None])  # [B, 1]
        sorted_l = sorted_l.masked_fill((sorted_l < kth) & sampled, float("-inf"))  # top-k, ties kept
        probs = torch.softmax(sorted_l, dim=-1)
        drop = ((torch.cumsum(probs, dim=-1) - probs) >= top_p.float()[:, None]) & (top_p < 1.0)[:, None] & sampled
        drop[:, 0] = False  # the most likely token always stays (top_p may round to 0)
        sorted_l = sorted_l.masked_fill(drop, float("-inf"))
        scaled = torch.empty_like(scaled).scatter_(1, order, sorted_l)
    if use_min_p:
        probs = torch.softmax(scaled, dim=-1)
        low = probs < min_p.float()[:, None] * probs.max(dim=-1, keepdim=True).values
        scaled = scaled.masked_fill(low & (min_p > 0)[:, None] & sampled, float("-inf"))
    return scaled


def sample_tokens(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seeds: torch.Tensor,
    offsets: torch.Tensor,
    use_top_k_top_p: bool = True,
    use_min_p: bool = True,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sample one token per row with per-row parameters and per-row seeded randomness.

    logits: [B, V] float (row stride free, last dim contiguous); temperature: [B] float
    (0 = greedy); top_k: [B] int (<= 0 off); top_p: [B] float (1 off); min_p: [B] float
    (0 off); seeds: [B] int64; offsets: [B] int64 (advance per step); use_top_k_top_p /
    use_min_p: host flags, False skips that masking for the whole batch; out: optional [B]
    int64. Returns token ids [B] int64. No host sync.
    """
    check_launch_device("sample_tokens", logits)
    check_tensor("logits", logits, ndim=2, dtypes=FLOAT_DTYPES)
    batch, vocab = logits.shape
    for name, t, dtypes in (("temperature", temperature, FLOAT_DTYPES), ("top_k", top_k, INDEX_DTYPES),
                            ("top_p", top_p, FLOAT_DTYPES), ("min_p", min_p, FLOAT_DTYPES),
                            ("seeds", seeds, INDEX_DTYPES), ("offsets", offsets, INDEX_DTYPES)):
        check_tensor(name, t, ndim=1, dtypes=dtypes, shape=(batch,), device=logits.device, last_contiguous=False)
    tokens = out if out is not None else torch.empty(batch, dtype=torch.int64, device=logits.device)
    check_tensor("out", tokens, ndim=1, dtypes=(torch.int64,), shape=(batch,), device=logits.device)
    if batch == 0:
        return tokens
    masking = use_top_k_top_p or use_min_p
    scores = masked_logits(logits, temperature, top_k, top_p, min_p, use_top_k_top_p, use_min_p) if masking \
        else logits
    block_v = min(next_pow2(vocab), 4096)
    _gumbel_argmax_kernel[(batch,)](
        scores, temperature, seeds, offsets, tokens, vocab, scores.stride(0),
        APPLY_TEMPERATURE=not masking, BLOCK_V=block_v, num_warps=8 if block_v >= 2048 else 4,
    )
    return tokens


install_fast_launch(__name__)  # HYBRID_SERVE_TRITON_FAST_LAUNCH=1: kernels/_launch.py
