"""A small draft model (any supported family, the target's tokenizer; a directory or a Hub id)
with its own engine and pools, on the device of the target's rank 0 (tp=1, as vLLM's
draft_tensor_parallel_size=1). Its weights load as the target's do (`load_format`).

Each verify step, every request that wants K drafts becomes a request of the draft engine:
prompt = the target request's tokens so far, greedy, max_tokens = K; the draft engine runs
until they finish and their outputs are the drafts::

    target   ... p0 p1 .. pn t1 t2          (t2: the target's last token)
    draft    prompt [p0 .. t2] -> d1 .. dK   (a request of the draft engine, greedy)

Rolling the draft model back after a rejected draft needs nothing: no draft request lives
past its step, so no recurrent state ever holds a rejected token. Its prefix cache does the
catching up: each draft request's prompt leaves a state checkpoint at its last page boundary
(mem_cache's hybrid prefix cache), so the next step's request re-reads only the tokens after
that boundary (< page_size) and the 1..K+1 the target added, not the whole history.

The draft engine runs with tensor parallelism off (`tp_context(0, 1)`), in the target's
engine thread between two target steps.
"""
from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Sequence

from ...distributed import tp_context
from .drafter import DraftRequest

DRAFT_GPU_MEMORY_UTILIZATION = 0.5  # of the GPU memory still free once the target's pools exist


class DraftModelDrafter:
    name = "draft_model"

    def __init__(self, draft_model: str, target_config, max_model_len: int, max_requests: int,
                 target_vocab_size: int) -> None:
        """`target_config`: the target's EngineConfig (device, dtype, page size, checkpoint
        interval and step sizes are taken from it); `max_requests`: verify rows per step."""
        from ..config import EngineConfig
        from ..engine import LLMEngine
        from ..model_files import resolve_model_path

        load_weights = target_config.load_format != "dummy"
        config = replace(target_config, model=resolve_model_path(draft_model, weights=load_weights), tokenizer=None, revision=None, max_num_seqs=max_requests,
                         max_model_len=max_model_len, enable_prefix_caching=True, speculative_config=None,
                         cuda_graph_max_batch=None, num_kv_pages_override=None, num_state_slots_override=None,
                         cache_memory_bytes=None, gpu_memory_utilization=DRAFT_GPU_MEMORY_UTILIZATION)
        if not isinstance(config, EngineConfig):
            raise TypeError("target_config must be an EngineConfig")
        with tp_context(0, 1):
            self.engine = LLMEngine(config)
        self.vocab_size = int(self.engine.hf_config.vocab_size)
        if self.vocab_size > target_vocab_size:
            raise ValueError(f"draft model {draft_model!r} has a vocabulary of {self.vocab_size} ids, more than the "
                             f"target's {target_vocab_size}: its drafts could name ids the target does not have")
        self._ids = itertools.count()
        self._params = {}

    def _sampling(self, k: int):
        from ..sampling_params import SamplingParams

        if k not in self._params:
            self._params[k] = SamplingParams(max_tokens=k, temperature=0.0, ignore_eos=True)
        return self._params[k]

    def propose(self, requests: Sequence[DraftRequest]) -> list[list[int]]:
        """Greedy drafts of the draft model, K per request (none for a request whose tokens
        the draft model cannot take: ids outside its vocabulary or past its context)."""
        from ..validation import validate_prompt

        seq_of = {}
        with tp_context(0, 1):
            for i, r in enumerate(requests):
                if r.num_draft_tokens < 1:
                    continue
                params = self._sampling(r.num_draft_tokens)
                try:
                    validate_prompt(list(r.token_ids), params, self.engine.limits)
                except ValueError:
                    continue
                seq_id = f"draft-{next(self._ids)}"
                self.engine.add_request(seq_id, list(r.token_ids), params, validated=True)
                seq_of[seq_id] = i
            out: list[list[int]] = [[] for _ in requests]
            while self.engine.has_unfinished():
                for req in self.engine.step():
                    if req.finished and req.request_id in seq_of:
                        out[seq_of[req.request_id]] = list(req.output_token_ids)
        return out

    def check_empty(self) -> None:
        """Every draft request released its pages and slots (what the prefix tree keeps aside)."""
        self.engine.cache.check_empty()
