"""Speculative decoding: drafters behind one protocol (`drafter.py`) and the acceptance
rule (`acceptance.py`). Verify steps are ordinary steps of the scheduler: a request with K
drafts is scheduled for K+1 tokens (its last token and the drafts), mixed with prefill
chunks and plain decodes; K may differ per request, 0 included.

How verify steps and overlapped scheduling coexist (the decision)
------------------------------------------------------------------
Overlap stays on. The engine queues step N+1 before it reads step N back; with
speculation the host does not know, when it plans N+1, how many of a request's drafts N
accepted. So the accepted lengths stay on the device, and the next step's inputs are
built there::

    step N (verify, batch row b, request row r, K drafts):
        inputs   [last, d1 .. dK]           K+1 tokens; KV written as usual
        state    every state layer writes its state after each of the K+1 tokens into
                 scratch [state layers, batch rows, K+1, ...], not in place
        on the device, after sampling:
          a = accepted(d, target)            0..K (acceptance.py), per row
          state_slot[r] <- scratch[b, a]     one commit over all state layers (keyword
                                             arguments, layout tag moved); finished or
                                             aborted rows are skipped (negative index)
          num_accepted[r] = a + 1            tokens the request gained
          last_tokens[r]  = target[a]        the bonus token: the next step's input
    step N+1 (planned before N is read back):
        the plan marks row r "pending" (as decode rows are today: input id -1); the runner
        takes its input token from last_tokens[r] and adds num_accepted[r] to its prefix
        length on the device, so positions and KV slots are right without the host;
        the host has mapped KV pages for the worst case (all K accepted)
    when the host reads step N back (one step later):
        it appends the accepted tokens, checks stops and max_tokens (a stop inside the
        accepted run ends the output exactly where non-speculative decoding would, and the
        request's step N+1 work is dropped as a finished decode's is today), releases KV
        pages past the accepted length, and takes a prefix-cache checkpoint if the accepted
        tokens crossed an interval.

Drafts for step N+1 must exist before N+1 is queued. Device-resident drafters (MTP heads,
a draft model) draft on the device from step N's accepted state, so they keep overlap.
Host drafters (n-gram prompt lookup, remote suffix drafts) need step N's tokens on the
host: a request drafting on the host verifies every other step (the step after its verify
is a plain decode of its pending bonus token, K=0), or the engine reads step N back before
planning N+1 when the adaptive depth says speculation pays more than overlap.
Today (before speculation lands) every request has K=0 and num_accepted is always 1: the
pending-token scheme of engine.py is this scheme's K=0 case.
"""
from .acceptance import greedy_accepted_length
from .drafter import DraftRequest, Drafter

__all__ = ["DraftRequest", "Drafter", "greedy_accepted_length"]
