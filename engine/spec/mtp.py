"""MTP drafting: the checkpoint's multi-token-prediction layers (models/mtp.py) propose the
drafts, run by every shard right after each step, so the next step can verify them.

After a step whose rows computed target positions [start, start + n) of their requests, the
host knows (once the step's tokens are read back) how many of those positions hold verified
tokens (`valid`: all n for a prefill chunk or plain decode, accepted + 1 for a verify row)
and the token after each. The MTP pass then, on every shard:

    1. extends the MTP layers' KV over positions [start, start + valid) of every row, from
       (x_{p+1}, h_p): the target's hidden states of that step, still on the device;
    2. for requests that decode next, drafts K tokens: the output at the row's last position
       gives draft 1, and each further draft feeds the previous draft and the previous MTP
       hidden state (chained), at the next position, whose KV slot the host maps beforehand
       (`ensure_kv`; positions past the request's length are rewritten by the next pass
       before anything reads them).

The drafts (greedy, on the device, the same on every rank) come back to rank 0 and are kept
by `MtpDrafter` (anchored at the request's length, as remote proposals are), which the
adaptive depth then consults like any drafter. A step followed by the pass does not overlap
the next (the pass needs the step's tokens on the host). Where the adaptive depth measured
plain decoding faster and no probe is due (`AdaptiveDepth.may_speculate_soon`), plain steps
skip the pass and overlap again; the MTP layers' KV then misses those positions, which only
makes later drafts worse.

Known limit: a prefix-cache hit reuses the MTP KV of the cached positions, and the KV at the
hit's last position was computed with the token that followed it in the request that filled
the cache (the target's hidden state there is not recomputed). Drafts, not outputs, can
differ from a cold run.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..runner.step_plan import MtpPlan
from .remote import RemoteDrafter


class MtpDrafter(RemoteDrafter):
    """Proposals are the MTP pass's drafts, supplied by the engine after each step."""

    name = "mtp"


@dataclass(frozen=True)
class StepRow:
    """A launched step's batch row as the MTP pass needs it: the request, the first position
    it computed, how many tokens it carried and where they start among the step's tokens."""

    request: object
    start: int
    num_tokens: int
    token_offset: int


def step_rows(chunks: list) -> list[StepRow]:
    """The rows of a step about to launch (request.num_computed_tokens is still the start)."""
    rows, offset = [], 0
    for c in chunks:
        rows.append(StepRow(c.request, c.request.num_computed_tokens, c.num_tokens, offset))
        offset += c.num_tokens
    return rows


def build_mtp_plan(rows: list[StepRow], num_draft_tokens: int, ensure_kv) -> tuple[MtpPlan, list]:
    """The MTP pass for a completed step's rows. `ensure_kv(request, seq_len) -> bool` maps a
    drafting request's KV slots for the chained positions (False: it does not draft this
    time). Returns (plan, the requests of plan.draft_rows in order)."""
    plan, drafting = MtpPlan(num_draft_tokens=num_draft_tokens), []
    for row in rows:
        req = row.request
        if req.finished:
            continue
        tokens = req.token_ids
        # positions whose token and next token are both verified
        valid = min(row.num_tokens, req.num_computed_tokens - row.start, len(tokens) - 1 - row.start)
        if valid < 1:
            continue
        batch_row = len(plan.req_rows)
        plan.req_rows.append(req.alloc.req_row)
        plan.prefix_lens.append(row.start)
        plan.extend_lens.append(valid)
        plan.hidden_rows.extend(range(row.token_offset, row.token_offset + valid))
        plan.next_ids.extend(tokens[row.start + 1 : row.start + valid + 1])
        last = row.start + valid  # the request's next position to compute
        decodes_next = last == req.num_computed_tokens == len(tokens) - 1
        if decodes_next and num_draft_tokens > 0 and ensure_kv(req, last + num_draft_tokens - 1):
            plan.draft_rows.append(batch_row)
            drafting.append(req)
    return plan, drafting
