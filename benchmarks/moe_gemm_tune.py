"""The expert GEMMs' tiles at decode (kernels/moe/triton_moe.py `GEMM_TILES`): fused_moe with
one-row tiles at 1 and 4 tokens, 512 experts top-10, hidden 2048, expert intermediate 512,
bf16 (Qwen3-Next-80B's shapes), each (BLOCK_N, BLOCK_K, warps, stages) of one GEMM with the
other GEMM's tiles held at the current default.

Timing: a CUDA graph of 48 back-to-back fused_moe calls, each on other experts (fresh random
ids) of one of 4 copies of the expert weights (12.9 GB), so the weights stream from HBM and
not from the 50 MB L2; replayed 20 times, us per call (median of 5 replays' means). Floor:
the bytes of the 10 chosen experts (the tokens' picks, distinct) over the copy rate
measured in the same run.

    python benchmarks/moe_gemm_tune.py [--tokens 1,4]

JSON in $OUT (moe_gemm_tune.json).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from decode_bench import copy_bandwidth  # noqa: E402

from hybrid_serve.kernels.moe import fused_moe, triton_moe  # noqa: E402

E, K, H, I = 512, 10, 2048, 512
COPIES, CALLS = 4, 48


def time_calls(x: torch.Tensor, weights: list[tuple[torch.Tensor, torch.Tensor]], ids: list[torch.Tensor],
               topk_w: torch.Tensor) -> float:
    """us per fused_moe call in a CUDA graph of CALLS calls over the weight copies and id sets."""
    def calls() -> None:
        for c in range(CALLS):
            gate_up, down = weights[c % COPIES]
            fused_moe(x, gate_up, down, topk_w, ids[c], out_dtype=torch.bfloat16)

    calls()  # compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    graph.replay()
    torch.cuda.synchronize()
    means = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            graph.replay()
        end.record()
        end.synchronize()
        means.append(start.elapsed_time(end) * 1e3 / 20 / CALLS)
    del graph
    return statistics.median(means)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="1,4")
    ap.add_argument("--block-n", default="16,32,64")
    ap.add_argument("--block-k", default="64,128,256")
    ap.add_argument("--warps", default="2,4")
    ap.add_argument("--stages", default="3,4")
    args = ap.parse_args()
    os.environ["HYBRID_SERVE_MOE_ONE_ROW_TILES"] = "1"
    bw = copy_bandwidth()
    device = torch.cuda.get_device_name(0)
    print(f"{device}: copy rate {bw / 1e12:.3f} TB/s", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    weights = [((torch.randn(E, 2 * I, H, device="cuda", generator=gen) / H ** 0.5).bfloat16(),
                (torch.randn(E, H, I, device="cuda", generator=gen) / I ** 0.5).bfloat16()) for _ in range(COPIES)]
    default = dict(triton_moe.GEMM_TILES)
    grid = list(itertools.product(*(map(int, v.split(",")) for v in (args.block_n, args.block_k, args.warps,
                                                                       args.stages))))
    result = {"device": device, "copy_rate_TBps": bw / 1e12, "default": {str(k): v for k, v in default.items()},
              "cases": []}
    for tokens in map(int, args.tokens.split(",")):
        x = torch.randn(tokens, H, device="cuda", generator=gen).bfloat16()
        ids = [torch.stack([torch.randperm(E, device="cuda", generator=gen)[:K] for _ in range(tokens)])
               for _ in range(CALLS)]
        distinct = statistics.mean(len(torch.unique(i)) for i in ids)
        floor_us = distinct * 3 * I * H * 2 / bw * 1e6
        topk_w = torch.full((tokens, K), 1.0 / K, device="cuda", dtype=torch.bfloat16)
        base = time_calls(x, weights, ids, topk_w)
        print(f"tokens {tokens}: default {base:.2f} us, floor {floor_us:.2f} us ({floor_us / base:.1%})", flush=True)
        for first in (True, False):
            rows = []
            for tiles in grid:
                triton_moe.GEMM_TILES.update(default)
                triton_moe.GEMM_TILES[(True, first)] = tiles
                try:
                    us = time_calls(x, weights, ids, topk_w)
                except Exception as e:  # noqa: BLE001  (a config Triton cannot compile: out of resources)
                    print(f"  {'gate_up' if first else 'down'} {tiles}: failed {type(e).__name__}")
                    continue
                rows.append((us, tiles))
                result["cases"].append({"tokens": tokens, "gemm": "gate_up" if first else "down",
                                        "tiles": tiles, "us_per_call": us, "default_us": base, "floor_us": floor_us})
            rows.sort()
            for us, tiles in rows[:6]:
                print(f"  {'gate_up' if first else 'down':7} BN,BK,warps,stages={tiles}: {us:.2f} us "
                      f"({base - us:+.2f} vs default)")
        triton_moe.GEMM_TILES.update(default)
    out_dir = os.environ.get("OUT", "./bench_out")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "moe_gemm_tune.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
