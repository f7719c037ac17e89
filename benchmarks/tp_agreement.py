"""tp=N against tp=1 on GPUs (NCCL): greedy tokens of 32 prompts x 16 tokens, and the KL of
the first next-token distribution over the tp=1 run's top-20 tokens (logprobs=20), in fp32
and bf16, Qwen3.5-layout 1.5B with dummy weights.

    python benchmarks/tp_agreement.py --tp 4     # on a machine with >= 4 GPUs
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile

import ray
import torch

sys.path.insert(0, os.path.dirname(__file__))
from model_configs import write_model_dir  # noqa: E402

from hybrid_serve.actors.offline import ReplicaSet  # noqa: E402
from hybrid_serve.engine.batch import BatchItem  # noqa: E402
from hybrid_serve.engine.config import EngineConfig  # noqa: E402
from hybrid_serve.engine.sampling_params import SamplingParams  # noqa: E402


def run(model_dir, dtype, tp, prompts):
    config = EngineConfig(model=model_dir, device="cuda", dtype=dtype, load_format="dummy", max_num_seqs=32,
                          enable_prefix_caching=False, max_model_len=1024, max_num_batched_tokens=4096,
                          chunked_prefill_size=512)
    replicas = ReplicaSet(config, tp, 1)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, logprobs=20)
    results = replicas.generate([BatchItem(str(i), p, params) for i, p in enumerate(prompts)])
    replicas.shutdown()
    return [results[str(i)].outputs[0] for i in range(len(prompts))]


def compare(base, other):
    tokens = sum(a == b for x, y in zip(base, other) for a, b in zip(x.token_ids, y.token_ids))
    total = sum(len(x.token_ids) for x in base)
    kls = []
    for x, y in zip(base, other):
        p, q = x.logprobs[0], y.logprobs[0]
        shared = [t for t in p if t in q]
        zp = math.log(sum(math.exp(p[t].logprob) for t in shared))
        zq = math.log(sum(math.exp(q[t].logprob) for t in shared))
        kls.append(sum(math.exp(p[t].logprob - zp) * ((p[t].logprob - zp) - (q[t].logprob - zq)) for t in shared))
    return tokens / total, sum(a.token_ids == b.token_ids for a, b in zip(base, other)) / len(base), sum(kls) / len(kls)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, default=4)
    args = ap.parse_args()
    ray.init(num_gpus=torch.cuda.device_count(), include_dashboard=False, log_to_driver=False)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 150000, (int(n),), generator=gen).tolist() for n in torch.randint(16, 200, (32,), generator=gen)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir("qwen3_5_1b", tmp)
        for dtype in ("float32", "bfloat16"):
            base = run(model_dir, dtype, 1, prompts)
            other = run(model_dir, dtype, args.tp, prompts)
            tok, full, kl = compare(base, other)
            rows.append({"dtype": dtype, "tp": args.tp, "tokens_agree": tok, "prompts_all_16_agree": full,
                         "mean_kl_first_token_top20": kl})
            print(json.dumps(rows[-1]), flush=True)
    out = os.path.join(os.environ.get("OUT", "./bench_out"), "tp_agreement.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    json.dump(rows, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()
