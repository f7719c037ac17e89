"""Speculative decoding: drafters behind one protocol (`drafter.py`) and the acceptance
rule (`acceptance.py`). Verify steps are ordinary steps of the scheduler: a request with K
drafts is scheduled for K+1 tokens (its last token and the drafts), mixed with prefill
chunks and plain decodes; K may differ per request, 0 included.

How a verify step runs (engine.py `_verify_step`, verify.py)
-------------------------------------------------------------
    plan     a decoding request r with drafts d1..dk (batch row b, scratch row v) gets the
             k+1 tokens [last, d1 .. dk]; plain decodes and prefill chunks share the step
    forward  attention writes KV for all k+1 positions as usual; every state layer updates
             r's slot in place AND writes the state after each of the first k tokens into the
             speculative scratch (StatePool rows after the slots, viewed as
             [L, scratch rows, K, ...]), through the same in-kernel checkpoint mechanism the
             prefix cache uses (ForwardBatch.checkpoints: (b, step + 1, scratch_slot(v, step)))
    sample   the target at each of the k+1 positions (the request's seed and token index, as
             plain decoding would sample them)
    accept   a = drafts kept (acceptance.py); outputs t0..ta, cut at a stop or max_tokens
             exactly where plain decoding stops (drafts never run past max_tokens)
    commit   one "commit" cache op over every state layer before the next forward:
             state_slot[r] <- scratch[v, a] (keyword arguments, layout tag moved); a == k
             needs none (the in-place state is right); finished or aborted rows are -1 and
             skipped; KV pages past the accepted length are freed; a prefix-cache checkpoint
             is taken from the scratch at every interval the accepted tokens reached

Verify graphs. A verify step whose rows all verify the configured K drafts (no prefill chunk,
no shorter draft) replays a CUDA graph captured per padded batch size
(engine/runner/cuda_graph.py, `enable_verify_graphs`): batch row b is scratch row b, and the
conv and Mamba2 layers take the recurrent kernels' scratch mode (the state after each of the
row's first K tokens to the scratch, after all K + 1 to the slot) instead of the chunked
kernels' in-kernel checkpoints. Gated DeltaNet layers defer instead: the recurrent kernel
records each token's k, v, g, beta and writes no state, and the commit replays the row's a + 1
kept tokens over its untouched slot (writing a checkpoint's step to the scratch on the way;
mem_cache/state_pool.py), a third of the state traffic. The shard tells the commit which kind
of step it ran (ModelRunner.deferred_verify); on a GPU the commit is one CUDA graph. Rows of a
step that fits a verify graph are all padded to K, so each draws K drafts (the adaptive depth
then only decides whether to speculate). Other verify steps run eagerly.

Overlap (the decision). The engine queues step N+1 before it reads step N back. The drafters
here run on the host and need step N's tokens, so a step that speculates first reads back the
step in flight and is itself read back before the next is planned: while the adaptive depth
(depth.py) gives some request drafts, steps do not overlap; when it gives none (low
acceptance, large batches), the engine is back to overlapped steps. The depth's cost model
charges speculation for the lost overlap (`sync_cost`), so it is chosen only where it pays.
The MTP drafter (mtp.py) runs on the device but its pass after each step needs the step's
tokens on the host (which positions were verified), so with MTP no step overlaps. Keeping
the accepted lengths and bonus tokens on the device (the pending-token scheme of engine.py
is that scheme's K = 0 case) would give overlap back; not done yet.
"""
from .acceptance import greedy_accepted_length
from .config import SpeculativeConfig
from .drafter import DraftRequest, Drafter
from .remote import RemoteDrafter

__all__ = ["DraftRequest", "Drafter", "RemoteDrafter", "SpeculativeConfig", "greedy_accepted_length"]
