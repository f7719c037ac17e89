"""EngineConfig: one frozen, validated config for a replica's engine (pure Python: the
ingress and the CLI import it without torch)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .spec.config import SpeculativeConfig

if TYPE_CHECKING:
    from ..mem_cache import PoolOptions


# Defaults by device. CUDA: a step of up to 8192 tokens and a prompt chunk of 8192 fill an
# H100's tensor cores (vLLM and SGLang default to 8192 there too), 256 running sequences, a
# decode graph for every batch size, and overlapped scheduling (step N+1 queued while the GPU
# runs step N). CPU: steps of at most 512 tokens, so a decoding request waits for at most one
# of them, and a prompt chunk as large as the step: a CPU prompt step costs ~30 ms beyond its
# tokens' share (a 1,024-token prompt of the demo: 350-410 ms in chunks of 256, 700-730 ms in
# chunks of 64), and a chat turn of ~270 new tokens split 256 + 16 pays a second step with
# every decoding row in it. No overlap on the CPU: torch runs a CPU step's forward inside the
# launch, so "queueing" step N+1 computes it whole before step N's tokens are handed out, one
# step of latency on every token and nothing gained. Together, one replica's share of the
# router's chat workload (8 conversations, 256-token turns, 128-token replies, one thread):
# later turns' TTFT p50 0.41-0.48 s against 0.87-0.96 s over three seeds, TPOT p50 alike
# (benchmarks/chat_replica_bench.py; benchmarks/RESULTS.md, session 33).
DEVICE_DEFAULTS = {
    "cuda": {"max_num_seqs": 256, "max_num_batched_tokens": 8192, "chunked_prefill_size": 8192,
             "prefill_hold_steps": 16, "enable_piecewise_graphs": True, "async_scheduling": True},
    "cpu": {"max_num_seqs": 64, "max_num_batched_tokens": 512, "chunked_prefill_size": 512,
            "prefill_hold_steps": 0, "enable_piecewise_graphs": False, "async_scheduling": False},
}


@dataclass(frozen=True)
class EngineConfig:
    model: str  # a local model directory (LLM and AppConfig resolve Hub ids to one: engine/model_files.py)
    tokenizer: str | None = None  # defaults to the model directory
    revision: str | None = None  # the Hub revision `model` was resolved at (branch, tag or commit)
    trust_remote_code: bool = False  # let transformers run a model repository's own config code
    device: str = "cpu"
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    load_format: str = "auto"  # auto | safetensors | dummy
    seed: int = 0  # dummy weights and unseeded sampling start from here
    # None: the device's default (DEVICE_DEFAULTS): what fills an H100 on CUDA, small on CPU
    max_num_seqs: int | None = None  # sequences running at once
    max_num_batched_tokens: int | None = None  # token budget per step
    chunked_prefill_size: int | None = None  # most prompt tokens of one request per step
    max_model_len: int | None = None  # prompt + output tokens; default: the model's, capped to fit the cache
    page_size: int = 16  # tokens per KV page
    cache_memory_bytes: int | None = None  # KV pages + state slots; default: see engine sizing
    gpu_memory_utilization: float = 0.85  # fraction of free GPU memory for the cache when not given
    state_pool_fraction: float = 0.25  # share of the cache budget for state slots (capped at what can be used)
    num_kv_pages_override: int | None = None  # exact pool sizes instead of the budget split (tests, tuning)
    num_state_slots_override: int | None = None
    enable_prefix_caching: bool = True  # radix prefix cache with state checkpoints
    state_checkpoint_interval: int = 256  # tokens between state checkpoints (a multiple of page_size)
    # Keep each decoding request's state at the latest page boundary of its reply (one more
    # state slot a request, copied every page_size tokens; admission takes it back before it
    # would wait) and cache it with the reply's KV when the request ends: a next turn that sends
    # the reply back resumes after it instead of recomputing it from the prompt's end.
    reply_checkpoints: bool = True
    check_integrity: bool = True  # assert pool integrity when the engine goes idle
    # Hold new prompts back while every running request decodes, as TGI's max_waiting_tokens /
    # waiting_served_ratio do: an eager step with prompt tokens has a fixed host cost (~25 ms
    # on an H100 host for the 2.3B model, benchmarks/host_overhead.py), so admitting each
    # arriving prompt into its own step multiplies the decoding requests' time per token.
    # A waiting prompt is held for at most `prefill_hold_steps` decode steps, and none is held
    # once waiting >= prefill_hold_ratio x running or a prompt is being computed anyway.
    # 0: admit at once. Trades TTFT (up to that many decode steps) for TPOT. Default: 16 on
    # CUDA (an H100, 2.3B model, 64 in flight, 512 in / 128 out, benchmarks/loaded_tpot.py,
    # ecb8a69: TPOT p50 21.0 -> 7.0 ms against a 4.6 ms decode step, TTFT p50 60 -> 98 ms;
    # 32 steps on an earlier tree: 6.6 ms, TTFT 150 ms), 0 on CPU.
    prefill_hold_steps: int | None = None
    prefill_hold_ratio: float = 0.3
    enable_cuda_graphs: bool = True  # replay captured CUDA graphs for pure-decode steps (ignored on CPU)
    cuda_graph_max_batch: int | None = None  # largest decode batch run through a graph; default max_num_seqs
    # with speculative decoding: verify steps whose rows all verify K drafts replay graphs too
    # (one per padded batch size, up to the state scratch's rows; engine/runner/cuda_graph.py)
    enable_verify_graphs: bool = True
    # Piecewise CUDA graphs for the other steps (prompt chunks, mixed prefill + decode, eager
    # verify) of up to `piecewise_graph_max_tokens` tokens (default: the step's token budget,
    # max_num_batched_tokens, so that no step the scheduler forms runs eagerly): the
    # token-parallel ops replay from graphs per padded token count, the varlen ones
    # (attention, convs, state recurrences) run eagerly between them
    # (engine/runner/piecewise_graph.py). Default on CUDA (ignored on CPU): on an H200, 2.3B
    # model, a 2,048-token prompt step 52.8 -> 20.7 ms (host share 34.9 -> 2.9 ms); graphs up to
    # 8,192 tokens (the budget) rather than 2,048: an 8k prompt of Nemotron-H 1B 20.8 -> 13.3
    # ms, and the ~4,600-token mixed steps under load no longer wait on the host
    # (benchmarks/RESULTS.md, "Piecewise CUDA graphs on the GPU" and session 42).
    enable_piecewise_graphs: bool | None = None
    piecewise_graph_max_tokens: int | None = None
    # queue step N+1 before reading step N's tokens back (default by device: on CUDA, off on CPU)
    async_scheduling: bool | None = None
    warm_up: bool = True  # compile every kernel shape at start-up, before serving (CUDA)
    # speculative decoding: None (off), or a dict / SpeculativeConfig (engine/spec/config.py)
    speculative_config: SpeculativeConfig | dict | None = None

    def __post_init__(self) -> None:
        if self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda[:N], got {self.device!r}")
        for name, value in DEVICE_DEFAULTS[self.device.split(":")[0]].items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        object.__setattr__(self, "speculative_config", SpeculativeConfig.from_value(self.speculative_config))
        if self.cuda_graph_max_batch is None:
            object.__setattr__(self, "cuda_graph_max_batch", self.max_num_seqs)

        def positive(name: str) -> None:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")

        if self.piecewise_graph_max_tokens is None:
            object.__setattr__(self, "piecewise_graph_max_tokens", self.max_num_batched_tokens)
        for name in ("max_num_seqs", "max_num_batched_tokens", "chunked_prefill_size", "page_size",
                     "state_checkpoint_interval", "cuda_graph_max_batch", "piecewise_graph_max_tokens"):
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
        if not isinstance(self.prefill_hold_steps, int) or self.prefill_hold_steps < 0:
            raise ValueError(f"prefill_hold_steps must be an integer >= 0, got {self.prefill_hold_steps!r}")
        if not self.prefill_hold_ratio >= 0.0:
            raise ValueError(f"prefill_hold_ratio must be >= 0, got {self.prefill_hold_ratio!r}")
        if not 0.0 <= self.state_pool_fraction <= 1.0:
            raise ValueError(f"state_pool_fraction must be in [0, 1], got {self.state_pool_fraction}")

    def pool_options(self, model_max_len: int) -> "PoolOptions":
        """The settings that size the pools (mem_cache.plan_pools)."""
        from ..mem_cache import PoolOptions

        spec = self.speculative_config

        return PoolOptions(page_size=self.page_size, max_num_seqs=self.max_num_seqs, max_model_len=self.max_model_len,
                           model_max_len=model_max_len, state_pool_fraction=self.state_pool_fraction,
                           state_checkpoint_interval=self.state_checkpoint_interval,
                           enable_prefix_cache=self.enable_prefix_caching,
                           num_kv_pages_override=self.num_kv_pages_override,
                           num_state_slots_override=self.num_state_slots_override,
                           spec_scratch_rows=spec.verify_rows(self.max_num_seqs) if spec else 0,
                           spec_scratch_steps=spec.num_speculative_tokens if spec else 0,
                           spec_scratch_auto=bool(spec) and spec.max_num_seqs is None)
