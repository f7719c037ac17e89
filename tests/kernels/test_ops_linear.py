"""models/layers/ops.py's dispatch of linears to kernels/linear: a few bf16 rows to the skinny or
few-rows kernel, `linear_out` into a given buffer, and a decoder layer's pending add and norm run
inside the next projection's launch (PendingAddNorm)."""
import pytest
import torch
from kernel_utils import DEVICE, rel_err, require_triton

require_triton()
from hybrid_serve.kernels.linear import skinny_linear, skinny_linear_ref  # noqa: E402


def _rand(*shape, dtype=torch.bfloat16, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(DEVICE)


def test_ops_linear_dispatch(monkeypatch):
    """ops.linear sends a few bf16 rows to the kernel and everything else to torch, with the
    same result; HYBRID_SERVE_SKINNY_ROWS=0 turns the kernel off."""
    from hybrid_serve.kernels import linear as klinear
    from hybrid_serve.kernels import switch
    from hybrid_serve.models.layers import ops

    monkeypatch.setenv("HYBRID_SERVE_KERNELS", "triton")
    assert switch.skinny_rows_limit() == switch.SKINNY_DEFAULT_ROWS == 1
    monkeypatch.setenv("HYBRID_SERVE_SKINNY_ROWS", "4")
    calls = []
    real = klinear.skinny_linear
    monkeypatch.setattr(klinear, "skinny_linear", lambda *a, **kw: calls.append(a[0].shape) or real(*a, **kw))
    w, b = _rand(24, 40, seed=6), _rand(24, seed=7)
    x = _rand(1, 3, 40, seed=8)  # [..., K] with 3 rows
    want = skinny_linear_ref(x.reshape(3, 40).cpu(), w.cpu(), b.cpu(), torch.float32).reshape(1, 3, 24)
    got = ops.linear(x, w, b)
    assert calls == [(3, 40)] and got.shape == (1, 3, 24)
    assert rel_err(got.float().cpu(), want) < 4e-3
    assert rel_err(ops.linear(x, w, b, out_dtype=torch.float32).cpu(), want) < 1e-5
    big = _rand(5, 40, seed=9)
    monkeypatch.setenv("HYBRID_SERVE_FEW_ROWS", "0")
    ops.linear(big, w)  # too many rows for the skinny kernel, few-rows kernel off: torch
    ops.linear(x.float(), w.float())  # fp32: torch
    assert len(calls) == 2
    few = []
    real_few = klinear.few_rows_linear
    monkeypatch.setattr(klinear, "few_rows_linear", lambda *a, **kw: few.append(a[0].shape) or real_few(*a, **kw))
    monkeypatch.delenv("HYBRID_SERVE_FEW_ROWS")
    assert switch.few_rows_limit() == switch.FEW_ROWS_DEFAULT_ROWS == 16
    got = ops.linear(big, w, b)  # 5 rows: the few-rows kernel
    assert few == [(5, 40)] and len(calls) == 2
    assert rel_err(got.float().cpu(), skinny_linear_ref(big.cpu(), w.cpu(), b.cpu(), torch.float32)) < 4e-3
    ops.linear(_rand(17, 40, seed=10), w)  # beyond one MMA tile: torch
    assert len(few) == 1
    monkeypatch.setenv("HYBRID_SERVE_FEW_ROWS", "x")
    with pytest.raises(ValueError, match="HYBRID_SERVE_FEW_ROWS"):
        ops.linear(big, w)
    monkeypatch.delenv("HYBRID_SERVE_FEW_ROWS")
    monkeypatch.setenv("HYBRID_SERVE_SKINNY_ROWS", "0")
    ops.linear(x, w)
    assert len(calls) == 2
    monkeypatch.setenv("HYBRID_SERVE_SKINNY_ROWS", "many")
    with pytest.raises(ValueError, match="HYBRID_SERVE_SKINNY_ROWS"):
        ops.linear(x, w)


def test_linear_out_writes_the_given_tensor(monkeypatch):
    """ops.linear_out: the skinny and few-rows kernels store x W^T (fp32 out: the LM head's
    logits) straight into the given tensor, rows strided too; torch's path copies its result in."""
    from hybrid_serve.models.layers import ops

    monkeypatch.setenv("HYBRID_SERVE_KERNELS", "triton")
    w = _rand(24, 40, seed=60)
    for rows in (1, 5, 20):  # skinny, few-rows, torch
        x = _rand(rows, 40, seed=61 + rows)
        want = ops.linear(x, w, out_dtype=torch.float32)
        buf = torch.full((rows, 30), float("nan"), device=DEVICE)
        out = buf[:, 3:27]  # strided rows
        got = ops.linear_out(x, w, out, out_dtype=torch.float32)
        assert got is out and torch.equal(out, want)
        assert torch.isnan(buf[:, :3]).all() and torch.isnan(buf[:, 27:]).all()
    with pytest.raises(ValueError, match="out"):
        skinny_linear(_rand(1, 40), w, out_dtype=torch.float32, out=torch.empty(1, 23, device=DEVICE))


def test_pending_add_norm_runs_in_the_next_projection(monkeypatch):
    """RMSNorm.add_and_norm(defer_to=) at a decode row returns an ops.PendingAddNorm when its
    consumer kind is allowed (HYBRID_SERVE_FUSE_ADD_NORM: default attention, mlp, moe); the next
    ops.linear runs the add and norm in its skinny launch and fills the residual it returned;
    a second reader takes the stored normed rows; rows the skinny kernel does not take run the
    norm as its own launch first."""
    from hybrid_serve.kernels import switch
    from hybrid_serve.kernels.norm import add_rms_norm
    from hybrid_serve.models.layers import RMSNorm, ops

    monkeypatch.setenv("HYBRID_SERVE_KERNELS", "triton")
    assert [switch.fuse_add_norm_allowed(k) for k in switch.ADD_NORM_CONSUMERS] == [False, True, True, True]
    monkeypatch.setenv(switch.FUSE_ADD_NORM_ENV, "gdn,moe")
    assert [switch.fuse_add_norm_allowed(k) for k in switch.ADD_NORM_CONSUMERS] == [True, False, False, True]
    monkeypatch.setenv(switch.FUSE_ADD_NORM_ENV, "gdn,ssm")
    with pytest.raises(ValueError, match="HYBRID_SERVE_FUSE_ADD_NORM"):
        switch.fuse_add_norm_allowed("gdn")
    monkeypatch.setenv(switch.FUSE_ADD_NORM_ENV, "1")
    norm = RMSNorm(64, eps=1e-6, zero_centered=True).to(DEVICE)
    with torch.no_grad():
        norm.weight.copy_(_rand(64, seed=50, dtype=torch.float32) * 0.3)
    x, residual = _rand(1, 64, seed=51), _rand(1, 64, seed=52)
    w1, w2 = _rand(16, 64, seed=53), _rand(8, 64, seed=54)
    normed, summed = add_rms_norm(x, residual, norm.weight, 1e-6, True)
    pending, res = norm.add_and_norm(x, residual, defer_to="mlp")
    assert isinstance(pending, ops.PendingAddNorm) and res is pending.summed and not pending.done
    y1 = ops.linear(pending, w1)  # the fused launch
    assert pending.done and torch.equal(res, summed)
    assert rel_err(pending.normed.float().cpu(), normed.float().cpu()) < 4e-3
    assert rel_err(y1.float().cpu(), ops.linear(normed, w1).float().cpu()) < 4e-3
    assert torch.equal(ops.linear(pending, w2), ops.linear(pending.normed, w2))  # the stored rows
    assert ops.resolve(pending) is pending.normed
    # off, or a consumer not allowed, or two rows: the plain (normed, summed)
    monkeypatch.setenv(switch.FUSE_ADD_NORM_ENV, "0")
    got, got_res = norm.add_and_norm(x, residual, defer_to="mlp")
    assert isinstance(got, torch.Tensor) and torch.equal(got, normed) and torch.equal(got_res, summed)
    monkeypatch.setenv(switch.FUSE_ADD_NORM_ENV, "1")
    assert isinstance(norm.add_and_norm(x, residual)[0], torch.Tensor)  # no consumer named
    x2, r2 = _rand(2, 64, seed=55), _rand(2, 64, seed=56)
    assert isinstance(norm.add_and_norm(x2, r2, defer_to="mlp")[0], torch.Tensor)
    # a pending the skinny kernel then does not take (skinny rows off): the norm's own launch,
    # into the same tensors, then torch's linear
    pending, res = norm.add_and_norm(x, residual, defer_to="moe")
    monkeypatch.setenv("HYBRID_SERVE_SKINNY_ROWS", "0")
    y = ops.linear(pending, w1)
    assert pending.done and torch.equal(res, summed) and torch.equal(pending.normed, normed)
    assert torch.equal(y, torch.nn.functional.linear(normed, w1))
