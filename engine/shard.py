"""Shard: one tensor-parallel rank's data plane. It loads its slice of the model (under the
process's TP context), owns its KV pool, state pool and request-row table, and executes
StepPlans. Rank 0's Shard lives beside the engine; other ranks' live in ShardWorker actors.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..mem_cache import KVPool, PoolSizes, RequestRowTable, StatePool, StateSpec
from ..models import load_model
from .config import EngineConfig
from .cuda_graph import decode_graph_max_batch
from .model_runner import ModelRunner
from .step_plan import StepPlan

CPU_DEFAULT_CACHE_BYTES = 512 * 1024**2


@dataclass(frozen=True)
class CacheLayout:
    """Per-rank bytes of one KV page and one state slot, and what they hold."""

    num_attn_layers: int
    num_state_layers: int
    kv_bytes_per_page: int
    state_bytes_per_slot: int
    state_spec: StateSpec


@dataclass(frozen=True)
class PoolSetup:
    """Sizes decided by rank 0 and sent to every rank, so all pools are alike."""

    sizes: PoolSizes
    max_model_len: int


class Shard:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = torch.device(config.device)
        self.model, self.hf_config, self.dtype = load_model(
            config.model, config.dtype, self.device, config.load_format, seed=config.seed)
        self.runner: ModelRunner | None = None

    def cache_layout(self) -> CacheLayout:
        cfg, model = self.config, self.model
        kv = model.kv_spec()
        num_attn, num_state = model.layer_ids.num_attn_layers, model.layer_ids.num_state_layers
        spec = (model.state_spec(self.dtype) if num_state else None) or StateSpec(1, 1, None, self.dtype)
        page_bytes = 0
        if num_attn:
            page_bytes = KVPool.bytes_per_page(cfg.page_size, num_attn, kv.num_kv_heads, kv.head_dim,
                                               kv.v_head_dim, self.dtype)
        return CacheLayout(num_attn, num_state, page_bytes, spec.bytes_per_slot(num_state) if num_state else 0, spec)

    def default_budget(self) -> int:
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            return int(free * self.config.gpu_memory_utilization)
        return CPU_DEFAULT_CACHE_BYTES

    def build_pools(self, setup: PoolSetup) -> None:
        cfg, layout, kv = self.config, self.cache_layout(), self.model.kv_spec()
        kv_pool = KVPool(setup.sizes.num_kv_pages, cfg.page_size, max(layout.num_attn_layers, 1),
                         kv.num_kv_heads if kv else 1, kv.head_dim if kv else 1, kv.v_head_dim if kv else 1,
                         self.dtype, self.device)
        state_pool = StatePool(setup.sizes.num_state_slots, max(layout.num_state_layers, 1), layout.state_spec,
                               self.device)
        table = RequestRowTable(cfg.max_num_seqs, setup.max_model_len, self.device)
        graph_batch = decode_graph_max_batch(cfg.enable_cuda_graphs, cfg.cuda_graph_max_batch, cfg.max_num_seqs,
                                             self.device)
        self.runner = ModelRunner(self.model, kv_pool, state_pool, table, self.device, graph_batch)

    def execute(self, plan: StepPlan) -> torch.Tensor | None:
        return self.runner.execute(plan)
