"""TTFT of one prompt with the prefill kernels' module-level switches set several ways, in
one engine and one process, rounds interleaved (A B C A B C ...), so that the host and the
card are the same for every variant (separate calls land on different machines).

    python benchmarks/prefill_variants_ab.py --model nemotron_h_1b --lengths 8192 [--rounds 6]
        [--variants old,new] [--json OUT]

Variants (kernels/causal_conv1d/triton_conv.py, kernels/gated_delta/triton_chunk.py):
  old       the conv's tiled kernel; state kernel value block 32, no pipelining (the
            defaults before 2026-11-28)
  default   whatever the code's defaults are
  scanNxD   the conv's scan kernel, tiles of N tokens and D channels (2 warps), state as default
  ssdbv32   the defaults with the SSD state kernel's value block at 32
  ssdone    the plain (SSD) recurrence's state in one sequential kernel (SSD_SPLIT_STATE off)
  passKxVsS the split SSD state, its state-pass kernel on K x V tiles with S pipelining stages
The first round of each variant compiles and is dropped; TTFT is LLM.generate(max_tokens=1).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from model_configs import CONFIGS, write_model_dir  # noqa: E402


def apply(name: str, defaults: dict) -> None:
    from hybrid_serve.kernels.causal_conv1d import triton_conv
    from hybrid_serve.kernels.gated_delta import triton_chunk

    triton_conv.PREFILL_SCAN[0] = defaults["scan"]
    triton_chunk.STATE_BLOCK_V[:] = defaults["block_v"]
    triton_chunk.STATE_STAGES[:] = defaults["stages"]
    triton_chunk.SSD_SPLIT_STATE = defaults["split"]
    (triton_chunk.PASS_BLOCK_K, triton_chunk.PASS_BLOCK_V, triton_chunk.PASS_STAGES) = defaults["pass"]
    if name == "old":
        triton_conv.PREFILL_SCAN[0] = None
        triton_chunk.STATE_BLOCK_V[:], triton_chunk.STATE_STAGES[:] = [32, 32], [1, 1]
    elif name.startswith("scan"):
        tile, block_d = (int(v) for v in name[4:].split("x"))
        triton_conv.PREFILL_SCAN[0] = (tile, block_d, 2, 1)
    elif name == "ssdbv32":
        triton_chunk.STATE_BLOCK_V[1] = 32
    elif name == "ssdone":
        triton_chunk.SSD_SPLIT_STATE = False
    elif name.startswith("pass"):
        tile, stages = name[4:].split("s")
        block_k, block_v = (int(x) for x in tile.split("x"))
        triton_chunk.SSD_SPLIT_STATE = True
        triton_chunk.PASS_BLOCK_K, triton_chunk.PASS_BLOCK_V, triton_chunk.PASS_STAGES = block_k, block_v, int(stages)
    elif name != "default":
        raise ValueError(f"unknown variant {name!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="qwen3_5_2p3b", choices=sorted(CONFIGS))
    ap.add_argument("--lengths", default="8192")
    ap.add_argument("--variants", default="old,default")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from hybrid_serve import LLM, SamplingParams
    from hybrid_serve.kernels.causal_conv1d import triton_conv
    from hybrid_serve.kernels.gated_delta import triton_chunk

    defaults = {"scan": triton_conv.PREFILL_SCAN[0],
                "block_v": list(triton_chunk.STATE_BLOCK_V), "stages": list(triton_chunk.STATE_STAGES),
                "split": triton_chunk.SSD_SPLIT_STATE,
                "pass": (triton_chunk.PASS_BLOCK_K, triton_chunk.PASS_BLOCK_V, triton_chunk.PASS_STAGES)}
    lengths = [int(x) for x in args.lengths.split(",")]
    variants = args.variants.split(",")
    times: dict = {n: {v: [] for v in variants} for n in lengths}
    with tempfile.TemporaryDirectory() as tmp:
        llm = LLM(model=write_model_dir(args.model, tmp), device="cuda", dtype="bfloat16", load_format="dummy",
                  max_model_len=max(lengths) + 16)
        params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        gen = torch.Generator().manual_seed(1)
        vocab = llm.engine.hf_config.vocab_size
        for r in range(args.rounds + 1):
            for n in lengths:
                for v in variants:
                    apply(v, defaults)
                    prompt = torch.randint(10, vocab, (n,), generator=gen).tolist()
                    torch.cuda.synchronize()
                    t = time.perf_counter()
                    llm.generate([prompt], params)
                    torch.cuda.synchronize()
                    if r:
                        times[n][v].append((time.perf_counter() - t) * 1e3)
        apply("default", defaults)
    result = {"device": torch.cuda.get_device_name(0), "model": args.model, "defaults": defaults, "ttft_ms": {}}
    for n in lengths:
        for v in variants:
            med = statistics.median(times[n][v])
            result["ttft_ms"][f"{n}/{v}"] = {"median": med, "runs": times[n][v]}
            print(f"{args.model} {n:6d} {v:12s} TTFT median {med:8.2f} ms  runs "
                  f"{[round(x, 1) for x in times[n][v]]}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
