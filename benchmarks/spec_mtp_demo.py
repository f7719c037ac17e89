"""MTP speculative decoding on the trained demo model (its jointly trained `mtp.*` layer) on
one GPU, bf16, decode graphs on: decode tok/s with MTP at K = 1..3 (fixed) and adaptive,
and with n-gram lookup (K = 3), against no speculation in the same run; greedy agreement
with the plain run and the measured acceptance.

    python benchmarks/spec_mtp_demo.py [--batches 1,16] [--prompts 16] [--tokens 96] [--out DIR]

Per batch size B: B held-out standard-library prompts (demo/corpus.py), `--tokens` greedy
tokens each; decode tok/s = B * (tokens - 1) / (wall - time to the last first token), i.e.
prefill excluded (as benchmarks/spec_decode.py). The demo model is tiny (11M parameters):
its steps are launch-bound, so this measures the drafter's acceptance and the engine's
per-step overhead, not the 2.3B model's bandwidth-bound speed-up.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from spec_decode import decode_rate  # noqa: E402

from hybrid_serve import LLM  # noqa: E402
from hybrid_serve.demo.corpus import heldout_prompts  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    prompts = heldout_prompts(max(max(batches), args.prompts))
    engine = dict(device="cuda", dtype="bfloat16", max_num_seqs=max(batches), enable_prefix_caching=False)
    variants = [("plain", None)] + [(f"mtp_k{k}", dict(method="mtp", num_speculative_tokens=k, adaptive=False))
                                    for k in (1, 2, 3)]
    variants += [("mtp_k3_adaptive", dict(method="mtp", num_speculative_tokens=3, adaptive=True)),
                 ("ngram_k3", dict(method="ngram", num_speculative_tokens=3, adaptive=False))]
    base, rows = {}, []
    for name, spec in variants:
        llm = LLM(**engine, speculative_config=spec)
        decode_rate(llm, prompts[:1], 8)  # warm
        for b in batches:
            before = llm.engine.stats()
            rate, got, _ = decode_rate(llm, prompts[:b], args.tokens)
            st = {k: v - before.get(k, 0) for k, v in llm.engine.stats().items() if k.startswith("spec_")}
            if spec is None:
                base[b] = (rate, got)
            want = base[b][1]
            rows.append(dict(variant=name, batch=b, decode_tok_s=round(rate, 1),
                             speedup=round(rate / base[b][0], 3),
                             acceptance=round(st.get("spec_accepted_tokens", 0) / max(st.get("spec_draft_tokens", 0), 1), 3),
                             mean_accepted_length=round(1 + st.get("spec_accepted_tokens", 0)
                                                        / max(st.get("spec_verify_rows", 0), 1), 3),
                             greedy_identical=sum(g == w for g, w in zip(got, want)) / b))
            print(json.dumps(rows[-1]), flush=True)
        llm.engine.cache.check_empty()
        del llm
        torch.cuda.empty_cache()
    result = dict(metric="spec_mtp_trained_demo_gpu", date=datetime.date.today().isoformat(),
                  commit=subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                        text=True).stdout.strip(),
                  device=torch.cuda.get_device_name(),
                  workload=f"trained demo model bf16, decode graphs on, held-out stdlib prompts, {args.tokens} greedy "
                           f"tokens, batches {batches}",
                  baseline="the same engine without speculation, same run", rows=rows)
    os.makedirs(os.path.join(args.out, "results"), exist_ok=True)
    with open(os.path.join(args.out, "results", "spec_mtp_trained_demo_gpu.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"{'variant':18s} {'batch':>5s} {'tok/s':>8s} {'speedup':>8s} {'accept':>7s} {'len':>5s} {'same':>5s}")
    for r in rows:
        print(f"{r['variant']:18s} {r['batch']:5d} {r['decode_tok_s']:8.1f} {r['speedup']:8.2f} {r['acceptance']:7.2f} "
              f"{r['mean_accepted_length']:5.2f} {r['greedy_identical']:5.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
