"""The varlen Mamba2 SSM reference vs transformers' chunked SSD scan (torch path), with state
carried across chunks through the pool, and varlen batching vs one sequence at a time."""
import hf_reference  # noqa: F401  (blocks mamba_ssm / causal_conv1d before transformers loads)
import pytest
import torch

from hybrid_serve.kernels.mamba_ssm import selective_state_update_varlen_ref

H, P, G, N = 4, 8, 2, 16  # heads, head_dim, groups, d_state
DT_LIMIT = (0.001, float("inf"))


def _inputs(num_tokens: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, H, P, generator=gen)
    dt = torch.randn(num_tokens, H, generator=gen) - 1.0
    A = -torch.exp(torch.randn(H, generator=gen) * 0.5)
    B = torch.randn(num_tokens, G, N, generator=gen)
    C = torch.randn(num_tokens, G, N, generator=gen)
    D = torch.randn(H, generator=gen)
    dt_bias = torch.randn(H, generator=gen) * 0.5
    return x, dt, A, B, C, D, dt_bias


def _hf_scan(x, dt, A, B, C, D, dt_bias, initial_state=None):
    from transformers.models.nemotron_h.modeling_nemotron_h import mamba2_chunk_scan

    y, final = mamba2_chunk_scan(
        x[None], dt[None], A, B[None], C[None], chunk_size=8, D=D, dt_bias=dt_bias,
        initial_states=None if initial_state is None else initial_state[None], dt_softplus=True,
        dt_limit=DT_LIMIT, return_final_states=True,
    )
    return y[0], final[0]


def _ours(args, ssm_states, state_slots, cu_seqlens):
    x, dt, A, B, C, D, dt_bias = args
    return selective_state_update_varlen_ref(
        x, dt, A, B, C, D, dt_bias, ssm_states, state_slots, cu_seqlens, dt_limit=DT_LIMIT
    )


def test_chunks_through_pool_match_transformers_scan():
    num_tokens = 29
    args = _inputs(num_tokens)
    ref_y, ref_state = _hf_scan(*args)
    pool = torch.zeros(3, H, P, N)
    outs = []
    for start, end in [(0, 5), (5, 6), (6, 23), (23, 29)]:  # prefill chunk, decode step, longer chunks
        outs.append(_ours([a[start:end] if a.shape[0] == num_tokens else a for a in args], pool, [2], [0, end - start]))
    y = torch.cat(outs)
    torch.testing.assert_close(y, ref_y, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(pool[2], ref_state, rtol=1e-4, atol=1e-4)
    assert pool[:2].abs().sum() == 0, "other slots must stay untouched"


def test_initial_state_matches_transformers_scan():
    args = _inputs(11, seed=1)
    init = torch.randn(H, P, N, generator=torch.Generator().manual_seed(2))
    ref_y, ref_state = _hf_scan(*args, initial_state=init)
    pool = torch.zeros(2, H, P, N)
    pool[1] = init
    y = _ours(args, pool, [1], [0, 11])
    torch.testing.assert_close(y, ref_y, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(pool[1], ref_state, rtol=1e-4, atol=1e-4)


def test_varlen_batch_equals_one_at_a_time_and_negative_slot_writes_nothing():
    lens, slots = [3, 1, 6], [2, -1, 1]
    cu = [0, 3, 4, 10]
    args = _inputs(cu[-1], seed=3)
    start_states = torch.randn(3, H, P, N, generator=torch.Generator().manual_seed(4))
    pool = start_states.clone()
    y = _ours(args, pool, slots, cu)
    for b, slot in enumerate(slots):
        part = [a[cu[b]:cu[b + 1]] if a.shape[0] == cu[-1] else a for a in args]
        single = start_states.clone()
        y_b = _ours(part, single, [slot], [0, lens[b]])
        torch.testing.assert_close(y[cu[b]:cu[b + 1]], y_b)
        if slot >= 0:
            torch.testing.assert_close(pool[slot], single[slot])
    torch.testing.assert_close(pool[0], start_states[0])  # slot 0 (padding) untouched
    # the slot -1 sequence started from zeros: equals transformers' scan with no initial state
    ref_y, _ = _hf_scan(*[a[3:4] if a.shape[0] == cu[-1] else a for a in args])
    torch.testing.assert_close(y[3:4], ref_y, rtol=1e-4, atol=1e-4)


def test_shape_errors():
    args = _inputs(4)
    with pytest.raises(ValueError, match="ssm_states"):
        _ours(args, torch.zeros(2, H, P, N + 1), [1], [0, 4])
    with pytest.raises(ValueError, match="cu_seqlens"):
        _ours(args, torch.zeros(2, H, P, N), [1], [0, 3])
