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
