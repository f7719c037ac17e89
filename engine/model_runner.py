"""Runs one step's forward on this shard: plan -> ForwardBatch -> hidden -> logits."""
from __future__ import annotations

import torch

from ..mem_cache import CacheManager
from .forward_batch import ForwardBatch
from .scheduler import ScheduledChunk


class ModelRunner:
    def __init__(self, model: torch.nn.Module, cache: CacheManager, device: torch.device | str) -> None:
        self.model = model
        self.cache = cache
        self.device = torch.device(device)

    def build_batch(self, plan: list[ScheduledChunk]) -> tuple[ForwardBatch, torch.Tensor]:
        req_rows, prefix_lens, extend_lens, input_ids = [], [], [], []
        for chunk in plan:
            req = chunk.request
            start = req.num_computed_tokens
            req_rows.append(req.alloc.req_row)
            prefix_lens.append(start)
            extend_lens.append(chunk.num_tokens)
            input_ids.extend(req.token_ids[start : start + chunk.num_tokens])
        fb = ForwardBatch.build(
            req_rows, prefix_lens, extend_lens, self.cache.req_table, self.cache.kv_pool, self.cache.state_pool
        )
        return fb, torch.tensor(input_ids, dtype=torch.long, device=self.device)

    @torch.inference_mode()
    def run(self, plan: list[ScheduledChunk]) -> torch.Tensor:
        """Returns fp32 logits [num_sampling_rows, V] for the chunks whose `samples` is true,
        in plan order."""
        fb, input_ids = self.build_batch(plan)
        hidden = self.model(input_ids, fb.positions, fb)  # [T, H]
        rows = [b for b, chunk in enumerate(plan) if chunk.samples]
        if not rows:
            return hidden.new_empty(0, 0, dtype=torch.float32)
        last = fb.logits_indices[torch.tensor(rows, device=fb.logits_indices.device)]
        return self.model.compute_logits(hidden[last])  # [S, V]
