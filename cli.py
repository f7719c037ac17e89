"""Command line:

    hybrid-serve generate "a prompt" [--model DIR|HUB_ID] [--max-tokens N] [--temperature T] [--chat]
    hybrid-serve serve [--model DIR|HUB_ID] [-tp N] [--replicas N] [--host 127.0.0.1] [--port 8000] [--address auto]

Without --model both run the built-in demo model (a small hybrid trained on Python's standard
library, hybrid_serve/demo) on CPU.
`serve` starts (or joins) a Ray cluster and serves the OpenAI API until SIGINT/SIGTERM.
Both take the model and engine flags of `vllm serve` (`hybrid-serve serve --help`).
"""
from __future__ import annotations

import argparse
import sys
import time

from .deploy.cli_args import HelpFormatter, add_model_arguments, engine_overrides
from .deploy.launcher import add_serve_arguments


def _generate(args: argparse.Namespace) -> int:
    from .engine import SamplingParams
    from .llm import LLM

    try:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                                stop=args.stop or None)
        llm = LLM(**llm_kwargs(args))
        start = time.perf_counter()
        if args.chat:
            out = llm.chat([{"role": "user", "content": args.prompt}], params)
        else:
            out = llm.generate([args.prompt], params)[0]
        elapsed = time.perf_counter() - start
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    completion = out.outputs[0]
    print(completion.text)
    print(f"[{len(completion.token_ids)} tokens in {elapsed:.2f} s, finish_reason={completion.finish_reason}, "
          f"model={args.model or 'demo'}]", file=sys.stderr)
    return 0


def llm_kwargs(args: argparse.Namespace) -> dict:
    """`LLM(...)`'s arguments from the `generate` flags (None: LLM's own default)."""
    out = {"model": args.model, "tokenizer": args.tokenizer, "chat_template": args.chat_template,
           "tp_size": args.tp, "device": args.device, "dtype": args.dtype, **engine_overrides(args)}
    out.update({k: v for k, v in (("revision", args.revision), ("load_format", args.load_format),
                                  ("seed", args.seed)) if v is not None})
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hybrid-serve", description=__doc__, formatter_class=HelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate a completion offline", formatter_class=HelpFormatter)
    gen.add_argument("prompt")
    add_model_arguments(gen)
    gen.add_argument("--tensor-parallel-size", "-tp", dest="tp", type=int, default=1,
                     help="tensor-parallel shards (more than 1: Ray actors)")
    gen.add_argument("--max-tokens", type=int, default=32, help="most tokens to generate")
    gen.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling")
    gen.add_argument("--stop", action="append", help="stop string (repeatable)")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template (default: off)")
    gen.set_defaults(func=_generate)
    srv = sub.add_parser("serve", help="serve the OpenAI-compatible HTTP API on Ray Serve",
                         formatter_class=HelpFormatter)
    add_serve_arguments(srv)
    srv.set_defaults(func=_serve)
    return parser


def _serve(args: argparse.Namespace) -> int:
    from .deploy.launcher import serve_main

    return serve_main(args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
