"""The skinny linear's fused inputs and conv epilogue (kernels/linear/triton_linear.py's
`_skinny_linear_kernel` at a decode row): Triton helpers the kernel inlines, and the host-side
checks of their arguments. Each gives the bits of the separate launch it replaces (the gated
norm: its rounding, see `skinny_x_tile`); the torch references are in ref.py.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _interpreter_compat  # noqa: F401  (interpreter under NumPy >= 2.4)
from .._common import check_tensor

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# The skinny kernel's input operations (X_OP): the product's input computed from x in the launch.
X_PLAIN, X_SILU_AND_MUL, X_SIGMOID_GATE, X_GATED_NORM = 0, 1, 2, 3


@triton.jit
def skinny_x_tile(x_ptr, stride_xm, g_ptr, stride_gm, stride_gh, nw_ptr, eps, offs_m, offs_k, K, mask,
                   w_dtype: tl.constexpr, X_OP: tl.constexpr, HEAD_D: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, PROD_DTYPE: tl.constexpr):
    """One [BM, BK] tile of the product's input at rows offs_m, inputs offs_k (absolute), rounded
    to W's dtype as the separate launch it replaces stores it:
    X_PLAIN           x itself;
    X_SILU_AND_MUL    silu(gate) * up from rows [gate | up] (kernels/activation's silu_and_mul:
                      gate and up rounded to W's dtype first, fp32 math);
    X_SIGMOID_GATE    x * sigmoid(g) (kernels/activation's sigmoid_gate_mul: the sigmoid rounded
                      to g's dtype);
    X_GATED_NORM      per head of HEAD_D inputs, (nw * norm(x).to(x)).to(PROD) * silu(g)
                      (kernels/norm's gated_rms_norm; BLOCK_K a multiple of HEAD_D).
    g (X_SIGMOID_GATE, X_GATED_NORM) is read in place: input k of row m at
    g_ptr + m * stride_gm + (k // HEAD_D) * stride_gh + k % HEAD_D (a slice of a wider projection)."""
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
    if X_OP == 1:
        gate = tl.load(x_ptrs, mask=mask, other=0.0).to(w_dtype).to(tl.float32)
        up = tl.load(x_ptrs + K, mask=mask, other=0.0).to(w_dtype).to(tl.float32)
        xv = (gate / (1.0 + tl.exp(-gate)) * up).to(w_dtype)
    elif X_OP == 2 or X_OP == 3:
        xf = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
        g_ptrs = g_ptr + offs_m[:, None] * stride_gm + ((offs_k // HEAD_D) * stride_gh + offs_k % HEAD_D)[None, :]
        g = tl.load(g_ptrs, mask=mask, other=0.0)
        if X_OP == 2:
            sig = (1.0 / (1.0 + tl.exp(-g.to(tl.float32)))).to(g.dtype).to(tl.float32)
            xv = (xf * sig).to(w_dtype)
        else:
            x3 = tl.reshape(xf, (BLOCK_M, BLOCK_K // HEAD_D, HEAD_D))
            n = x3 * tl.rsqrt(tl.sum(x3 * x3, axis=2) / HEAD_D + eps)[:, :, None]
            nw = tl.load(nw_ptr + tl.arange(0, HEAD_D)).to(tl.float32)
            g3 = tl.reshape(g.to(tl.float32), (BLOCK_M, BLOCK_K // HEAD_D, HEAD_D))
            y = (nw[None, None, :] * n.to(w_dtype).to(tl.float32)).to(PROD_DTYPE).to(tl.float32) \
                * (g3 / (1.0 + tl.exp(-g3)))
            xv = tl.reshape(y.to(w_dtype), (BLOCK_M, BLOCK_K))
    else:
        xv = tl.load(x_ptrs, mask=mask, other=0.0)
    return xv


@triton.jit
def conv_decode_epilogue(xq, y, offs_m, offs_n, m_ok, n_ok, w_ptr, stride_w, states_ptr, slots_ptr, num_slots,
                          channels, stride_s_n, stride_s_d, stride_s_k, CONV_K: tl.constexpr, SILU: tl.constexpr):
    """kernels/causal_conv1d's decode step for channels offs_n < `channels` of rows offs_m, one
    token a row whose input is xq ([BM, BN], the projection as the separate launch stores it):
    out = sum_j w[c, j] * window_j (the pool's K-1 columns of the row's slot, then xq), in that
    order in fp32 (silu after, if SILU), and the window moves on by one (columns shifted left,
    xq last). A negative or out-of-range slot reads zeros and writes nothing (as the conv
    kernel). Every channel is this program's own: no other program reads or writes its window.
    Other channels keep y."""
    slot = tl.load(slots_ptr + offs_m, mask=m_ok, other=-1).to(tl.int64)
    c_ok = n_ok & (offs_n < channels)
    s_mask = (m_ok & (slot >= 0) & (slot < num_slots))[:, None] & c_ok[None, :]
    s_ptrs = states_ptr + slot[:, None] * stride_s_n + offs_n[None, :].to(tl.int64) * stride_s_d  # [BM, BN]
    acc = tl.zeros(xq.shape, dtype=tl.float32)
    for j in tl.static_range(CONV_K - 1):
        sv = tl.load(s_ptrs + j * stride_s_k, mask=s_mask, other=0.0)
        acc += sv.to(tl.float32) * tl.load(w_ptr + offs_n * stride_w + j, mask=c_ok, other=0.0).to(tl.float32)[None, :]
        if j > 0:
            tl.store(s_ptrs + (j - 1) * stride_s_k, sv, mask=s_mask)
    acc += xq * tl.load(w_ptr + offs_n * stride_w + (CONV_K - 1), mask=c_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(s_ptrs + (CONV_K - 2) * stride_s_k, xq.to(states_ptr.dtype.element_ty), mask=s_mask)
    if SILU:
        acc = acc * tl.sigmoid(acc)
    return tl.where(c_ok[None, :], acc, y)


def x_gate_args(name: str, gate: torch.Tensor, m: int, k: int, x: torch.Tensor) -> tuple[int, int, int]:
    """(stride_gm, stride_gh, head_d) of a [M, H, D] gate (H * D = K, last dim contiguous) read in
    place by the skinny kernel's X_SIGMOID_GATE / X_GATED_NORM inputs."""
    check_tensor(name, gate, ndim=3, dtypes=_FLOAT_DTYPES, device=x.device, last_contiguous=False)
    if gate.shape[0] != m or gate.shape[1] * gate.shape[2] != k or gate.stride(2) != 1:
        raise ValueError(f"{name} must be a [{m}, H, D] view with H * D = {k} and a contiguous last dim, "
                         f"got shape {tuple(gate.shape)} strides {gate.stride()}")
    return gate.stride(0), gate.stride(1), gate.shape[2]


def decode_conv_args(decode_conv: tuple, y: torch.Tensor, m: int) -> dict:
    """The skinny kernel's conv-epilogue arguments for `skinny_linear(decode_conv=)`, checked."""
    conv_w, states, slots, activation = decode_conv
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"decode_conv activation must be None or 'silu', got {activation!r}")
    check_tensor("decode_conv weight", conv_w, ndim=2, dtypes=_FLOAT_DTYPES, device=y.device,
                 last_contiguous=False)
    channels, width = conv_w.shape
    if width < 2 or conv_w.stride(1) != 1:
        raise ValueError(f"decode_conv weight must be [C, W >= 2] with contiguous taps, got {tuple(conv_w.shape)} "
                         f"strides {conv_w.stride()}")
    check_tensor("conv_states", states, ndim=3, dtypes=(y.dtype,), shape=(None, None, width - 1), device=y.device,
                 last_contiguous=False)
    if states.shape[1] < channels or channels > y.shape[1]:
        raise ValueError(f"decode_conv: {channels} conv channels, conv_states hold {states.shape[1]}, "
                         f"the product has {y.shape[1]} outputs")
    check_tensor("state_slots", slots, ndim=1, dtypes=(torch.int32, torch.int64), shape=(m,), device=y.device)
    return dict(CONV_K=width, CONV_SILU=activation is not None, conv_w_ptr=conv_w, stride_cw=conv_w.stride(0),
                conv_states_ptr=states, state_slots_ptr=slots, conv_num_slots=states.shape[0], conv_channels=channels,
                stride_cs_n=states.stride(0), stride_cs_d=states.stride(1), stride_cs_k=states.stride(2))
