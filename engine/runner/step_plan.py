"""StepPlan: the one message a step sends to every shard (new requests travel as token ids
within it; the host keeps everything else).

    pre_ops   : cache ops applied before the forward (row maps, KV slots, resets, COW copies)
    post_ops  : cache ops applied after the forward (state checkpoint snapshots)
    req_rows / prefix_lens / extend_lens : one entry per batch row
    input_ids : the batch's new tokens back to back (T = sum(extend_lens)); -1 = the token
                the previous step sampled for that request row, still on the device
    has_pending : some input id is -1 (ranks > 0 first receive rank 0's sampled tokens)
    sample_rows : batch rows whose last token's logits are wanted
    sample_counts : per sample row, how many of its last tokens' logits are wanted (speculative
                  verify: 1 + drafts); empty = 1 each. Logits come back row after row.
    checkpoints : (batch row, offset, state slot): the state kernels write the state after
                  `offset` of that row's tokens into the slot (prefix-cache checkpoints
                  inside the step's tokens)
    mtp       : an MTP drafting pass over the previous step's rows (MtpPlan), instead of a
                forward; `execute` then returns the drafts
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...mem_cache import CacheOps


@dataclass
class MtpPlan:
    """The MTP pass after a step (engine/spec/mtp.py): per batch row of the pass, the request
    row, the first position p and the number of positions; per position the index of its
    h_p among the previous step's final hidden states and the token x_{p+1}. Rows
    `draft_rows` (batch rows of this pass, each ending at its request's last computed
    position) then chain `num_draft_tokens - 1` more steps; the KV slots of those positions
    are mapped by the plan's pre-ops."""

    req_rows: list[int] = field(default_factory=list)
    prefix_lens: list[int] = field(default_factory=list)
    extend_lens: list[int] = field(default_factory=list)
    hidden_rows: list[int] = field(default_factory=list)
    next_ids: list[int] = field(default_factory=list)
    draft_rows: list[int] = field(default_factory=list)
    num_draft_tokens: int = 0


@dataclass
class StepPlan:
    pre_ops: CacheOps = field(default_factory=CacheOps)
    post_ops: CacheOps = field(default_factory=CacheOps)
    req_rows: list[int] = field(default_factory=list)
    prefix_lens: list[int] = field(default_factory=list)
    extend_lens: list[int] = field(default_factory=list)
    input_ids: list[int] = field(default_factory=list)
    has_pending: bool = False
    sample_rows: list[int] = field(default_factory=list)
    sample_counts: list[int] = field(default_factory=list)
    checkpoints: list[tuple[int, int, int]] = field(default_factory=list)
    mtp: MtpPlan | None = None

    @property
    def num_logits(self) -> int:
        return sum(self.sample_counts) if self.sample_counts else len(self.sample_rows)

    @property
    def has_forward(self) -> bool:
        return bool(self.req_rows)
