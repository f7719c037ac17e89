"""Dispatch of the recurrent-state mixers' ops (causal conv, Gated DeltaNet, Mamba2), re-exported
by ops.py: which kernel a step's rows take (recurrent for decode and short verify rows,
chunked on tensor cores for prompt chunks and steps with checkpoints inside, both in one step
when the rows differ), their verify modes (scratch or deferred), and the torch references.
Batch metadata as in ops.py: device tensors of the ForwardBatch on the kernel path, its host
lists on the reference path.
"""
from __future__ import annotations

import torch

from ...kernels.switch import use_triton
from ...kernels import causal_conv1d as _conv
from ...kernels import gated_delta as _gdn
from ...kernels import mamba_ssm as _ssm
from ..forward_batch import ForwardBatch
from .varlen import out_like_v, varlen_op

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


@varlen_op(out_like_v)
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
    if _chunked(fb):  # prompt rows: the recurrence a chunk of matrix products at a time (CPU)
        return _gdn.gated_delta_rule_varlen_chunked_ref(q, k, v, g, beta, ssm_states, fb.host.state_slots,
                                                        fb.host.cu_seqlens, use_qk_l2norm=use_qk_l2norm,
                                                        checkpoints=fb.checkpoints, chunk=STATE_CHUNK)
    return _gdn.gated_delta_rule_varlen_ref(q, k, v, g, beta, ssm_states, fb.host.state_slots, fb.host.cu_seqlens,
                                            use_qk_l2norm=use_qk_l2norm, checkpoints=fb.checkpoints)


@varlen_op(out_like_v)
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
