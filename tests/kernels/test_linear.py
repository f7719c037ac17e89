"""Skinny (decode-batch) and few-rows linear kernels vs kernels/linear/ref.py (the ops.linear
dispatch to them: test_ops_linear.py)."""
import pytest
import torch
from kernel_utils import DEVICE, gpu, rel_err, require_triton

require_triton()
from hybrid_serve.kernels.linear import (  # noqa: E402
    FEW_ROWS_MAX_ROWS, SKINNY_MAX_ROWS, few_rows_linear, skinny_linear, skinny_linear_ref)


def _rand(*shape, dtype=torch.bfloat16, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(DEVICE)


@pytest.mark.parametrize("m,n,k", [(1, 64, 256), (3, 70, 200), (8, 36, 1030), (2, 5, 16)])
@pytest.mark.parametrize("bias", [False, True])
def test_skinny_linear_matches_ref(m, n, k, bias):
    x, w = _rand(m, k, seed=1), _rand(n, k, seed=2)
    b = _rand(n, seed=3) if bias else None
    want = skinny_linear_ref(x.cpu(), w.cpu(), None if b is None else b.cpu(), torch.float32)
    got32 = skinny_linear(x, w, b, torch.float32)
    assert got32.dtype == torch.float32 and got32.shape == (m, n)
    assert rel_err(got32.cpu(), want) < 1e-5  # fp32 accumulation, unrounded
    got = skinny_linear(x, w, b)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got.cpu(), want.to(torch.bfloat16)) or rel_err(got.float().cpu(), want) < 4e-3


@pytest.mark.parametrize("m,n,k", [(1, 64, 256), (1, 40, 200), (3, 36, 1030)])
@pytest.mark.parametrize("gate_up_dtype", [torch.float32, torch.bfloat16])
def test_skinny_linear_silu_and_mul_input(m, n, k, gate_up_dtype):
    """x_silu_and_mul: the activation inside the launch gives the bits of silu_and_mul (rounding
    gate and up to W's dtype first) followed by the plain kernel, and matches the reference."""
    from hybrid_serve.kernels.activation import silu_and_mul

    gate_up, w = _rand(m, 2 * k, dtype=gate_up_dtype, seed=6) * 2, _rand(n, k, seed=7)
    for out_dtype in (None, torch.float32):
        got = skinny_linear(gate_up, w, out_dtype=out_dtype, x_silu_and_mul=True)
        two_launches = skinny_linear(silu_and_mul(gate_up, out_dtype=w.dtype), w, out_dtype=out_dtype)
        assert got.dtype == (out_dtype or w.dtype) and torch.equal(got, two_launches)
    want = skinny_linear_ref(gate_up.cpu(), w.cpu(), out_dtype=torch.float32, x_silu_and_mul=True)
    assert rel_err(got.cpu(), want) < 1e-5
    with pytest.raises(ValueError, match="even"):
        skinny_linear(gate_up[:, 1:], w, x_silu_and_mul=True)
    with pytest.raises(ValueError, match="shape"):
        skinny_linear(gate_up, _rand(n, k + 1), x_silu_and_mul=True)


@pytest.mark.parametrize("m,h,d,n", [(1, 4, 16, 24), (3, 3, 12, 10), (1, 8, 128, 8)])
def test_skinny_linear_sigmoid_gate_input(m, h, d, n):
    """x_sigmoid_gate: the attention output gate inside the launch, its gate read in place from a
    strided slice ([q | gate] per head), gives the bits of sigmoid_gate_mul then the plain kernel."""
    from hybrid_serve.kernels.activation import sigmoid_gate_mul

    x = _rand(m, h, d, seed=11)
    gate = _rand(m, h, 2 * d, seed=12)[:, :, d:]  # the second half of every head's row
    w = _rand(n, h * d, seed=13)
    for out_dtype in (None, torch.float32):
        got = skinny_linear(x.reshape(m, h * d), w, out_dtype=out_dtype, x_sigmoid_gate=gate)
        two_launches = skinny_linear(sigmoid_gate_mul(x, gate), w, out_dtype=out_dtype)
        assert torch.equal(got, two_launches)
    want = skinny_linear_ref(x.reshape(m, h * d).cpu(), w.cpu(), out_dtype=torch.float32, x_sigmoid_gate=gate.cpu())
    assert rel_err(got.cpu(), want) < 1e-5
    with pytest.raises(ValueError, match="H \\* D"):
        skinny_linear(x.reshape(m, h * d), w, x_sigmoid_gate=gate[:, 1:])
    with pytest.raises(ValueError, match="exclusive"):
        skinny_linear(x.reshape(m, h * d), w, x_sigmoid_gate=gate, x_silu_and_mul=True)


@pytest.mark.parametrize("m,h,d,n,block_k", [(1, 4, 32, 24, None), (1, 6, 16, 10, 32), (2, 8, 128, 8, None)])
@pytest.mark.parametrize("norm_dtype", [torch.bfloat16, torch.float32])
def test_skinny_linear_gated_norm_input(m, h, d, n, block_k, norm_dtype):
    """x_gated_norm: a GDN output norm (per head, then silu(z)) inside the out projection's launch,
    z read in place from its slice of the in-projection. Each head's sum of squares may add in
    another order than the norm kernel's, so against the two launches the inputs may differ by a
    rounding (1 in 256 at most here) and the outputs stay at bf16 precision; against the
    reference likewise."""
    from hybrid_serve.kernels.norm import gated_rms_norm

    x = _rand(m, h, d, seed=21) * 3
    z = _rand(m, 2 * h * d + 5, seed=22)[:, 5 + h * d:].reshape(m, h, d)  # a column slice
    nw = (_rand(d, seed=23) * 0.5 + 1).to(norm_dtype)
    w = _rand(n, h * d, seed=24)
    eps = 1e-6
    normed = gated_rms_norm(x, z, nw, eps)
    for out_dtype in (None, torch.float32):
        got = skinny_linear(x.reshape(m, h * d), w, out_dtype=out_dtype, x_gated_norm=(z, nw, eps), block_k=block_k)
        two_launches = skinny_linear(normed.reshape(m, h * d), w, out_dtype=out_dtype)
        assert got.dtype == (out_dtype or w.dtype)
        assert rel_err(got.float().cpu(), two_launches.float().cpu()) < 4e-3
    want = skinny_linear_ref(x.reshape(m, h * d).cpu(), w.cpu(), out_dtype=torch.float32,
                             x_gated_norm=(z.cpu(), nw.cpu(), eps))
    assert rel_err(got.cpu(), want) < 4e-3
    # the input itself, through a weight whose rows pick one input each (64 inputs across the heads)
    k = h * d
    cols = torch.linspace(0, k - 1, 64).long()
    pick = torch.zeros(64, k, dtype=torch.bfloat16)
    pick[torch.arange(64), cols] = 1
    picked = skinny_linear(x.reshape(m, k), pick.to(DEVICE), x_gated_norm=(z, nw, eps), block_k=block_k)
    ref_in = normed.reshape(m, k)[:, cols.to(DEVICE)]
    assert (picked != ref_in).float().mean().item() <= 1 / 32  # (a rounding in 256 over 64 picks)
    assert rel_err(picked.float().cpu(), ref_in.float().cpu()) < 4e-3
    with pytest.raises(ValueError, match="power-of-two"):
        skinny_linear(_rand(1, 36), _rand(4, 36), x_gated_norm=(_rand(1, 3, 12), _rand(12), eps))
    with pytest.raises(ValueError, match="whole heads"):
        skinny_linear(_rand(1, 64), _rand(4, 64), x_gated_norm=(_rand(1, 2, 32), _rand(32), eps), block_k=48)


@pytest.mark.parametrize("m,n,k,block_k", [(1, 24, 256, None), (1, 10, 200, 64), (3, 12, 96, 32)])
@pytest.mark.parametrize("variant", ["zero_centered", "fp32_weight", "plain"])
def test_skinny_linear_add_norm_input(m, n, k, block_k, variant):
    """x_add_norm: a decoder layer's residual add and the next RMSNorm inside the following
    projection's launch. The stored sum is the norm kernel's (bits); the normed rows' sums of
    squares may add in another order, so they may differ from the separate launch's by a rounding,
    and the product stays at bf16 precision against the two launches and the reference."""
    from hybrid_serve.kernels.linear import AddNormInput
    from hybrid_serve.kernels.norm import add_rms_norm

    x = _rand(m, k, seed=41) * 2
    residual = _rand(m, k + 7, seed=42)[:, 7:]  # rows strided, as a wider buffer's slice
    nw = _rand(k, seed=43, dtype=torch.float32 if variant == "fp32_weight" else torch.bfloat16) * 0.5 + 1
    w = _rand(n, k, seed=44)
    eps = 1e-6
    flags = dict(zero_centered=variant == "zero_centered", fp32_weight=variant == "fp32_weight")
    normed, summed = add_rms_norm(x, residual, nw, eps, **flags)
    for out_dtype in (None, torch.float32):
        outs = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
        arg = AddNormInput(residual, nw, eps, flags["zero_centered"], flags["fp32_weight"], *outs)
        got = skinny_linear(x, w, out_dtype=out_dtype, x_add_norm=arg, block_k=block_k)
        two_launches = skinny_linear(normed, w, out_dtype=out_dtype)
        assert got.dtype == (out_dtype or w.dtype)
        assert rel_err(got.float().cpu(), two_launches.float().cpu()) < 4e-3
        assert torch.equal(arg.summed, summed)
        assert (arg.normed != normed).float().mean().item() <= 1 / 64
        assert rel_err(arg.normed.float().cpu(), normed.float().cpu()) < 4e-3
    ref_outs = torch.zeros(m, k, dtype=x.dtype), torch.zeros(m, k, dtype=x.dtype)
    ref_arg = AddNormInput(residual.cpu(), nw.cpu(), eps, flags["zero_centered"], flags["fp32_weight"], *ref_outs)
    want = skinny_linear_ref(x.cpu(), w.cpu(), out_dtype=torch.float32, x_add_norm=ref_arg)
    assert rel_err(got.cpu(), want) < 4e-3
    assert torch.equal(ref_arg.summed, summed.cpu())
    with pytest.raises(ValueError, match="exclusive"):
        skinny_linear(x, w, x_add_norm=arg, x_silu_and_mul=True)
    with pytest.raises(ValueError, match="summed"):
        skinny_linear(x, w, x_add_norm=arg._replace(summed=arg.summed[:, :-1]))
    with pytest.raises(ValueError, match="residual"):
        skinny_linear(x, w, x_add_norm=arg._replace(residual=residual.float()))


@pytest.mark.parametrize("m,n,k,channels,width", [(1, 40, 64, 24, 4), (3, 20, 48, 20, 4), (2, 12, 32, 6, 2)])
@pytest.mark.parametrize("activation", ["silu", None])
def test_skinny_linear_decode_conv_epilogue(m, n, k, channels, width, activation):
    """decode_conv: a GDN in-projection whose first channels feed the causal conv, one decode token
    a row: the product's conv channels come out as causal_conv1d_varlen's output over the plain
    product (bits), the other channels as the plain product, and the slots' windows move on as
    the conv kernel moves them; a negative slot reads zeros and writes nothing."""
    from hybrid_serve.kernels.causal_conv1d import causal_conv1d_varlen

    x, w = _rand(m, k, seed=31), _rand(n, k, seed=32)
    conv_w = _rand(channels, 1, width, seed=33)[:, 0, :]  # the model's [C, 1, W] parameter, strided
    states = _rand(6, channels + 3, width - 1, seed=34)  # more channels in the pool than convolved: ignored
    slots = torch.tensor([4, -1, 2][:m], dtype=torch.int32, device=DEVICE)
    cu = torch.arange(m + 1, dtype=torch.int32, device=DEVICE)
    plain = skinny_linear(x, w)
    want_states = states.clone()
    want_conv = causal_conv1d_varlen(plain[:, :channels].contiguous(), conv_w, None, want_states[:, :channels],
                                     slots, cu, activation)
    got_states = states.clone()
    got = skinny_linear(x, w, decode_conv=(conv_w, got_states[:, :channels], slots, activation))
    assert torch.equal(got[:, channels:], plain[:, channels:])
    assert torch.equal(got[:, :channels], want_conv)
    assert torch.equal(got_states, want_states)
    ref_states = states.cpu().clone()
    ref = skinny_linear_ref(x.cpu(), w.cpu(), decode_conv=(conv_w.cpu(), ref_states[:, :channels], slots.cpu(),
                                                           activation))
    assert rel_err(got.float().cpu(), ref.float()) < 4e-3
    assert torch.equal(ref_states[:, channels:], states.cpu()[:, channels:])
    with pytest.raises(ValueError, match="activation"):
        skinny_linear(x, w, decode_conv=(conv_w, got_states[:, :channels], slots, "gelu"))
    with pytest.raises(ValueError, match="state_slots"):
        skinny_linear(x, w, decode_conv=(conv_w, got_states[:, :channels], slots[:0], activation))


def test_skinny_linear_tiles_override_and_strided_rows():
    x = _rand(4, 2 * 96, seed=4)[:, ::2]  # non-contiguous last dim: refused
    w = _rand(48, 96, seed=5)
    with pytest.raises(ValueError, match="contiguous"):
        skinny_linear(x, w)
    x = _rand(4, 96 + 8, seed=4)[:, 8:]  # strided rows are fine
    got = skinny_linear(x, w, block_n=8, block_k=32, num_warps=2)
    assert rel_err(got.float().cpu(), skinny_linear_ref(x.cpu(), w.cpu(), out_dtype=torch.float32)) < 4e-3


def test_skinny_linear_rejects_bad_input():
    x, w = _rand(2, 32), _rand(8, 32)
    with pytest.raises(ValueError, match="at most"):
        skinny_linear(_rand(SKINNY_MAX_ROWS + 1, 32), w)
    with pytest.raises(ValueError, match="shape"):
        skinny_linear(x, _rand(8, 31))
    with pytest.raises(ValueError, match="dtype"):
        skinny_linear(x, w.float())
    with pytest.raises(ValueError, match="out_dtype"):
        skinny_linear(x, w, out_dtype=torch.float16)
    assert skinny_linear(x[:0], w).shape == (0, 8)


@gpu
@pytest.mark.parametrize("m", [1, 2, 4, 8])
@pytest.mark.parametrize("n,k", [(12352, 2048), (2048, 6144), (2048, 4096)])
def test_skinny_linear_serving_shapes(m, n, k):
    """The 2.3B layout's decode projections (GDN in_proj, down_proj, out_proj) in bf16."""
    x, w = _rand(m, k, seed=10), _rand(n, k, seed=11) * 0.02
    want = skinny_linear_ref(x, w, out_dtype=torch.float32)
    assert rel_err(skinny_linear(x, w, out_dtype=torch.float32), want) < 1e-5
    assert rel_err(skinny_linear(x, w).float(), want) < 4e-3


@pytest.mark.parametrize("m,n,k,w_left", [(5, 70, 200, False), (5, 64, 256, True), (16, 96, 512, False),
                                          (2, 33, 96, True), (1, 16, 64, False)])
@pytest.mark.parametrize("bias", [False, True])
def test_few_rows_linear_matches_ref(m, n, k, w_left, bias):
    """Both MMA orientations, ragged N and K, 1-16 rows, fp32 and rounded outputs."""
    x, w = _rand(m, k, seed=1), _rand(n, k, seed=2)
    b = _rand(n, seed=3) if bias else None
    want = skinny_linear_ref(x.cpu(), w.cpu(), None if b is None else b.cpu(), torch.float32)
    tiles = dict(block_n=64 if w_left else 32, block_k=64, w_left=w_left)
    got32 = few_rows_linear(x, w, b, torch.float32, **tiles)
    assert got32.dtype == torch.float32 and got32.shape == (m, n)
    assert rel_err(got32.cpu(), want) < 1e-5
    got = few_rows_linear(x, w, b, **tiles)
    assert got.dtype == torch.bfloat16 and rel_err(got.float().cpu(), want) < 4e-3


def test_few_rows_linear_rows_are_independent():
    """A row's result does not depend on how many rows come with it (an eager step of 5 rows
    and the graph of 8 rows it would be padded to give the same bits)."""
    x, w = _rand(FEW_ROWS_MAX_ROWS, 160, seed=4), _rand(48, 160, seed=5)
    full = few_rows_linear(x, w, out_dtype=torch.float32, block_n=16, block_k=32)
    for m in (2, 5, 9):
        assert torch.equal(few_rows_linear(x[:m], w, out_dtype=torch.float32, block_n=16, block_k=32), full[:m])


def test_few_rows_linear_rejects_bad_input():
    x, w = _rand(2, 32), _rand(8, 32)
    with pytest.raises(ValueError, match="at most"):
        few_rows_linear(_rand(FEW_ROWS_MAX_ROWS + 1, 32), w)
    with pytest.raises(ValueError, match="shape"):
        few_rows_linear(x, _rand(8, 31))
    with pytest.raises(ValueError, match="out_dtype"):
        few_rows_linear(x, w, out_dtype=torch.float16)
    assert few_rows_linear(x[:0], w).shape == (0, 8)


@gpu
@pytest.mark.parametrize("m", [2, 5, 8, 16])
@pytest.mark.parametrize("n,k", [(12352, 2048), (2048, 6144), (2048, 4096), (151936, 2048)])
def test_few_rows_linear_serving_shapes(m, n, k):
    """The 2.3B layout's projections and LM head at verify / small-batch row counts, bf16."""
    x, w = _rand(m, k, seed=10), _rand(n, k, seed=11) * 0.02
    want = skinny_linear_ref(x, w, out_dtype=torch.float32)
    assert rel_err(few_rows_linear(x, w, out_dtype=torch.float32), want) < 1e-5
    assert rel_err(few_rows_linear(x, w).float(), want) < 4e-3
