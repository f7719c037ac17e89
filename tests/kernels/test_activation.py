"""silu-and-mul vs kernels/activation/ref.py."""
import pytest
import torch
from kernel_utils import DEVICE, gpu, rel_err, require_triton

require_triton()
from hybrid_serve.kernels.activation import silu_and_mul, silu_and_mul_ref  # noqa: E402

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


@gpu
@pytest.mark.parametrize("t", [1, 64])
def test_silu_and_mul_serving_shapes(t):
    """The 2.3B layout's MLP (intermediate 6144) in bf16."""
    x = _rand(t, 2 * 6144, dtype=torch.bfloat16)
    assert rel_err(silu_and_mul(x).float(), silu_and_mul_ref(x).float()) < 8e-3
