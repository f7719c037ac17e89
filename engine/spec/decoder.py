"""SpecDecoder: what the engine asks of speculation each step. It owns the drafter (built
from the SpeculativeConfig), the adaptive depth and the counters::

    drafts = spec.propose(candidates, num_running)   # request -> draft tokens (the K of this step)
    ... verify step ...
    spec.record(request, num_drafts, num_accepted)   # per verified request
    spec.forget(request)                              # finished

Candidates are running requests that decode (one token to compute, none pending); a
request's drafts never run past its max_tokens (k <= tokens left - 1: the verify step adds
one token of the target's own).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .config import SpeculativeConfig
from .depth import AdaptiveDepth
from .drafter import DraftRequest, Drafter
from .mtp import MtpDrafter
from .ngram import NgramDrafter
from .remote import RemoteDrafter
from .suffix import SuffixDrafter
from .synthetic import SyntheticDrafter


@dataclass
class SpecStats:
    """Cumulative counters (metrics): verify rows with drafts, tokens drafted and accepted,
    and accepted tokens by draft position (index i: draft i+1 kept)."""

    num_verify_rows: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per verify row (accepted drafts + the target's own token)."""
        return 1.0 + self.num_accepted_tokens / self.num_verify_rows if self.num_verify_rows else 0.0


def make_drafter(config: SpeculativeConfig, vocab_size: int, target_config=None, max_model_len: int = 0,
                 max_requests: int = 0) -> Drafter:
    """The drafter of `config.method`; a draft model also needs the target's EngineConfig,
    context length and verify rows per step (its engine is sized from them)."""
    if config.method == "draft_model":
        from .draft_model import DraftModelDrafter

        if target_config is None:
            raise ValueError("a draft model drafter needs the target engine's config")
        return DraftModelDrafter(config.model, target_config, max_model_len, max(1, max_requests), vocab_size)
    if config.method == "ngram":
        return NgramDrafter(config.prompt_lookup_min, config.prompt_lookup_max)
    if config.method == "remote":
        return RemoteDrafter()
    if config.method == "mtp":  # drafts supplied by the engine's MTP pass after each step
        return MtpDrafter()
    if config.method == "suffix":  # the replica attaches the cluster-wide index's local copy
        return SuffixDrafter()
    if config.method == "synthetic":
        return SyntheticDrafter(config.continuations, config.acceptance_rate, vocab_size, config.seed,
                                vary_length=config.vary_length)
    raise ValueError(f"speculative method {config.method!r} is not implemented")


class SpecDecoder:
    def __init__(self, config: SpeculativeConfig, vocab_size: int, max_verify_rows: int, device_type: str,
                 drafter: Drafter | None = None, target_config=None, max_model_len: int = 0,
                 verify_graph_rows: int | None = None) -> None:
        self.config = config
        self.drafter = drafter if drafter is not None else make_drafter(config, vocab_size, target_config,
                                                                        max_model_len, max_verify_rows)
        self.max_verify_rows = max_verify_rows
        cost = 1 / 128 if device_type == "cuda" else 1 / 32  # see depth.py; CPU steps grow with tokens sooner
        self.depth = AdaptiveDepth(config.num_speculative_tokens, config.adaptive, cost_per_token=cost,
                                   disable_by_batch_size=config.disable_by_batch_size)
        if verify_graph_rows is not None and config.adaptive:
            # a verify step of more rows than the largest verify graph runs eagerly, ~10x a graph
            # step on a GPU (and the probes that measure it cost as much): adaptive depth does
            # not speculate at those batch sizes
            self.depth.cap_batch_size(verify_graph_rows)
        self.stats = SpecStats(accepted_per_position=[0] * config.num_speculative_tokens)
        self.proposed: dict = {}  # request -> drafts proposed this step (before any padding)

    def wants_drafts(self, candidates: list, num_running: int) -> dict:
        """request -> K for this step, the requests with K > 0 only (at most max_verify_rows)."""
        if not candidates or self.max_verify_rows == 0:
            return {}
        depths = self.depth.depths([r.request_id for r in candidates], num_running)
        wanted = {}
        for req in candidates:
            k = min(depths[req.request_id], req.params.max_tokens - req.num_output_tokens - 1)
            if k > 0 and len(wanted) < self.max_verify_rows:
                wanted[req] = k
        return wanted

    def propose(self, wanted: dict) -> dict:
        """request -> its draft tokens (non-empty only) for the K's `wants_drafts` chose; their
        counts stay in `proposed` until the next call (what `record` is told, padding aside)."""
        self.proposed = {}
        if not wanted:
            return {}
        requests = list(wanted)
        asks = [DraftRequest(r.request_id, r.token_ids, wanted[r], r.prompt_len) for r in requests]
        proposals = self.drafter.propose(asks)
        for r, p in zip(requests, proposals):
            if not p:  # no guess: counts as one rejected draft, so the depth turns such requests off
                self.depth.observe(r.request_id, 1, 0)
        drafts = {r: list(p[: wanted[r]]) for r, p in zip(requests, proposals) if p}
        self.proposed = {r: len(d) for r, d in drafts.items()}
        return drafts

    def pad(self, drafts: dict, decode_rows: list, k: int, max_rows: int, max_model_len: int) -> dict:
        """Every decoding row with exactly k drafts, for verify graphs (engine/runner/cuda_graph.py
        replays steps whose rows all verify k): shorter proposals (a short guess, k capped by
        max_tokens) and rows without one are padded with a repeat of their last token. A padding
        token is verified like any draft: kept only where the target itself produces it (outputs
        unchanged at any temperature; past max_tokens or a stop nothing is kept); `record` is
        told only the proposed ones. Unpadded when no row has drafts, more than `max_rows`
        decode, or a row's drafts would pass max_model_len."""
        if not drafts or len(decode_rows) > max_rows:
            return drafts
        padded = {}
        for req in decode_rows:
            if req.num_computed_tokens + k >= max_model_len:  # the drafts' positions must fit
                return drafts
            real = drafts.get(req, [])
            padded[req] = real + [real[-1] if real else req.token_ids[-1]] * (k - len(real))
        return padded

    def record(self, request_id: str, num_drafts: int, num_accepted: int) -> None:
        self.depth.observe(request_id, num_drafts, num_accepted)
        self.stats.num_verify_rows += 1
        self.stats.num_draft_tokens += num_drafts
        self.stats.num_accepted_tokens += num_accepted
        for i in range(num_accepted):
            self.stats.accepted_per_position[i] += 1

    def forget(self, request_id: str) -> None:
        self.depth.forget(request_id)
        forget = getattr(self.drafter, "forget", None)
        if forget is not None:
            forget(request_id)
