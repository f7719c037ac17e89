"""tp=N vs tp=1 on the trained demo model: on CPU (gloo) or on GPUs (NCCL, one per shard), in
fp32 and bf16 (issues 16 and 18): the 64 held-out prompts of bf16_agreement_trained_demo.py,
32 greedy tokens. Per dtype: the share of prompts whose first 16 (and all 32) tokens are
identical, of equal tokens, and the mean KL(tp=1 || tp=2) of the next-token distributions
over tp=1's top-20 tokens (logprobs=20, renormalised over the tokens both runs list) at the
positions where the two still agree.

    python benchmarks/tp_agreement_demo.py [--prompts 64] [--tokens 32]   # CPU, tp=2; JSON into $OUT
    python benchmarks/tp_agreement_demo.py --device cuda --tps 2,4 --dtypes bfloat16
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


def run(dtype: str, tp: int, prompts, tokens: int, device: str = "cpu", model: str = DEMO_DIR,
        gpu_memory_utilization: float = 0.85):
    llm = LLM(model=model, dtype=dtype, tp_size=tp, device=device, max_num_seqs=64, enable_prefix_caching=False,
              max_model_len=512, gpu_memory_utilization=gpu_memory_utilization)
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
    ap.add_argument("--model", default=DEMO_DIR, help="a demo-layout checkpoint (default: the shipped demo)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.85,
                    help="share of free GPU memory each engine's cache takes (lower to share the GPUs)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads of this process")
    ap.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL, a GPU per shard)")
    ap.add_argument("--tps", default="2", help="comma-separated tensor-parallel sizes compared with tp=1")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tps = [int(t) for t in args.tps.split(",")]
    if args.device == "cpu":
        ray.init(num_cpus=2 * max(tps), include_dashboard=False, log_to_driver=False)
    else:
        ray.init(include_dashboard=False, log_to_driver=False)
    from hybrid_serve.engine.tokenizer import load_tokenizer

    tok = load_tokenizer(args.model)
    prompts = [tok.encode(t, add_special_tokens=False) for t in heldout_prompts(args.prompts)]
    rows, seconds = {}, {}
    for dtype in args.dtypes.split(","):
        base, seconds[f"{dtype}_tp1"] = run(dtype, 1, prompts, args.tokens, args.device, args.model,
                                            args.gpu_memory_utilization)
        for tp in tps:
            other, seconds[f"{dtype}_tp{tp}"] = run(dtype, tp, prompts, args.tokens, args.device, args.model,
                                                    args.gpu_memory_utilization)
            rows[f"{dtype}_tp{tp}"] = compare(base, other)
            print(dtype, f"tp={tp}", json.dumps({k: v for k, v in rows[f"{dtype}_tp{tp}"].items()
                                                 if k != "divergences"}), flush=True)
    ray.shutdown()
    if args.device == "cpu":
        where = f"cpu ({os.cpu_count()} cores), gloo"
    else:
        where = f"{torch.cuda.device_count()}x {torch.cuda.get_device_name(0)}, NCCL"
    name = "tp2_vs_tp1_trained_demo" if tps == [2] and args.device == "cpu" else f"tp_vs_tp1_trained_demo_{args.device}"
    result = {"metric": name, "device": where, "model": args.model,
              "workload": f"{args.prompts} held-out stdlib prompts x {args.tokens} greedy tokens, trained demo model",
              "rows": rows, "seconds": seconds}
    out_dir = os.environ.get("OUT", "./bench_out")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
