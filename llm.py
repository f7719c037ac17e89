"""The offline API (the shape vLLM users know)::

    from hybrid_serve import LLM, SamplingParams
    llm = LLM(model="path/to/hf_dir" or "Qwen/Qwen3.5-0.8B", device="cpu", dtype="float32",
              max_num_seqs=64, max_num_batched_tokens=512, chunked_prefill_size=64)
    outs = llm.generate(["a prompt", ...] or [[token ids], ...], SamplingParams(max_tokens=32, temperature=0.0))
    outs[i].outputs[0].token_ids, .text, .finish_reason   # "stop" | "length"

`LLM()` with no model runs the built-in demo model (11M parameters trained on Python's
standard library: hybrid_serve/demo). One
replica at tp_size 1 runs in this process (`engine.LLMEngine`); more replicas or shards run
as Ray actors (`actors.offline.ReplicaSet`), the same engine behind each.
"""
from __future__ import annotations

from typing import Sequence, Union

from .engine.batch import BatchItem, run_batch
from .engine.config import EngineConfig
from .engine.model_files import resolve_model_path
from .engine.outputs import RequestOutput
from .engine.sampling_params import SamplingParams
from .engine.tokenizer import load_tokenizer
from .engine.validation import validate_prompt

PromptType = Union[str, Sequence[int], dict]  # dict: vLLM's {"prompt": str} or {"prompt_token_ids": [ids]}


class LLM:
    """`model` and `tokenizer`: local directories or Hugging Face Hub ids (downloaded, or found
    in the local HF cache offline; `revision=` picks the model's branch, tag or commit).
    `chat_template` (a file or inline Jinja) replaces the model's template in `chat`.
    `tp_size` > 1 or `num_replicas` > 1 run the replicas as Ray actors (one per TP rank),
    starting a local Ray instance unless RAY_ADDRESS names a cluster; otherwise the engine
    runs in this process."""

    def __init__(self, model: str | None = None, tokenizer: str | None = None, tp_size: int = 1,
                 num_replicas: int = 1, chat_template: str | None = None, **engine_args) -> None:
        if model is None:
            from .demo import DEMO_DIR, DEMO_SEED

            model = DEMO_DIR
            engine_args.setdefault("seed", DEMO_SEED)  # and load_format="dummy": the demo's random-weight twin
        weights = engine_args.get("load_format", "auto") != "dummy"
        model = resolve_model_path(model, engine_args.get("revision"), weights=weights)
        tokenizer = resolve_model_path(tokenizer, weights=False) if tokenizer is not None else None
        self.config = EngineConfig(model=model, tokenizer=tokenizer, **engine_args)
        self.tokenizer = load_tokenizer(tokenizer or model, chat_template=chat_template)
        self.engine = None
        self.replicas = None
        if tp_size == 1 and num_replicas == 1:
            from .engine.engine import LLMEngine

            self.engine = LLMEngine(self.config, self.tokenizer)
            self.limits = self.engine.limits
        else:
            from .actors.offline import ReplicaSet  # Ray only when asked for

            self.replicas = ReplicaSet(self.config, tp_size, num_replicas)
            self.limits = self.replicas.limits
        self._counter = 0

    def shutdown(self) -> None:
        if self.replicas is not None:
            self.replicas.shutdown()
            self.replicas = None

    # ----- prompts ---------------------------------------------------------------------
    def _token_ids(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):  # vLLM's TextPrompt / TokensPrompt
            keys = set(prompt)
            if keys == {"prompt_token_ids"}:
                prompt = prompt["prompt_token_ids"]
                if isinstance(prompt, str) or not isinstance(prompt, (list, tuple)):
                    raise ValueError(f"prompt_token_ids must be a list of token ids, got {type(prompt).__name__}")
            elif keys == {"prompt"}:
                prompt = prompt["prompt"]
                if not isinstance(prompt, str):
                    raise ValueError(f"a dict's 'prompt' must be a string, got {type(prompt).__name__}")
            else:
                raise ValueError(f"a prompt dict takes 'prompt' (text) or 'prompt_token_ids' (ids), "
                                 f"got keys {sorted(keys)}")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model directory has no tokenizer: pass prompts as token id lists")
            return prompt, self.tokenizer.encode(prompt, add_special_tokens=False)
        if isinstance(prompt, (list, tuple)):  # its ids are checked once, by validate_prompt
            return None, list(prompt)
        raise ValueError(f"a prompt must be a string or a list of token ids, got {type(prompt).__name__}")

    def _normalize(self, prompts) -> list[PromptType]:
        if isinstance(prompts, (str, dict)):
            return [prompts]
        prompts = list(prompts)
        if prompts and all(isinstance(t, int) for t in prompts):
            return [prompts]  # one prompt of token ids
        return prompts

    # ----- generation ------------------------------------------------------------------
    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in prompt order. Every prompt is
        validated before any is queued, so a bad one raises ValueError and queues nothing.
        `use_tqdm` shows a progress bar over finished requests (in-process engine)."""
        prompts = self._normalize(prompts)
        params = sampling_params or SamplingParams()
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"{len(params_list)} sampling params for {len(prompts)} prompts")
        encoded = [self._token_ids(p) for p in prompts]
        for (_, ids), p in zip(encoded, params_list):
            validate_prompt(ids, p, self.limits)
        items = []
        for (_, ids), p in zip(encoded, params_list):
            items.append(BatchItem(str(self._counter), ids, p))
            self._counter += 1
        if self.engine is not None:
            results = run_batch(self.engine, items, validated=True, progress=use_tqdm)
        else:
            results = self.replicas.generate(items)
        for item, (text, _) in zip(items, encoded):
            results[item.request_id].prompt = text
        return [results[item.request_id] for item in items]

    def reset_prefix_cache(self) -> None:
        """Drop every cached prefix that no running request uses (in-process engine)."""
        if self.engine is not None:
            self.engine.reset_prefix_cache()

    def chat(self, messages: list[dict], sampling_params: SamplingParams | None = None) -> RequestOutput:
        if self.tokenizer is None:
            raise ValueError("this model directory has no tokenizer, so no chat template")
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.generate([text], sampling_params)[0]
