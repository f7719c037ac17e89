"""Shard: one tensor-parallel rank's data plane. It loads its slice of the model (under the
process's TP context), owns its KV pool, state pool and request-row table, and executes
StepPlans. Rank 0's Shard lives beside the engine; other ranks' live in ShardWorker actors.

Start-up, on every rank::

    shard = Shard(config)                       # this rank's slice of the model
    setup = plan_pools(shard.pool_layout(), shard.cache_budget(), config.pool_options(...))  # rank 0 only,
    shard.build_pools(setup)                    # then sent to the other ranks, which build the same
"""
from __future__ import annotations

import torch

from ...mem_cache import KVPool, PoolLayout, PoolSetup, RequestRowTable, StatePool, StateSpec
from ...models import load_model
from ..config import EngineConfig
from .cuda_graph import decode_graph_max_batch
from .model_runner import ModelRunner
from .step_plan import StepPlan

CPU_DEFAULT_CACHE_BYTES = 512 * 1024**2


class Shard:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = torch.device(config.device)
        spec = config.speculative_config
        self.model, self.hf_config, self.dtype = load_model(
            config.model, config.dtype, self.device, config.load_format, seed=config.seed,
            enable_mtp=spec is not None and spec.method == "mtp")
        if self.device.type == "cuda":  # the loader's transient tensors must not count against the cache budget
            torch.cuda.empty_cache()
        self.runner: ModelRunner | None = None

    @property
    def model_max_len(self) -> int:
        """The model's own context length (its config's max_position_embeddings)."""
        return int(getattr(self.hf_config, "max_position_embeddings", 0) or 1 << 20)

    def pool_layout(self) -> PoolLayout:
        cfg, model = self.config, self.model
        kv = model.kv_spec()
        num_attn, num_state = model.num_kv_layers, model.layer_ids.num_state_layers  # KV layers: + MTP's
        spec = (model.state_spec(self.dtype) if num_state else None) or StateSpec(1, 1, None, self.dtype)
        page_bytes = 0
        if num_attn:
            page_bytes = KVPool.bytes_per_page(cfg.page_size, num_attn, kv.num_kv_heads, kv.head_dim,
                                               kv.v_head_dim, self.dtype)
        return PoolLayout(num_attn, num_state, page_bytes, spec.bytes_per_slot(num_state) if num_state else 0, spec)

    def cache_budget(self) -> int:
        """Bytes for KV pages + state slots: the config's, else a share of free GPU memory
        (gpu_memory_utilization), else a CPU default."""
        if self.config.cache_memory_bytes:
            return self.config.cache_memory_bytes
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            return int(free * self.config.gpu_memory_utilization)
        return CPU_DEFAULT_CACHE_BYTES

    def build_pools(self, setup: PoolSetup) -> None:
        cfg, layout, kv = self.config, self.pool_layout(), self.model.kv_spec()
        kv_pool = KVPool(setup.num_kv_pages, setup.page_size, max(layout.num_attn_layers, 1),
                         kv.num_kv_heads if kv else 1, kv.head_dim if kv else 1, kv.v_head_dim if kv else 1,
                         self.dtype, self.device)
        state_pool = StatePool(setup.num_state_slots, max(layout.num_state_layers, 1), layout.state_spec,
                               self.device, scratch_rows=setup.scratch_rows, scratch_steps=setup.scratch_steps)
        # whole pages: a request's last page may run past max_model_len (the KV writes are per page)
        table = RequestRowTable(setup.num_req_rows, -(-setup.max_model_len // setup.page_size) * setup.page_size,
                                self.device)
        graph_batch = decode_graph_max_batch(cfg.enable_cuda_graphs, cfg.cuda_graph_max_batch, setup.num_req_rows,
                                             self.device)
        spec = cfg.speculative_config
        verify_q = spec.num_speculative_tokens + 1 if spec is not None and cfg.enable_verify_graphs else 0
        piecewise = 0
        if cfg.enable_piecewise_graphs and cfg.enable_cuda_graphs and self.device.type == "cuda":
            piecewise = min(cfg.piecewise_graph_max_tokens, cfg.max_num_batched_tokens)
        self.runner = ModelRunner(self.model, kv_pool, state_pool, table, self.device, graph_batch,
                                  warm_up_tokens=cfg.max_num_batched_tokens if cfg.warm_up else 0,
                                  verify_tokens_per_row=verify_q, piecewise_max_tokens=piecewise)

    def execute(self, plan: StepPlan) -> torch.Tensor | None:
        return self.runner.execute(plan)
