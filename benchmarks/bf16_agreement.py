"""bf16 Triton path vs the fp32 reference path, for the four families at 0.5-2B (dummy
weights, LM head sharpened so that next-token distributions are peaked as in trained models;
the bf16 *reference* path is run too, to tell kernel error from bf16 rounding):
greedy agreement over the first 16 tokens of 64 prompts, mean KL(fp32 || bf16) of the
next-token distributions while the two sequences agree, and CUDA graphs on vs off.

    python benchmarks/bf16_agreement.py [--families qwen3_5_1b,...] [--prompts 64]   # on a GPU
The reference runs the kernels' ref.py path in fp32 (HYBRID_SERVE_KERNELS=ref), on the GPU for speed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from model_configs import write_model_dir  # noqa: E402

from hybrid_serve import LLM, SamplingParams  # noqa: E402

SHARPEN = 16.0


def run(model_dir: str, dtype: str, prompts, kernels: str, cuda_graphs: bool = True):
    os.environ["HYBRID_SERVE_KERNELS"] = kernels
    llm = LLM(model=model_dir, device="cuda", dtype=dtype, load_format="dummy", max_num_seqs=64,
              max_num_batched_tokens=4096, chunked_prefill_size=512, enable_prefix_caching=False,
              enable_cuda_graphs=cuda_graphs, max_model_len=1024)
    llm.engine.model.lm_head.weight.data.mul_(SHARPEN)
    captured: dict[str, list[torch.Tensor]] = {}
    llm.engine.logits_hook = lambda reqs, logits: [
        captured.setdefault(r.request_id, []).append(torch.log_softmax(row.float(), -1).cpu())
        for r, row in zip(reqs, logits)]
    start = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    elapsed = time.perf_counter() - start
    tokens = [o.outputs[0].token_ids for o in outs]
    logps = [captured[o.request_id] for o in outs]
    del llm
    torch.cuda.empty_cache()
    return tokens, logps, elapsed


def compare(ref_tokens, ref_logps, tokens, logps):
    same_prompts = sum(a == b for a, b in zip(ref_tokens, tokens))
    same_tokens = kls = n = 0
    for rt, rl, t, lp in zip(ref_tokens, ref_logps, tokens, logps):
        for i in range(len(rt)):
            if rt[:i] != t[:i]:
                break  # past a divergence the two condition on different text
            kls += float((rl[i].exp() * (rl[i] - lp[i])).sum())
            n += 1
        same_tokens += sum(a == b for a, b in zip(rt, t))
    return same_prompts / len(ref_tokens), same_tokens / sum(map(len, ref_tokens)), kls / max(n, 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", default="qwen3_5_1b,qwen3_next_1b,lfm2_1b,nemotron_h_1b")
    ap.add_argument("--prompts", type=int, default=64)
    args = ap.parse_args()
    out_dir = os.environ.get("OUT", "./bench_out")
    os.makedirs(out_dir, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.families.split(","):
            model_dir = write_model_dir(name, tmp)
            vocab = json.load(open(os.path.join(model_dir, "config.json")))["vocab_size"]
            prompts = [torch.randint(0, vocab, (int(n),), generator=gen).tolist()
                       for n in torch.randint(16, 200, (args.prompts,), generator=gen)]
            ref_t, ref_l, t_ref = run(model_dir, "float32", prompts, "ref", cuda_graphs=False)
            bf_t, bf_l, t_bf = run(model_dir, "bfloat16", prompts, "auto", cuda_graphs=True)
            eager_t, _, t_eager = run(model_dir, "bfloat16", prompts, "auto", cuda_graphs=False)
            bref_t, bref_l, _ = run(model_dir, "bfloat16", prompts, "ref", cuda_graphs=False)  # same dtype, ref ops
            prompt_agree, token_agree, kl = compare(ref_t, ref_l, bf_t, bf_l)
            _, ref_bf16_tokens, ref_bf16_kl = compare(ref_t, ref_l, bref_t, bref_l)
            row = {"model": name, "prompts_all_16_agree": prompt_agree, "tokens_agree": token_agree,
                   "mean_kl": kl, "graphs_equal_eager": bf_t == eager_t,
                   "bf16_ref_path": {"tokens_agree": ref_bf16_tokens, "mean_kl": ref_bf16_kl},
                   "seconds": {"fp32_ref": t_ref, "bf16_graphs": t_bf, "bf16_eager": t_eager}}
            rows.append(row)
            print(json.dumps(row), flush=True)
    json.dump(rows, open(os.path.join(out_dir, "bf16_agreement.json"), "w"), indent=1)
    print(f"{'model':16} {'prompts=':>9} {'tokens=':>8} {'mean KL':>9} graphs==eager | bf16 ref path: tokens=, KL")
    for r in rows:
        print(f"{r['model']:16} {r['prompts_all_16_agree']:9.1%} {r['tokens_agree']:8.1%} {r['mean_kl']:9.2e} "
              f"{str(r['graphs_equal_eager']):13} | {r['bf16_ref_path']['tokens_agree']:.1%}, "
              f"{r['bf16_ref_path']['mean_kl']:.2e}")


if __name__ == "__main__":
    main()
