"""extend_attention (new keys read contiguously) vs paged_attention_ref, alone and sharing a
mixed batch with the paged kernel (rows split by length, one output)."""
import pytest
import torch
from kernel_utils import DEVICE, cu_seqlens, gpu, lens_id, rel_err, require_triton

require_triton()
from hybrid_serve.kernels.attention import (  # noqa: E402
    extend_attention, paged_attention, paged_attention_ref, store_kv,
)


def _batch(prefix_lens, ext_lens, Hq, Hkv, D, Dv, dtype, device=DEVICE, page=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    B, T = len(ext_lens), sum(ext_lens)
    max_ctx = max(p + e for p, e in zip(prefix_lens, ext_lens)) + 3
    num_slots = 1 + sum(-(-(p + e) // page) * page for p, e in zip(prefix_lens, ext_lens)) + page * 3
    k_cache = torch.randn(num_slots, Hkv, D, generator=g).to(dtype)
    v_cache = torch.randn(num_slots, Hkv, Dv, generator=g).to(dtype)
    perm = torch.randperm(num_slots - 1, generator=g) + 1  # scattered slots, slot 0 unused
    req_to_token = torch.zeros(B + 1, max_ctx, dtype=torch.int32)
    used = 0
    for b, (p, e) in enumerate(zip(prefix_lens, ext_lens)):
        req_to_token[b + 1, : p + e] = perm[used: used + p + e].int()
        used += p + e
    q = torch.randn(T, Hq, D, generator=g).to(dtype)
    k = torch.randn(T, Hkv, D, generator=g).to(dtype)
    v = torch.randn(T, Hkv, Dv, generator=g).to(dtype)
    kv_slots = torch.cat([req_to_token[b + 1, p: p + e] for b, (p, e) in enumerate(zip(prefix_lens, ext_lens))])
    to = lambda t: t.to(device)  # noqa: E731
    return (to(q), to(k), to(v), to(k_cache), to(v_cache), to(req_to_token), to(kv_slots.long()),
            torch.arange(1, B + 1, dtype=torch.int32, device=device))


CASES = [([0], [40]), ([13, 0], [21, 9]), ([30, 5, 0], [1, 50, 2])]


@pytest.mark.parametrize("prefix_lens,ext_lens", CASES, ids=[lens_id(c[1]) for c in CASES])
@pytest.mark.parametrize("heads", [(4, 2), (2, 2)], ids=["gqa2", "mha"])
def test_extend_matches_ref(prefix_lens, ext_lens, heads):
    Hq, Hkv = heads
    q, k, v, kc, vc, rtt, kv_slots, rows = _batch(prefix_lens, ext_lens, Hq, Hkv, 16, 24, torch.float32)
    store_kv(kc, vc, kv_slots, k, v)
    want = paged_attention_ref(q.cpu(), kc.cpu(), vc.cpu(), rtt.cpu(), rows.tolist(), prefix_lens, ext_lens, 0.3)
    cu = cu_seqlens(ext_lens)
    prefix = torch.tensor(prefix_lens, dtype=torch.int32, device=DEVICE)
    got = extend_attention(q, k, v, kc, vc, rtt, rows, prefix, cu, 0.3)
    assert rel_err(got.cpu(), want) < 1e-5
    # split by length: rows of >= 10 new tokens here, the rest through the paged kernel, one output
    out = torch.full_like(got, float("nan"))
    extend_attention(q, k, v, kc, vc, rtt, rows, prefix, cu, 0.3, out=out, min_tokens=10)
    paged_attention(q, kc, vc, rtt, rows, prefix, cu, 0.3, out=out, skip_longer_than=9)
    assert rel_err(out.cpu(), want) < 1e-5


def test_extend_bf16_head_dim_256():
    q, k, v, kc, vc, rtt, kv_slots, rows = _batch([7], [33], 4, 1, 256, 256, torch.bfloat16)
    store_kv(kc, vc, kv_slots, k, v)
    want = paged_attention_ref(q.cpu(), kc.cpu(), vc.cpu(), rtt.cpu(), rows.tolist(), [7], [33], 0.0625)
    got = extend_attention(q, k, v, kc, vc, rtt, rows, torch.tensor([7], dtype=torch.int32, device=DEVICE),
                           cu_seqlens([33]), 0.0625)
    assert rel_err(got.float().cpu(), want.float()) < 2e-2


@gpu
def test_extend_serving_shapes():
    """A 4k prompt after a 1k cached prefix, Qwen3.5 2.3B attention (Hq=16, Hkv=2, D=256), bf16."""
    q, k, v, kc, vc, rtt, kv_slots, rows = _batch([1024, 0], [4096, 100], 16, 2, 256, 256, torch.bfloat16, page=16)
    store_kv(kc, vc, kv_slots, k, v)
    want = paged_attention_ref(q.cpu(), kc.cpu(), vc.cpu(), rtt.cpu(), rows.tolist(), [1024, 0], [4096, 100], 0.0625)
    got = extend_attention(q, k, v, kc, vc, rtt, rows, torch.tensor([1024, 0], dtype=torch.int32, device=DEVICE),
                           cu_seqlens([4096, 100]), 0.0625)
    assert rel_err(got.float().cpu(), want.float()) < 2e-2


@pytest.mark.parametrize("prefix_lens,ext_lens", CASES, ids=[lens_id(c[1]) for c in CASES])
def test_sdpa_extend_matches_ref(prefix_lens, ext_lens):
    """torch SDPA per long row (prefix gathered from the pool, causal lower-right), beside the
    paged kernel for the other rows."""
    from hybrid_serve.kernels.attention import extend_attention_sdpa

    q, k, v, kc, vc, rtt, kv_slots, rows = _batch(prefix_lens, ext_lens, 4, 2, 16, 24, torch.float32)
    store_kv(kc, vc, kv_slots, k, v)
    want = paged_attention_ref(q.cpu(), kc.cpu(), vc.cpu(), rtt.cpu(), rows.tolist(), prefix_lens, ext_lens, 0.3)
    long_rows = [b for b, n in enumerate(ext_lens) if n >= 10]
    out = torch.full((q.shape[0], 4, 24), float("nan"), device=DEVICE)
    cu = cu_seqlens(ext_lens, "cpu").tolist()
    extend_attention_sdpa(q, k, v, kc, vc, rtt, rows.tolist(), prefix_lens, cu, long_rows, 0.3, out)
    prefix = torch.tensor(prefix_lens, dtype=torch.int32, device=DEVICE)
    paged_attention(q, kc, vc, rtt, rows, prefix, cu_seqlens(ext_lens), 0.3, out=out, skip_longer_than=9)
    assert rel_err(out.cpu(), want) < 1e-5
