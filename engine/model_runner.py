"""The shard side of a step: apply the plan's cache ops to this shard's tables and pools,
build the ForwardBatch, run the model, return the sampled rows' logits."""
from __future__ import annotations

import torch

from ..mem_cache import KVPool, RequestRowTable, StatePool, apply_cache_ops
from .forward_batch import ForwardBatch
from .step_plan import StepPlan


class ModelRunner:
    def __init__(self, model: torch.nn.Module, kv_pool: KVPool, state_pool: StatePool, req_table: RequestRowTable,
                 device: torch.device | str) -> None:
        self.model = model
        self.kv_pool = kv_pool
        self.state_pool = state_pool
        self.req_table = req_table
        self.device = torch.device(device)

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> torch.Tensor | None:
        """Returns fp32 logits [len(plan.sample_rows), V], or None when nothing samples."""
        apply_cache_ops(plan.pre_ops, self.req_table, self.state_pool)
        logits = None
        if plan.has_forward:
            fb = ForwardBatch.build(plan.req_rows, plan.prefix_lens, plan.extend_lens, self.req_table,
                                    self.kv_pool, self.state_pool)
            input_ids = torch.tensor(plan.input_ids, dtype=torch.long, device=self.device)
            hidden = self.model(input_ids, fb.positions, fb)  # [T, H]
            if plan.sample_rows:
                rows = torch.tensor(plan.sample_rows, dtype=torch.long, device=self.device)
                logits = self.model.compute_logits(hidden[fb.logits_indices[rows]])  # [S, V]
        apply_cache_ops(plan.post_ops, self.req_table, self.state_pool)
        return logits
