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

Gated DeltaNet states (`StateSpec.ssm_replay`) are written lazily instead when the verify step
ran from a verify CUDA graph (`deferred`): the recurrent kernel records each token's k, v, g
and beta in the replay buffers (`replay_k`, `replay_v`, `replay_gb`: [L, scratch_rows,
scratch_steps + 1, ...], fp32) and leaves the slot as it was; `commit_verified` then replays
the kept tokens over the slot (kernels/state_ops.replay_gdn_state), writing the scratch step
of a checkpoint on the way. A verify step then moves each GDN state in and out once instead
of writing it K + 1 times, and the commit copies none. (This departs from DESIGN.md's
per-step state scratch for GDN: measured on an H200, the scratch writes doubled the state
kernels' time of a verify step; see benchmarks/RESULTS.md.) Conv windows and Mamba2 states
keep the scratch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..device_io import copy_to_device, to_device
from ..kernels.state_ops import (
    commit_verified_state, commit_verified_state_ref, copy_state_slots, replay_gdn_state, replay_gdn_state_ref,
)
from ..kernels.switch import use_triton


@dataclass(frozen=True)
class StateSpec:
    """What one state layer keeps per slot (this shard's slice)."""

    conv_dim: int
    conv_width: int  # K-1 kept inputs
    ssm_shape: tuple[int, ...] | None
    conv_dtype: torch.dtype
    ssm_dtype: torch.dtype = torch.float32
    ssm_replay: bool = False  # Gated DeltaNet: verify graphs defer the state update (module doc)

    def bytes_per_slot(self, num_layers: int) -> int:
        conv = self.conv_dim * self.conv_width * torch.empty((), dtype=self.conv_dtype).element_size()
        ssm = 0
        if self.ssm_shape is not None:
            n = 1
            for d in self.ssm_shape:
                n *= d
            ssm = n * torch.empty((), dtype=self.ssm_dtype).element_size()
        return num_layers * (conv + ssm)

    def replay_bytes_per_step(self, num_layers: int) -> int:
        """Bytes of the GDN replay buffers per verify row and step (k, v, g and beta in fp32,
        every layer); 0 for states that keep the scratch."""
        if not self.ssm_replay or self.ssm_shape is None:
            return 0
        hv, dk, dv = self.ssm_shape
        return num_layers * hv * (dk + dv + 2) * 4


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
        self.commit_graphs = True  # CUDA: the verify commit as a graph per kind (commit_verified)
        self._commit_graphs: dict[bool, torch.cuda.CUDAGraph] = {}
        self._commit_rows: torch.Tensor | None = None  # [slots | steps | kept | masks] x scratch rows
        self.replay_k = self.replay_v = self.replay_gb = None
        if spec.ssm_replay and spec.ssm_shape is not None and scratch_rows and scratch_steps:
            hv, dk, dv = spec.ssm_shape
            lead = (num_layers, scratch_rows, scratch_steps + 1)
            self.replay_k = torch.zeros(*lead, hv, dk, dtype=torch.float32, device=device)
            self.replay_v = torch.zeros(*lead, hv, dv, dtype=torch.float32, device=device)
            self.replay_gb = torch.zeros(*lead, 2, hv, dtype=torch.float32, device=device)

    @property
    def defers_verify(self) -> bool:
        """Whether verify graphs defer this pool's SSM updates to the commit (GDN)."""
        return self.replay_k is not None

    def layer_replay(self, layer_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The replay buffers (k, v, gb; [scratch_rows, scratch_steps + 1, ...]) of the layer whose
        SSM states `layer_states` (= ssm_states[l]) are: the deferred verify kernel's `replay`."""
        per_layer = self.ssm_states.stride(0) * self.ssm_states.element_size()
        layer, rest = divmod(layer_states.data_ptr() - self.ssm_states.data_ptr(), per_layer)
        if rest or not 0 <= layer < self.num_layers or layer_states.shape != self.ssm_states.shape[1:]:
            raise ValueError("layer_states must be one layer of this pool's ssm_states")
        return self.replay_k[layer], self.replay_v[layer], self.replay_gb[layer]

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

    def commit_verified(self, *, state_slots: list[int], accepted_steps: list[int],
                        kept_tokens: list[int] | None = None, checkpoint_masks: list[int] | None = None,
                        deferred: bool = False) -> None:
        """After a verify step, in every state layer (conv windows and SSM states) and with the
        layout tag: `state_slots[v] <- scratch[v, accepted_steps[v]]` for each verify row v
        (host lists, V <= scratch_rows). A row with state_slots[v] <= 0 (finished / aborted) or
        accepted_steps[v] outside [0, scratch_steps) (all drafts accepted: the in-place state is
        right) is skipped. One copy to the device carries the values and the tags' moves.

        `deferred` (the step ran from a verify graph and `defers_verify`): the SSM states are
        instead replayed over each row's `kept_tokens[v]` tokens (its own + the accepted drafts),
        and bit s of `checkpoint_masks[v]` also writes the state after token s to scratch[v, s],
        where a checkpoint's copy reads it (so checkpoint copies go after the commit)."""
        if len(state_slots) != len(accepted_steps):
            raise ValueError(f"{len(state_slots)} state slots for {len(accepted_steps)} accepted steps")
        replay = deferred and self.defers_verify
        if replay and (kept_tokens is None or checkpoint_masks is None
                       or not len(kept_tokens) == len(checkpoint_masks) == len(state_slots)):
            raise ValueError("a deferred commit needs kept_tokens and checkpoint_masks for every verify row")
        rows = len(state_slots)
        if rows > self.scratch_rows:
            raise ValueError(f"{rows} verify rows, the scratch has {self.scratch_rows}")
        if rows == 0 or self.scratch_steps == 0:
            return
        if self.conv_states.is_cuda and self.commit_graphs:
            # one copy of the rows into static buffers, one graph replay: the commit's launches
            # cost ~0.3-0.5 ms of host time a verify step (measured on an H100), on its critical path
            pad = self.scratch_rows - rows
            values = (list(state_slots) + [-1] * pad + list(accepted_steps) + [-1] * pad
                      + (list(kept_tokens) + [0] * pad + list(checkpoint_masks) + [0] * pad if replay else []))
            graph = self._commit_graphs.get(replay) or self._capture_commit(replay)
            copy_to_device(self._commit_rows, values)
            graph.replay()
            return
        extra = list(kept_tokens) + list(checkpoint_masks) if replay else []
        values = to_device(list(state_slots) + list(accepted_steps) + extra, torch.int64, self.conv_states.device)
        self._commit_from(values, rows, replay)

    def _commit_from(self, values: torch.Tensor, rows: int, replay: bool) -> None:
        """The commit's device work from `values` = [slots | steps (| kept | masks)] of `rows`
        rows each: the state copies or replays, then the layout tags of the copied rows (by
        device indices: no host values, so a graph can hold it)."""
        slots_d, steps_d = values[:rows], values[rows : 2 * rows]
        triton_path = use_triton(self.conv_states)
        commit = commit_verified_state if triton_path else commit_verified_state_ref
        for states in (self.conv_states, self.ssm_states):
            if states is None or not states[0, 0].numel():
                continue
            if replay and states is self.ssm_states:
                kept_d, masks_d = values[2 * rows : 3 * rows], values[3 * rows : 4 * rows]
                (replay_gdn_state if triton_path else replay_gdn_state_ref)(
                    states[:, : self.num_slots + 1], self._scratch_view(states), self.replay_k, self.replay_v,
                    self.replay_gb, slots_d, kept_d, masks_d)
            else:
                commit(states[:, : self.num_slots + 1], self._scratch_view(states), slots_d, steps_d)
        # the tag moves with the state; rows not copied move slot 0's tag onto itself
        moved = (slots_d > 0) & (slots_d <= self.num_slots) & (steps_d >= 0) & (steps_d < self.scratch_steps)
        src = self.num_slots + 1 + torch.arange(rows, device=values.device) * self.scratch_steps + steps_d
        self.layout_tag[torch.where(moved, slots_d, 0)] = self.layout_tag[torch.where(moved, src, 0)]

    def prepare_copies(self) -> None:
        """Compile `copy_many`'s kernel now (the Triton path): one launch per state kind over
        two padding pairs (dst slot 0), which the kernel skips, so nothing is written. The
        engine does this before it reports ready: the first step whose chunk ends at several
        checkpoints (or that keeps several replies' states) would otherwise compile it while
        serving."""
        if not use_triton(self.conv_states):
            return
        padding = torch.zeros(2, dtype=torch.int64, device=self.conv_states.device)
        for states in (self.conv_states, self.ssm_states):
            if states is not None and states[0, 0].numel():
                copy_state_slots(states, padding, padding)

    def prepare_commit_graphs(self) -> None:
        """Compile the commit's kernels and capture its graphs now (CUDA, with a scratch): the
        engine does this before it reports ready, so the first verify step compiles nothing."""
        if not (self.conv_states.is_cuda and self.commit_graphs and self.scratch_rows and self.scratch_steps):
            return
        for replay in (False, True) if self.defers_verify else (False,):
            if replay not in self._commit_graphs:
                self._capture_commit(replay)

    def _capture_commit(self, replay: bool) -> "torch.cuda.CUDAGraph":
        """The commit over every scratch row, reading them from `_commit_rows`, as a CUDA graph
        (run once first with no rows, which compiles its kernels and writes nothing)."""
        if self._commit_rows is None:
            self._commit_rows = torch.full((4 * self.scratch_rows,), -1, dtype=torch.int64,
                                           device=self.conv_states.device)
        self._commit_rows.fill_(-1)
        self._commit_from(self._commit_rows, self.scratch_rows, replay)
        torch.cuda.synchronize(self.conv_states.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._commit_from(self._commit_rows, self.scratch_rows, replay)
        self._commit_graphs[replay] = graph
        return graph

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
        self.copy_many([src_state_slot], [dst_state_slot])

    def copy_many(self, src_state_slots: list[int], dst_state_slots: list[int]) -> None:
        """dst[m] <- src[m] for every pair at once, as `copy` does each. The dst slots must be
        distinct and none may be a src (the copies run in parallel). On the Triton path one
        launch per state kind (`copy_state_slots`) and one copy of the indices to the device:
        torch's own copy of a slot (strided over layers) ran at 0.8 TB/s and cost ~100 us of
        host time a slot on an H200 (benchmarks/state_copy_bench.py). A single pair keeps torch's
        copy: the kernel path's two launches and index copy took 230 us of host time a call."""
        if len(src_state_slots) != len(dst_state_slots):
            raise ValueError(f"{len(src_state_slots)} src slots for {len(dst_state_slots)} dst slots")
        pairs = [(src, dst) for src, dst in zip(src_state_slots, dst_state_slots) if src != dst]  # (no-ops)
        src_state_slots, dst_state_slots = [src for src, _ in pairs], [dst for _, dst in pairs]
        for src, dst in pairs:
            self._check(src, allow_scratch=True)
            self._check(dst)
        if len(set(dst_state_slots)) != len(dst_state_slots) or set(src_state_slots) & set(dst_state_slots):
            raise ValueError(f"dst slots {dst_state_slots} must be distinct and disjoint from src slots "
                             f"{src_state_slots}")
        if not src_state_slots:
            return
        if len(pairs) == 1 or not use_triton(self.conv_states):  # (one copy: torch's is cheaper on the host)
            for src, dst in zip(src_state_slots, dst_state_slots):
                self.conv_states[:, dst] = self.conv_states[:, src]
                if self.ssm_states is not None:
                    self.ssm_states[:, dst] = self.ssm_states[:, src]
                self.layout_tag[dst : dst + 1].copy_(self.layout_tag[src : src + 1])
            return
        num = len(src_state_slots)
        slots = to_device(list(src_state_slots) + list(dst_state_slots), torch.int64, self.conv_states.device)
        src_d, dst_d = slots[:num], slots[num:]
        for states in (self.conv_states, self.ssm_states):
            if states is not None and states[0, 0].numel():
                copy_state_slots(states, src_d, dst_d)
        self.layout_tag[dst_d] = self.layout_tag[src_d]
