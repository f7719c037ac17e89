"""tp=2 vs tp=1 on the trained demo model, on CPU (gloo) in fp32 and bf16 (issue 16's check
where no two-GPU machine is lent): the 64 held-out prompts of bf16_agreement_trained_demo.py,
32 greedy tokens. Per dtype: the share of prompts whose first 16 (and all 32) tokens are
identical, of equal tokens, and the mean KL(tp=1 || tp=2) of the next-token distributions
over tp=1's top-20 tokens (logprobs=20, renormalised over the tokens both runs list) at the
positions where the two still agree.

    python benchmarks/tp_agreement_demo.py [--prompts 64] [--tokens 32]   # JSON into $OUT
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time

import ray
import torch

from hybrid_serve import LLM, SamplingParams
from hybrid_serve.demo import DEMO_DIR
from hybrid_serve.demo.corpus import heldout_prompts


def run(dtype: str, tp: int, prompts, tokens: int):
    llm = LLM(dtype=dtype, tp_size=tp, max_num_seqs=64, enable_prefix_caching=False, max_model_len=512)
    start = time.perf_counter()
    try:
        outs = llm.generate(prompts, SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True, logprobs=20))
    finally:
        llm.shutdown()
    return [o.outputs[0] for o in outs], time.perf_counter() - start


def _kl_top(p: dict, q: dict) -> float:
    shared = [t for t in p if t in q]
    zp = math.log(sum(math.exp(p[t].logprob) for t in shared))
    zq = math.log(sum(math.exp(q[t].logprob) for t in shared))
    return sum(math.exp(p[t].logprob - zp) * ((p[t].logprob - zp) - (q[t].logprob - zq)) for t in shared)


def compare(base, other, first: int = 16) -> dict:
    """As bf16_agreement_trained_demo.compare, over top-20 logprobs: at each first divergence,
    tp=1's margin (nats) between its own token and tp=2's."""
    kls, margins = [], []
    for x, y in zip(base, other):
        for i, (a, b) in enumerate(zip(x.token_ids, y.token_ids)):
            kls.append(_kl_top(x.logprobs[i], y.logprobs[i]))
            if a != b:
                lp = x.logprobs[i]
                margins.append({"position": i, "margin_nats": round(lp[a].logprob - lp[b].logprob, 4)
                                if b in lp else None})
                break
    total = sum(len(x.token_ids) for x in base)
    return {"prompts_first16_agree": sum(x.token_ids[:first] == y.token_ids[:first] for x, y in zip(base, other))
            / len(base),
            "prompts_all_agree": sum(x.token_ids == y.token_ids for x, y in zip(base, other)) / len(base),
            "tokens_agree": sum(a == b for x, y in zip(base, other) for a, b in zip(x.token_ids, y.token_ids)) / total,
            "mean_kl_top20": sum(kls) / len(kls), "kl_positions": len(kls), "divergences": margins}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads of this process")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    from hybrid_serve.engine.tokenizer import load_tokenizer

    tok = load_tokenizer(DEMO_DIR)
    prompts = [tok.encode(t, add_special_tokens=False) for t in heldout_prompts(args.prompts)]
    rows, seconds = {}, {}
    for dtype in ("float32", "bfloat16"):
        base, seconds[f"{dtype}_tp1"] = run(dtype, 1, prompts, args.tokens)
        other, seconds[f"{dtype}_tp2"] = run(dtype, 2, prompts, args.tokens)
        rows[dtype] = compare(base, other)
        print(dtype, json.dumps(rows[dtype]), flush=True)
    ray.shutdown()
    result = {"metric": "tp2_vs_tp1_trained_demo", "device": f"cpu ({os.cpu_count()} cores), gloo",
              "workload": f"{args.prompts} held-out stdlib prompts x {args.tokens} greedy tokens, trained demo model",
              "rows": rows, "seconds": seconds}
    out_dir = os.environ.get("OUT", "./bench_out")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tp2_vs_tp1_trained_demo.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
