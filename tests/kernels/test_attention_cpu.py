"""paged_attention_cpu (torch's fused SDPA, the CPU path) vs paged_attention_ref."""
import pytest
import torch
from kernel_utils import rel_err

from hybrid_serve.kernels.attention import paged_attention_cpu, paged_attention_ref


def _batch(prefix_lens, extend_lens, Hq, Hkv, D, Dv, dtype, seed=0):
    """A KV pool with every request's context scattered over random slots (slot 0 unused),
    request rows out of order."""
    g = torch.Generator().manual_seed(seed)
    ctx = [p + e for p, e in zip(prefix_lens, extend_lens)]
    num_slots = sum(ctx) + 5
    perm = torch.randperm(num_slots - 1, generator=g) + 1
    req_to_token = torch.zeros(len(ctx) + 3, max(ctx) + 3, dtype=torch.int32)
    req_rows = (torch.randperm(len(ctx) + 2, generator=g)[:len(ctx)] + 1).tolist()
    used = 0
    for row, n in zip(req_rows, ctx):
        req_to_token[row, :n] = perm[used:used + n].int()
        used += n
    k_cache = torch.randn(num_slots, Hkv, D, generator=g).to(dtype)
    v_cache = torch.randn(num_slots, Hkv, Dv, generator=g).to(dtype)
    q = torch.randn(sum(extend_lens), Hq, D, generator=g).to(dtype)
    return q, k_cache, v_cache, req_to_token, req_rows


CASES = [
    ([0], [1]),  # first token
    ([5, 17, 0], [1, 1, 1]),  # decode
    ([0, 0], [9, 3]),  # prompts
    ([6, 0, 20, 3], [4, 1, 11, 1]),  # mixed: a prompt chunk after a prefix, a new prompt, decodes
    ([3, 7], [0, 2]),  # a row with no new token (skipped)
    ([1024], [256]),  # a serving-sized chunk
]


@pytest.mark.parametrize("prefix_lens,extend_lens", CASES, ids=[str(c[1]) for c in CASES])
@pytest.mark.parametrize("heads", [(8, 2), (4, 4), (6, 1)], ids=["gqa4", "mha", "mqa6"])
@pytest.mark.parametrize("dv", [16, 8], ids=["dv16", "dv8"])
def test_cpu_attention_fp32_equals_ref(prefix_lens, extend_lens, heads, dv):
    q, k_cache, v_cache, req_to_token, rows = _batch(prefix_lens, extend_lens, *heads, 16, dv, torch.float32)
    args = (q, k_cache, v_cache, req_to_token, rows, prefix_lens, extend_lens, 16 ** -0.5)
    got, want = paged_attention_cpu(*args), paged_attention_ref(*args)
    assert got.shape == want.shape == (sum(extend_lens), heads[0], dv)
    assert rel_err(got, want) < 1e-5


def test_cpu_attention_bf16_close_to_fp32_ref():
    """bf16 pools and queries: within bf16's rounding of the fp32 reference (the kernel
    accumulates in fp32; the reference rounds its probabilities to bf16)."""
    prefix_lens, extend_lens = [40, 0, 9], [1, 24, 5]
    q, k_cache, v_cache, req_to_token, rows = _batch(prefix_lens, extend_lens, 8, 2, 32, 32, torch.bfloat16)
    got = paged_attention_cpu(q, k_cache, v_cache, req_to_token, rows, prefix_lens, extend_lens, 32 ** -0.5)
    want = paged_attention_ref(q.float(), k_cache.float(), v_cache.float(), req_to_token, rows, prefix_lens,
                               extend_lens, 32 ** -0.5)
    assert got.dtype == torch.bfloat16
    assert rel_err(got.float(), want) < 1e-2


def test_cpu_attention_rejects_heads_not_a_multiple():
    q, k_cache, v_cache, req_to_token, rows = _batch([0], [2], 3, 2, 16, 16, torch.float32)
    with pytest.raises(ValueError, match="q heads 3 not a multiple of kv heads 2"):
        paged_attention_cpu(q, k_cache, v_cache, req_to_token, rows, [0], [2], 0.25)


@pytest.mark.parametrize("switch,want", [(None, "cpu"), ("auto", "cpu"), ("ref", "ref")])
def test_cpu_path_runs_the_fused_attention_unless_the_reference_is_forced(monkeypatch, switch, want):
    """models/layers/ops.py's CPU attention: kernels/attention/cpu.py, or the reference with
    HYBRID_SERVE_KERNELS=ref (which forces the references everywhere)."""
    from types import SimpleNamespace

    import hybrid_serve.kernels.attention as attention
    from hybrid_serve.models.layers import ops

    if switch is None:
        monkeypatch.delenv("HYBRID_SERVE_KERNELS", raising=False)
    else:
        monkeypatch.setenv("HYBRID_SERVE_KERNELS", switch)
    called = []
    monkeypatch.setattr(attention, "paged_attention_cpu", lambda *a: called.append("cpu") or paged_attention_cpu(*a))
    monkeypatch.setattr(attention, "paged_attention_ref", lambda *a: called.append("ref") or paged_attention_ref(*a))
    q, k_cache, v_cache, req_to_token, rows = _batch([4], [2], 4, 2, 16, 16, torch.float32)
    fb = SimpleNamespace(req_to_token=req_to_token,
                         host=SimpleNamespace(req_rows=rows, prefix_lens=[4], extend_lens=[2]))
    out = ops.paged_attention(q, k_cache, v_cache, 0.25, fb)
    assert called == [want]
    assert rel_err(out, paged_attention_ref(q, k_cache, v_cache, req_to_token, rows, [4], [2], 0.25)) < 1e-5
