"""The one dispatch point between model layers and kernels: one function per op.

Each op runs its Triton kernel or its torch reference (kernels/*/ref.py) as the kernel
switch (`kernels.switch.use_triton`: CUDA tensors, or HYBRID_SERVE_KERNELS) says.

Batch metadata comes from the step's ForwardBatch `fb` (models/forward_batch.py):

    kernel path     fb.state_slots, fb.cu_seqlens, fb.prefix_lens, fb.req_rows, ...
                    device tensors only: no host sync, CUDA-graph safe
    reference path  fb.host.state_slots, fb.host.cu_seqlens, ... host lists
"""
from __future__ import annotations

import functools
import inspect

import torch
import torch.nn.functional as F

from ...kernels.switch import few_rows_limit, skinny_rows_limit, use_triton
from ...kernels import attention as _attn
from ...kernels import causal_conv1d as _conv
from ...kernels import linear as _linear
from ...kernels import gated_delta as _gdn
from ...kernels import activation as _act
from ...kernels import mamba_ssm as _ssm
from ...kernels import moe as _moe
from ...kernels import norm as _norm
from ...kernels import rotary as _rotary
from ..forward_batch import ForwardBatch


# ----- varlen ops: where piecewise CUDA graphs cut ------------------------------------------
# Most ops of a step depend only on its token count T; the ops marked `varlen_op` depend on its
# rows (their lengths, slots, checkpoints: the ForwardBatch). Piecewise CUDA graphs
# (engine/runner/piecewise_graph.py) capture everything between them per padded T and run
# them eagerly. While a capture runs, VARLEN_HOOK[0] is its callback.
VARLEN_HOOK: list = [None]


def varlen_op(out_spec):
    """Mark a varlen op. out_spec(arguments by name) -> (shape, dtype) of its one output tensor
    (what a capture allocates inside the graph before running the op eagerly). A varlen op
    takes `out=`, a buffer of that shape its kernel path writes (its reference path may
    return a new tensor instead)."""
    def mark(fn):
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def run(*args, **kwargs):
            hook = VARLEN_HOOK[0]
            if hook is None:
                return fn(*args, **kwargs)
            return hook(fn, signature.bind(*args, **kwargs), out_spec)
        return run
    return mark


def _out_like_v(a: dict) -> tuple[tuple[int, ...], torch.dtype]:
    return tuple(a["v"].shape), a["v"].dtype


# ----- linears -----------------------------------------------------------------------------
def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x W^T (+ b). x: [..., K]; weight: [N, K]. out_dtype: None (x's dtype) or torch.float32
    (fp32 accumulation left unrounded, for a tensor-parallel reduce). On the kernel path bf16/fp16
    rows go through kernels/linear: one row (skinny kernel) or up to 16 (tensor-core few-rows
    kernel: a verify row, a small decode batch); everything else to torch (cuBLAS on CUDA)."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    skinny = skinny_rows_limit()
    if (0 < rows <= max(skinny, few_rows_limit()) and x.dtype in (torch.bfloat16, torch.float16)
            and weight.dtype == x.dtype and use_triton(x)):
        flat = x.reshape(rows, x.shape[-1])
        if flat.stride(-1) != 1:
            flat = flat.contiguous()
        kernel = _linear.skinny_linear if rows <= skinny else _linear.few_rows_linear
        y = kernel(flat, weight, bias, out_dtype)
        return y.reshape(*x.shape[:-1], weight.shape[0])
    if out_dtype is None or out_dtype == x.dtype:
        return F.linear(x, weight, bias)
    if out_dtype != torch.float32:
        raise ValueError(f"out_dtype must be None, x's dtype or torch.float32, got {out_dtype}")
    y = _linear_fp32_out(x, weight)
    return y if bias is None else y + bias.float()


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
    return F.linear(x.float(), weight.float())


# ----- activations ------------------------------------------------------------------------------
def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up: [T, 2F] (gate | up) -> silu(gate) * up [T, F]; one launch on the kernel path."""
    if use_triton(gate_up):
        return _act.silu_and_mul(gate_up)
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
# A step with at most this many long rows gives each to torch's SDPA (flash kernels, 2.3x our
# Triton extend kernel at head_dim 256 on an H100); more long rows share one extend launch.
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
    return _attn.paged_attention_ref(q, k_cache, v_cache, fb.req_to_token, fb.host.req_rows, fb.host.prefix_lens,
                                     fb.host.extend_lens, scale)


# ----- recurrent-state mixers -------------------------------------------------------------
# A step whose rows extend by more than this many tokens (a prefill chunk) runs the chunked
# tensor-core state kernels; decode and short verify steps the recurrent ones. Steps with
# checkpoints inside their tokens always take the chunked kernels, which write them.
RECURRENT_MAX_TOKENS = 8
STATE_CHUNK = 64  # tokens per chunk of the chunked kernels


def _chunked(fb: ForwardBatch) -> bool:
    return fb.max_extend_len > RECURRENT_MAX_TOKENS or (bool(fb.checkpoints) and not fb.spec_scratch_steps)


def _verify_kwargs(fb: ForwardBatch, ssm_states: torch.Tensor) -> dict:
    """A recurrent state kernel's scratch mode for a verify batch in scratch order
    (fb.spec_scratch_steps): the layer's scratch rows get the states after each of a row's
    first K tokens, the slot the state after all K + 1. Otherwise nothing (in place)."""
    if not fb.spec_scratch_steps:
        return {}
    return dict(intermediate_states=fb.state_pool.layer_scratch(ssm_states), update_pool=True)


def verify_graph_defers_state(state_pool, tokens_per_row: int) -> bool:
    """Whether a verify graph's step of `tokens_per_row` tokens a row leaves its GDN states to
    the commit (the recurrent kernel's deferred mode, `_gdn_verify_kwargs`): the shard passes
    this to the next commit (mem_cache/ops.py)."""
    return (state_pool is not None and state_pool.defers_verify and tokens_per_row <= RECURRENT_MAX_TOKENS
            and use_triton(state_pool.ssm_states))


def _gdn_verify_kwargs(fb: ForwardBatch, ssm_states: torch.Tensor) -> dict:
    """The recurrent GDN kernel's verify mode: deferred (`replay`: no state written, the commit
    replays the kept tokens; mem_cache/state_pool.py) where the pool keeps replay buffers,
    else the scratch mode of `_verify_kwargs`."""
    if fb.spec_scratch_steps and verify_graph_defers_state(fb.state_pool, fb.spec_scratch_steps + 1):
        return dict(replay=fb.state_pool.layer_replay(ssm_states))  # the rule the shard tells the commit
    return _verify_kwargs(fb, ssm_states)


@varlen_op(lambda a: (tuple(a["x"].shape), a["x"].dtype))
def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, conv_states: torch.Tensor,
                  fb: ForwardBatch, activation: str | None, out: torch.Tensor | None = None) -> torch.Tensor:
    """x: [T, D]; weight: [D, K]; conv_states: [N+1, D, K-1] (updated in place; checkpoint
    slots of fb.checkpoints receive the windows at their positions) -> y: [T, D]."""
    if fb.spec_scratch_steps and use_triton(x):  # verify batch in scratch order: windows to the scratch
        return _conv.causal_conv1d_varlen(x, weight, bias, conv_states, fb.state_slots, fb.cu_seqlens, activation,
                                          intermediate_conv_windows=fb.state_pool.layer_scratch(conv_states),
                                          update_pool=True, out=out)
    if fb.checkpoints:  # (checkpoints come with a plan: its host lists, no sync)
        index = fb.conv_snapshot_index(conv_states.shape[-1])
        if use_triton(x):
            _conv.snapshot_conv_windows(x, conv_states, fb.state_slots, index)
        else:
            _conv.snapshot_conv_windows_ref(x, conv_states, fb.state_slots, fb.host_cu_seqlens, fb.checkpoints, index)
    if use_triton(x):
        split = fb.row_split(RECURRENT_MAX_TOKENS)
        if split is not None:  # decode rows and prompt chunks as two launches, each of its own shape
            y = out if out is not None else torch.empty(x.shape, dtype=x.dtype, device=x.device)
            n = split.tokens
            _conv.causal_conv1d_varlen(x[:n], weight, bias, conv_states, split.short_slots, split.short_cu_seqlens,
                                       activation, out=y[:n], max_seqlen=split.short_max_len)
            _conv.causal_conv1d_varlen(x[n:], weight, bias, conv_states, split.long_slots, split.long_cu_seqlens,
                                       activation, out=y[n:], max_seqlen=split.long_max_len)
            return y
        return _conv.causal_conv1d_varlen(x, weight, bias, conv_states, fb.state_slots, fb.cu_seqlens, activation,
                                          out=out, max_seqlen=fb.max_extend_len)
    return _conv.causal_conv1d_varlen_ref(x, weight, bias, conv_states, fb.host.state_slots, fb.host.cu_seqlens,
                                          activation)


def gdn_gating(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """a, b: [T, HV] -> (g [T, HV] fp32 log decay, beta [T, HV])."""
    if use_triton(a):
        return _gdn.gdn_gating(a, b, A_log, dt_bias)
    return _gdn.gdn_gating_ref(a, b, A_log, dt_bias)


@varlen_op(_out_like_v)
def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     ssm_states: torch.Tensor, fb: ForwardBatch, use_qk_l2norm: bool = True,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """q, k: [T, H, Dk]; v: [T, HV, Dv]; g, beta: [T, HV]; ssm_states: [N+1, HV, Dk, Dv]
    (updated in place, checkpoint slots too) -> o: [T, HV, Dv] in v's dtype."""
    if use_triton(q):
        if _chunked(fb):
            return _gdn_chunked(q, k, v, g, beta, ssm_states, fb, use_qk_l2norm, out)
        return _gdn.gated_delta_rule_recurrent(q, k, v, g, beta, ssm_states, fb.state_slots, fb.cu_seqlens,
                                               use_qk_l2norm=use_qk_l2norm, out=out, **_gdn_verify_kwargs(fb, ssm_states))
    return _gdn.gated_delta_rule_varlen_ref(q, k, v, g, beta, ssm_states, fb.host.state_slots, fb.host.cu_seqlens,
                                            use_qk_l2norm=use_qk_l2norm, checkpoints=fb.checkpoints)


@varlen_op(_out_like_v)
def gated_delta_rule_from_projections(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor,
                                      b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                                      ssm_states: torch.Tensor, fb: ForwardBatch,
                                      use_qk_l2norm: bool = True, out: torch.Tensor | None = None) -> torch.Tensor:
    """gdn_gating(a, b, A_log, dt_bias) then gated_delta_rule: a, b: [T, HV] raw projections.
    The recurrent kernel computes the gates itself (one launch)."""
    if use_triton(q) and not _chunked(fb):
        return _gdn.gated_delta_rule_recurrent(q, k, v, a, b, ssm_states, fb.state_slots, fb.cu_seqlens,
                                               use_qk_l2norm=use_qk_l2norm, gating=(A_log, dt_bias), out=out,
                                               **_gdn_verify_kwargs(fb, ssm_states))
    g, beta = gdn_gating(a, b, A_log, dt_bias)
    if use_triton(q):  # (chunked) decode rows of a mixed step gate as a decode step does: raw a, b
        return _gdn_chunked(q, k, v, g, beta, ssm_states, fb, use_qk_l2norm, out, short_gates=(a, b, (A_log, dt_bias)))
    return gated_delta_rule(q, k, v, g, beta, ssm_states, fb, use_qk_l2norm, out=out)


def _gdn_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                 ssm_states: torch.Tensor, fb: ForwardBatch, use_qk_l2norm: bool, out: torch.Tensor | None,
                 short_gates: tuple | None = None) -> torch.Tensor:
    """The chunked kernels over the batch; in a mixed step (`fb.row_split`) over its prompt rows
    only, and the recurrent kernel over its leading decode rows, into the same output.
    short_gates: (a, b, (A_log, dt_bias)), the decode rows' raw gates for the recurrent kernel's
    fused gating; default g, beta."""
    split = fb.row_split(RECURRENT_MAX_TOKENS)
    if split is None:
        return _gdn.gated_delta_rule_chunked(q, k, v, g, beta, ssm_states, fb.state_slots,
                                             fb.chunk_table(STATE_CHUNK), use_qk_l2norm=use_qk_l2norm, out=out)
    o = _gdn.gated_delta_rule_chunked(q, k, v, g, beta, ssm_states, split.long_slots,
                                      fb.chunk_table(STATE_CHUNK, split.rows), use_qk_l2norm=use_qk_l2norm, out=out)
    n = split.tokens
    gate_a, gate_b, gating = short_gates if short_gates is not None else (g, beta, None)
    _gdn.gated_delta_rule_recurrent(q[:n], k[:n], v[:n], gate_a[:n], gate_b[:n], ssm_states, split.short_slots,
                                    split.short_cu_seqlens, use_qk_l2norm=use_qk_l2norm, gating=gating, out=o[:n])
    return o


@varlen_op(lambda a: (tuple(a["x"].shape), a["out_dtype"] or a["x"].dtype))
def selective_state_update(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                           D: torch.Tensor | None, dt_bias: torch.Tensor | None, ssm_states: torch.Tensor,
                           fb: ForwardBatch, *,
                           dt_softplus: bool, dt_limit: tuple[float, float],
                           out_dtype: torch.dtype | None, out: torch.Tensor | None = None) -> torch.Tensor:
    """x: [T, H, P]; dt: [T, H]; A, D, dt_bias: [H]; B, C: [T, G, N]; ssm_states: [N_slots+1, H, P, N]
    (updated in place, checkpoint slots too) -> y: [T, H, P] in out_dtype."""
    kwargs = dict(dt_softplus=dt_softplus, dt_limit=dt_limit, out_dtype=out_dtype)
    if use_triton(x):
        if _chunked(fb):
            split = fb.row_split(RECURRENT_MAX_TOKENS)
            if split is None:
                return _ssm.ssd_chunked(x, dt, A, B, C, D, dt_bias, ssm_states, fb.state_slots,
                                        fb.chunk_table(STATE_CHUNK), out=out, **kwargs)
            y = _ssm.ssd_chunked(x, dt, A, B, C, D, dt_bias, ssm_states, split.long_slots,
                                 fb.chunk_table(STATE_CHUNK, split.rows), out=out, **kwargs)
            n = split.tokens  # the decode rows as a decode step runs them
            _ssm.selective_state_update_varlen(x[:n], dt[:n], A, B[:n], C[:n], D, dt_bias, ssm_states,
                                               split.short_slots, split.short_cu_seqlens, out=y[:n], **kwargs)
            return y
        return _ssm.selective_state_update_varlen(x, dt, A, B, C, D, dt_bias, ssm_states, fb.state_slots,
                                                  fb.cu_seqlens, out=out, **kwargs, **_verify_kwargs(fb, ssm_states))
    return _ssm.selective_state_update_varlen_ref(x, dt, A, B, C, D, dt_bias, ssm_states, fb.host.state_slots,
                                                  fb.host.cu_seqlens, checkpoints=fb.checkpoints, **kwargs)


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
def moe_topk_softmax(router_logits: torch.Tensor, top_k: int,
                     renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits: [T, E] -> (weights [T, K] in the logits' dtype, expert ids [T, K] int64)."""
    fn = _moe.moe_topk_softmax if use_triton(router_logits) else _moe.moe_topk_softmax_ref
    return fn(router_logits, top_k, renormalize)


def fused_moe(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, activation: str = "silu", out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x: [T, H]; w1: [E, 2I, H] (silu, rows [gate | up]) or [E, I, H] (relu2); w2: [E, H, I];
    topk_weights, topk_ids: [T, K]. Returns this rank's partial sum [T, H] in out_dtype
    (default x's dtype)."""
    fn = _moe.fused_moe if use_triton(x) else _moe.fused_moe_ref
    return fn(x, w1, w2, topk_weights, topk_ids, activation, out_dtype=out_dtype)
