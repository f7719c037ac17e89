"""The model and engine flags `hybrid-serve serve` and `hybrid-serve generate` share, named as
`vllm serve` names them where they mean the same (`--gpu-memory-utilization`,
`--max-num-batched-tokens`, `--enable-prefix-caching`, `--enforce-eager`, ...).

    add_model_arguments(parser)      # the flags, each with its help and default
    engine_overrides(args)           # {EngineConfig field: value} of the engine flags given

Defaults shown in `--help` come from EngineConfig (and DEVICE_DEFAULTS), so they cannot drift.
"""
from __future__ import annotations

import argparse
import dataclasses

from ..engine.config import DEVICE_DEFAULTS, EngineConfig
from ..engine.spec.config import METHODS as SPEC_METHODS

DTYPES = ("auto", "float32", "bfloat16", "float16")
LOAD_FORMATS = ("auto", "safetensors", "dummy")


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Shows "(default: X)" after each flag's help, except where the help already says its
    default or the default is None (then the help says what None means)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is None or action.default is False or "default" in text:
            return text
        return super()._get_help_string(action)


def _engine_default(name: str):
    return {f.name: f.default for f in dataclasses.fields(EngineConfig)}[name]


def _by_device(name: str) -> str:
    return ", ".join(f"{values[name]} on {device}" for device, values in DEVICE_DEFAULTS.items())


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The model, tokenizer and engine flags."""
    p.add_argument("--model", default=None,
                   help="Hugging Face model directory or Hub id, e.g. Qwen/Qwen3.5-0.8B (fetched into the HF "
                        "cache, or found there offline) (default: the built-in demo model)")
    p.add_argument("--revision", default=None, help="Hub branch, tag or commit of --model (default: main)")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory or Hub id (default: the model's)")
    p.add_argument("--chat-template", default=None,
                   help="chat template file, or inline Jinja, instead of the model's (default: the model's)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="let transformers run the model repository's own config code (default: off)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="auto", choices=DTYPES, help="weights and activations; auto: the model's")
    p.add_argument("--load-format", default=None, choices=LOAD_FORMATS,
                   help="dummy: random weights of the real shapes (default: auto)")
    p.add_argument("--seed", type=int, default=None,
                   help="engine seed: dummy weights, and sampling of requests without their own seed "
                        "(default: the demo's seed for the demo model, else 0)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="most tokens of prompt + output per request (default: the model's, capped to fit the cache)")
    p.add_argument("--max-num-seqs", type=int, default=None,
                   help=f"sequences running at once (default: {_by_device('max_num_seqs')})")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help=f"token budget of one engine step (default: {_by_device('max_num_batched_tokens')})")
    p.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="fraction of free GPU memory for the KV and state cache "
                        f"(default: {_engine_default('gpu_memory_utilization')})")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                   help="radix prefix cache with state checkpoints "
                        f"(default: {'on' if _engine_default('enable_prefix_caching') else 'off'})")
    p.add_argument("--reply-checkpoints", action=argparse.BooleanOptionalAction, default=None,
                   help="cache each finished reply up to its last page boundary, state included, so that a "
                        "chat's next turn resumes after the reply (one more state slot a decoding request) "
                        f"(default: {'on' if _engine_default('reply_checkpoints') else 'off'})")
    p.add_argument("--enforce-eager", action="store_true",
                   help="no CUDA graphs: every step runs eagerly (default: graphs for decode steps on CUDA)")
    p.add_argument("--speculative-config", type=_json_object, default=None, metavar="JSON",
                   help='speculative decoding, as vLLM: e.g. \'{"method": "ngram", "num_speculative_tokens": 4}\' or '
                        '\'{"method": "draft_model", "model": "DIR"}\' (methods: ' + ", ".join(SPEC_METHODS)
                        + "; keys: engine/spec/config.py; default: off)")


def _json_object(text: str) -> dict:
    """argparse type: a JSON object (argparse turns the ValueError into a usage error)."""
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc.msg} at column {exc.colno}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def engine_overrides(args: argparse.Namespace) -> dict:
    """The EngineConfig fields set by the engine flags given (None: left to EngineConfig)."""
    out = {"max_model_len": args.max_model_len, "max_num_seqs": args.max_num_seqs,
           "max_num_batched_tokens": args.max_num_batched_tokens,
           "gpu_memory_utilization": args.gpu_memory_utilization,
           "enable_prefix_caching": args.enable_prefix_caching, "reply_checkpoints": args.reply_checkpoints,
           "speculative_config": args.speculative_config}
    out = {k: v for k, v in out.items() if v is not None}
    if args.enforce_eager:
        out["enable_cuda_graphs"] = False
    if args.trust_remote_code:
        out["trust_remote_code"] = True
    return out
