"""LLMEngine: one replica's loop, `schedule -> run on every shard -> sample and postprocess`.

    engine.add_request(request_id, prompt_token_ids, params)   # validates; ValueError on bad input
    while engine.has_unfinished(): touched = engine.step()     # the Requests that got a token
"""
from __future__ import annotations

import gc
import logging
import random
import sys
import time
from dataclasses import dataclass

import torch

from ..device_io import PendingHostCopy
from ..mem_cache import CacheManager, PoolSetup, plan_pools
from .admission import Admission, LoadView
from .config import EngineConfig
from .detokenizer import IncrementalDetokenizer
from .request import Request, sequence_ids
from .runner import Shard, StepPlan
from .sampler import adjust_logits, record_logprobs, sample
from .sampling_params import SamplingParams
from .scheduler import ScheduledChunk, Scheduler
from .spec.decoder import SpecDecoder
from .spec.mtp import step_rows
from .spec.steps import SpeculativeSteps
from .spec.verify import VerifyRows, complete_verify
from .tokenizer import eos_token_ids
from .validation import ModelLimits, validate_prompt

logger = logging.getLogger(__name__)


@dataclass
class _Launched:
    """A queued step: its sampling requests (in batch order) and their tokens on the way back."""

    sampling: list[Request]
    tokens: PendingHostCopy | None = None
    logits: torch.Tensor | None = None  # kept when a request wants logprobs
    verify: VerifyRows | None = None  # a speculative verify step: its drafts and scratch rows
    rows: list | None = None  # the step's batch rows (MTP drafting: engine/spec/mtp.py)

    @property
    def needs_logits(self) -> bool:
        return self.logits is not None


class LLMEngine(SpeculativeSteps):
    """Rank 0 of a replica: the scheduler, cache bookkeeping and sampling, plus its own Shard.

    Start-up: load this rank's shard, decide the pools (`mem_cache.plan_pools`), send the
    `PoolSetup` to the other ranks (`channel`), build the pools. With tensor parallelism
    `channel` then carries every StepPlan to the other ranks (one broadcast per step, no RPC
    per rank); they execute the same plan on their shards, and rank 0 samples.
    """

    def __init__(self, config: EngineConfig, tokenizer=None, channel=None, on_shard_loaded=None) -> None:
        """`on_shard_loaded()`: called once this rank's weights are loaded, before the pools are
        planned and sent (a replica waits there for the other ranks, which load theirs meanwhile)."""
        self.config = config
        self.device = torch.device(config.device)
        t0 = time.perf_counter()
        self.shard = Shard(config)
        t1 = time.perf_counter()
        if on_shard_loaded is not None:
            on_shard_loaded()
        t2 = time.perf_counter()
        self.model, self.hf_config, self.dtype = self.shard.model, self.shard.hf_config, self.shard.dtype
        self.tokenizer = tokenizer
        self.channel = channel
        self.eos_token_ids = eos_token_ids(config.model, self.hf_config, tokenizer)
        layout = self.shard.pool_layout()
        self.pool_setup: PoolSetup = plan_pools(layout, self.shard.cache_budget(),
                                                config.pool_options(self.shard.model_max_len))
        short = self.pool_setup.resume_slots_short()
        if short:
            logger.warning("%d state slots for %d request rows (%d short of a running slot and a resume checkpoint "
                           "a row): with every row busy the prefix cache evicts the checkpoints later turns resume "
                           "from, and they recompute their history; raise cache_memory_bytes or state_pool_fraction",
                           self.pool_setup.num_state_slots, self.pool_setup.num_req_rows, short)
        if channel is not None:
            channel.send(self.pool_setup)
        self.shard.build_pools(self.pool_setup)
        self.runner = self.shard.runner
        # start-up, in seconds: this rank's load, waiting for the other ranks' loads, pools + warm-up + graphs
        self.startup_seconds = {"load_shard": t1 - t0, "wait_other_ranks": t2 - t1,
                                "pools_warm_up_graphs": time.perf_counter() - t2}
        if self.device.type == "cuda":
            print("hybrid-serve: engine ready: " + ", ".join(f"{k} {v:.1f} s" for k, v in self.startup_seconds.items()),
                  file=sys.stderr, flush=True)
        self.limits = ModelLimits(self.pool_setup.max_model_len, int(self.hf_config.vocab_size))
        self.cache = CacheManager.from_setup(self.pool_setup, needs_state=layout.num_state_layers > 0,
                                             enable_prefix_cache=config.enable_prefix_caching)
        self.admission = Admission(self.pool_setup.num_req_rows)
        self.scheduler = Scheduler(config, self.cache, self.admission)
        if self.device.type == "cuda":
            # start-up's objects (model, pools, compiled kernels, graphs) live as long as the
            # engine: moved out of the collector's generations, so that a full collection
            # while serving walks only what serving creates (as vLLM and SGLang do)
            gc.collect()
            gc.freeze()
        self._seed_rng = random.Random(config.seed)
        self.requests: dict[str, Request] = {}  # live sequences by id
        self.logits_hook = None  # debugging/benchmarks: called as hook(requests, logits [S, V]) each step
        self.step_timings: list[dict] | None = None  # benchmarks: set to [] to record where each step goes
        self.num_steps = 0  # steps run (a liveness/progress signal)
        self.num_invariant_violations = 0  # idle-time pool checks that failed (logged, see step())
        # queue step N+1 before reading step N's tokens back (other ranks receive rank 0's
        # sampled tokens on the device: ModelRunner.execute)
        spec_config = config.speculative_config
        self.mtp = spec_config is not None and spec_config.method == "mtp"  # MTP pass after steps (_mtp_wanted)
        self.overlap = config.async_scheduling and not self.mtp
        self._inflight: _Launched | None = None  # a queued step whose tokens are not read yet
        self.num_generated_tokens = 0  # output tokens appended so far (all requests)
        self._last_step_end: float | None = None  # when the last step returned (speculation's timing)
        self.spec: SpecDecoder | None = None  # speculative decoding (engine/spec/)
        if config.speculative_config is not None:
            rows = self.pool_setup.scratch_rows if layout.num_state_layers else \
                config.speculative_config.verify_rows(config.max_num_seqs)
            self.spec = SpecDecoder(config.speculative_config, int(self.hf_config.vocab_size), rows,
                                    self.device.type, target_config=config, max_model_len=self.limits.max_model_len,
                                    verify_graph_rows=self.runner.verify_graphs.sizes[-1] if self.verify_graph_k else None)

    @property
    def verify_graph_k(self) -> int:
        """Drafts per row of the verify graphs' steps (0: no verify graphs)."""
        graphs = getattr(self.runner, "verify_graphs", None)
        return graphs.tokens_per_row - 1 if graphs is not None else 0

    @property
    def max_model_len(self) -> int:
        return self.limits.max_model_len

    # ----- requests ----------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    validated: bool = False) -> list[str]:
        """Queue a prompt; with n > 1, one sequence per sample (ids `request_id`, `request_id#1`, ...).
        Returns the sequence ids. Raises ValueError naming the problem unless the caller has
        already run `validate_prompt` against `self.limits` (`validated=True`)."""
        if not validated:
            validate_prompt(prompt_token_ids, params, self.limits)
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
        if self.spec is not None:
            self.spec.forget(seq_id)
        if not self.scheduler.has_unfinished():
            self._execute(self._plan([]))  # no next step will carry the release: apply it now

    def get_request(self, seq_id: str) -> Request | None:
        return self.requests.get(seq_id)

    def load_view(self) -> LoadView:
        """Running and waiting sequences, free rows, slots and pages: what admission decides from."""
        return self.scheduler.load_view()

    def take_cache_events(self) -> list:
        """The prefix cache's events since the last call (mem_cache.CacheEvent), for the router."""
        return self.cache.take_events()

    def stats(self) -> dict[str, float]:
        """Gauges and cumulative counters for metrics."""
        cache = self.cache.stats
        return {"running": len(self.scheduler.running), "waiting": len(self.scheduler.waiting),
                **self.cache.usage(), "prefix_queries": cache.prefix_queries,
                "prefix_query_tokens": cache.prefix_query_tokens, "kv_hit_tokens": cache.kv_hit_tokens,
                "checkpoint_hit_tokens": cache.checkpoint_hit_tokens, "evicted_pages": cache.evicted_pages,
                "evicted_checkpoints": cache.evicted_checkpoints, "preemptions": self.scheduler.num_preemptions,
                "invariant_violations": self.num_invariant_violations, **self._spec_stats()}

    def _spec_stats(self) -> dict[str, float]:
        if self.spec is None:
            return {}
        st = self.spec.stats
        out = {"spec_verify_rows": st.num_verify_rows, "spec_draft_tokens": st.num_draft_tokens,
               "spec_accepted_tokens": st.num_accepted_tokens}
        out.update({f"spec_accepted_tokens_pos{i}": n for i, n in enumerate(st.accepted_per_position)})
        return out

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self._inflight is not None

    # ----- the step ----------------------------------------------------------------------
    # Overlap: step N is queued on the device (forward, sampling, the tokens' copy back), then
    # the host finishes step N-1 (reads its tokens, detokenizes, checks stops) while the GPU
    # runs N. Step N's decode rows take step N-1's tokens from the device (input id -1, see
    # model_runner.py); a request found finished by N-1 has computed one extra token in N,
    # which is dropped (its KV and state are those of real tokens and are released after N).
    # Requests that want logprobs are finished in their own step (their logits are read).
    # Speculative verify steps generalise this: a request's accepted length stays on the
    # device with its last token, and the next step's inputs are built there (the K=0 case
    # is exactly the pending token above); see engine/spec/__init__.py.
    def step(self) -> list[Request]:
        """One step: schedule -> queue on the shard(s) -> finish the previous step (or, without
        overlap, this one). Returns the requests that got a token (finished ones included)."""
        wanted = self._spec_depths() if self.spec is not None else {}
        if wanted:
            return self._timed(True, self._verify_step, wanted)
        if self.spec is not None:
            return self._timed(False, self._plain_step)
        return self._plain_step()

    def _plain_step(self) -> list[Request]:
        chunks = self.scheduler.schedule()
        launched = self._launch(chunks)
        outputs = self._complete(self._inflight) if self._inflight is not None else []
        self._inflight = None
        self.scheduler.after_step(chunks)
        for req in launched.sampling:
            if not req.finished:
                req.num_pending_tokens += 1
        mtp_pass = self.mtp and self._mtp_wanted()
        overlap = self.overlap or (self.mtp and self.config.async_scheduling and not mtp_pass)
        if overlap and launched.sampling and not launched.needs_logits:
            self._inflight = launched
        else:
            outputs += self._complete(launched)
            if mtp_pass:
                self._mtp_pass(launched)
        if self.config.check_integrity and not self.has_unfinished():
            self._check_idle_invariants()
        return outputs

    def _finish(self, req: Request) -> None:
        self.scheduler.finish(req)
        self.requests.pop(req.request_id, None)
        if self.spec is not None:
            self.spec.forget(req.request_id)

    def _check_idle_invariants(self) -> None:
        """Idle: the pools' used pages and slots are exactly the prefix tree's (counts only,
        O(1) whatever the pool size). A violation is logged and counted
        (hybrid_serve_pool_invariant_violations_total), and serving goes on."""
        try:
            self.cache.check_empty(full=False)
        except AssertionError as exc:
            self.num_invariant_violations += 1
            logger.error("pool invariant violated while idle (%d so far): %s", self.num_invariant_violations, exc)

    def _launch(self, chunks: list[ScheduledChunk]) -> "_Launched":
        """Queue a step's cache ops, forward and sampling; nothing waits for the device."""
        plan = self._plan(chunks)
        logits = self._execute(plan)
        self.num_steps += 1
        sampling = [c.request for c in chunks if c.samples]
        rows = step_rows(chunks) if self.mtp else None
        if not sampling:
            return _Launched(sampling, rows=rows)
        needs_logits = any(r.logprobs is not None for r in sampling)
        if plan.sample_counts:  # verify: every verified position samples, as plain decoding would
            verify = VerifyRows.of(chunks, plan.sample_counts)
            logits = adjust_logits(logits, verify.row_requests, verify.row_offsets)
            tokens = sample(logits, verify.row_requests, verify.row_offsets)  # [sum counts]
            return _Launched(sampling, PendingHostCopy(tokens), logits if needs_logits else None, verify, rows)
        if self.logits_hook is not None:
            self.logits_hook(sampling, logits)
        logits = adjust_logits(logits, sampling)
        tokens = sample(logits, sampling)  # [S] on the device
        self.runner.record_sampled(plan, tokens)
        return _Launched(sampling, PendingHostCopy(tokens), logits if needs_logits else None, rows=rows)

    def _complete(self, launched: "_Launched") -> list[Request]:
        """Read a launched step's tokens back and hand them to their requests."""
        if not launched.sampling:
            return []
        tokens = launched.tokens.wait().tolist()
        if launched.verify is not None:
            return complete_verify(self, launched.verify, tokens, launched.logits)
        if launched.logits is not None:
            record_logprobs(launched.logits, tokens, launched.sampling)
        outputs = []
        for req, token in zip(launched.sampling, tokens):
            if req.finished:  # aborted, or ended by the step before: this token is extra
                continue
            req.num_pending_tokens -= 1
            req.append_token(token)
            self.num_generated_tokens += 1
            if req.finish_reason is not None:
                self._finish(req)
            outputs.append(req)
        return outputs

    def _plan(self, chunks: list[ScheduledChunk]) -> StepPlan:
        pre_ops, post_ops = self.cache.take_ops()
        plan = StepPlan(pre_ops=pre_ops, post_ops=post_ops)
        counts, verify_row = [], 0
        scratch = self.pool_setup.scratch_rows > 0
        for batch_row, chunk in enumerate(chunks):
            req, start, n = chunk.request, chunk.request.num_computed_tokens, chunk.num_real_tokens
            plan.req_rows.append(req.alloc.req_row)
            plan.prefix_lens.append(start)
            plan.extend_lens.append(chunk.num_tokens)
            ids = req.token_ids[start : start + n]
            if len(ids) < n:
                ids = ids + [-1] * (n - len(ids))  # -1: pending, on the device
                plan.has_pending = True
            plan.input_ids.extend(ids + chunk.draft_tokens)
            if chunk.samples:
                plan.sample_rows.append(batch_row)
                counts.append(1 + len(chunk.draft_tokens))
            plan.checkpoints.extend((batch_row, offset, slot) for offset, slot in chunk.checkpoints)
            if chunk.draft_tokens and scratch:  # the state after each but the last verified token
                plan.checkpoints.extend((batch_row, step + 1, self.pool_setup.scratch_slot(verify_row, step))
                                        for step in range(len(chunk.draft_tokens)))
                verify_row += 1
        if any(c > 1 for c in counts):
            plan.sample_counts = counts
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
