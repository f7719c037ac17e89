"""rotary_neox (Triton) vs rotary_neox_ref, and the ref vs the model's RotaryEmbedding."""
import pytest
import torch
from kernel_utils import DEVICE, gpu, rel_err, require_triton

require_triton()
from hybrid_serve.kernels.rotary import rotary_neox, rotary_neox_ref  # noqa: E402


def _inputs(T, Hq, Hk, D, rot, dtype, device=DEVICE, seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(T, (Hq + 2 * Hk) * D, generator=g).to(dtype)
    q = qkv[:, :Hq * D].view(T, Hq, D)  # strided views, as a fused projection gives
    k = qkv[:, Hq * D:(Hq + Hk) * D].view(T, Hk, D)
    positions = torch.randint(0, 5000, (T,), generator=g)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, rot, 2, dtype=torch.float) / rot))
    return q.to(device), k.to(device), positions.to(device), inv_freq.to(device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("dims", [(16, 16), (32, 8), (24, 12)], ids=["full", "partial-quarter", "odd-half"])
@pytest.mark.parametrize("inplace", [True, False], ids=["inplace", "outofplace"])
def test_rotary_matches_ref(dtype, dims, inplace):
    D, rot = dims
    q, k, pos, inv_freq = _inputs(5, 4, 2, D, rot, dtype)
    want_q, want_k = rotary_neox_ref(q.cpu(), k.cpu(), pos.cpu(), inv_freq.cpu())
    q_before = q.clone()
    got_q, got_k = rotary_neox(q, k, pos, inv_freq, inplace=inplace)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert rel_err(got_q.float().cpu(), want_q.float()) < tol
    assert rel_err(got_k.float().cpu(), want_k.float()) < tol
    if inplace:
        assert got_q.data_ptr() == q.data_ptr()
    else:
        assert torch.equal(q, q_before)
    assert torch.equal(got_q[..., rot:], q_before[..., rot:])  # pass-through dims untouched / copied


def test_ref_matches_model_rotary():
    from hybrid_serve.models.layers.rotary import RotaryEmbedding

    q, k, pos, _ = _inputs(6, 4, 2, 32, 16, torch.bfloat16, device="cpu")
    emb = RotaryEmbedding(32, 16, 10000.0)
    mq, mk = emb(pos, q, k)
    rq, rk = rotary_neox_ref(q, k, pos, emb.inv_freq)
    assert torch.equal(mq, rq) and torch.equal(mk, rk)


def test_rotary_rejects_bad_inputs():
    q, k, pos, inv_freq = _inputs(3, 2, 1, 8, 8, torch.float32)
    with pytest.raises(ValueError, match="rotary dim"):
        rotary_neox(q, k, pos, torch.ones(5, device=q.device))
    with pytest.raises(ValueError, match="positions"):
        rotary_neox(q, k, pos[:2], inv_freq)


@gpu
@pytest.mark.parametrize("tokens", [64, 4096], ids=["decode64", "prefill4k"])
def test_rotary_serving_shapes_gpu(tokens):
    """2.3B Qwen3.5 layout: 16 q / 2 kv heads of 256, partial rotary 0.25 (64 dims)."""
    q, k, pos, inv_freq = _inputs(tokens, 16, 2, 256, 64, torch.bfloat16, device="cuda")
    want_q, want_k = rotary_neox_ref(q, k, pos, inv_freq)
    got_q, got_k = rotary_neox(q.clone(), k.clone(), pos, inv_freq)
    assert rel_err(got_q.float(), want_q.float()) < 1e-2 and rel_err(got_k.float(), want_k.float()) < 1e-2
