"""State-pool copies for speculative decoding and prefix-cache forks, torch reference.

Tensors carry a leading layer dim so one call moves a slot in every layer::

    pool    : [L, N+1, *F]      conv windows [L, N+1, D, K-1] or SSM states [L, N+1, HV, Dk, Dv]
    scratch : [L, B_s, S, *F]   per batch row b, per verify step s: the state after token s

    commit_verified_state:  pool[:, state_slots[b]] <- scratch[:, b, accepted_steps[b]]
    copy_state_slots:       pool[:, dst_slots[m]]   <- pool[:, src_slots[m]]

Slot 0 is the padding slot: rows whose slot is <= 0 (or whose step is outside [0, S)) are
skipped, as are copies whose source or destination is not a real slot. Layout tags are
the caller's business.
"""
from __future__ import annotations

import torch


def commit_verified_state_ref(
    pool: torch.Tensor, scratch: torch.Tensor, state_slots: torch.Tensor, accepted_steps: torch.Tensor
) -> None:
    """pool: [L, N+1, *F]; scratch: [L, B_s, S, *F]; state_slots, accepted_steps: [B] int
    (accepted_steps[b] = index of the last accepted step of row b). Updates pool in place."""
    for b, (slot, step) in enumerate(zip(state_slots.tolist(), accepted_steps.tolist())):
        if 0 < slot < pool.shape[1] and 0 <= step < scratch.shape[2] and b < scratch.shape[1]:
            pool[:, slot] = scratch[:, b, step].to(pool.dtype)


def copy_state_slots_ref(pool: torch.Tensor, src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:
    """pool: [L, N+1, *F]; src_slots, dst_slots: [M] int. pool[:, dst] <- pool[:, src], in order;
    pairs with dst 0 (padding) are skipped."""
    for src, dst in zip(src_slots.tolist(), dst_slots.tolist()):
        if 0 < dst < pool.shape[1] and 0 <= src < pool.shape[1]:
            pool[:, dst] = pool[:, src]


def replay_gdn_state_ref(
    pool: torch.Tensor, scratch: torch.Tensor, replay_k: torch.Tensor, replay_v: torch.Tensor, replay_gb: torch.Tensor,
    state_slots: torch.Tensor, num_tokens: torch.Tensor, checkpoint_masks: torch.Tensor,
) -> None:
    """After a deferred verify step (kernels/gated_delta/triton_recurrent.py, `replay`): apply
    the kept tokens' gated delta updates to the untouched slots, in every layer.

    pool: [L, N+1, HV, Dk, Dv] GDN states (fp32); scratch: [L, B_s, S, HV, Dk, Dv] the verify
    scratch; replay_k: [L, B_r, S_r, HV, Dk], replay_v: [L, B_r, S_r, HV, Dv], replay_gb:
    [L, B_r, S_r, 2, HV] (g, beta), what each token fed the update; state_slots, num_tokens,
    checkpoint_masks: [B] int. Row b (slot > 0, b < B_r): for its first num_tokens[b] tokens t
    (at most S_r), S <- S * exp(g_t); S <- S + k_t (beta_t (v_t - S^T k_t))^T, and where bit t
    of checkpoint_masks[b] is set (t < S) the state after token t also goes to scratch[:, b, t]
    (a prefix-cache checkpoint taken from accepted drafts is copied from there); then the
    slot gets the state after the last."""
    for b, (slot, n, mask) in enumerate(zip(state_slots.tolist(), num_tokens.tolist(), checkpoint_masks.tolist())):
        if not (0 < slot < pool.shape[1]) or b >= replay_k.shape[1]:
            continue
        state = pool[:, slot].float().clone()  # [L, HV, Dk, Dv]
        for t in range(min(n, replay_k.shape[2])):
            k, v = replay_k[:, b, t], replay_v[:, b, t]  # [L, HV, Dk], [L, HV, Dv]
            g, beta = replay_gb[:, b, t, 0], replay_gb[:, b, t, 1]  # [L, HV]
            state = state * g.exp()[..., None, None]
            kv_mem = torch.einsum("lhkv,lhk->lhv", state, k)
            state = state + k[..., :, None] * ((v - kv_mem) * beta[..., None])[..., None, :]
            if (mask >> t) & 1 and t < scratch.shape[2] and b < scratch.shape[1]:
                scratch[:, b, t] = state.to(scratch.dtype)
        pool[:, slot] = state.to(pool.dtype)
