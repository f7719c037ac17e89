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
from .._common import check_tensor, next_pow2
from .ref import ADD_NORM_MAX_K, AddNormInput

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# The skinny kernel's input operations (X_OP): the product's input computed from x in the launch.
X_PLAIN, X_SILU_AND_MUL, X_SIGMOID_GATE, X_GATED_NORM, X_ADD_NORM = 0, 1, 2, 3, 4
# X_ADD_NORM's norm variants: kernels/norm's modes of the same names (their casts)
NORM_PLAIN, NORM_ZERO_CENTER, NORM_FP32_WEIGHT = 0, 1, 4


@triton.jit
def add_norm_values(s, rstd, nw, NORM_MODE: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """kernels/norm's add_rms_norm output from the rounded sum s (fp32 values), its row's
    rstd and the norm weight nw (fp32), rounded to OUT_DTYPE (x's dtype) as that kernel stores it."""
    n = s * rstd
    if NORM_MODE == 1:
        y = n * (1.0 + nw)
    elif NORM_MODE == 4:
        y = nw * n
    else:
        y = nw * n.to(OUT_DTYPE).to(tl.float32)
    return y.to(OUT_DTYPE)


@triton.jit
def add_norm_rstd(x_ptr, stride_xm, r_ptr, stride_rm, nw_ptr, eps, offs_m, m_ok, K, sum_ptr, normed_ptr,
                  NORM_MODE: tl.constexpr, KP: tl.constexpr):
    """X_ADD_NORM's row statistics: s = residual + x rounded to x's dtype (as the model adds), and
    each row's 1 / sqrt(mean(s^2) + eps) ([BM] fp32), from whole rows (K <= KP). Program 0 also
    stores s and the normed rows ([M, K] each, contiguous) for the layer's later reads (the
    residual stream, a MoE block's experts)."""
    offs_d = tl.arange(0, KP)
    mask = m_ok[:, None] & (offs_d < K)[None, :]
    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_d[None, :], mask=mask, other=0.0)
    r = tl.load(r_ptr + offs_m[:, None] * stride_rm + offs_d[None, :], mask=mask, other=0.0)
    s = (r.to(tl.float32) + x.to(tl.float32)).to(x.dtype)
    sf = s.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(sf * sf, axis=1) / K + eps)
    if tl.program_id(0) == 0:
        out_offs = offs_m[:, None] * K + offs_d[None, :]
        tl.store(sum_ptr + out_offs, s, mask=mask)
        nw = tl.load(nw_ptr + offs_d, mask=offs_d < K, other=0.0).to(tl.float32)[None, :]
        tl.store(normed_ptr + out_offs, add_norm_values(sf, rstd[:, None], nw, NORM_MODE, x.dtype), mask=mask)
    return rstd


@triton.jit
def skinny_x_tile(x_ptr, stride_xm, g_ptr, stride_gm, stride_gh, nw_ptr, eps, offs_m, offs_k, K, mask,
                   w_dtype: tl.constexpr, X_OP: tl.constexpr, HEAD_D: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, PROD_DTYPE: tl.constexpr,
                   rstd=None, NORM_MODE: tl.constexpr = 0):
    """One [BM, BK] tile of the product's input at rows offs_m, inputs offs_k (absolute), rounded
    to W's dtype as the separate launch it replaces stores it:
    X_PLAIN           x itself;
    X_SILU_AND_MUL    silu(gate) * up from rows [gate | up] (kernels/activation's silu_and_mul:
                      gate and up rounded to W's dtype first, fp32 math);
    X_SIGMOID_GATE    x * sigmoid(g) (kernels/activation's sigmoid_gate_mul: the sigmoid rounded
                      to g's dtype);
    X_GATED_NORM      per head of HEAD_D inputs, (nw * norm(x).to(x)).to(PROD) * silu(g)
                      (kernels/norm's gated_rms_norm; BLOCK_K a multiple of HEAD_D);
    X_ADD_NORM        rms_norm(g + x) of a decoder layer's residual g (rows stride_gm apart) and
                      the sublayer output x, with each row's rstd from `add_norm_rstd` (kernels/
                      norm's add_rms_norm: its casts; its sum of squares may add in another order).
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
    elif X_OP == 4:
        xr = tl.load(x_ptrs, mask=mask, other=0.0)
        r = tl.load(g_ptr + offs_m[:, None] * stride_gm + offs_k[None, :], mask=mask, other=0.0)
        s = (r.to(tl.float32) + xr.to(tl.float32)).to(xr.dtype).to(tl.float32)
        nw = tl.load(nw_ptr + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)[None, :]
        xv = add_norm_values(s, rstd[:, None], nw, NORM_MODE, xr.dtype).to(w_dtype)
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


def add_norm_args(add_norm: AddNormInput, x: torch.Tensor, weight: torch.Tensor) -> dict:
    """The skinny kernel's X_ADD_NORM arguments for `skinny_linear(x_add_norm=)`, checked."""
    m, k = x.shape
    residual, nw = add_norm.residual, add_norm.weight
    check_tensor("x_add_norm's residual", residual, ndim=2, dtypes=(x.dtype,), shape=(m, k), device=x.device)
    check_tensor("x_add_norm's weight", nw, ndim=1, shape=(k,), device=x.device)
    for name in ("summed", "normed"):
        out = getattr(add_norm, name)
        check_tensor(f"x_add_norm's {name}", out, ndim=2, dtypes=(x.dtype,), shape=(m, k), device=x.device)
        if not out.is_contiguous():
            raise ValueError(f"x_add_norm's {name} must be contiguous")
    if add_norm.zero_centered and add_norm.fp32_weight:
        raise ValueError("x_add_norm: zero_centered and fp32_weight are exclusive")
    mode = NORM_ZERO_CENTER if add_norm.zero_centered else NORM_FP32_WEIGHT if add_norm.fp32_weight else NORM_PLAIN
    if mode == NORM_PLAIN and nw.dtype != x.dtype:
        raise ValueError(f"x_add_norm: a plain norm's weight must be in x's dtype ({x.dtype}), got {nw.dtype}")
    if k > ADD_NORM_MAX_K:
        raise ValueError(f"x_add_norm takes rows of at most {ADD_NORM_MAX_K} values, got {k}")
    if x.dtype != weight.dtype:
        raise ValueError(f"x_add_norm needs x in the weight's dtype ({weight.dtype}), got {x.dtype}")
    return dict(xg_ptr=residual, stride_xgm=residual.stride(0), xnw_ptr=nw, x_eps=float(add_norm.eps),
                sum_ptr=add_norm.summed, normed_ptr=add_norm.normed, NORM_MODE=mode, X_KP=next_pow2(k))
