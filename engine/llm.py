"""The offline API (the shape vLLM users know)::

    from hybrid_serve import LLM, SamplingParams
    llm = LLM(model="path/to/hf_dir", device="cpu", dtype="float32",
              max_num_seqs=64, max_num_batched_tokens=512, chunked_prefill_size=64)
    outs = llm.generate(["a prompt", ...] or [[token ids], ...], SamplingParams(max_tokens=32, temperature=0.0))
    outs[i].outputs[0].token_ids, .text, .finish_reason   # "stop" | "length"

`LLM()` with no model runs the built-in demo model (random weights, real tokenizer).
"""
from __future__ import annotations

import os
from typing import Sequence, Union

from .config import EngineConfig
from .engine import LLMEngine, completion_of
from .outputs import RequestOutput
from .sampling_params import SamplingParams

PromptType = Union[str, Sequence[int]]


def load_tokenizer(path: str | None):
    """A transformers tokenizer from `path`, or None when the directory has no tokenizer files."""
    if path is None or not any(
        os.path.isfile(os.path.join(path, f)) for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    ):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


class LLM:
    def __init__(self, model: str | None = None, tokenizer: str | None = None, **engine_args) -> None:
        if model is None:
            from ..demo import DEMO_DIR, DEMO_SEED

            model = DEMO_DIR
            engine_args.setdefault("load_format", "dummy")
            engine_args.setdefault("seed", DEMO_SEED)
        self.config = EngineConfig(model=model, tokenizer=tokenizer, **engine_args)
        self.tokenizer = load_tokenizer(tokenizer or model)
        self.engine = LLMEngine(self.config, self.tokenizer)
        self._counter = 0

    # ----- prompts ---------------------------------------------------------------------
    def _token_ids(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model directory has no tokenizer: pass prompts as token id lists")
            return prompt, self.tokenizer.encode(prompt, add_special_tokens=False)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return None, list(prompt)
        raise ValueError(f"a prompt must be a string or a list of token ids, got {type(prompt).__name__}")

    def _normalize(self, prompts) -> list[PromptType]:
        if isinstance(prompts, str):
            return [prompts]
        prompts = list(prompts)
        if prompts and all(isinstance(t, int) for t in prompts):
            return [prompts]  # one prompt of token ids
        return prompts

    # ----- generation ------------------------------------------------------------------
    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in prompt order. Every prompt is
        validated before any is queued, so a bad one raises ValueError and queues nothing."""
        prompts = self._normalize(prompts)
        params = sampling_params or SamplingParams()
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"{len(params_list)} sampling params for {len(prompts)} prompts")
        encoded = [self._token_ids(p) for p in prompts]
        for (_, ids), p in zip(encoded, params_list):
            self.engine.validate_prompt(ids, p)
        groups = []
        for (text, ids), p in zip(encoded, params_list):
            request_id = str(self._counter)
            self._counter += 1
            groups.append((request_id, text, ids, self.engine.add_request(request_id, ids, p)))
        finished = {}
        while self.engine.has_unfinished():
            for req in self.engine.step():
                if req.finished:
                    finished[req.request_id] = req
        return [self._output(rid, text, ids, [finished[s] for s in seqs]) for rid, text, ids, seqs in groups]

    def reset_prefix_cache(self) -> None:
        """Drop every cached prefix that no running request uses."""
        self.engine.reset_prefix_cache()

    def chat(self, messages: list[dict], sampling_params: SamplingParams | None = None) -> RequestOutput:
        if self.tokenizer is None:
            raise ValueError("this model directory has no tokenizer, so no chat template")
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.generate([text], sampling_params)[0]

    def _output(self, request_id: str, text: str | None, ids: list[int], seqs) -> RequestOutput:
        outputs = [completion_of(req, i) for i, req in enumerate(seqs)]
        if self.tokenizer is not None:
            for out in outputs:
                for entry in out.logprobs or []:
                    for token_id, lp in entry.items():
                        lp.decoded_token = self.tokenizer.decode([token_id])
        return RequestOutput(request_id=request_id, prompt=text, prompt_token_ids=ids, outputs=outputs,
                             finished=True, num_cached_tokens=seqs[0].num_cached_tokens or 0)
