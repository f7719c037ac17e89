"""Recurrent-state pool: per state layer, per state slot, the conv window and the SSM state.

State slot 0 is reserved as the padding/dummy slot and never allocated; requests get slots
1..N. Layouts (L = state layers on this shard, N = usable slots)::

    conv_states : [L, N+1, conv_dim/tp, K-1]       model dtype (K-1 inputs before the next token)
    ssm_states  : [L, N+1, *ssm_shape]              fp32 by default
                  GDN:    [HV/tp, Dk, Dv]
                  Mamba2: [H/tp, head_dim, d_state]
                  (absent for short-conv layers)
    layout_tag  : [N+1] int8                        0 = the reference layout

A kernel that keeps a slot in another layout sets its tag; every copy, fork and reset moves
the tag together with the state.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StateSpec:
    """What one state layer keeps per slot (this shard's slice)."""

    conv_dim: int
    conv_width: int  # K-1 kept inputs
    ssm_shape: tuple[int, ...] | None
    conv_dtype: torch.dtype
    ssm_dtype: torch.dtype = torch.float32

    def bytes_per_slot(self, num_layers: int) -> int:
        conv = self.conv_dim * self.conv_width * torch.empty((), dtype=self.conv_dtype).element_size()
        ssm = 0
        if self.ssm_shape is not None:
            n = 1
            for d in self.ssm_shape:
                n *= d
            ssm = n * torch.empty((), dtype=self.ssm_dtype).element_size()
        return num_layers * (conv + ssm)


class StatePool:
    def __init__(self, num_slots: int, num_layers: int, spec: StateSpec, device: torch.device | str) -> None:
        if num_slots < 1:
            raise ValueError(f"state pool needs >= 1 usable slot, got {num_slots}")
        self.num_slots = num_slots
        self.num_layers = num_layers
        self.spec = spec
        self.conv_states = torch.zeros(
            num_layers, num_slots + 1, spec.conv_dim, spec.conv_width, dtype=spec.conv_dtype, device=device
        )
        self.ssm_states = None
        if spec.ssm_shape is not None:
            self.ssm_states = torch.zeros(
                num_layers, num_slots + 1, *spec.ssm_shape, dtype=spec.ssm_dtype, device=device
            )
        self.layout_tag = torch.zeros(num_slots + 1, dtype=torch.int8, device=device)
        self._free_slots: list[int] = list(range(num_slots, 0, -1))
        self._slot_is_free = [False] + [True] * num_slots

    @property
    def num_free_slots(self) -> int:
        return len(self._free_slots)

    def alloc(self) -> int:
        """Take one state slot (1..N), zeroed, in the reference layout."""
        if not self._free_slots:
            raise MemoryError("no free state slot")
        slot = self._free_slots.pop()
        self._slot_is_free[slot] = False
        self.reset(slot)
        return slot

    def free(self, state_slot: int) -> None:
        if state_slot <= 0 or state_slot > self.num_slots or self._slot_is_free[state_slot]:
            raise ValueError(f"freeing state slot {state_slot} that is reserved, out of range or already free")
        self._slot_is_free[state_slot] = True
        self._free_slots.append(state_slot)

    def reset(self, state_slot: int) -> None:
        self.conv_states[:, state_slot].zero_()
        if self.ssm_states is not None:
            self.ssm_states[:, state_slot].zero_()
        self.layout_tag[state_slot] = 0

    def copy(self, src_state_slot: int, dst_state_slot: int) -> None:
        """dst <- src in every layer, conv and SSM, with the layout tag (copy-on-write, fork)."""
        for slot in (src_state_slot, dst_state_slot):
            if not 0 < slot <= self.num_slots:
                raise ValueError(f"state slot {slot} out of range 1..{self.num_slots}")
        self.conv_states[:, dst_state_slot] = self.conv_states[:, src_state_slot]
        if self.ssm_states is not None:
            self.ssm_states[:, dst_state_slot] = self.ssm_states[:, src_state_slot]
        self.layout_tag[dst_state_slot] = self.layout_tag[src_state_slot]

    def check_integrity(self, slots_held: list[int] | None = None) -> None:
        assert not self._slot_is_free[0], "state slot 0 is reserved and must never be free"
        assert len(set(self._free_slots)) == len(self._free_slots), "a state slot is free twice"
        assert all(self._slot_is_free[s] for s in self._free_slots), "free list and flags disagree"
        assert sum(self._slot_is_free) == len(self._free_slots), "free flags and free list disagree"
        if slots_held is not None:
            used = {s for s in range(1, self.num_slots + 1) if not self._slot_is_free[s]}
            assert len(slots_held) == len(set(slots_held)), "a state slot is held twice"
            assert used == set(slots_held), f"used state slots {sorted(used)} != held {sorted(slots_held)}"
