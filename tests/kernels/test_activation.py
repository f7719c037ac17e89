"""The fused activations (silu-and-mul, sigmoid gate, relu2) vs kernels/activation/ref.py."""
import pytest
import torch
from kernel_utils import DEVICE, gpu, rel_err, require_triton

require_triton()
from hybrid_serve.kernels.activation import (  # noqa: E402
    relu2, relu2_ref, sigmoid_gate_mul, sigmoid_gate_mul_ref, silu_and_mul, silu_and_mul_ref,
)

TOL = {torch.float32: 1e-6, torch.bfloat16: 8e-3}


def _rand(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("t", [0, 1, 5])
def test_silu_and_mul(dtype, t):
    x = _rand(t, 2 * 40 + 6, dtype=dtype)[:, 6:]  # strided rows
    got = silu_and_mul(x)
    want = silu_and_mul_ref(x.cpu())
    assert got.shape == (t, 40) and got.dtype == dtype
    if t:
        assert rel_err(got.float().cpu(), want.float()) < TOL[dtype]
    with pytest.raises(ValueError, match="even"):
        silu_and_mul(_rand(2, 7))


def test_silu_and_mul_rounds_fp32_sums_to_out_dtype():
    """fp32 GEMM sums in, bf16 out: gate and up rounded to bf16 first, so the result is the bits
    of the same kernel on the bf16 projection (what the model's bf16 GEMM would have stored);
    the ops dispatcher's reference path agrees to one rounding."""
    from hybrid_serve.models.layers import ops

    x = _rand(3, 2 * 40 + 6, seed=4)[:, 6:]  # fp32, strided rows
    got = silu_and_mul(x, out_dtype=torch.bfloat16)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, silu_and_mul(x.to(torch.bfloat16)))
    ref = ops.silu_and_mul(x.cpu(), out_dtype=torch.bfloat16) if DEVICE == "cpu" else got.cpu()
    assert rel_err(got.float().cpu(), ref.float()) < TOL[torch.bfloat16]
    with pytest.raises(ValueError, match="out_dtype"):
        silu_and_mul(x, out_dtype=torch.int32)


@gpu
@pytest.mark.parametrize("t", [1, 64])
def test_silu_and_mul_serving_shapes(t):
    """The 2.3B layout's MLP (intermediate 6144) in bf16."""
    x = _rand(t, 2 * 6144, dtype=torch.bfloat16)
    assert rel_err(silu_and_mul(x).float(), silu_and_mul_ref(x).float()) < 8e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("t", [0, 1, 3])
@pytest.mark.parametrize("heads,dim", [(3, 20), (5, 1024)], ids=["one_head_block", "head_blocks"])
def test_sigmoid_gate_mul(dtype, t, heads, dim):
    """The gate is the second half of each head of a [T, H, 2D] projection (strided), as in
    Qwen3.5's attention; rounding as torch's ops in the same dtype. 5 heads of 1,024: the
    kernel's programs take 4 heads each (the last block masked)."""
    q_gate = _rand(t, heads, 2 * dim, dtype=dtype, seed=1)
    gate = q_gate[..., dim:]
    x = _rand(t, heads, dim, dtype=dtype, seed=2)
    got = sigmoid_gate_mul(x, gate)
    want = sigmoid_gate_mul_ref(x.cpu(), gate.cpu())
    assert got.shape == (t, heads * dim) and got.dtype == dtype and got.is_contiguous()
    torch_ops = x.cpu().reshape(t, heads * dim) * torch.sigmoid(gate.cpu().reshape(t, heads * dim))
    if dtype == torch.bfloat16:
        assert torch.equal(want, torch_ops)  # the reference rounds as torch's ops do
    elif t:
        assert rel_err(want, torch_ops) < 1e-6
    if t:
        assert rel_err(got.float().cpu(), want.float()) < TOL[dtype]
    with pytest.raises(ValueError, match="shape"):
        sigmoid_gate_mul(x, q_gate)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("t", [0, 1, 5])
def test_relu2_same_bits_as_torch(dtype, t):
    """relu(x)^2 of strided rows (a slice of a wider output): the very bits torch's relu then
    square give in that dtype (both round the exact square once)."""
    x = _rand(t, 40 + 6, dtype=dtype, seed=2)[:, 6:]
    got = relu2(x)
    assert got.shape == (t, 40) and got.dtype == dtype and got.is_contiguous()
    assert torch.equal(got.cpu(), relu2_ref(x.cpu()))
    assert (got >= 0).all()
    with pytest.raises(ValueError, match="x"):
        relu2(_rand(2, 3, 4))
