"""The engine's speculative steps (a mixin of LLMEngine, engine/engine.py): the adaptive
depth's choice per step, the verify step, the timing the depth learns from, and MTP's
drafting pass after a step. They use the engine's scheduler, cache, runner and step
primitives (`_launch`, `_complete`, `_plan`, `_execute`); how a verify step runs and why it
does not overlap: engine/spec/__init__.py.
"""
from __future__ import annotations

import time

from .mtp import build_mtp_plan


class SpeculativeSteps:
    def _spec_depths(self) -> dict:
        """The adaptive depth's K per decoding request this step ({}: no speculation)."""
        running = self.scheduler.running
        candidates = [r for r in running if r.num_tokens_to_compute == 1 and not r.sampled_last_token]
        return self.spec.wants_drafts(candidates, len(running))

    def _timed(self, speculative: bool, run, *args) -> list:
        """Run a step; report decode-only steps' output tokens and time (from the previous
        step's end) to the adaptive depth, so it can compare speculation with none."""
        batch = len(self.scheduler.running)
        decode_only = batch > 0 and all(r.num_tokens_to_compute == 1 for r in self.scheduler.running)
        before = self.num_generated_tokens
        outputs = run(*args)
        now = time.perf_counter()
        if decode_only and self._last_step_end is not None:
            self.spec.depth.observe_step(speculative, batch, self.num_generated_tokens - before,
                                         now - self._last_step_end)
        self._last_step_end = now
        return outputs

    def _verify_step(self, wanted: dict) -> list:
        """A step with speculative drafts. Host drafters need each request's last token, so
        the step in flight is read back first and this one completes before the next is
        planned (no overlap while speculating: engine/spec/__init__.py)."""
        outputs = self._complete(self._inflight) if self._inflight is not None else []
        self._inflight = None
        decode_rows = self.scheduler.decode_candidates()
        candidates = set(decode_rows)
        wanted = {r: k for r, k in wanted.items() if r in candidates}
        max_rows = min(self.spec.max_verify_rows, self.runner.verify_graphs.sizes[-1]) if self.verify_graph_k else 0
        if self.verify_graph_k and len(decode_rows) <= max_rows and self.spec.config.method != "draft_model":
            # the step pads every decoding row to K drafts (below): a shorter depth, or none,
            # would cost the same and yield less, so every row drafts K (the adaptive depth's
            # choice is then only whether to speculate, which it makes by measured step rates;
            # a draft model's extra drafts are not free: not for it)
            wanted = {r: min(self.verify_graph_k, r.params.max_tokens - r.num_output_tokens - 1) for r in decode_rows}
            wanted = {r: k for r, k in wanted.items() if k > 0}
        drafts = self.spec.propose(wanted)
        if self.verify_graph_k:  # verify graphs replay steps whose rows all verify K drafts
            drafts = self.spec.pad(drafts, decode_rows, self.verify_graph_k, max_rows, self.max_model_len)
        chunks = self.scheduler.schedule(drafts)
        launched = self._launch(chunks)
        self.scheduler.after_step(chunks)
        for req in launched.sampling:
            if not req.finished:
                req.num_pending_tokens += 1
        outputs += self._complete(launched)
        if self.mtp:
            self._mtp_pass(launched)
        if self.config.check_integrity and not self.has_unfinished():
            self._check_idle_invariants()
        return outputs

    def _mtp_wanted(self) -> bool:
        """MTP's pass after a plain step only while the adaptive depth may speculate soon:
        where plain decoding measured faster, plain steps skip it and overlap again (the MTP
        layers' KV then misses those positions: later drafts are worse, outputs unchanged)."""
        return self.spec.depth.may_speculate_soon(len(self.scheduler.running))

    def _mtp_pass(self, launched) -> None:
        """After a completed step: extend the MTP layers' KV over its verified positions and
        draft for the requests that decode next (engine/spec/mtp.py)."""
        if not launched.rows:
            return
        max_context = self.pool_setup.max_model_len

        def ensure_kv(req, seq_len: int) -> bool:
            return seq_len <= max_context and self.cache.ensure_kv(req.alloc, seq_len)

        mtp_plan, drafting = build_mtp_plan(launched.rows, self.spec.config.num_speculative_tokens, ensure_kv)
        if not mtp_plan.req_rows:
            return
        plan = self._plan([])
        plan.mtp = mtp_plan
        drafts = self._execute(plan)
        if drafts is None:
            return
        for req, tokens in zip(drafting, drafts.tolist()):
            self.spec.drafter.supply(req.request_id, len(req.token_ids), tokens)
