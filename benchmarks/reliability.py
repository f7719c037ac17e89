"""Reliability of the served app on the CPU demo (issue 15's acceptance): overload, client
disconnects, replica failure, bad input. Each scenario starts its own local Ray + Serve app
on loopback (the built-in demo model), drives it over HTTP, prints a short table and writes
`benchmarks/results/reliability_<scenario>.json`.

    python benchmarks/reliability.py burst        [--replicas 1] [--duration 60] [--multiplier 10] [--bursts 2]
    python benchmarks/reliability.py disconnects  [--clients 100]
    python benchmarks/reliability.py kill         [--kills 5] [--clients 10] [--nonstream-clients 2]
    python benchmarks/reliability.py fuzz         [--cases 1000] [--prompt-cases 500]
    python benchmarks/reliability.py all

burst        capacity first (closed loop, small concurrency), then `bursts` x open-loop Poisson
             arrivals at `multiplier` x that rate for `duration` s (streaming and non-streaming
             mixed, greedy, short seeded prompts, 16 tokens), 30 s apart: every answer 200 or
             503/429 with a Retry-After; accepted greedy outputs == the same request sent alone
             afterwards; TTFT of the accepted (client-side, and the replicas' histogram) vs the
             bound the configured queues imply; the front end's own delay (GET /v1/models from
             another process); RSS of the Serve processes before, right after and 30 s after.
disconnects  `clients` streaming requests that hang up after 1-3 chunks, twice, after the same
             prompts ran to completion: afterwards nothing running or waiting, no pool
             invariant violation, and no page or slot held per aborted request (what stays in
             use is the prefix tree's).
kill         a 2-replica app under looping streaming (and a few non-streaming) clients;
             SIGKILL one LLMServer replica's worker process `kills` times, waiting for Serve
             to have 2 replicas serving again between kills: HTTP statuses, streams ended by
             an SSE error event + [DONE], retries before the first token, recovery times,
             aborted / failed sequences on the surviving replica.
fuzz         schemathesis over the app's own /openapi.json (`cases` cases, positive and
             negative) and hypothesis over prompts (unicode edge cases, lone surrogates sent
             as JSON escapes, stop strings, token-id lists with out-of-vocabulary ids):
             statuses counted, no 5xx (nor an in-band server_error), healthy afterwards.

The scenarios live in reliability_burst.py, reliability_faults.py (disconnects, kill) and
reliability_fuzz.py; the app, the HTTP client and the helpers they share in reliability_harness.py.

Figures depend on the machine and on what else runs on it (2 shared cores here): the JSON
records the load average at the start.
"""
from __future__ import annotations

import argparse
import sys

from hybrid_serve.benchmarks.provenance import git_commit
from hybrid_serve.benchmarks.reliability_burst import run_burst
from hybrid_serve.benchmarks.reliability_faults import run_disconnects, run_kill
from hybrid_serve.benchmarks.reliability_fuzz import run_fuzz
from hybrid_serve.benchmarks.reliability_harness import write_json


SCENARIOS = {"burst": run_burst, "disconnects": run_disconnects, "kill": run_kill, "fuzz": run_fuzz}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", choices=[*SCENARIOS, "all"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--no-json", action="store_true", help="print only; do not write benchmarks/results/")
    p.add_argument("--dump", default=None, help="kill: every request's record, as JSON lines, to this file")
    g = p.add_argument_group("burst")
    g.add_argument("--replicas", type=int, default=1)
    g.add_argument("--threads", type=int, default=1, help="torch_num_threads per replica")
    g.add_argument("--max-num-seqs", type=int, default=16)
    g.add_argument("--max-waiting-requests", type=int, default=None, help="default: the app's")
    g.add_argument("--max-queued-requests", type=int, default=None, help="default: the app's")
    g.add_argument("--pool", type=int, default=300, help="distinct prompts the requests draw from")
    g.add_argument("--capacity-concurrency", type=int, default=4)
    g.add_argument("--capacity-seconds", type=float, default=20.0)
    g.add_argument("--multiplier", type=float, default=10.0)
    g.add_argument("--duration", type=float, default=60.0)
    g.add_argument("--identity-sample", type=int, default=100)
    g.add_argument("--bursts", type=int, default=2, help="bursts in a row (memory: does a second one grow it?)")
    g.add_argument("--rss-tolerance-mib", type=float, default=64.0)
    g = p.add_argument_group("disconnects")
    g.add_argument("--clients", type=int, default=None, help="disconnects: 100; kill: 10 (streaming)")
    g = p.add_argument_group("kill")
    g.add_argument("--kills", type=int, default=5)
    g.add_argument("--nonstream-clients", type=int, default=2, help="more clients, non-streaming")
    g.add_argument("--kill-max-num-seqs", type=int, default=4)
    g.add_argument("--kill-max-waiting", type=int, default=12, help="max_waiting_requests of the kill app")
    g.add_argument("--settle", type=float, default=5.0, help="seconds of steady load before each kill / after recovery")
    g = p.add_argument_group("fuzz")
    g.add_argument("--cases", type=int, default=1000)
    g.add_argument("--prompt-cases", type=int, default=500)
    args = p.parse_args()
    failed = False
    for name in (SCENARIOS if args.scenario == "all" else [args.scenario]):
        a = argparse.Namespace(**vars(args))
        if a.clients is None:
            a.clients = 100 if name == "disconnects" else 10
        if name == "kill" and args.max_tokens == 16 and "--max-tokens" not in sys.argv:
            a.max_tokens = 48  # streams long enough to be cut mid-way
        commit = git_commit()  # the tree the scenario runs on (as it starts)
        out = SCENARIOS[name](a)
        failed |= not all(out["checks"].values())
        if not args.no_json:
            print("wrote", write_json(name, out, commit))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
