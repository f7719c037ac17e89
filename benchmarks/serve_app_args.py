"""`hybrid-serve serve` with extra AppConfig fields that have no command-line flag (the
admission bounds `max_waiting_requests`, `max_waiting_tokens`, `max_queued_requests`...),
for benchmarks that must admit a whole burst, as a YAML's `args:` would set them.

    python benchmarks/serve_app_args.py '{"max_waiting_requests": 256}' --model DIR --device cuda ...

The JSON is merged into the app args the `serve` flags give (deploy/launcher.app_args);
everything else is `hybrid-serve serve`.
"""
from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    extra = json.loads(argv[0])
    from hybrid_serve.cli import main as cli_main
    from hybrid_serve.deploy import launcher

    flags_only = launcher.app_args
    launcher.app_args = lambda args: {**flags_only(args), **extra}
    return cli_main(["serve", *argv[1:]])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
