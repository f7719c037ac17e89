"""paged_attention / store_kv (Triton) vs paged_attention_ref / store_kv_ref."""
import pytest
import torch
from kernel_utils import DEVICE, cu_seqlens, gpu, lens_id, rel_err, require_triton

require_triton()
from hybrid_serve.kernels.attention import paged_attention, paged_attention_ref, store_kv, store_kv_ref  # noqa: E402


def _batch(prefix_lens, extend_lens, Hq, Hkv, D, Dv, dtype, device=DEVICE, seed=0, num_rows=None):
    """A KV pool with every request's context scattered over random slots (slot 0 unused)."""
    g = torch.Generator().manual_seed(seed)
    batch = len(prefix_lens)
    ctx = [p + e for p, e in zip(prefix_lens, extend_lens)]
    num_slots = sum(ctx) + 5
    num_rows = num_rows or batch + 2
    max_context = max(ctx) + 3
    perm = torch.randperm(num_slots - 1, generator=g) + 1
    req_to_token = torch.zeros(num_rows + 1, max_context, dtype=torch.int32, device=DEVICE)
    req_rows = torch.randperm(num_rows, generator=g)[:batch] + 1  # distinct, never the padding row 0
    used = 0
    for row, n in zip(req_rows.tolist(), ctx):
        req_to_token[row, :n] = perm[used:used + n].int()
        used += n
    k_cache = torch.randn(num_slots, Hkv, D, generator=g).to(dtype)
    v_cache = torch.randn(num_slots, Hkv, Dv, generator=g).to(dtype)
    q = torch.randn(sum(extend_lens), Hq, D, generator=g).to(dtype)
    to = lambda t: t.to(device)  # noqa: E731
    return to(q), to(k_cache), to(v_cache), to(req_to_token), to(req_rows.int())


def _check(prefix_lens, extend_lens, Hq, Hkv, D, Dv, dtype, tol, splits=None, device=DEVICE, max_extend_len=None):
    q, k_cache, v_cache, req_to_token, req_rows = _batch(prefix_lens, extend_lens, Hq, Hkv, D, Dv, dtype, device)
    scale = D ** -0.5
    want = paged_attention_ref(q.cpu().float(), k_cache.cpu().float(), v_cache.cpu().float(), req_to_token.cpu(),
                               req_rows.tolist(), prefix_lens, extend_lens, scale)
    out = torch.full((q.shape[0], Hq, Dv), float("nan"), dtype=dtype, device=device)
    got = paged_attention(q, k_cache, v_cache, req_to_token, req_rows,
                          torch.tensor(prefix_lens, dtype=torch.int32, device=device),
                          cu_seqlens(extend_lens, device), scale, out=out, num_kv_splits=splits,
                          max_extend_len=max_extend_len)
    assert got is out
    assert rel_err(got.float().cpu(), want) < tol


CASES = [
    ([0], [1]),  # first token
    ([5, 17, 0], [1, 1, 1]),  # decode
    ([0, 0], [9, 3]),  # prefill
    ([6, 0, 20, 3], [4, 1, 11, 1]),  # mixed: chunked prefill, new prompt, decode
]


@pytest.mark.parametrize("prefix_lens,extend_lens", CASES, ids=[lens_id(c[1]) for c in CASES])
@pytest.mark.parametrize("heads", [(4, 1), (4, 2), (2, 2)], ids=["gqa4", "gqa2", "mha"])
@pytest.mark.parametrize("splits", [1, 3], ids=["nosplit", "split3"])
def test_attention_fp32_matches_ref(prefix_lens, extend_lens, heads, splits):
    _check(prefix_lens, extend_lens, heads[0], heads[1], 16, 16, torch.float32, 1e-5, splits)


@pytest.mark.parametrize("heads", [(4, 1), (16, 1), (32, 1)], ids=["gqa4", "gqa16", "gqa32-two-blocks"])
@pytest.mark.parametrize("splits", [1, 3], ids=["nosplit", "split3"])
def test_decode_hint_skips_block_bookkeeping(heads, splits):
    """max_extend_len=1 (decode): one q block per request where the group fits a block, the
    general path otherwise; both equal the reference."""
    _check([5, 17, 0, 9], [1, 1, 1, 1], heads[0], heads[1], 16, 16, torch.float32, 1e-5, splits, max_extend_len=1)


def test_attention_odd_dims_big_group_default_splits():
    _check([3, 30], [2, 5], 16, 2, 24, 40, torch.float32, 1e-5)  # group 8 > BLOCK_M/2, D, Dv not powers of 2


def test_attention_bf16():
    _check([7, 0, 40], [1, 6, 2], 8, 2, 32, 32, torch.bfloat16, 1e-2, splits=2)


def test_attention_long_rows_span_many_blocks():
    _check([70], [70], 2, 1, 16, 16, torch.float32, 1e-5, splits=1)


def test_attention_rejects_bad_inputs():
    q, k_cache, v_cache, req_to_token, req_rows = _batch([2], [1], 4, 2, 16, 16, torch.float32)
    prefix, cu = torch.tensor([2], dtype=torch.int32, device=DEVICE), cu_seqlens([1])
    with pytest.raises(ValueError, match="req_rows"):
        paged_attention(q, k_cache, v_cache, req_to_token, req_rows + 100, prefix, cu, 1.0)
    with pytest.raises(ValueError, match="prefix_lens"):
        paged_attention(q, k_cache, v_cache, req_to_token, req_rows, prefix + 100, cu, 1.0)
    with pytest.raises(ValueError, match="multiple"):
        paged_attention(q[:, :3], k_cache, v_cache, req_to_token, req_rows, prefix, cu, 1.0)
    q2, *_ = _batch([2], [2], 4, 2, 16, 16, torch.float32)
    with pytest.raises(ValueError, match="max_extend_len"):
        paged_attention(q2, k_cache, v_cache, req_to_token, req_rows, prefix, cu_seqlens([2]), 1.0, max_extend_len=1)


def test_store_kv_matches_ref_and_touches_only_its_slots():
    g = torch.Generator().manual_seed(0)
    k_cache = torch.full((12, 2, 24), float("nan"), device=DEVICE)
    v_cache = torch.full((12, 2, 8), float("nan"), device=DEVICE)
    kv_slots = torch.tensor([3, 0, 7, 11, 0])  # slot 0: dummy writes of padding tokens
    big = torch.randn(5, 2, 40, generator=g)
    k, v = big[:, :, :24], big[:, :, 24:32]  # strided views, as a split projection output
    k_ref, v_ref = k_cache.cpu(), v_cache.cpu()
    store_kv_ref(k_ref, v_ref, kv_slots, k, v)
    store_kv(k_cache, v_cache, kv_slots.to(DEVICE), k.to(DEVICE), v.to(DEVICE))
    for got, want in ((k_cache.cpu(), k_ref), (v_cache.cpu(), v_ref)):
        assert torch.equal(got[[3, 7, 11]], want[[3, 7, 11]])
        assert torch.equal(got.isnan(), want.isnan())
    with pytest.raises(ValueError, match="kv_slots"):
        store_kv(k_cache, v_cache, torch.tensor([12, 0, 1, 2, 3], device=DEVICE), k.to(DEVICE), v.to(DEVICE))


@gpu
@pytest.mark.parametrize("batch,prefix,extend", [(1, 4000, 1), (64, 1000, 1), (16, 500, 4), (2, 0, 1500)],
                         ids=["decode1-4k", "decode64-1k", "verify16x4", "prefill2x1500"])
def test_attention_serving_shapes_gpu(batch, prefix, extend):
    """2.3B Qwen3.5 layout: 16 q heads, 2 kv heads, head dim 256, bf16."""
    _check([prefix] * batch, [extend] * batch, 16, 2, 256, 256, torch.bfloat16, 1e-2, device="cuda")


def test_warm_up_runs_every_variant():
    """Start-up compiles each launch variant (q rows per program x KV splits x one-block) on the
    dummy request row 0, so serving never compiles one."""
    from hybrid_serve.kernels.attention import warm_up_paged_attention

    k_cache = torch.zeros(32, 2, 16, device=DEVICE)
    v_cache = torch.zeros(32, 2, 16, device=DEVICE)
    req_to_token = torch.zeros(3, 64, dtype=torch.int32, device=DEVICE)
    assert warm_up_paged_attention(4, k_cache, v_cache, req_to_token) == 24
