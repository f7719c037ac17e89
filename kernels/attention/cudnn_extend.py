"""Extend attention for long rows on cuDNN's fused attention (Hopper), at a bounded set of shapes.

On an H200 with torch 2.11, at the 2.3B model's attention shape (16 q heads, 2 KV heads, head
dim 256), torch's flash kernel (FlashAttention-2) runs causal prefill at ~300 TFLOP/s and
cuDNN's at 610-655 (benchmarks/RESULTS.md, session 21). cuDNN builds an execution plan for
every new shape, though: 45-75 ms of host time at a new sequence length, which a server meets
with nearly every prompt. Its varlen (ragged) entry point builds one on every call. So long
rows go to dense cuDNN calls whose shapes come from a small set, every one of which the
engine builds during warm-up (`warm_up_cudnn_extend`):

    row: `prefix` cached keys, `new` tokens.  B = PREFIX_BLOCK, P1 = B * (prefix // B), r = prefix - P1
    part A (one call per prefix block i): q padded to Lq = bucket(new) rows, unmasked, over
             keys [P1_i, P1_i + B): the new tokens see every key of a full block
    part B: square causal attention of L = bucket(r + new) rows, top-left aligned:
             queries [r zeros | q | zeros], keys [prefix[P1:] | k | zeros]; query r + i sees
             keys <= r + i, i.e. the prefix's tail and its own tokens up to i; the trailing
             padding keys are seen only by padding queries
    out    = the parts merged by their log-sum-exps (`merge_attention_parts`)

bucket(n) rounds n up to a multiple of LEN_GRANULE; shapes: Lq in the buckets up to the
step's token budget, L up to bucket(B - 1 + budget), keys of B. A row takes this path only
when its padded work (Lq * P1 + L^2 / 2) is below CUDNN_COST_MARGIN x the row's own causal work
(new * prefix + new^2 / 2): cuDNN's 2x pays for padding and the r front rows up to there.
Elsewhere (other GPUs, short rows, a long prefix tail with few new tokens) rows keep flash
(sdpa_extend.py).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable

import torch

logger = logging.getLogger(__name__)

CUDNN_MIN_TOKENS = 2048  # new tokens of a row below which flash keeps it (its attention is small)
LEN_GRANULE = 1024  # padded lengths are multiples of this
PREFIX_BLOCK = 8192  # cached keys per unmasked call (the default CUDA chunk: a prompt's chunks start at multiples)
CUDNN_COST_MARGIN = 1.6  # take cuDNN while its padded work is below this x the row's work (it runs ~2x flash)
# HYBRID_SERVE_CUDNN_ATTENTION=0 keeps every row on flash (a list: benchmarks switch it in one process)
ENABLED = [os.environ.get("HYBRID_SERVE_CUDNN_ATTENTION", "1") != "0"]


def bucket(n: int) -> int:
    return -(-n // LEN_GRANULE) * LEN_GRANULE


@dataclass(frozen=True)
class RowSplit:
    """How one row's attention is cut (module docstring)."""
    prefix_blocks: int  # part A calls, PREFIX_BLOCK keys each
    tail: int  # r: cached keys after the blocks, attended in part B
    q_rows: int  # Lq: padded query rows of the part A calls
    square: int  # L: padded length of part B


def split_row(prefix: int, new: int) -> RowSplit | None:
    """The row's cut, or None when flash should take it (too short, or padding too costly)."""
    if new < CUDNN_MIN_TOKENS:
        return None
    blocks, tail = divmod(prefix, PREFIX_BLOCK)
    split = RowSplit(blocks, tail, bucket(new), bucket(tail + new))
    padded = blocks * PREFIX_BLOCK * split.q_rows + split.square * split.square / 2
    return split if padded <= CUDNN_COST_MARGIN * (new * prefix + new * new / 2) else None


def cudnn_usable(q: torch.Tensor, num_kv_heads: int, v_head_dim: int) -> bool:
    """Hopper (sm_90), cuDNN present, this torch exposes the cuDNN attention op with its LSE,
    head dims cuDNN takes, and a layout whose warm-up cuDNN did not refuse. q: [T, Hq, D]."""
    if not (ENABLED[0] and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)):
        return False
    layout = (q.shape[-2], num_kv_heads, q.shape[-1], v_head_dim)
    return head_dims_supported(q.shape[-1], v_head_dim) and layout not in _REFUSED and _cudnn_ready(q.device)


def head_dims_supported(head_dim: int, v_head_dim: int) -> bool:
    """cuDNN's fused attention on Hopper: head dims up to 256, multiples of 8."""
    return all(0 < d <= 256 and d % 8 == 0 for d in (head_dim, v_head_dim))


_REFUSED: set = set()  # (q heads, KV heads, head dim, v head dim) whose plans cuDNN would not build

_READY: dict = {}


def _cudnn_ready(device: torch.device) -> bool:
    key = torch.device(device).index
    if key not in _READY:
        major, _ = torch.cuda.get_device_capability(device)
        _READY[key] = (major == 9 and torch.backends.cudnn.is_available()
                       and hasattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention"))
    return _READY[key]


PartFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool, float], tuple[torch.Tensor, torch.Tensor]]


def cudnn_part(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
               scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One cuDNN call. q: [L, Hq, D], k: [S, Hkv, D], v: [S, Hkv, Dv] (contiguous buffers:
    the shapes and strides key cuDNN's plan cache; Hq a multiple of Hkv: cuDNN groups the
    query heads itself, the same bits as repeating the KV heads, 5-8% faster and a third of
    the memory on an H200). Returns (o [L, Hq, Dv] view, lse [L, Hq] fp32 view); causal is
    top-left aligned."""
    hq = q.shape[1]
    o, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], None, True, 0.0, causal, False,
        scale=scale)[:2]
    return o[0].transpose(0, 1), lse.reshape(hq, q.shape[0]).transpose(0, 1)


def math_part(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
              scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`cudnn_part`'s contract in plain torch, fp32 (the split's reference and CPU tests)."""
    hq, hkv = q.shape[1], k.shape[1]
    kf = k.float().repeat_interleave(hq // hkv, dim=1)
    vf = v.float().repeat_interleave(hq // hkv, dim=1)
    s = torch.einsum("lhd,shd->hls", q.float(), kf) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[1:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # [H, L]
    o = torch.einsum("hls,shd->lhd", torch.softmax(s, dim=-1), vf)
    return o.to(q.dtype), lse.transpose(0, 1)


def attend_row_split(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix_k: torch.Tensor,
                     prefix_v: torch.Tensor, split: RowSplit, scale: float, out: torch.Tensor,
                     part: PartFn = cudnn_part, merge: Callable | None = None) -> torch.Tensor:
    """One row: q: [n, Hq, D]; k, v: [n, Hkv, D / Dv] its new keys; prefix_k, prefix_v:
    [prefix, Hkv, D / Dv] its cached keys (a gathered copy); writes out [n, Hq, Dv]."""
    from . import merge_attention_parts  # the Triton merge (or its reference off the kernel path)

    merge = merge or merge_attention_parts
    n, hq = q.shape[0], q.shape[1]
    tail_start = split.prefix_blocks * PREFIX_BLOCK
    r, square = split.tail, split.square
    qb = q.new_zeros((square, hq, q.shape[2]))
    qb[r:r + n] = q
    kb = k.new_zeros((square, k.shape[1], k.shape[2]))
    vb = v.new_zeros((square, v.shape[1], v.shape[2]))
    kb[:r], vb[:r] = prefix_k[tail_start:], prefix_v[tail_start:]
    kb[r:r + n], vb[r:r + n] = k, v
    o, lse = part(qb, kb, vb, True, scale)
    o, lse = o[r:r + n], lse[r:r + n]
    if split.prefix_blocks == 0:
        out.copy_(o)
        return out
    if r == 0:  # no tail: part B's padded queries are already [q | zeros] of q_rows = bucket(n) rows
        qa = qb
    else:
        qa = q.new_zeros((split.q_rows, hq, q.shape[2]))
        qa[:n] = q
    acc, lse_acc = o, lse  # merged in order: part B, then each prefix block; the last merge writes out
    for i in range(split.prefix_blocks):
        lo = i * PREFIX_BLOCK
        oa, la = part(qa, prefix_k[lo:lo + PREFIX_BLOCK].contiguous(), prefix_v[lo:lo + PREFIX_BLOCK].contiguous(),
                      False, scale)
        if i == split.prefix_blocks - 1:
            merge(acc, lse_acc, oa[:n], la[:n], out)
        else:  # an fp32 accumulator between merges (rounding once, at the end)
            nxt = torch.empty((n, hq, out.shape[2]), dtype=torch.float32, device=q.device)
            nxt_lse = torch.empty((n, hq), dtype=torch.float32, device=q.device)
            merge(acc, lse_acc, oa[:n], la[:n], nxt, nxt_lse)
            acc, lse_acc = nxt, nxt_lse
    return out


def warm_up_cudnn_extend(num_q_heads: int, num_kv_heads: int, head_dim: int, v_head_dim: int, scale: float,
                         dtype: torch.dtype, device: torch.device, max_tokens: int, max_context: int) -> int:
    """Build cuDNN's plan for every shape `split_row` can ask for, rows of up to max_tokens
    new tokens in contexts of up to max_context (the engine calls this before it says ready).
    Returns the number of shapes run (0 where the path is off)."""
    probe = torch.empty((0, num_q_heads, head_dim), dtype=dtype, device=device)
    if not cudnn_usable(probe, num_kv_heads, v_head_dim) or max_tokens < CUDNN_MIN_TOKENS:
        return 0
    first = bucket(CUDNN_MIN_TOKENS)
    squares = range(first, bucket(min(PREFIX_BLOCK - 1 + max_tokens, max_context)) + 1, LEN_GRANULE)
    q_rows = range(first, bucket(max_tokens) + 1, LEN_GRANULE) if max_context > PREFIX_BLOCK else range(0)

    def zeros(rows: int, heads: int, dim: int) -> torch.Tensor:
        return torch.zeros((rows, heads, dim), dtype=dtype, device=device)

    try:
        for length in squares:
            cudnn_part(zeros(length, num_q_heads, head_dim), zeros(length, num_kv_heads, head_dim),
                       zeros(length, num_kv_heads, v_head_dim), True, scale)
        for rows in q_rows:
            cudnn_part(zeros(rows, num_q_heads, head_dim), zeros(PREFIX_BLOCK, num_kv_heads, head_dim),
                       zeros(PREFIX_BLOCK, num_kv_heads, v_head_dim), False, scale)
    except RuntimeError as exc:  # this cuDNN / torch refuses the layout: its rows keep flash
        _REFUSED.add((num_q_heads, num_kv_heads, head_dim, v_head_dim))
        logger.warning("cuDNN attention refused %d q / %d KV heads of dims %d / %d (%s); those prompt rows "
                       "use the flash kernel", num_q_heads, num_kv_heads, head_dim, v_head_dim, str(exc)[:200])
        return 0
    return len(squares) + len(q_rows)
