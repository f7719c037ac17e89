"""LLMEngine: one replica's loop, `schedule -> run -> postprocess`, on one shard (tp=1).

    engine.add_request(request_id, prompt_token_ids, params)   # validates; ValueError on bad input
    while engine.has_unfinished(): outputs = engine.step()     # RequestOutput of each request touched
"""
from __future__ import annotations

import random

import torch

from ..mem_cache import CacheManager, KVPool, RequestRowTable, StatePool, StateSpec
from ..mem_cache.sizing import PoolSizes, check_pool_sizes, size_pools
from ..models import load_model
from .config import EngineConfig
from .detokenizer import IncrementalDetokenizer
from .model_runner import ModelRunner
from .outputs import CompletionOutput
from .request import Request
from .sampler import sample
from .sampling_params import SamplingParams
from .scheduler import ScheduledChunk, Scheduler
from .step_plan import StepPlan

CPU_DEFAULT_CACHE_BYTES = 512 * 1024**2


class LLMEngine:
    def __init__(self, config: EngineConfig, tokenizer=None) -> None:
        self.config = config
        self.device = torch.device(config.device)
        self.model, self.hf_config, self.dtype = load_model(
            config.model, config.dtype, self.device, config.load_format, seed=config.seed
        )
        self.tokenizer = tokenizer
        self.eos_token_ids = _eos_token_ids(config.model, self.hf_config, tokenizer)
        self.cache, self.runner, self.max_model_len = self._build_cache()
        self.scheduler = Scheduler(config, self.cache)
        self._seed_rng = random.Random(config.seed)

    # ----- set-up ----------------------------------------------------------------------
    def _build_cache(self) -> tuple[CacheManager, ModelRunner, int]:
        """Size the pools from one budget; build the host bookkeeping and this shard's pools."""
        cfg, model = self.config, self.model
        kv = model.kv_spec()
        num_attn, num_state = model.layer_ids.num_attn_layers, model.layer_ids.num_state_layers
        spec = model.state_spec(self.dtype) if num_state else None
        spec = spec or StateSpec(conv_dim=1, conv_width=1, ssm_shape=None, conv_dtype=self.dtype)
        page_bytes = 0
        if num_attn:
            page_bytes = KVPool.bytes_per_page(cfg.page_size, num_attn, kv.num_kv_heads, kv.head_dim,
                                               kv.v_head_dim, self.dtype)
        slot_bytes = spec.bytes_per_slot(num_state) if num_state else 0
        budget = cfg.cache_memory_bytes or self._default_budget()
        model_max = int(getattr(self.hf_config, "max_position_embeddings", 0) or 1 << 20)
        max_model_len = cfg.max_model_len
        if max_model_len is None:  # the model's, capped to what the KV part of the budget holds
            state_part = min(int(budget * cfg.state_pool_fraction), cfg.max_num_seqs * slot_bytes)
            kv_tokens = (budget - state_part) // page_bytes * cfg.page_size - cfg.page_size if page_bytes else model_max
            max_model_len = max(1, min(model_max, kv_tokens))
        ckpts = max_model_len // cfg.state_checkpoint_interval + 1 if cfg.enable_prefix_cache and num_state else 0
        if cfg.num_kv_pages_override or cfg.num_state_slots_override:  # exact sizes instead of the budget
            sizes = check_pool_sizes(
                PoolSizes(cfg.num_kv_pages_override or 1 + cfg.max_num_seqs * -(-max_model_len // cfg.page_size),
                          cfg.num_state_slots_override or cfg.max_num_seqs * (1 + ckpts)),
                cfg.page_size, max_model_len, min_state_slots=1 + ckpts)
        else:
            sizes = size_pools(budget, cfg.state_pool_fraction, page_bytes, slot_bytes, cfg.page_size,
                               max_model_len, min_state_slots=1 + ckpts, max_state_slots=cfg.max_num_seqs * (1 + ckpts))
        cache = CacheManager(sizes.num_kv_pages, cfg.page_size, sizes.num_state_slots, cfg.max_num_seqs,
                             max_model_len, needs_state=num_state > 0, enable_prefix_cache=cfg.enable_prefix_cache)
        kv_pool = KVPool(sizes.num_kv_pages, cfg.page_size, max(num_attn, 1), kv.num_kv_heads if kv else 1,
                         kv.head_dim if kv else 1, kv.v_head_dim if kv else 1, self.dtype, self.device)
        state_pool = StatePool(sizes.num_state_slots, max(num_state, 1), spec, self.device)
        table = RequestRowTable(cfg.max_num_seqs, max_model_len, self.device)
        return cache, ModelRunner(self.model, kv_pool, state_pool, table, self.device), max_model_len

    def _default_budget(self) -> int:
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            return int(free * self.config.gpu_memory_utilization)
        return CPU_DEFAULT_CACHE_BYTES

    # ----- requests ----------------------------------------------------------------------
    def validate_prompt(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raises ValueError naming the problem; changes nothing."""
        if not prompt_token_ids:
            raise ValueError("prompt is empty")
        vocab = self.hf_config.vocab_size
        bad = [t for t in prompt_token_ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
        total = len(prompt_token_ids) + params.max_tokens
        if total > self.max_model_len:
            raise ValueError(
                f"prompt of {len(prompt_token_ids)} tokens + max_tokens={params.max_tokens} = {total} "
                f"exceeds the context length max_model_len={self.max_model_len}"
            )

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> list[str]:
        """Queue a prompt; with n > 1, one sequence per sample (ids `request_id`, `request_id#1`, ...).
        Returns the sequence ids."""
        self.validate_prompt(prompt_token_ids, params)
        ids = []
        for i in range(params.n):
            seed = params.seed + i if params.seed is not None else self._seed_rng.getrandbits(63)
            detok = IncrementalDetokenizer(self.tokenizer, params.stop_strings, params.skip_special_tokens,
                                           params.include_stop_str_in_output)
            seq_id = request_id if i == 0 else f"{request_id}#{i}"
            req = Request(seq_id, prompt_token_ids, params, detok, self.eos_token_ids, seed, self.device)
            self.scheduler.add(req)
            ids.append(seq_id)
        return ids

    def abort(self, seq_id: str) -> None:
        for req in list(self.scheduler.running) + list(self.scheduler.waiting):
            if req.request_id == seq_id:
                req.finish_reason = "abort"
                self.scheduler.finish(req)  # its cache ops reach the shards with the next step

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # ----- the step ----------------------------------------------------------------------
    def step(self) -> list[Request]:
        """One step: schedule -> run on the shard(s) -> sample and postprocess. Returns the
        requests that produced a token (finished ones included)."""
        chunks = self.scheduler.schedule()
        plan = self._plan(chunks)
        logits = self.runner.execute(plan)
        sampling = [c.request for c in chunks if c.samples]
        tokens = sample(logits, sampling) if sampling else []
        self.scheduler.after_step(chunks)
        for req, token in zip(sampling, tokens):
            req.append_token(token)
            if req.finish_reason is not None:
                self.scheduler.finish(req)
        if self.config.check_integrity and not self.scheduler.has_unfinished():
            self.cache.check_empty()
        return sampling

    def _plan(self, chunks: list[ScheduledChunk]) -> StepPlan:
        pre_ops, post_ops = self.cache.take_ops()
        plan = StepPlan(pre_ops=pre_ops, post_ops=post_ops)
        for batch_row, chunk in enumerate(chunks):
            req, start = chunk.request, chunk.request.num_computed_tokens
            plan.req_rows.append(req.alloc.req_row)
            plan.prefix_lens.append(start)
            plan.extend_lens.append(chunk.num_tokens)
            plan.input_ids.extend(req.token_ids[start : start + chunk.num_tokens])
            if chunk.samples:
                plan.sample_rows.append(batch_row)
        return plan

    def reset_prefix_cache(self) -> None:
        self.cache.reset_prefix_cache()
        self.runner.execute(self._plan([]))  # apply any pending ops


def completion_of(req: Request, index: int) -> CompletionOutput:
    return CompletionOutput(
        index=index, text=req.detokenizer.text, token_ids=list(req.output_token_ids),
        cumulative_logprob=req.cumulative_logprob if req.logprobs is not None else None,
        logprobs=req.logprobs, finish_reason=req.finish_reason, stop_reason=req.stop_reason,
    )


def _eos_token_ids(model_dir: str, hf_config, tokenizer) -> set[int]:
    ids: set[int] = set()
    try:
        from transformers import GenerationConfig

        gen = GenerationConfig.from_pretrained(model_dir)
        eos = gen.eos_token_id
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    except (OSError, ValueError):
        pass
    eos = getattr(hf_config, "eos_token_id", None)
    ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if not ids and tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids

