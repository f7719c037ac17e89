"""Adaptive speculation depth: per step, K per request from its measured acceptance and
the batch, so that speculation is never slower than none.

A request whose drafts are each accepted with probability `a` (independently) gains, from a
verify step with k drafts, E(k) = 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a) tokens. The
step costs more than a plain decode step: every extra token adds `cost_per_token` (a
fraction of a decode step's time: small while the step is bound by reading the weights, and
growing with the batch), and any speculation at all costs `sync_cost` (a verify step is read
back before the next is planned: the host's work no longer overlaps the device's). Among the
common caps k = 0..K (each request at min(k, its own best)), the policy takes the one with the
most tokens per unit of time, and speculates only if that beats plain decoding::

    tokens(k) = sum_r E_r(min(k, k_r))      time(k) = 1 + sync_cost + cost_per_token * sum_r min(k, k_r)
    plain:      tokens = B, time = 1

Acceptance per request starts at `prior` (worth `prior_weight` drafts) and follows what its
verify steps measure; a request kept at K = 0 is probed with one draft every `probe_every`
steps so it can come back.

The cost model is a guess; the engine also reports the output tokens and duration of every
decode-only step (`observe_step`), per batch-size bucket (powers of two) and kind
(speculative or plain). In a bucket the first `min_steps` such steps run plain (the
baseline), then speculation is tried; once both are measured, the faster kind runs, and one
step in `probe_steps` runs the other to keep the comparison fresh. So speculation that is
measured slower than none is switched off, whatever the model, device or drafter.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _Acceptance:
    drafted: float
    accepted: float
    idle_steps: int = 0

    @property
    def rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


@dataclass
class _Rates:
    """Output tokens per second of plain and speculative steps in one batch-size bucket (EMA)."""

    plain: float = 0.0
    spec: float = 0.0
    plain_steps: int = 0
    spec_steps: int = 0
    since_probe: int = 0


class AdaptiveDepth:
    def __init__(self, max_depth: int, adaptive: bool = True, cost_per_token: float = 1 / 128,
                 sync_cost: float = 0.1, prior: float = 0.6, prior_weight: float = 4.0, decay: float = 0.9,
                 probe_every: int = 16, disable_by_batch_size: int | None = None, min_steps: int = 4,
                 probe_steps: int = 64, rate_decay: float = 0.8) -> None:
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        self.max_depth, self.adaptive = max_depth, adaptive
        self.cost_per_token, self.sync_cost = cost_per_token, sync_cost
        self.prior, self.prior_weight, self.decay, self.probe_every = prior, prior_weight, decay, probe_every
        self.disable_by_batch_size = disable_by_batch_size
        self.min_steps, self.probe_steps, self.rate_decay = min_steps, probe_steps, rate_decay
        self._requests: dict[str, _Acceptance] = {}
        self._rates: dict[int, _Rates] = {}
        self.trace: list[tuple] | None = None  # benchmarks: set to [] to record (kind, batch, tokens, s) per step

    def cap_batch_size(self, batch_size: int) -> None:
        """No speculation while more than `batch_size` requests run (on top of
        `disable_by_batch_size`, which stays if lower): the engine's largest verify graph."""
        if batch_size < 0:
            raise ValueError(f"batch_size must be >= 0, got {batch_size}")
        if self.disable_by_batch_size is None or batch_size < self.disable_by_batch_size:
            self.disable_by_batch_size = batch_size

    @staticmethod
    def _bucket(batch_size: int) -> int:
        return max(batch_size, 1).bit_length()

    def observe_step(self, speculative: bool, batch_size: int, num_tokens: int, seconds: float) -> None:
        """A step of `batch_size` running requests produced `num_tokens` output tokens in
        `seconds` (from the end of the previous step: host work included)."""
        if seconds <= 0:
            return
        if self.trace is not None:
            self.trace.append(("spec" if speculative else "plain", batch_size, num_tokens, round(seconds * 1e3, 3)))
        rates = self._rates.setdefault(self._bucket(batch_size), _Rates())
        rate = num_tokens / seconds
        if speculative:
            rates.spec = rate if not rates.spec_steps else self.rate_decay * rates.spec + (1 - self.rate_decay) * rate
            rates.spec_steps += 1
        else:
            rates.plain = rate if not rates.plain_steps else \
                self.rate_decay * rates.plain + (1 - self.rate_decay) * rate
            rates.plain_steps += 1

    def plain_step_due(self, batch_size: int) -> bool:
        """Run this step without speculation, by measurement: too few plain steps measured at
        this batch size yet, or speculation measured slower (then one step in `probe_steps`
        speculates anyway), or speculation measured faster (then one step in `probe_steps`
        runs plain, to keep the comparison fresh)."""
        rates = self._rates.setdefault(self._bucket(batch_size), _Rates())
        if rates.plain_steps < self.min_steps:
            return True
        if rates.spec_steps < self.min_steps:
            return False
        rates.since_probe += 1
        probe = rates.since_probe >= self.probe_steps
        if probe:
            rates.since_probe = 0
        return (rates.spec < rates.plain) != probe

    def may_speculate_soon(self, batch_size: int, lookahead: int = 2) -> bool:
        """Whether one of the next `lookahead` steps at this batch size may speculate (no
        state changes). A drafter that prepares its drafts a step ahead (MTP's pass after each
        step) skips that work, and its step may overlap, when not: speculation measured
        slower here and no probe due."""
        if not self.adaptive:
            return True
        if self.disable_by_batch_size is not None and batch_size > self.disable_by_batch_size:
            return False
        rates = self._rates.get(self._bucket(batch_size))
        if rates is None or rates.plain_steps < self.min_steps or rates.spec_steps < self.min_steps:
            return True
        return rates.spec >= rates.plain or rates.since_probe + lookahead >= self.probe_steps

    def acceptance(self, request_id: str) -> float:
        entry = self._requests.get(request_id)
        return entry.rate if entry is not None else self.prior

    def observe(self, request_id: str, num_drafts: int, num_accepted: int) -> None:
        """A verify step of `request_id` kept `num_accepted` of its `num_drafts` drafts (its
        measured acceptance decays older steps by `decay`)."""
        if num_drafts <= 0:
            return
        entry = self._entry(request_id)
        entry.drafted = entry.drafted * self.decay + num_drafts
        entry.accepted = entry.accepted * self.decay + num_accepted
        entry.idle_steps = 0

    def forget(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def _entry(self, request_id: str) -> _Acceptance:
        if request_id not in self._requests:
            self._requests[request_id] = _Acceptance(self.prior_weight, self.prior * self.prior_weight)
        return self._requests[request_id]

    @staticmethod
    def expected_tokens(rate: float, k: int) -> float:
        """E(k): tokens a verify step with k drafts yields at per-draft acceptance `rate`."""
        return float(k + 1) if rate >= 1.0 else (1.0 - rate ** (k + 1)) / (1.0 - rate)

    def depths(self, request_ids: list[str], batch_size: int) -> dict[str, int]:
        """K per request for this step (0 = no drafts). `batch_size`: requests running."""
        if not request_ids or (self.disable_by_batch_size is not None and batch_size > self.disable_by_batch_size):
            return {r: 0 for r in request_ids}
        if not self.adaptive:
            return {r: self.max_depth for r in request_ids}
        if self.plain_step_due(batch_size):
            return {r: 0 for r in request_ids}
        rates = {r: self.acceptance(r) for r in request_ids}
        own_best = {r: self._own_best(rate, batch_size) for r, rate in rates.items()}
        others = batch_size - len(request_ids)  # running but not drafting (prefill): 1 token each at most
        best_k, best_gain = 0, 1.0
        for k in range(1, self.max_depth + 1):
            ks = {r: min(k, own_best[r]) for r in request_ids}
            tokens = sum(self.expected_tokens(rates[r], ks[r]) for r in request_ids) + others
            time = 1.0 + self.sync_cost + self.cost_per_token * sum(ks.values())
            gain = tokens / time / max(batch_size, 1)
            if gain > best_gain:
                best_k, best_gain = k, gain
        out = {r: min(best_k, own_best[r]) for r in request_ids}
        for r in request_ids:  # probe requests the policy keeps off, now and then
            entry = self._entry(r)
            entry.idle_steps = entry.idle_steps + 1 if out[r] == 0 else 0
            if out[r] == 0 and entry.idle_steps >= self.probe_every:
                out[r], entry.idle_steps = 1, 0
        return out

    def _own_best(self, rate: float, batch_size: int) -> int:
        """The k where one more draft stops paying for itself for this request: the next
        draft adds rate^(k+1) tokens and costs cost_per_token of a step yielding ~batch_size."""
        k = 0
        while k < self.max_depth and rate ** (k + 1) > self.cost_per_token * max(batch_size, 1):
            k += 1
        return k
