"""The one dispatch point between model layers and kernels: one function per op.

Each op runs its Triton kernel or its torch reference (kernels/*/ref.py) as the kernel
switch (`kernels.switch.use_triton`: CUDA tensors, or HYBRID_SERVE_KERNELS) says.

Batch metadata comes from the step's ForwardBatch `fb` (models/forward_batch.py):

    kernel path     fb.state_slots, fb.cu_seqlens, fb.prefix_lens, fb.req_rows, ...
                    device tensors only: no host sync, CUDA-graph safe
    reference path  fb.host.state_slots, fb.host.cu_seqlens, ... host lists

The recurrent-state mixers' ops (causal conv, Gated DeltaNet, Mamba2) are dispatched in
state_mixer_ops.py and re-exported here, as is pending_norm.py's PendingAddNorm (a decoder
layer's add and norm left to the next projection's launch); the varlen-op marking (where piecewise CUDA graphs
cut) lives in varlen.py.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ...kernels.switch import few_rows_limit, forced_reference, skinny_rows_limit, use_triton
from ...kernels import attention as _attn
from ...kernels import linear as _linear
from ...kernels import activation as _act
from ...kernels import moe as _moe
from ...kernels import norm as _norm
from ...kernels import rotary as _rotary
from ..forward_batch import ForwardBatch
from .varlen import VARLEN_HOOK, varlen_op  # noqa: F401  (VARLEN_HOOK: piecewise graphs set it)
# the recurrent-state mixers (conv, GDN, Mamba2), dispatched in their own module
from .pending_norm import PendingAddNorm, defer_add_norm, resolve  # noqa: F401  (re-exported)
from .state_mixer_ops import (  # noqa: F401
    RECURRENT_MAX_TOKENS, STATE_CHUNK, causal_conv1d, gated_delta_rule, gated_delta_rule_from_projections, gdn_gating,
    selective_state_update, verify_graph_defers_state,
)


# ----- linears -----------------------------------------------------------------------------
def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           out_dtype: torch.dtype | None = None, *, x_silu_and_mul: bool = False,
           x_sigmoid_gate: torch.Tensor | None = None,
           x_gated_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None) -> torch.Tensor:
    """x W^T (+ b). x: [..., K]; weight: [N, K]. out_dtype: None (x's dtype) or torch.float32
    (fp32 accumulation left unrounded, for a tensor-parallel reduce). On the kernel path bf16/fp16
    rows go through kernels/linear: one row (skinny kernel) or up to 16 (tensor-core few-rows
    kernel: a verify row, a small decode batch); everything else to torch (cuBLAS on CUDA).
    The product's input may be an operation on x, done inside the skinny kernel's launch for a
    `skinny_row` (the separate op's bits, or for the norm its rounding), else as its own op first:
    x_silu_and_mul: x is [..., 2K] (gate | up), the input `silu_and_mul(x, out_dtype=weight.dtype)`;
    x_sigmoid_gate: gate [T, H, D] (H * D = K, may be a strided slice), the input
    `sigmoid_gate_mul(x, gate)` (an attention output gate);
    x_gated_norm: (gate [T, H, D], norm weight [D], eps), the input `gated_rms_norm(x, gate, ...)`
    per head (a GDN output norm).
    x may be a PendingAddNorm (a decoder layer's residual add and norm not yet run): at a
    `skinny_row` they run inside this launch, else as their own launch first."""
    if isinstance(x, PendingAddNorm):
        other_op = x_silu_and_mul or x_sigmoid_gate is not None or x_gated_norm is not None
        if add_norm_fusable(x, weight) and not other_op:
            y = _linear.skinny_linear(_rows_view(x.x), weight, bias, out_dtype, x_add_norm=x.kernel_input())
            return y.reshape(*x.shape[:-1], weight.shape[0])
        x = x.tensor()
    if x_silu_and_mul:
        if skinny_row(x, weight) and x.dtype in (torch.float32, weight.dtype):
            y = _linear.skinny_linear(_rows_view(x), weight, bias, out_dtype, x_silu_and_mul=True)
            return y.reshape(*x.shape[:-1], weight.shape[0])
        x = silu_and_mul(x, out_dtype=weight.dtype)
    elif x_sigmoid_gate is not None or x_gated_norm is not None:
        gate = x_sigmoid_gate if x_sigmoid_gate is not None else x_gated_norm[0]
        fused = skinny_row(x, weight) if x_sigmoid_gate is not None else gated_norm_row(x, weight, gate)
        if fused and x.dtype == weight.dtype and gate.stride(-1) == 1:
            flat = _rows_view(x)
            y = _linear.skinny_linear(flat, weight, bias, out_dtype, x_sigmoid_gate=x_sigmoid_gate,
                                      x_gated_norm=x_gated_norm)
            return y.reshape(*x.shape[:-1], weight.shape[0])
        x3 = x.reshape(gate.shape)
        if x_sigmoid_gate is not None:
            x = sigmoid_gate_mul(x3, gate)
        else:
            x = gated_rms_norm(x3, gate, x_gated_norm[1], x_gated_norm[2]).reshape(x.shape)
    if few_rows(x) and x.dtype in (torch.bfloat16, torch.float16) and weight.dtype == x.dtype:
        flat = _rows_view(x)
        kernel = _linear.skinny_linear if flat.shape[0] <= skinny_rows_limit() else _linear.few_rows_linear
        y = kernel(flat, weight, bias, out_dtype)
        return y.reshape(*x.shape[:-1], weight.shape[0])
    if out_dtype is None or out_dtype == x.dtype:
        return F.linear(x, weight, bias)
    if out_dtype != torch.float32:
        raise ValueError(f"out_dtype must be None, x's dtype or torch.float32, got {out_dtype}")
    y = _linear_fp32_out(x, weight)
    return y if bias is None else y + bias.float()


def linear_out(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, out_dtype: torch.dtype | None = None
               ) -> torch.Tensor:
    """`linear(x, weight, out_dtype=out_dtype)` written into out ([T, N], x: [T, K]) and returned:
    the skinny and few-rows kernels store their result there (a CUDA graph's static logits
    buffer: no copy of its logits after the LM head); any other path copies its result in."""
    if (few_rows(x) and x.dim() == 2 and x.dtype in (torch.bfloat16, torch.float16) and weight.dtype == x.dtype
            and out.dim() == 2 and out.stride(-1) == 1):
        kernel = _linear.skinny_linear if x.shape[0] <= skinny_rows_limit() else _linear.few_rows_linear
        return kernel(_rows_view(x), weight, None, out_dtype, out=out)
    return out.copy_(linear(x, weight, out_dtype=out_dtype))


def linear_into_decode_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                            conv_weight: torch.Tensor, conv_states: torch.Tensor, fb: ForwardBatch,
                            activation: str | None) -> tuple[torch.Tensor, bool]:
    """x W^T (+ b) whose first conv_weight.shape[0] ([C, W]) columns are a causal conv's input
    (a GDN in-projection). Returns (y, conv_done): for a `skinny_row` of a pure decode step
    (one token a row, no checkpoint, no verify scratch) the conv runs in the projection's launch
    (kernels/linear's decode_conv: causal_conv1d's bits, the windows in conv_states moved on)
    and those columns are its output; otherwise (linear(x), False) and the caller runs
    `causal_conv1d`."""
    if (skinny_row(x, weight) and fb.max_extend_len == 1 and not fb.checkpoints and not fb.spec_scratch_steps
            and x.dtype == weight.dtype == conv_states.dtype):
        add_norm = x.kernel_input() if add_norm_fusable(x, weight) else None
        flat = _rows_view(x.x if add_norm is not None else resolve(x))
        y = _linear.skinny_linear(flat, weight, bias, decode_conv=(conv_weight, conv_states, fb.state_slots,
                                                                   activation), x_add_norm=add_norm)
        return y.reshape(*x.shape[:-1], weight.shape[0]), True
    return linear(x, weight, bias), False


def _num_rows(x: torch.Tensor) -> int:
    """Rows of x ([..., K]) as a linear sees them."""
    return x.numel() // x.shape[-1] if x.shape[-1] else 0


def _rows_view(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, K] with a contiguous last dim (the kernels' layout), without a copy where it can."""
    flat = x.reshape(_num_rows(x), x.shape[-1])
    return flat if flat.stride(-1) == 1 else flat.contiguous()


def _skinny(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return 0 < _num_rows(x) <= skinny_rows_limit() and use_triton(x) and weight.dtype in (torch.bfloat16, torch.float16)


def add_norm_fusable(x: "torch.Tensor | PendingAddNorm", weight: torch.Tensor) -> bool:
    """Whether x is a PendingAddNorm whose add and norm a linear by `weight` can run in its skinny
    launch now (not run yet, a skinny row, x in the weight's dtype)."""
    return isinstance(x, PendingAddNorm) and not x.done and _skinny(x.x, weight) and x.dtype == weight.dtype


def skinny_row(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a linear of x by `weight` is the skinny kernel's (rows up to HYBRID_SERVE_SKINNY_ROWS,
    a decode row by default, on the kernel path, half-precision weights): where the fused inputs
    and epilogues that give the separate launches' bits (`linear(x_silu_and_mul=True)`,
    `linear(x_sigmoid_gate=)`, `shared_expert_combine`) run in its launch."""
    return _skinny(x, weight)


def gated_norm_row(x: torch.Tensor, weight: torch.Tensor, gate: torch.Tensor) -> bool:
    """Whether `linear(x_gated_norm=(gate, ...))` runs the norm inside the skinny kernel's launch
    (a `skinny_row` whose heads, gate.shape[-1], are a power of two). Its per-head sums of
    squares may add in another order than kernels/norm's, so a normalized input can differ from
    the separate launch's by a rounding (its own predicate: tests compare the exact fusions
    alone)."""
    head_d = gate.shape[-1]
    return _skinny(x, weight) and head_d > 0 and head_d & (head_d - 1) == 0


def shared_expert_combine(gate_up: torch.Tensor, down_weight: torch.Tensor, topk_rows: torch.Tensor,
                          shared_gate: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """A MoE block's last sum in one launch (for a `skinny_row` x): the experts'
    weighted rows topk_rows [T * K, H] fp32 (fused_moe(combine=False)) summed per token, plus
    sigmoid(shared_gate [T, 1]) * down(silu(gate) * up) of the gated shared expert's projection
    gate_up [T, 2I] (fp32 sums or the weight's dtype). The bits of fused_moe(shared=, shared_gate=)
    with the shared term from `linear(gate_up, down_weight, out_dtype=fp32, x_silu_and_mul=True)`."""
    return _linear.skinny_linear(gate_up.contiguous(), down_weight, out_dtype=out_dtype, x_silu_and_mul=True,
                                 topk_rows=topk_rows, shared_gate=shared_gate)


def few_rows(x: torch.Tensor) -> bool:
    """Whether `linear` gives x (rows of [..., K]) to the Triton skinny / few-rows kernels
    (decode-sized batches), which write fp32 sums as cheaply as x's dtype."""
    return 0 < _num_rows(x) <= max(skinny_rows_limit(), few_rows_limit()) and use_triton(x)


_MIXED_DTYPE_MM = {"cuda": True}  # torch.mm(..., out_dtype=) usable here (checked on first use)


def _linear_fp32_out(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x W^T with fp32 output from bf16/fp16 operands (fp32 accumulation, no rounding of the
    result): cuBLAS's mixed-dtype GEMM on CUDA, an upcast elsewhere (or where this torch lacks
    it). x: [..., K]; weight: [N, K]."""
    if x.is_cuda and _MIXED_DTYPE_MM["cuda"]:
        flat = x.reshape(-1, x.shape[-1])
        try:
            return torch.mm(flat, weight.t(), out_dtype=torch.float32).reshape(*x.shape[:-1], weight.shape[0])
        except (TypeError, RuntimeError, NotImplementedError):
            if torch.cuda.is_current_stream_capturing():
                raise
            _MIXED_DTYPE_MM["cuda"] = False
    return F.linear(x.float(), weight.float())


def router_logits(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """MoE router logits in fp32: x [T, H], weight [E, H] -> [T, E] float32.

    Half-precision operands go through `linear(..., out_dtype=torch.float32)` (products of
    bf16/fp16 values are exact in fp32, so this equals upcasting first), which for a decode
    batch is the skinny kernel: a row's logits then do not depend on how many other rows the
    step carries, so an eager step of 5 rows routes exactly as the CUDA graph padded to 8
    (cuBLAS's fp32 GEMM picks other algorithms by row count and near-tied experts flipped)."""
    if x.dtype in (torch.bfloat16, torch.float16) and weight.dtype == x.dtype:
        return linear(x, weight, out_dtype=torch.float32)
    return F.linear(resolve(x).float(), weight.float())


# ----- activations ------------------------------------------------------------------------------
def silu_and_mul(gate_up: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """gate_up: [T, 2F] (gate | up) -> silu(gate) * up [T, F] in out_dtype (default gate_up's;
    a narrower one rounds gate and up to it first: fp32 GEMM sums of a projection the model
    holds in out_dtype); one launch on the kernel path."""
    if use_triton(gate_up):
        return _act.silu_and_mul(gate_up, out_dtype)
    if out_dtype is not None and out_dtype != gate_up.dtype:
        gate, up = gate_up.to(out_dtype).chunk(2, dim=-1)
        return (F.silu(gate.float()) * up.float()).to(out_dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def relu2(x: torch.Tensor) -> torch.Tensor:
    """relu(x)^2 (Nemotron-H's MLP); one launch on the kernel path for [T, F] inputs."""
    if use_triton(x) and x.dim() == 2 and x.stride(-1) == 1:
        return _act.relu2(x)
    return _act.relu2_ref(x)


def sigmoid_gate_mul(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """x, gate: [T, H, D] (gate may be a strided slice) -> x * sigmoid(gate) as [T, H * D]; one
    launch on the kernel path."""
    if use_triton(x):
        return _act.sigmoid_gate_mul(x, gate)
    t, h, d = x.shape
    return x.reshape(t, h * d) * torch.sigmoid(gate.reshape(t, h * d))


# ----- attention --------------------------------------------------------------------------
def store_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fb: ForwardBatch) -> None:
    """Write this step's keys/values at fb.kv_slots. k_cache: [S, Hkv, D]; k: [T, Hkv, D]."""
    fn = _attn.store_kv if use_triton(k) else _attn.store_kv_ref
    fn(k_cache, v_cache, fb.kv_slots, k, v)


# Rows with more new tokens than this (prefill chunks) take the extend-attention kernel (their
# new keys read contiguously, one q head per program); shorter rows (decode, verify) the paged
# kernel, whose token-major rows share each K/V tile across a GQA group.
EXTEND_ATTENTION_MIN_TOKENS = 32
# A step with at most this many long rows gives each to kernels/attention/sdpa_extend.py (cuDNN
# at padded shapes for rows of 2,048+ tokens on Hopper, torch's flash kernels for the rest);
# more long rows share one extend launch.
SDPA_MAX_ROWS = 4


@varlen_op(lambda a: ((a["q"].shape[0], a["q"].shape[1], a["v_cache"].shape[-1]), a["q"].dtype))
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
              scale: float, fb: ForwardBatch, out: torch.Tensor | None = None) -> torch.Tensor:
    """Store this step's K/V at fb.kv_slots, then causal attention of q [T, Hq, D] over each
    request's context -> [T, Hq, Dv] in q's dtype. k: [T, Hkv, D]; v: [T, Hkv, Dv]. out: an
    optional [T, Hq, Dv] buffer the kernel path writes (the varlen ops' `out`: piecewise graphs;
    a path may return a new tensor instead)."""
    store_kv(k_cache, v_cache, k, v, fb)
    if not use_triton(q) or fb.max_extend_len < EXTEND_ATTENTION_MIN_TOKENS:
        return paged_attention(q, k_cache, v_cache, scale, fb, out)
    long_rows = [b for b, n in enumerate(fb.plan.extend_lens) if n >= EXTEND_ATTENTION_MIN_TOKENS] \
        if fb.plan is not None else None
    if long_rows is not None and len(long_rows) <= SDPA_MAX_ROWS:
        p = fb.plan
        o = out if out is not None else torch.empty((q.shape[0], q.shape[1], v_cache.shape[-1]), dtype=q.dtype,
                                                    device=q.device)
        _attn.extend_attention_sdpa(q, k, v, k_cache, v_cache, fb.req_to_token, p.req_rows, p.prefix_lens,
                                    p.cu_seqlens, long_rows, scale, o)
    else:
        o = _attn.extend_attention(q, k, v, k_cache, v_cache, fb.req_to_token, fb.req_rows, fb.prefix_lens,
                                   fb.cu_seqlens, scale, out=out, min_tokens=EXTEND_ATTENTION_MIN_TOKENS)
    if fb.min_extend_len is None or fb.min_extend_len < EXTEND_ATTENTION_MIN_TOKENS:  # short rows too
        _attn.paged_attention(q, k_cache, v_cache, fb.req_to_token, fb.req_rows, fb.prefix_lens, fb.cu_seqlens,
                              scale, out=o, skip_longer_than=EXTEND_ATTENTION_MIN_TOKENS - 1)
    return o


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float,
                    fb: ForwardBatch, out: torch.Tensor | None = None) -> torch.Tensor:
    """q: [T, Hq, D] over each request's paged context -> [T, Hq, Dv] in q's dtype (into `out`
    on the kernel path, if given)."""
    if use_triton(q):
        return _attn.paged_attention(q, k_cache, v_cache, fb.req_to_token, fb.req_rows, fb.prefix_lens,
                                     fb.cu_seqlens, scale, out=out, max_extend_len=fb.max_extend_len)
    fn = _attn.paged_attention_cpu if q.device.type == "cpu" and not forced_reference() else _attn.paged_attention_ref
    return fn(q, k_cache, v_cache, fb.req_to_token, fb.host.req_rows, fb.host.prefix_lens, fb.host.extend_lens, scale)


# ----- norms and rotary -------------------------------------------------------------------
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered: bool = False,
             fp32_weight: bool = False) -> torch.Tensor:
    """x: [..., D]; weight: [D]. Casts as kernels/norm/ref.py states them per variant."""
    if use_triton(x):
        return _norm.rms_norm(x, weight, eps, zero_centered, fp32_weight=fp32_weight)
    return _norm.rms_norm_ref(x, weight, eps, zero_centered, fp32_weight)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 zero_centered: bool = False, fp32_weight: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """A layer's residual add and the next norm: (rms_norm(residual + x), residual + x). x, residual: [T, D]."""
    if use_triton(x):
        return _norm.add_rms_norm(x, residual, weight, eps, zero_centered, fp32_weight=fp32_weight)
    return _norm.add_rms_norm_ref(x, residual, weight, eps, zero_centered, fp32_weight)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """GDN output norm (normalise, then gate). x, gate: [..., D]; weight: [D]."""
    fn = _norm.gated_rms_norm if use_triton(x) else _norm.gated_rms_norm_ref
    return fn(x, gate, weight, eps)


def grouped_gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, group_size: int, eps: float,
                           out_dtype: torch.dtype) -> torch.Tensor:
    """Mamba2 output norm (gate, then normalise per group). x, gate: [T, C]; weight: [C]."""
    fn = _norm.grouped_gated_rms_norm if use_triton(x) else _norm.grouped_gated_rms_norm_ref
    return fn(x, gate, weight, group_size, eps, out_dtype)


def rotary_neox(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [T, Hq, D]; k: [T, Hk, D]; positions: [T]; inv_freq: [rot/2]. Returns rotated copies."""
    if use_triton(q):
        return _rotary.rotary_neox(q, k, positions, inv_freq.float(), inplace=False)
    return _rotary.rotary_neox_ref(q, k, positions, inv_freq)


# ----- mixture of experts -----------------------------------------------------------------
def moe_topk_softmax(router_logits: torch.Tensor, top_k: int, renormalize: bool,
                     out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits: [T, E] -> (weights [T, K] in out_dtype, default the logits' dtype; expert
    ids [T, K] int64)."""
    fn = _moe.moe_topk_softmax if use_triton(router_logits) else _moe.moe_topk_softmax_ref
    return fn(router_logits, top_k, renormalize, out_dtype)


def fused_moe(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, activation: str = "silu", out_dtype: torch.dtype | None = None,
              shared: torch.Tensor | None = None, shared_gate: torch.Tensor | None = None,
              combine: bool = True) -> torch.Tensor:
    """x: [T, H]; w1: [E, 2I, H] (silu, rows [gate | up]) or [E, I, H] (relu2); w2: [E, H, I];
    topk_weights, topk_ids: [T, K]. Returns this rank's partial sum [T, H] in out_dtype
    (default x's dtype), plus `shared` [T, H] (times sigmoid(shared_gate [T, 1]) if given)
    added in the same fp32 sum: a shared expert's term without launches of its own.
    combine=False: the weighted expert rows [T * K, H] fp32 instead of their sum
    (`shared_expert_combine` adds them)."""
    fn = _moe.fused_moe if use_triton(x) else _moe.fused_moe_ref
    return fn(x, w1, w2, topk_weights, topk_ids, activation, out_dtype=out_dtype, shared=shared,
              shared_gate=shared_gate, combine=combine)
