"""LLMEngine: one replica's loop, `schedule -> run on every shard -> sample and postprocess`.

    engine.add_request(request_id, prompt_token_ids, params)   # validates; ValueError on bad input
    while engine.has_unfinished(): outputs = engine.step()     # RequestOutput of each request touched
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass

import torch

from ..device_io import PendingHostCopy
from ..mem_cache import CacheManager
from ..mem_cache.sizing import PoolSizes, check_pool_sizes, size_pools
from .config import EngineConfig
from .detokenizer import IncrementalDetokenizer
from .outputs import CompletionOutput
from .request import Request
from .sampler import mask_early_stops, record_logprobs, sample
from .sampling_params import SamplingParams
from .scheduler import ScheduledChunk, Scheduler
from .shard import CacheLayout, PoolSetup, Shard
from .step_plan import StepPlan


@dataclass
class _Launched:
    """A queued step: its sampling requests (in batch order) and their tokens on the way back."""

    sampling: list[Request]
    tokens: PendingHostCopy | None = None
    logits: torch.Tensor | None = None  # kept when a request wants logprobs

    @property
    def needs_logits(self) -> bool:
        return self.logits is not None


class LLMEngine:
    """Rank 0 of a replica: the scheduler, cache bookkeeping and sampling, plus its own Shard.

    With tensor parallelism, `channel` carries PoolSetup and every StepPlan to the other
    ranks (one broadcast per step, no RPC per rank); they execute the same plan on their
    shards, and rank 0 samples from the gathered logits.
    """

    def __init__(self, config: EngineConfig, tokenizer=None, channel=None) -> None:
        self.config = config
        self.device = torch.device(config.device)
        self.shard = Shard(config)
        self.model, self.hf_config, self.dtype = self.shard.model, self.shard.hf_config, self.shard.dtype
        self.tokenizer = tokenizer
        self.channel = channel
        self.eos_token_ids = _eos_token_ids(config.model, self.hf_config, tokenizer)
        layout = self.shard.cache_layout()
        setup, ckpts = plan_pools(config, layout, self.shard.default_budget(), self.hf_config)
        self.max_model_len = setup.max_model_len
        if channel is not None:
            channel.send(setup)
        self.shard.build_pools(setup)
        self.runner = self.shard.runner
        self.cache = CacheManager(setup.sizes.num_kv_pages, config.page_size, setup.sizes.num_state_slots,
                                  config.max_num_seqs, setup.max_model_len, needs_state=layout.num_state_layers > 0,
                                  enable_prefix_cache=config.enable_prefix_cache)
        self.scheduler = Scheduler(config, self.cache)
        self._seed_rng = random.Random(config.seed)
        self.requests: dict[str, Request] = {}  # live sequences by id
        self.logits_hook = None  # debugging/benchmarks: called as hook(requests, logits [S, V]) each step
        self.step_timings: list[dict] | None = None  # benchmarks: set to [] to record where each step goes
        self.num_steps = 0  # steps run (a liveness/progress signal)
        # queue step N+1 before reading step N's tokens back (other ranks receive rank 0's
        # sampled tokens from it on the device: ModelRunner.sync_last_tokens)
        self.overlap = config.async_scheduling
        self._inflight: _Launched | None = None  # a queued step whose tokens are not read yet

    # ----- requests ----------------------------------------------------------------------
    def validate_prompt(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raises ValueError naming the problem; changes nothing."""
        validate_prompt(prompt_token_ids, params, self.hf_config.vocab_size, self.max_model_len)

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> list[str]:
        """Queue a prompt; with n > 1, one sequence per sample (ids `request_id`, `request_id#1`, ...).
        Returns the sequence ids."""
        self.validate_prompt(prompt_token_ids, params)
        ids = sequence_ids(request_id, params.n)
        for i, seq_id in enumerate(ids):
            seed = params.seed + i if params.seed is not None else self._seed_rng.getrandbits(63)
            detok = IncrementalDetokenizer(self.tokenizer, params.stop_strings, params.skip_special_tokens,
                                           params.include_stop_str_in_output)
            req = Request(seq_id, prompt_token_ids, params, detok, self.eos_token_ids, seed, self.device)
            self.requests[seq_id] = req
            self.scheduler.add(req)
        return ids

    def abort(self, seq_id: str) -> None:
        """End a sequence now (finish_reason "abort"), releasing what it holds."""
        req = self.requests.pop(seq_id, None)
        if req is None or req.finished:
            return
        req.finish_reason = "abort"
        self.scheduler.finish(req)
        if not self.scheduler.has_unfinished():
            self._execute(self._plan([]))  # no next step will carry the release: apply it now

    def get_request(self, seq_id: str) -> Request | None:
        return self.requests.get(seq_id)

    def stats(self) -> dict[str, float]:
        """Gauges and cumulative counters for metrics."""
        cache = self.cache.stats
        return {"running": len(self.scheduler.running), "waiting": len(self.scheduler.waiting),
                **self.cache.usage(), "prefix_queries": cache.prefix_queries,
                "prefix_query_tokens": cache.prefix_query_tokens, "kv_hit_tokens": cache.kv_hit_tokens,
                "checkpoint_hit_tokens": cache.checkpoint_hit_tokens, "evicted_pages": cache.evicted_pages,
                "evicted_checkpoints": cache.evicted_checkpoints, "preemptions": self.scheduler.num_preemptions}

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self._inflight is not None

    # ----- the step ----------------------------------------------------------------------
    # Overlap: step N is queued on the device (forward, sampling, the tokens' copy back), then
    # the host finishes step N-1 (reads its tokens, detokenizes, checks stops) while the GPU
    # runs N. Step N's decode rows take step N-1's tokens from the device (input id -1, see
    # model_runner.py); a request found finished by N-1 has computed one extra token in N,
    # which is dropped (its KV and state are those of real tokens and are released after N).
    # Requests that want logprobs are finished in their own step (their logits are read).
    def step(self) -> list[Request]:
        """One step: schedule -> queue on the shard(s) -> finish the previous step (or, without
        overlap, this one). Returns the requests that got a token (finished ones included)."""
        chunks = self.scheduler.schedule()
        launched = self._launch(chunks)
        outputs = self._complete(self._inflight) if self._inflight is not None else []
        self._inflight = None
        self.scheduler.after_step(chunks)
        for req in launched.sampling:
            if not req.finished:
                req.num_pending_tokens += 1
        if self.overlap and launched.sampling and not launched.needs_logits:
            self._inflight = launched
        else:
            outputs += self._complete(launched)
        if self.config.check_integrity and not self.has_unfinished():
            self.cache.check_empty()
        return outputs

    def _launch(self, chunks: list[ScheduledChunk]) -> "_Launched":
        """Queue a step's cache ops, forward and sampling; nothing waits for the device."""
        plan = self._plan(chunks)
        logits = self._execute(plan)
        self.num_steps += 1
        sampling = [c.request for c in chunks if c.samples]
        if not sampling:
            return _Launched(sampling)
        if self.logits_hook is not None:
            self.logits_hook(sampling, logits)
        logits = mask_early_stops(logits, sampling)
        tokens = sample(logits, sampling)  # [S] on the device
        self.runner.record_sampled(plan, tokens)
        needs_logits = any(r.logprobs is not None for r in sampling)
        return _Launched(sampling, PendingHostCopy(tokens), logits if needs_logits else None)

    def _complete(self, launched: "_Launched") -> list[Request]:
        """Read a launched step's tokens back and hand them to their requests."""
        if not launched.sampling:
            return []
        tokens = launched.tokens.wait().tolist()
        if launched.logits is not None:
            record_logprobs(launched.logits, tokens, launched.sampling)
        outputs = []
        for req, token in zip(launched.sampling, tokens):
            if req.finished:  # aborted, or ended by the step before: this token is extra
                continue
            req.num_pending_tokens -= 1
            req.append_token(token)
            if req.finish_reason is not None:
                self.scheduler.finish(req)
                self.requests.pop(req.request_id, None)
            outputs.append(req)
        return outputs

    def _plan(self, chunks: list[ScheduledChunk]) -> StepPlan:
        pre_ops, post_ops = self.cache.take_ops()
        plan = StepPlan(pre_ops=pre_ops, post_ops=post_ops)
        for batch_row, chunk in enumerate(chunks):
            req, start = chunk.request, chunk.request.num_computed_tokens
            plan.req_rows.append(req.alloc.req_row)
            plan.prefix_lens.append(start)
            plan.extend_lens.append(chunk.num_tokens)
            ids = req.token_ids[start : start + chunk.num_tokens]
            if len(ids) < chunk.num_tokens:
                ids = ids + [-1] * (chunk.num_tokens - len(ids))  # -1: pending, on the device
                plan.has_pending = True
            plan.input_ids.extend(ids)
            if chunk.samples:
                plan.sample_rows.append(batch_row)
        return plan

    def reset_prefix_cache(self) -> None:
        self.cache.reset_prefix_cache()
        self._execute(self._plan([]))  # carries the pending cache ops

    def _execute(self, plan: StepPlan):
        """Run a plan on every shard: broadcast to the other ranks, then run shard 0."""
        if self.step_timings is not None and plan.has_forward:
            return self._execute_timed(plan)
        if self.channel is not None:
            self.channel.send(plan)
        return self.shard.execute(plan)

    def _execute_timed(self, plan: StepPlan):
        """_execute, recording the broadcast's host time, the execute call's host time and CUDA
        events around it (benchmarks only: nothing waits here; once the device has caught up,
        e.g. after a synchronize, the GPU time is `start.elapsed_time(end)` of entry["events"])."""
        t0 = time.perf_counter()
        if self.channel is not None:
            self.channel.send(plan)
        t1 = time.perf_counter()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        logits = self.shard.execute(plan)
        end.record()
        self.step_timings.append({"broadcast_ms": (t1 - t0) * 1e3, "execute_ms": (time.perf_counter() - t1) * 1e3,
                                  "events": (start, end), "batch": len(plan.req_rows)})
        return logits


def validate_prompt(prompt_token_ids: list[int], params: SamplingParams, vocab_size: int, max_model_len: int) -> None:
    """Raises ValueError naming the problem with a prompt (empty, unknown ids, too long)."""
    if not prompt_token_ids:
        raise ValueError("prompt is empty")
    bad = [t for t in prompt_token_ids if not isinstance(t, int) or not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})")
    bad_stops = [t for t in params.stop_token_ids if t >= vocab_size]
    if bad_stops:
        raise ValueError(f"stop_token_ids {bad_stops[:5]} are outside the vocabulary [0, {vocab_size})")
    total = len(prompt_token_ids) + params.max_tokens
    if total > max_model_len:
        raise ValueError(f"prompt of {len(prompt_token_ids)} tokens + max_tokens={params.max_tokens} = {total} "
                         f"exceeds the context length max_model_len={max_model_len}")


def plan_pools(cfg: EngineConfig, layout: CacheLayout, default_budget: int, hf_config) -> tuple[PoolSetup, int]:
    """Pool sizes and max_model_len from one budget (or the explicit overrides); returns the
    setup and the number of prefix-cache checkpoints one request may hold."""
    page_bytes, slot_bytes = layout.kv_bytes_per_page, layout.state_bytes_per_slot
    budget = cfg.cache_memory_bytes or default_budget
    model_max = int(getattr(hf_config, "max_position_embeddings", 0) or 1 << 20)
    max_model_len = cfg.max_model_len
    if max_model_len is None:  # the model's, capped to what the KV part of the budget holds
        state_part = min(int(budget * cfg.state_pool_fraction), cfg.max_num_seqs * slot_bytes)
        kv_tokens = (budget - state_part) // page_bytes * cfg.page_size - cfg.page_size if page_bytes else model_max
        max_model_len = max(1, min(model_max, kv_tokens))
    ckpts = max_model_len // cfg.state_checkpoint_interval + 1 if cfg.enable_prefix_cache and layout.num_state_layers else 0
    if cfg.num_kv_pages_override or cfg.num_state_slots_override:  # exact sizes instead of the budget
        sizes = check_pool_sizes(
            PoolSizes(cfg.num_kv_pages_override or 1 + cfg.max_num_seqs * -(-max_model_len // cfg.page_size),
                      cfg.num_state_slots_override or cfg.max_num_seqs * (1 + ckpts)),
            cfg.page_size, max_model_len, min_state_slots=1 + ckpts)
    else:
        sizes = size_pools(budget, cfg.state_pool_fraction, page_bytes, slot_bytes, cfg.page_size, max_model_len,
                           min_state_slots=1 + ckpts, max_state_slots=cfg.max_num_seqs * (1 + ckpts))
    return PoolSetup(sizes, max_model_len), ckpts


def sequence_ids(request_id: str, n: int) -> list[str]:
    """The ids of a request's n samples: `request_id`, `request_id#1`, ..."""
    return [request_id] + [f"{request_id}#{i}" for i in range(1, n)]


def run_batch(engine: LLMEngine, items: list[tuple[str, list[int], SamplingParams]],
              finished: dict | None = None) -> dict[str, dict]:
    """Run requests (request_id, prompt ids, params) to completion. Returns request_id ->
    {"outputs": [CompletionOutput per sample], "num_cached_tokens": int}. `finished` (seq id ->
    Request) fills as sequences end, so a caller can tell what completed if a step raises."""
    finished = {} if finished is None else finished
    seqs = {rid: engine.add_request(rid, ids, p) for rid, ids, p in items}
    while engine.has_unfinished():
        for req in engine.step():
            if req.finished:
                finished[req.request_id] = req
    return {rid: batch_result([finished[s] for s in ss]) for rid, ss in seqs.items()}


def start_decode_batch(engine: LLMEngine, batch: int, prompt_len: int, max_tokens: int, token_high: int,
                       seed: int, prefix: str = "bench") -> list[str]:
    """Benchmarks: queue `batch` greedy requests of random prompts (token ids in [10,
    token_high)), run their prefill and 3 warm-up decode steps (graph capture), so that every
    following step is a pure decode step of the whole batch. Returns the sequence ids."""
    gen = torch.Generator().manual_seed(seed)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request(f"{prefix}{i}", torch.randint(10, token_high, (prompt_len,), generator=gen).tolist(),
                              params)[0] for i in range(batch)]
    while engine.scheduler.waiting or any(r.num_computed_tokens < r.prompt_len for r in engine.scheduler.running):
        engine.step()
    for _ in range(3):
        engine.step()
    return ids


def batch_result(reqs: list[Request]) -> dict:
    return {"outputs": [completion_of(r, i) for i, r in enumerate(reqs)],
            "num_cached_tokens": reqs[0].num_cached_tokens or 0}


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

