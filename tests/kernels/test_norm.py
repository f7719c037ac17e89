"""RMSNorm kernels vs kernels/norm/ref.py, and the refs vs the model's norm modules."""
import pytest
import torch
from kernel_utils import DEVICE, gpu, rel_err, require_triton

require_triton()
from hybrid_serve.kernels.norm import (  # noqa: E402
    gated_rms_norm, gated_rms_norm_ref, grouped_gated_rms_norm, grouped_gated_rms_norm_ref, rms_norm, rms_norm_ref,
)

DTYPES = [torch.float32, torch.bfloat16]
TOL = {torch.float32: 1e-6, torch.bfloat16: 1e-2}


def _rand(*shape, dtype=torch.float32, seed=0, device=DEVICE):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(device)


def _strided_heads(T, H, D, dtype):
    """[T, H, D] view into a wider projection output (row stride > H*D), as q/k/z are."""
    return _rand(T, H * D + 40, dtype=dtype)[:, 8:8 + H * D].view(T, H, D)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("zero_centered", [False, True], ids=["plain", "zero-centered"])
@pytest.mark.parametrize("shape", [(5, 48), (3, 4, 32), "strided"], ids=["2d", "3d", "strided-heads"])
def test_rms_norm(dtype, zero_centered, shape):
    x = _strided_heads(3, 4, 32, dtype) if shape == "strided" else _rand(*shape, dtype=dtype)
    w = _rand(x.shape[-1], dtype=dtype, seed=1) * 0.1 + (0.0 if zero_centered else 1.0)
    want = rms_norm_ref(x.cpu(), w.cpu(), 1e-6, zero_centered)
    out = torch.full(x.shape, float("nan"), dtype=want.dtype, device=DEVICE)
    got = rms_norm(x, w, 1e-6, zero_centered, out=out)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert rel_err(got.float().cpu(), want.float()) < TOL[dtype]


def test_rms_norm_fp32_weight_bf16_x_promotes_like_torch():
    x, w = _rand(4, 64, dtype=torch.bfloat16), _rand(64, seed=1)
    got, want = rms_norm(x, w, 1e-5), rms_norm_ref(x.cpu(), w.cpu(), 1e-5)
    assert got.dtype == want.dtype == torch.float32
    assert rel_err(got.cpu(), want) < 1e-6



@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_rms_norm_fp32_weight(dtype):
    """Nemotron-H's norm: the weight multiplies in fp32, one rounding to x's dtype at the end."""
    x = _strided_heads(3, 4, 32, dtype)
    w = _rand(32, dtype=dtype, seed=1) * 0.1 + 1.0
    want = rms_norm_ref(x.cpu(), w.cpu(), 1e-5, fp32_weight=True)
    got = rms_norm(x, w, 1e-5, fp32_weight=True)
    assert got.dtype == want.dtype == dtype
    assert rel_err(got.float().cpu(), want.float()) < TOL[dtype]


def test_fp32_weight_ref_matches_nemotron_norm():
    from hybrid_serve.models.nemotron_h import NemotronHRMSNorm

    x = _rand(5, 32, dtype=torch.bfloat16, device="cpu")
    m = NemotronHRMSNorm(32, eps=1e-5).to(torch.bfloat16)
    m.weight.data.normal_()
    x32, w32 = x.float(), m.weight.data.float()
    want = (w32 * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5))).to(torch.bfloat16)
    assert torch.equal(m(x), want) and torch.equal(rms_norm_ref(x, m.weight.data, 1e-5, fp32_weight=True), want)

@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("strided", [False, True], ids=["contig", "strided"])
def test_gated_rms_norm(dtype, strided):
    x = _strided_heads(5, 4, 24, dtype) if strided else _rand(5, 4, 24, dtype=dtype)
    gate = _strided_heads(5, 4, 24, dtype) if strided else _rand(5, 4, 24, dtype=dtype, seed=2)
    w = _rand(24, dtype=dtype, seed=1)
    want = gated_rms_norm_ref(x.cpu(), gate.cpu(), w.cpu(), 1e-6)
    out = torch.full(x.shape, float("nan"), dtype=dtype, device=DEVICE)
    got = gated_rms_norm(x, gate, w, 1e-6, out=out)
    assert rel_err(got.float().cpu(), want.float()) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("group_size", [8, 32], ids=["g8", "g32"])
def test_grouped_gated_rms_norm(dtype, group_size):
    x = _rand(6, 64, dtype=torch.float32)  # the SSM output is fp32
    gate = _rand(6, 64 + 16, dtype=dtype, seed=2)[:, 16:]  # z: a slice of in_proj's output
    w = _rand(64, dtype=dtype, seed=1)
    want = grouped_gated_rms_norm_ref(x.cpu(), gate.cpu(), w.cpu(), group_size, 1e-5, dtype)
    out = torch.full(x.shape, float("nan"), dtype=dtype, device=DEVICE)
    got = grouped_gated_rms_norm(x, gate, w, group_size, 1e-5, dtype, out=out)
    assert rel_err(got.float().cpu(), want.float()) < TOL[dtype]


def test_refs_match_model_modules():
    from hybrid_serve.models.layers.mamba2 import GroupedGatedRMSNorm
    from hybrid_serve.models.layers.norm import GatedRMSNorm, RMSNorm

    x, gate = _rand(3, 4, 32, dtype=torch.bfloat16, device="cpu"), _rand(3, 4, 32, dtype=torch.bfloat16, seed=3,
                                                                          device="cpu")
    for zc in (False, True):
        m = RMSNorm(32, eps=1e-6, zero_centered=zc).to(torch.bfloat16)
        m.weight.data.normal_()
        assert torch.equal(m(x), rms_norm_ref(x, m.weight.data, 1e-6, zc))
    m = GatedRMSNorm(32, eps=1e-6).to(torch.bfloat16)
    m.weight.data.normal_()
    assert torch.equal(m(x, gate), gated_rms_norm_ref(x, gate, m.weight.data, 1e-6))
    m = GroupedGatedRMSNorm(64, 16, 1e-5)
    m.weight.data.normal_()
    x2, g2 = x.view(6, 64).float(), gate.view(6, 64)
    assert torch.equal(m(x2, g2, torch.bfloat16), grouped_gated_rms_norm_ref(x2, g2, m.weight.data, 16, 1e-5,
                                                                             torch.bfloat16))


def test_norm_rejects_bad_inputs():
    x = _rand(4, 32)
    with pytest.raises(ValueError, match="weight"):
        rms_norm(x, _rand(16), 1e-6)
    with pytest.raises(ValueError, match="group size"):
        grouped_gated_rms_norm(x, x, _rand(32), 12, 1e-5, torch.float32)
    with pytest.raises(ValueError, match="gate"):
        gated_rms_norm(x, _rand(4, 16), _rand(32), 1e-6)


@gpu
@pytest.mark.parametrize("rows,dim", [(64, 2048), (64 * 16, 256), (4096, 2048)], ids=["hidden64", "qnorm64", "prefill"])
def test_norm_serving_shapes_gpu(rows, dim):
    x = _rand(rows, dim, dtype=torch.bfloat16, device="cuda")
    w = _rand(dim, dtype=torch.bfloat16, seed=1, device="cuda")
    assert rel_err(rms_norm(x, w, 1e-6, True).float(), rms_norm_ref(x, w, 1e-6, True).float()) < 1e-2
    gate = _rand(rows, dim, dtype=torch.bfloat16, seed=2, device="cuda")
    want = gated_rms_norm_ref(x.view(rows, -1, 128), gate.view(rows, -1, 128), w[:128], 1e-6)
    assert rel_err(gated_rms_norm(x.view(rows, -1, 128), gate.view(rows, -1, 128), w[:128], 1e-6).float(),
                   want.float()) < 1e-2


@pytest.mark.parametrize("variant", ["plain", "zero_centered", "fp32_weight"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_add_rms_norm_matches_ref(variant, dtype):
    from hybrid_serve.kernels.norm import add_rms_norm, add_rms_norm_ref

    g = torch.Generator().manual_seed(0)
    wide = torch.randn(5, 96, generator=g).to(dtype).to(DEVICE)
    x = wide[:, 16:80]  # strided rows, as a slice of a fused output
    residual = torch.randn(5, 64, generator=g).to(dtype).to(DEVICE)
    weight = (torch.randn(64, generator=g) * 0.1).to(dtype).to(DEVICE)
    zero_centered, fp32_weight = variant == "zero_centered", variant == "fp32_weight"
    normed, summed = add_rms_norm(x, residual, weight, 1e-6, zero_centered, fp32_weight=fp32_weight)
    want_normed, want_summed = add_rms_norm_ref(x, residual, weight, 1e-6, zero_centered, fp32_weight)
    assert torch.equal(summed, want_summed)
    if fp32_weight:  # Nemotron-H's norm: (w.float() * norm(x)).to(x.dtype), returned in x's dtype
        assert normed.dtype == dtype
    assert normed.dtype == want_normed.dtype
    assert rel_err(normed.float(), want_normed.float()) < (1e-6 if dtype == torch.float32 else 8e-3)
