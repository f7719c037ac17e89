"""Reference for the skinny (few-row) linear: y = x W^T (+ b), fp32 accumulation."""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..activation.ref import sigmoid_gate_mul_ref
from ..causal_conv1d.ref import causal_conv1d_varlen_ref
from ..norm.ref import add_rms_norm_ref, gated_rms_norm_ref


ADD_NORM_MAX_K = 8192  # the skinny kernel's X_ADD_NORM holds whole rows of x and the residual


class AddNormInput(NamedTuple):
    """`skinny_linear(x_add_norm=)`: the product's input is kernels/norm's add_rms_norm(x,
    residual, weight, eps, zero_centered, fp32_weight), and the launch stores its (normed,
    summed) rows into `normed` and `summed` ([M, K] contiguous, x's dtype) as that op returns them."""
    residual: torch.Tensor
    weight: torch.Tensor
    eps: float
    zero_centered: bool
    fp32_weight: bool
    summed: torch.Tensor
    normed: torch.Tensor


def skinny_linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                      out_dtype: torch.dtype | None = None, x_silu_and_mul: bool = False,
                      x_sigmoid_gate: torch.Tensor | None = None,
                      x_gated_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None,
                      decode_conv: tuple | None = None, x_add_norm: AddNormInput | None = None) -> torch.Tensor:
    """x: [M, K]; weight: [N, K]; bias: [N] or None. Returns [M, N] in out_dtype (default the
    weight's dtype), accumulated in fp32 and rounded once. The product's input may be an
    operation on x (kernels/linear's skinny_linear, same arguments):
    x_silu_and_mul: x is [M, 2K] (gate | up), the input silu(gate) * up, gate and up rounded to
    the weight's dtype first and the result rounded to it (kernels/activation's silu_and_mul);
    x_sigmoid_gate: g [M, H, D], the input x * sigmoid(g) (sigmoid_gate_mul);
    x_gated_norm: (g [M, H, D], norm weight [D], eps), the input gated_rms_norm of x per head;
    x_add_norm: an AddNormInput, the input add_rms_norm(x, residual, ...)'s normed rows, its
    (normed, summed) copied into the AddNormInput's outputs.
    decode_conv: (conv weight [C, W], conv_states, state_slots [M], activation): outputs 0..C-1
    then go through the causal conv as one decode token per row (the windows updated in place)."""
    if x_silu_and_mul:
        gate, up = x.to(weight.dtype).float().chunk(2, dim=-1)
        x = (torch.nn.functional.silu(gate) * up).to(weight.dtype)
    elif x_sigmoid_gate is not None:
        x = sigmoid_gate_mul_ref(x.reshape(x_sigmoid_gate.shape), x_sigmoid_gate)
    elif x_gated_norm is not None:
        gate, norm_weight, eps = x_gated_norm
        x = gated_rms_norm_ref(x.reshape(gate.shape), gate, norm_weight, eps).reshape(x.shape[0], -1)
    elif x_add_norm is not None:
        a = x_add_norm
        normed, summed = add_rms_norm_ref(x, a.residual, a.weight, a.eps, a.zero_centered, a.fp32_weight)
        a.normed.copy_(normed)
        a.summed.copy_(summed)
        x = normed
    y = x.float() @ weight.float().t()
    if bias is not None:
        y = y + bias.float()
    y = y.to(out_dtype or weight.dtype)
    if decode_conv is not None:
        conv_w, states, slots, activation = decode_conv
        c = conv_w.shape[0]
        y[:, :c] = causal_conv1d_varlen_ref(y[:, :c].contiguous(), conv_w, None, states, slots.tolist(),
                                            list(range(y.shape[0] + 1)), activation)
    return y
