"""Speculative decoding on real text: the trained demo model (CPU, fp32) on held-out
standard-library code, n-gram prompt lookup or the demo's own MTP layer (`--method mtp`)
at K = 1..4, against decoding without
speculation in the same run: greedy tokens identical, draft acceptance, mean accepted
length, verify rows, and tokens/s (CPU wall time, indicative only).

    python benchmarks/spec_acceptance_demo.py [--method ngram|mtp] [--prompts 32] [--tokens 64] [--out DIR]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import time

import torch

from hybrid_serve import LLM, SamplingParams
from hybrid_serve.demo.corpus import heldout_prompts


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--method", choices=("ngram", "mtp"), default="ngram")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks"))
    args = ap.parse_args()
    torch.set_num_threads(2)
    prompts = heldout_prompts(args.prompts)
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    plain = LLM(max_num_seqs=args.prompts)
    t = time.perf_counter()
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, params)]
    plain_s = time.perf_counter() - t
    rows = []
    for k in (1, 2, 3, 4):
        spec = dict(method=args.method, num_speculative_tokens=k, adaptive=False)
        if args.method == "ngram":
            spec["prompt_lookup_max"] = 4
        llm = LLM(max_num_seqs=args.prompts, speculative_config=spec)
        t = time.perf_counter()
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        seconds = time.perf_counter() - t
        st = llm.engine.stats()
        rows.append(dict(k=k, identical=sum(g == w for g, w in zip(got, want)) / len(want),
                         acceptance=round(st["spec_accepted_tokens"] / max(st["spec_draft_tokens"], 1), 3),
                         mean_accepted_length=round(1 + st["spec_accepted_tokens"] / max(st["spec_verify_rows"], 1), 3),
                         verify_rows=st["spec_verify_rows"], draft_tokens=st["spec_draft_tokens"],
                         accepted_per_position=[st[f"spec_accepted_tokens_pos{i}"] for i in range(k)],
                         seconds=round(seconds, 2), plain_seconds=round(plain_s, 2)))
        print(json.dumps(rows[-1]), flush=True)
        llm.engine.cache.check_empty()
    name = f"spec_{args.method}_acceptance_trained_demo"
    drafter = ("ngram prompt lookup n=1..4" if args.method == "ngram"
               else "the demo's MTP layer (mtp.*, trained jointly), chained drafts")
    result = dict(metric=name, date=datetime.date.today().isoformat(),
                  commit=subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                        text=True).stdout.strip(),
                  device="CPU (2 cores)",
                  workload=f"trained demo model (fp32), {args.prompts} held-out stdlib prompts (<= 600 chars), "
                           f"{args.tokens} greedy tokens, {drafter}, K fixed",
                  baseline="the same engine without speculation, same run (greedy tokens and wall time)", rows=rows)
    os.makedirs(os.path.join(args.out, "results"), exist_ok=True)
    with open(os.path.join(args.out, "results", f"{name}.json"), "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
