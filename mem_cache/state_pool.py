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

A kernel that keeps a slot in another layout sets its tag; `copy`, `reset` and
`commit_verified` move the tag together with the state, in every layer, conv and SSM.

Speculative scratch: `scratch_rows x scratch_steps` more rows after slot N, never allocated.
A verify step's state kernels write the state after each of a verifying row's first
`scratch_steps` tokens there (as prefix-cache checkpoints, through `scratch_slot`), so the
same rows, viewed as `[L, scratch_rows, scratch_steps, ...]`, are the DESIGN's scratch::

    rows 1..N                         state slots (requests, checkpoints)
    rows N+1 + v*S + s                verify row v, step s: the state after its token s
                                      (s = 0: after the row's last real token, s = k: after draft k)

After acceptance `commit_verified` copies `scratch[v, accepted]` into each row's slot in every
layer at once. A row whose drafts were all accepted needs nothing (the in-place state after
all K+1 tokens is right): its step is out of range and skipped, as is a row whose slot is <= 0.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..device_io import to_device
from ..kernels.state_ops import commit_verified_state, commit_verified_state_ref
from ..kernels.switch import use_triton


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
    def __init__(self, num_slots: int, num_layers: int, spec: StateSpec, device: torch.device | str,
                 scratch_rows: int = 0, scratch_steps: int = 0) -> None:
        if num_slots < 1:
            raise ValueError(f"state pool needs >= 1 usable slot, got {num_slots}")
        if scratch_rows < 0 or scratch_steps < 0:
            raise ValueError(f"scratch_rows and scratch_steps must be >= 0, got {scratch_rows}, {scratch_steps}")
        self.num_slots = num_slots
        self.num_layers = num_layers
        self.spec = spec
        self.scratch_rows, self.scratch_steps = scratch_rows, scratch_steps
        total = num_slots + 1 + scratch_rows * scratch_steps
        self.conv_states = torch.zeros(num_layers, total, spec.conv_dim, spec.conv_width,
                                       dtype=spec.conv_dtype, device=device)
        self.ssm_states = None
        if spec.ssm_shape is not None:
            self.ssm_states = torch.zeros(num_layers, total, *spec.ssm_shape, dtype=spec.ssm_dtype, device=device)
        self.layout_tag = torch.zeros(total, dtype=torch.int8, device=device)

    # ----- speculative scratch -----------------------------------------------------------
    def scratch_slot(self, verify_row: int, step: int) -> int:
        """The pool row holding verify row `verify_row`'s state after its token `step`."""
        if not (0 <= verify_row < self.scratch_rows and 0 <= step < self.scratch_steps):
            raise ValueError(f"scratch ({verify_row}, {step}) outside {self.scratch_rows} rows x "
                             f"{self.scratch_steps} steps")
        return self.num_slots + 1 + verify_row * self.scratch_steps + step

    def layer_scratch(self, layer_states: torch.Tensor) -> torch.Tensor:
        """One layer's states [N+1+R*S, *F] (`conv_states[l]` / `ssm_states[l]`) -> its scratch
        rows as [R, S, *F] (a view: the verify kernels' `intermediate_*` argument)."""
        return layer_states[self.num_slots + 1:].view(self.scratch_rows, self.scratch_steps, *layer_states.shape[1:])

    def _scratch_view(self, states: torch.Tensor) -> torch.Tensor:
        """[L, N+1+R*S, *F] -> the scratch rows as [L, R, S, *F]."""
        return states[:, self.num_slots + 1:].view(states.shape[0], self.scratch_rows, self.scratch_steps,
                                                   *states.shape[2:])

    def commit_verified(self, *, state_slots: list[int], accepted_steps: list[int]) -> None:
        """After a verify step, in every state layer (conv windows and SSM states) and with the
        layout tag: `state_slots[v] <- scratch[v, accepted_steps[v]]` for each verify row v
        (host lists, V <= scratch_rows). A row with state_slots[v] <= 0 (finished / aborted) or
        accepted_steps[v] outside [0, scratch_steps) (all drafts accepted: the in-place state is
        right) is skipped. One copy to the device carries the values and the tags' moves."""
        if len(state_slots) != len(accepted_steps):
            raise ValueError(f"{len(state_slots)} state slots for {len(accepted_steps)} accepted steps")
        rows = len(state_slots)
        if rows > self.scratch_rows:
            raise ValueError(f"{rows} verify rows, the scratch has {self.scratch_rows}")
        if rows == 0 or self.scratch_steps == 0:
            return
        dst, src = self.tag_moves_of(state_slots, accepted_steps)
        values = to_device(list(state_slots) + list(accepted_steps) + dst + src, torch.int64,
                           self.conv_states.device)
        slots_d, steps_d = values[:rows], values[rows : 2 * rows]
        commit = commit_verified_state if use_triton(self.conv_states) else commit_verified_state_ref
        for states in (self.conv_states, self.ssm_states):
            if states is not None and states[0, 0].numel():
                commit(states[:, : self.num_slots + 1], self._scratch_view(states), slots_d, steps_d)
        if dst:  # the tag moves with the state
            moved = values[2 * rows :]
            self.layout_tag[moved[: len(dst)]] = self.layout_tag[moved[len(dst) :]]

    def tag_moves_of(self, state_slots: list[int], accepted_steps: list[int]) -> tuple[list[int], list[int]]:
        """The (dst slots, src scratch slots) whose layout tags a `commit_verified` of these host
        values moves: the rows it does not skip."""
        dst, src = [], []
        for row, (slot, step) in enumerate(zip(state_slots, accepted_steps)):
            if 0 < slot <= self.num_slots and 0 <= step < self.scratch_steps:
                dst.append(slot)
                src.append(self.num_slots + 1 + row * self.scratch_steps + step)
        return dst, src

    def _check(self, state_slot: int, allow_scratch: bool = False) -> None:
        last = self.num_slots + (self.scratch_rows * self.scratch_steps if allow_scratch else 0)
        if not 0 < state_slot <= last:
            raise ValueError(f"state slot {state_slot} out of range 1..{last}")

    def reset(self, state_slot: int) -> None:
        """Zero a slot (a request starting from no state) and give it the reference layout."""
        self._check(state_slot)
        self.conv_states[:, state_slot].zero_()
        if self.ssm_states is not None:
            self.ssm_states[:, state_slot].zero_()
        self.layout_tag[state_slot : state_slot + 1].zero_()  # (`[i] = 0` would copy from the host and sync)

    def copy(self, src_state_slot: int, dst_state_slot: int) -> None:
        """dst <- src in every layer, conv and SSM, with the layout tag (copy-on-write, fork;
        src may be a speculative scratch row: a checkpoint of accepted tokens)."""
        self._check(src_state_slot, allow_scratch=True)
        self._check(dst_state_slot)
        self.conv_states[:, dst_state_slot] = self.conv_states[:, src_state_slot]
        if self.ssm_states is not None:
            self.ssm_states[:, dst_state_slot] = self.ssm_states[:, src_state_slot]
        self.layout_tag[dst_state_slot : dst_state_slot + 1].copy_(self.layout_tag[src_state_slot : src_state_slot + 1])
