"""Command line:

    hybrid-serve generate "a prompt" [--model DIR] [--max-tokens N] [--temperature T]
    hybrid-serve serve [--model DIR] [--tp N] [--replicas N] [--host 127.0.0.1] [--port 8000] [--address auto]

Without --model both run the built-in demo model (random weights, real tokenizer) on CPU.
`serve` starts (or joins) a Ray cluster and serves the OpenAI API until SIGINT/SIGTERM.
"""
from __future__ import annotations

import argparse
import sys
import time

from .deploy.launcher import add_serve_arguments


def _generate(args: argparse.Namespace) -> int:
    from .engine import SamplingParams
    from .llm import LLM

    try:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                                seed=args.seed, stop=args.stop or None)
        llm = LLM(model=args.model, device=args.device, dtype=args.dtype,
                  **({"load_format": args.load_format} if args.load_format else {}))
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hybrid-serve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate a completion offline")
    gen.add_argument("prompt")
    gen.add_argument("--model", default=None, help="Hugging Face model directory (default: built-in demo)")
    gen.add_argument("--max-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--stop", action="append", help="stop string (repeatable)")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    gen.add_argument("--device", default="cpu")
    gen.add_argument("--dtype", default="auto")
    gen.add_argument("--load-format", default=None, choices=["auto", "safetensors", "dummy"])
    gen.set_defaults(func=_generate)
    srv = sub.add_parser("serve", help="serve the OpenAI-compatible HTTP API on Ray Serve")
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
