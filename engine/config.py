"""EngineConfig: one frozen, validated config for a replica's engine (pure Python: the
ingress and the CLI import it without torch)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..mem_cache import PoolOptions


@dataclass(frozen=True)
class EngineConfig:
    model: str
    tokenizer: str | None = None  # defaults to the model directory
    device: str = "cpu"
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    load_format: str = "auto"  # auto | safetensors | dummy
    seed: int = 0  # dummy weights and unseeded sampling start from here
    max_num_seqs: int = 64  # requests running at once
    max_num_batched_tokens: int = 512  # token budget per step
    chunked_prefill_size: int = 64  # most prompt tokens of one request per step
    max_model_len: int | None = None  # prompt + output tokens; default: the model's, capped to fit the cache
    page_size: int = 16  # tokens per KV page
    cache_memory_bytes: int | None = None  # KV pages + state slots; default: see engine sizing
    gpu_memory_utilization: float = 0.85  # fraction of free GPU memory for the cache when not given
    state_pool_fraction: float = 0.25  # share of the cache budget for state slots (capped at what can be used)
    num_kv_pages_override: int | None = None  # exact pool sizes instead of the budget split (tests, tuning)
    num_state_slots_override: int | None = None
    enable_prefix_cache: bool = True  # radix prefix cache with state checkpoints
    state_checkpoint_interval: int = 256  # tokens between state checkpoints (a multiple of page_size)
    check_integrity: bool = True  # assert pool integrity when the engine goes idle
    enable_cuda_graphs: bool = True  # replay captured CUDA graphs for pure-decode steps (ignored on CPU)
    cuda_graph_max_batch: int = 64  # largest decode batch run through a graph (capped at max_num_seqs)
    async_scheduling: bool = True  # queue step N+1 before reading step N's tokens back (tp = 1)

    def __post_init__(self) -> None:
        def positive(name: str) -> None:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")

        for name in ("max_num_seqs", "max_num_batched_tokens", "chunked_prefill_size", "page_size",
                     "state_checkpoint_interval", "cuda_graph_max_batch"):
            positive(name)
        if self.state_checkpoint_interval % self.page_size:
            raise ValueError(f"state_checkpoint_interval={self.state_checkpoint_interval} must be a multiple of "
                             f"page_size={self.page_size}")
        if self.max_model_len is not None:
            positive("max_model_len")
        for name in ("cache_memory_bytes", "num_kv_pages_override", "num_state_slots_override"):
            if getattr(self, name) is not None:
                positive(name)
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if not 0.0 <= self.state_pool_fraction <= 1.0:
            raise ValueError(f"state_pool_fraction must be in [0, 1], got {self.state_pool_fraction}")
        if self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda[:N], got {self.device!r}")

    def pool_options(self, model_max_len: int) -> "PoolOptions":
        """The settings that size the pools (mem_cache.plan_pools)."""
        from ..mem_cache import PoolOptions

        return PoolOptions(page_size=self.page_size, max_num_seqs=self.max_num_seqs, max_model_len=self.max_model_len,
                           model_max_len=model_max_len, state_pool_fraction=self.state_pool_fraction,
                           state_checkpoint_interval=self.state_checkpoint_interval,
                           enable_prefix_cache=self.enable_prefix_cache,
                           num_kv_pages_override=self.num_kv_pages_override,
                           num_state_slots_override=self.num_state_slots_override)
