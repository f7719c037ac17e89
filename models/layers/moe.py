"""Sparse mixture of experts: softmax top-k router, stacked experts, optional gated shared expert.

Routing and experts run through `ops` (models/layers/ops.py): on CUDA the Triton top-k softmax
and grouped-GEMM `fused_moe` kernels, elsewhere the references in kernels/moe/ref.py (one matmul
pair per expert that has tokens). Both read the same stacked storage.

Storage follows transformers' in-memory layout (and names):
    experts.gate_up_proj : [E, 2 * I/tp, H]   rows [gate_r | up_r] of this rank
    experts.down_proj    : [E, H, I/tp]
so each expert's intermediate dim is split across ranks (column-parallel gate/up, row-parallel
down); the routed output of a rank is a partial sum, all-reduced by `SparseMoeBlock`.

Checkpoints come in two forms, both accepted:
    fused       `...experts.gate_up_proj [E, 2I, H]`, `...experts.down_proj [E, H, I]`
                (loaded by the parameters' own `weight_loader`);
    per expert  `...experts.<e>.gate_proj.weight [I, H]`, `.up_proj.weight [I, H]`,
                `.down_proj.weight [H, I]` (what the Hub and save_pretrained hold), assembled
                by `PerExpertWeightLoader`, which `HybridForCausalLM.load_weights` tries first
                for every tensor (any experts module with `load_expert` takes part).
"""
from __future__ import annotations

import re

import torch
import torch.nn as nn

from . import ops
from .linear import LinearGroup, ReplicatedLinear, attach_segmented_loader, copy_checked, segmented_shard
from ...distributed import all_reduce, divide, partial_sum_dtype, tp_rank, tp_size


def softmax_topk(router_logits: torch.Tensor, top_k: int, renormalize: bool,
                 out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits: [T, E] -> (weights [T, K] in out_dtype, default the logits' dtype; expert
    ids [T, K] int64).

    Softmax in fp32 over all experts, keep the top k; with `renormalize` (config `norm_topk_prob`)
    the kept weights are rescaled to sum to 1."""
    return ops.moe_topk_softmax(router_logits, top_k, renormalize, out_dtype)


class FusedExperts(nn.Module):
    """E gated-SiLU experts stored stacked; forward returns this rank's partial output."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.intermediate_size = intermediate_size  # full, before sharding
        self.local_intermediate = divide(intermediate_size, tp_size(), "moe_intermediate_size")
        i_r = self.local_intermediate
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * i_r, hidden_size))
        attach_segmented_loader(self.gate_up_proj, [intermediate_size, intermediate_size], dim=1)
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, i_r))
        attach_segmented_loader(self.down_proj, [intermediate_size], dim=2)

    def load_expert(self, expert_id: int, proj: str, full: torch.Tensor, name: str) -> str:
        """Copy one expert's full checkpoint matrix (gate_proj/up_proj [I, H], down_proj [H, I]) into
        this rank's slice of the stacked storage. Returns the parameter attribute it wrote to."""
        if not 0 <= expert_id < self.num_experts:
            raise ValueError(f"unexpected tensor {name!r}: expert {expert_id} >= num_experts {self.num_experts}")
        i_full, i_r, hidden = self.intermediate_size, self.local_intermediate, self.down_proj.shape[1]
        shard_dim = 1 if proj == "down_proj" else 0
        expected = (hidden, i_full) if proj == "down_proj" else (i_full, hidden)
        if tuple(full.shape) != expected:
            raise ValueError(f"shape mismatch for {name}: model expects {expected}, checkpoint {tuple(full.shape)}")
        part = segmented_shard(full, [i_full], shard_dim, tp_rank(), tp_size())
        if proj == "down_proj":
            copy_checked(self.down_proj.data[expert_id], part, name)
            return "down_proj"
        rows = slice(0, i_r) if proj == "gate_proj" else slice(i_r, 2 * i_r)
        copy_checked(self.gate_up_proj.data[expert_id, rows], part, name)
        return "gate_up_proj"

    @staticmethod
    def checkpoint_parts(attr: str) -> int:
        """Per-expert checkpoint tensors that make one expert's slice of parameter `attr`."""
        return 2 if attr == "gate_up_proj" else 1

    def forward(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                out_dtype: torch.dtype | None = None, shared: torch.Tensor | None = None,
                shared_gate: torch.Tensor | None = None, combine: bool = True) -> torch.Tensor:
        """x: [T, H]; topk_ids, topk_weights: [T, K]. Returns [T, H], this rank's partial sum, in
        out_dtype (default `partial_sum_dtype`: fp32 under tensor parallelism in bf16); `shared`
        [T, H] (times sigmoid(shared_gate [T, 1]) if given) joins the sum (ops.fused_moe).
        combine=False: the weighted expert rows [T * K, H] fp32 instead (ops.shared_expert_combine)."""
        return ops.fused_moe(x, self.gate_up_proj, self.down_proj, topk_weights, topk_ids,
                             out_dtype=out_dtype or partial_sum_dtype(x.dtype), shared=shared,
                             shared_gate=shared_gate, combine=combine)


class SparseMoeBlock(nn.Module):
    """out = experts(x, softmax_topk(gate(x))) [+ sigmoid(shared_expert_gate(x)) * shared_expert(x)].

    Parameter names match transformers' Qwen2/3-MoE and Qwen3-Next blocks: `gate.weight [E, H]`
    (replicated), `experts.*`, `shared_expert.*`, `shared_expert_gate.weight [1, H]` (replicated).
    `shared_expert` is any module mapping [T, H] -> [T, H] with its own all-reduce (e.g. a gated
    MLP of column/row-parallel linears); None for families without one."""

    pending_norm_consumer = "moe"  # x is read by the router's projection first (models/layers/ops.PendingAddNorm)

    def __init__(
        self,
        hidden_size: int,
        num_experts: int,
        top_k: int,
        moe_intermediate_size: int,
        norm_topk_prob: bool,
        shared_expert: nn.Module | None = None,
        shared_expert_gate: bool = False,
    ) -> None:
        super().__init__()
        if not 0 < top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok={top_k} must be in [1, num_experts={num_experts}]")
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        self.gate = ReplicatedLinear(hidden_size, num_experts)
        self.experts = FusedExperts(num_experts, hidden_size, moe_intermediate_size)
        self.shared_expert = shared_expert
        self.shared_expert_gate = ReplicatedLinear(hidden_size, 1) if shared_expert_gate else None
        if shared_expert_gate and shared_expert is None:
            raise ValueError("shared_expert_gate needs a shared_expert")
        # after loading: one GEMM of x for the router, the shared expert's gate row below it and
        # (a GatedMLP shared expert) its gate/up rows: [E | 1 | 2 * I_shared/tp, H], fp32 out
        self.router = LinearGroup([self.gate, self.shared_expert_gate]) if shared_expert_gate else None
        self.router_rows = num_experts + (1 if shared_expert_gate else 0)  # the router's logits and gate

    def post_load(self) -> None:
        """Fuse the GEMMs of x (`router`). A GatedMLP shared expert's gate_up group is made a
        view of the fused weight's last rows (its own post_load then keeps it)."""
        if self.router is None or self.router.weight is not None:
            return
        mlp = getattr(self.shared_expert, "gate_up", None)
        if isinstance(mlp, LinearGroup) and mlp.weight is None and hasattr(self.shared_expert, "partial") \
                and all(getattr(p, "bias", None) is None for p in mlp.parts):
            self.router = LinearGroup(self.router.parts + mlp.parts)
            self.router.fuse()
            mlp.weight, mlp.sizes = self.router.weight[self.router_rows:], self.router.sizes[2:]
        else:
            self.router.fuse()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, H] -> [T, H] (complete, all-reduced across ranks).

        The routed experts' and the shared expert's partial sums are added on each rank and
        all-reduced once (one all-reduce per layer, not two), in fp32 for bf16/fp16 models at
        every tp (so tp=1 rounds once where tp=N does: their tokens agree)."""
        # the router in fp32: in bf16, near-tied experts flip and the output jumps
        num_experts = self.experts.num_experts
        fused = self.router is not None and self.router.weight is not None
        weight = self.gate.weight
        if fused:  # decode rows: one fp32 GEMM for all of x's projections; prompt rows: the router's
            # rows alone in fp32 (cuBLAS's fp32-output GEMM over the shared expert's rows too made
            # an 8k prompt of Qwen3-Next's 12-layer slice 6% slower), the shared expert's in x's dtype
            weight = self.router.weight if ops.few_rows(x) else self.router.weight[:self.router_rows]
        projections = ops.router_logits(x, weight)  # [T, E (+1 +2I/tp)]
        x = ops.resolve(x)  # a PendingAddNorm's normed rows (stored by the router's launch at a decode row)
        topk_weights, topk_ids = softmax_topk(projections[:, :num_experts], self.top_k, self.norm_topk_prob,
                                              out_dtype=x.dtype)  # [T, K]
        if self.shared_expert is None or not hasattr(self.shared_expert, "partial"):
            out = all_reduce(self.experts(x, topk_ids, topk_weights)).to(x.dtype)  # [T, H]
            return out if self.shared_expert is None else out + self._gated(x, self.shared_expert(x))
        acc_dtype = torch.float32 if x.dtype in (torch.bfloat16, torch.float16) else x.dtype
        gate_logit = None  # [T, 1]: the shared expert's gate, applied in the experts' final sum
        if self.shared_expert_gate is not None:
            gate_logit = projections[:, num_experts:self.router_rows] if fused else self.shared_expert_gate(x)
        shared_gate_up = projections[:, self.router_rows:] if projections.shape[1] > self.router_rows else None
        # at tp=1 the all-reduce is the identity: the experts' sum rounds to x's dtype itself
        out_dtype = x.dtype if tp_size() == 1 else acc_dtype
        down = getattr(self.shared_expert, "down_proj", None)
        if shared_gate_up is not None and acc_dtype == torch.float32 and getattr(down, "bias", True) is None \
                and ops.skinny_row(x, down.weight):
            # a decode row: the shared expert's activation, down projection and gate and the
            # experts' sum in one launch (the bits of the path below)
            rows = self.experts(x, topk_ids, topk_weights, combine=False)
            out = ops.shared_expert_combine(shared_gate_up, down.weight, rows, gate_logit, out_dtype)
            return all_reduce(out).to(x.dtype)
        shared = self.shared_expert.partial(x, acc_dtype, gate_up=shared_gate_up)
        out = self.experts(x, topk_ids, topk_weights, out_dtype=out_dtype, shared=shared, shared_gate=gate_logit)
        return all_reduce(out).to(x.dtype)

    def _gated(self, x: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
        """sigmoid(shared_expert_gate(x)) * shared, gate [T, 1] (or shared as is, ungated)."""
        if self.shared_expert_gate is None:
            return shared
        return torch.sigmoid(self.shared_expert_gate(x)) * shared


class PerExpertWeightLoader:
    """Assembles one-key-per-expert checkpoint tensors into stacked expert storage: any
    module named `...experts` with `num_experts`, `load_expert(expert_id, proj, full, name) ->
    attr` and `checkpoint_parts(attr)` (FusedExperts, Nemotron-H's relu2 experts).

    Use one instance per `load_weights` call. A stacked parameter is reported as loaded only
    once every expert's part of it has arrived, so the loader's missing check still names
    parameters with an expert absent from the checkpoint."""

    pattern = re.compile(
        r"^(?P<module>(?:.+\.)?experts)\.(?P<expert>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$"
    )

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.arrived: dict[str, set[tuple[int, str]]] = {}  # param name -> {(expert, proj)}

    def __call__(self, name: str, tensor: torch.Tensor, loaded: set[str]) -> bool:
        match = self.pattern.match(name)
        if match is None:
            return False
        try:
            experts = self.model.get_submodule(match["module"])
        except AttributeError:
            return False  # no such module: the caller reports an unexpected tensor
        if not hasattr(experts, "load_expert"):
            return False
        expert_id, proj = int(match["expert"]), match["proj"]
        attr = experts.load_expert(expert_id, proj, tensor, name)
        param_name = f"{match['module']}.{attr}"
        parts = self.arrived.setdefault(param_name, set())
        parts.add((expert_id, proj))
        needed = experts.num_experts * experts.checkpoint_parts(attr)
        if len(parts) == needed:
            loaded.add(param_name)
        return True
