"""The shard side of a step: apply the plan's cache ops to this shard's tables and pools,
build the ForwardBatch, run the model (a pure-decode step through a CUDA graph when
captured, see cuda_graph.py), return the sampled rows' logits."""
from __future__ import annotations

import torch

from ..mem_cache import KVPool, RequestRowTable, StatePool, apply_cache_ops
from .cuda_graph import DecodeGraphs, pad_decode_plan
from .forward_batch import ForwardBatch
from .step_plan import StepPlan


class ModelRunner:
    def __init__(self, model: torch.nn.Module, kv_pool: KVPool, state_pool: StatePool, req_table: RequestRowTable,
                 device: torch.device | str, cuda_graph_max_batch: int = 0) -> None:
        """cuda_graph_max_batch > 0 (CUDA only) captures decode graphs for batches up to that size."""
        self.model = model
        self.kv_pool = kv_pool
        self.state_pool = state_pool
        self.req_table = req_table
        self.device = torch.device(device)
        self.decode_graphs: DecodeGraphs | None = None
        if cuda_graph_max_batch > 0:
            if self.device.type != "cuda":
                raise ValueError(f"CUDA graphs need a CUDA device, got {self.device}")
            self.decode_graphs = DecodeGraphs(model, cuda_graph_max_batch, self.device)
            self.decode_graphs.capture(self._padding_batch)

    def _build(self, req_rows: list[int], prefix_lens: list[int], extend_lens: list[int]) -> ForwardBatch:
        return ForwardBatch.build(req_rows, prefix_lens, extend_lens, self.req_table, self.kv_pool,
                                  self.state_pool)

    def _padding_batch(self, size: int) -> ForwardBatch:
        return self._build([0] * size, [0] * size, [1] * size)

    def _forward(self, plan: StepPlan) -> tuple[torch.Tensor, ForwardBatch]:
        """Returns (hidden [T or padded B, H], the batch it ran); rows past the plan's are padding."""
        size = self.decode_graphs.padded_size(plan.extend_lens) if self.decode_graphs is not None else None
        if size is None:
            fb = self._build(plan.req_rows, plan.prefix_lens, plan.extend_lens)
            input_ids = torch.tensor(plan.input_ids, dtype=torch.long, device=self.device)
            return self.model(input_ids, fb.positions, fb), fb
        req_rows, prefix_lens, input_ids = pad_decode_plan(plan.req_rows, plan.prefix_lens, plan.input_ids, size)
        fb = self._build(req_rows, prefix_lens, [1] * size)
        input_ids_t = torch.tensor(input_ids, dtype=torch.long, device=self.device)
        return self.decode_graphs.run(fb, input_ids_t), fb

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> torch.Tensor | None:
        """Returns fp32 logits [len(plan.sample_rows), V], or None when nothing samples."""
        apply_cache_ops(plan.pre_ops, self.req_table, self.state_pool)
        logits = None
        if plan.has_forward:
            hidden, fb = self._forward(plan)  # [T, H]
            if plan.sample_rows:
                rows = torch.tensor(plan.sample_rows, dtype=torch.long, device=self.device)
                logits = self.model.compute_logits(hidden[fb.logits_indices[rows]])  # [S, V]
        apply_cache_ops(plan.post_ops, self.req_table, self.state_pool)
        return logits
