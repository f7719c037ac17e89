"""Recurrent-state pool (device tensors): per state layer, per state slot, the conv window
and the SSM state.

State slot 0 is reserved as the padding/dummy slot and never allocated; requests and
prefix-cache checkpoints get slots 1..N (host bookkeeping in `CacheManager`). Layouts
(L = state layers on this shard)::

    conv_states : [L, N+1, conv_dim/tp, K-1]       model dtype (the K-1 inputs before the next token)
    ssm_states  : [L, N+1, *ssm_shape]              fp32 by default
                  GDN:    [HV/tp, Dk, Dv]
                  Mamba2: [H/tp, head_dim, d_state]
                  (absent for short-conv layers)
    layout_tag  : [N+1] int8                        0 = the reference layout

A kernel that keeps a slot in another layout sets its tag; `copy` and `reset` move the tag
together with the state, in every layer, conv and SSM.
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
        self.conv_states = torch.zeros(num_layers, num_slots + 1, spec.conv_dim, spec.conv_width,
                                       dtype=spec.conv_dtype, device=device)
        self.ssm_states = None
        if spec.ssm_shape is not None:
            self.ssm_states = torch.zeros(num_layers, num_slots + 1, *spec.ssm_shape, dtype=spec.ssm_dtype,
                                          device=device)
        self.layout_tag = torch.zeros(num_slots + 1, dtype=torch.int8, device=device)

    def _check(self, state_slot: int) -> None:
        if not 0 < state_slot <= self.num_slots:
            raise ValueError(f"state slot {state_slot} out of range 1..{self.num_slots}")

    def reset(self, state_slot: int) -> None:
        """Zero a slot (a request starting from no state) and give it the reference layout."""
        self._check(state_slot)
        self.conv_states[:, state_slot].zero_()
        if self.ssm_states is not None:
            self.ssm_states[:, state_slot].zero_()
        self.layout_tag[state_slot : state_slot + 1].zero_()  # (`[i] = 0` would copy from the host and sync)

    def copy(self, src_state_slot: int, dst_state_slot: int) -> None:
        """dst <- src in every layer, conv and SSM, with the layout tag (copy-on-write, fork)."""
        self._check(src_state_slot)
        self._check(dst_state_slot)
        self.conv_states[:, dst_state_slot] = self.conv_states[:, src_state_slot]
        if self.ssm_states is not None:
            self.ssm_states[:, dst_state_slot] = self.ssm_states[:, src_state_slot]
        self.layout_tag[dst_state_slot : dst_state_slot + 1].copy_(self.layout_tag[src_state_slot : src_state_slot + 1])
