"""The CPU path's chunked gated delta rule vs the token-by-token reference (both plain torch)."""
import pytest
import torch

from hybrid_serve.kernels.gated_delta import gated_delta_rule_varlen_chunked_ref, gated_delta_rule_varlen_ref

CASES = [  # (row lengths, state slots, checkpoints (row, offset, slot))
    ([150], [1], []),
    ([64, 1, 65, 3], [1, 2, 3, 4], []),
    ([200, 7, 90], [2, -1, 5], [(0, 64, 7), (0, 100, 8), (2, 1, 9), (2, 89, 10)]),
    ([1, 1, 1], [1, 2, 3], []),
]


def _inputs(lens, H, HV, Dk, Dv, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = sum(lens)
    q, k = (torch.randn(T, H, Dk, generator=g).to(dtype) for _ in range(2))
    v = torch.randn(T, HV, Dv, generator=g).to(dtype)
    gate = -torch.rand(T, HV, generator=g) * 0.5
    beta = torch.rand(T, HV, generator=g).to(dtype)
    pool = torch.randn(12, HV, Dk, Dv, generator=g) * 0.1
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return q, k, v, gate, beta, pool, cu


@pytest.mark.parametrize("chunk", [64, 16, 1])
@pytest.mark.parametrize("heads", [(2, 4), (2, 2)], ids=["gqa2", "mha"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_chunked_equals_token_loop(case, heads, chunk):
    """Outputs, final states and checkpoint states (slots it writes, and no others) agree to
    fp32 rounding, whatever the chunk; a negative slot starts from zeros and writes nothing."""
    lens, slots, checkpoints = CASES[case]
    q, k, v, gate, beta, pool, cu = _inputs(lens, *heads, 32, 16)
    pool_loop, pool_chunked = pool.clone(), pool.clone()
    want = gated_delta_rule_varlen_ref(q, k, v, gate, beta, pool_loop, slots, cu, checkpoints=checkpoints)
    got = gated_delta_rule_varlen_chunked_ref(q, k, v, gate, beta, pool_chunked, slots, cu, checkpoints=checkpoints,
                                              chunk=chunk)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pool_chunked, pool_loop, rtol=1e-5, atol=1e-5)
    written = {s for s in slots if s >= 0} | {s for _, _, s in checkpoints}
    untouched = [s for s in range(pool.shape[0]) if s not in written]
    assert torch.equal(pool_chunked[untouched], pool[untouched])


def test_chunked_bf16_inputs_and_no_l2norm():
    q, k, v, gate, beta, pool, cu = _inputs([130, 5], 2, 4, 32, 16, dtype=torch.bfloat16, seed=1)
    pool_loop, pool_chunked = pool.clone(), pool.clone()
    want = gated_delta_rule_varlen_ref(q, k, v, gate, beta, pool_loop, [1, 2], cu, use_qk_l2norm=False, scale=0.1)
    got = gated_delta_rule_varlen_chunked_ref(q, k, v, gate, beta, pool_chunked, [1, 2], cu, use_qk_l2norm=False,
                                              scale=0.1)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(pool_chunked, pool_loop, rtol=1e-4, atol=1e-4)


def test_chunked_rejects_bad_arguments():
    q, k, v, gate, beta, pool, cu = _inputs([4], 2, 4, 8, 8)
    with pytest.raises(ValueError, match="chunk"):
        gated_delta_rule_varlen_chunked_ref(q, k, v, gate, beta, pool, [1], cu, chunk=0)
    with pytest.raises(ValueError, match="value heads"):
        gated_delta_rule_varlen_chunked_ref(q, k, v[:, :3], gate[:, :3], beta[:, :3], pool[:, :3], [1], cu)
