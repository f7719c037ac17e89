"""Reference kernels against transformers' own torch functions, over variable-length
batches with state carried through the pool across chunks."""
import sys

for _pkg in ("fla", "causal_conv1d", "mamba_ssm"):
    sys.modules.setdefault(_pkg, None)

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf  # noqa: E402

from hybrid_serve.kernels.attention import paged_attention_ref, store_kv_ref  # noqa: E402
from hybrid_serve.kernels.causal_conv1d import causal_conv1d_varlen_ref  # noqa: E402
from hybrid_serve.kernels.gated_delta import gated_delta_rule_varlen_ref  # noqa: E402


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("lens", [[5, 1, 9], [1, 1, 1], [17]], ids=["mixed", "decode", "single"])
def test_conv1d_varlen_matches_transformers_with_chunks(lens):
    torch.manual_seed(0)
    dim, width = 6, 4
    weight = torch.randn(dim, width)
    seqs = [torch.randn(2 * n, dim) for n in lens]  # each sequence in two chunks of n
    conv_states = torch.full((5, dim, width - 1), float("nan"))
    slots = [3, 1, 4][: len(lens)]
    conv_states[slots] = 0.0
    outs = []
    for half in (0, 1):
        x = torch.cat([s[half * n:(half + 1) * n] for s, n in zip(seqs, lens)])
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)
        outs.append((x, causal_conv1d_varlen_ref(x, weight, None, conv_states, slots, cu, "silu"), cu))
    for b, s in enumerate(seqs):
        want = hf.causal_conv1d_fn(s.t()[None], weight, None, activation="silu")[0].t()
        got = torch.cat([y[cu[b]:cu[b + 1]] for _, y, cu in outs])
        assert _rel(got, want) < 1e-6
        padded = torch.cat([torch.zeros(width - 1, dim), s])  # the window starts as zeros
        assert torch.allclose(conv_states[slots[b]], padded[-(width - 1):].t())
    assert torch.isnan(conv_states[0]).all() and torch.isnan(conv_states[2]).all()  # untouched


@pytest.mark.parametrize("slots", [[2], [-1], [3, -1, 1], [-1, -1]], ids=["one", "one-no-state", "mixed", "none"])
def test_conv1d_one_token_rows_match_transformers(slots):
    """A decode batch (one token per row) takes a batched path: each row equals transformers'
    conv over its window and token, a row without state (negative slot) sees zeros and writes
    nothing, and the other slots' windows shift by one."""
    torch.manual_seed(1)
    dim, width = 6, 4
    weight, bias = torch.randn(dim, width), torch.randn(dim)
    conv_states = torch.randn(5, dim, width - 1)
    before = conv_states.clone()
    x = torch.randn(len(slots), dim)
    got = causal_conv1d_varlen_ref(x, weight, bias, conv_states, slots, list(range(len(slots) + 1)), "silu")
    for b, slot in enumerate(slots):
        window = before[slot] if slot >= 0 else torch.zeros(dim, width - 1)
        seq = torch.cat([window, x[b][:, None]], dim=-1)  # [D, K]
        want = hf.causal_conv1d_fn(seq[None], weight, bias, activation="silu")[0, :, -1]
        assert _rel(got[b], want) < 1e-6
        if slot >= 0:
            assert torch.equal(conv_states[slot], seq[:, 1:])
    untouched = [s for s in range(5) if s not in slots]
    assert torch.equal(conv_states[untouched], before[untouched])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv1d_one_token_rows_equal_the_per_row_path_bit_for_bit(dtype):
    """A decode row gives the same bits whether its step is all decode rows (the batched path)
    or also carries a prompt row (the per-row F.conv1d path): else greedy tokens would depend on
    what else a step holds (bf16 tp=2 with other prompt chunks against tp=1)."""
    torch.manual_seed(2)
    dim, width = 64, 4
    weight, bias = torch.randn(dim, width).to(dtype), torch.randn(dim).to(dtype)
    pool = torch.randn(6, dim, width - 1).to(dtype)
    decode_x, prompt_x = torch.randn(3, dim).to(dtype), torch.randn(5, dim).to(dtype)
    alone_pool, mixed_pool = pool.clone(), pool.clone()
    alone = causal_conv1d_varlen_ref(decode_x, weight, bias, alone_pool, [1, 4, 2], [0, 1, 2, 3], "silu")
    mixed = causal_conv1d_varlen_ref(torch.cat([decode_x, prompt_x]), weight, bias, mixed_pool, [1, 4, 2, 5],
                                     [0, 1, 2, 3, 8], "silu")
    assert torch.equal(alone, mixed[:3])
    assert torch.equal(alone_pool[[1, 4, 2]], mixed_pool[[1, 4, 2]])


def test_gated_delta_varlen_matches_transformers_chunk_rule():
    torch.manual_seed(0)
    H, HV, Dk, Dv = 2, 4, 8, 6
    lens = [13, 1, 40]
    states = torch.full((4, HV, Dk, Dv), float("nan"))
    slots = [2, 3, 1]
    states[slots] = 0.0
    seqs = []
    for n in lens:
        q, k = torch.randn(n, H, Dk), torch.randn(n, H, Dk)
        v, beta = torch.randn(n, HV, Dv), torch.rand(n, HV)
        g = -torch.rand(n, HV)
        seqs.append((q, k, v, g, beta))
    got = [[] for _ in lens]
    for lo, hi in ((0, 0.5), (0.5, 1.0)):  # two chunks per sequence
        parts = [tuple(t[int(lo * n):int(hi * n)] for t in s) for s, n in zip(seqs, lens)]
        cu = [0]
        for p in parts:
            cu.append(cu[-1] + p[0].shape[0])
        active = [b for b, p in enumerate(parts) if p[0].shape[0] > 0]
        cat = [torch.cat([parts[b][i] for b in active]) for i in range(5)]
        cu = [0]
        for b in active:
            cu.append(cu[-1] + parts[b][0].shape[0])
        out = gated_delta_rule_varlen_ref(*cat, states, [slots[b] for b in active], cu)
        for j, b in enumerate(active):
            got[b].append(out[cu[j]:cu[j + 1]])
    for b, (q, k, v, g, beta) in enumerate(seqs):
        rep = HV // H  # as transformers' module does before the rule (older versions need equal heads)
        want, final = hf.torch_chunk_gated_delta_rule(
            q.repeat_interleave(rep, 1)[None], k.repeat_interleave(rep, 1)[None], v[None], g=g[None], beta=beta[None],
            output_final_state=True,
            use_qk_l2norm_in_kernel=True)
        assert _rel(torch.cat(got[b]), want[0]) < 1e-5
        assert _rel(states[slots[b]], final[0]) < 1e-5
    assert torch.isnan(states[0]).all()


def test_paged_attention_matches_dense_causal_attention():
    torch.manual_seed(0)
    Hq, Hkv, D, L = 4, 2, 8, 11
    q, k, v = torch.randn(L, Hq, D), torch.randn(L, Hkv, D), torch.randn(L, Hkv, D)
    k_cache, v_cache = torch.zeros(64, Hkv, D), torch.zeros(64, Hkv, D)
    req_to_token = torch.zeros(2, 32, dtype=torch.int32)
    req_to_token[1, :L] = torch.randperm(60)[:L] + 4  # scattered KV slots
    store_kv_ref(k_cache, v_cache, req_to_token[1, :L].long(), k, v)
    prefix = 6
    out = paged_attention_ref(q[prefix:], k_cache, v_cache, req_to_token, [1], [prefix], [L - prefix], D**-0.5)
    kr, vr = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = torch.einsum("lhd,shd->hls", q, kr) * D**-0.5
    scores = scores.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    want = torch.einsum("hls,shd->lhd", scores.softmax(-1), vr)[prefix:]
    assert _rel(out, want) < 1e-6
