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
    python benchmarks/moe_gemm_tune.py --skinny   # one token: HYBRID_SERVE_MOE_ONE_ROW_TILES=skinny
                                                  # (_moe_skinny_kernel) per GEMM and tile vs the tensor-core tiles

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

from hybrid_serve.kernels.moe import fused_moe, skinny_experts, triton_moe  # noqa: E402

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


def card_and_weights() -> tuple[float, str, torch.Generator, list[tuple[torch.Tensor, torch.Tensor]]]:
    """The copy rate measured now (printed with the card's name), a seeded generator, and COPIES
    copies of the experts' bf16 weights (Qwen3-Next's shapes)."""
    bw = copy_bandwidth()
    device = torch.cuda.get_device_name(0)
    print(f"{device}: copy rate {bw / 1e12:.3f} TB/s", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    weights = [((torch.randn(E, 2 * I, H, device="cuda", generator=gen) / H ** 0.5).bfloat16(),
                (torch.randn(E, H, I, device="cuda", generator=gen) / I ** 0.5).bfloat16()) for _ in range(COPIES)]
    return bw, device, gen, weights


def skinny_sweep(tile_list: str) -> None:
    """One token: the tensor-core one-row tiles, then HYBRID_SERVE_MOE_ONE_ROW_TILES=skinny with
    its default tiles, then each GEMM with each of `tile_list` (the other GEMM at its default)."""
    bw, device, gen, weights = card_and_weights()
    x = torch.randn(1, H, device="cuda", generator=gen).bfloat16()
    ids = [torch.randperm(E, device="cuda", generator=gen)[:K].view(1, K) for _ in range(CALLS)]
    floor_us = K * 3 * I * H * 2 / bw * 1e6
    topk_w = torch.full((1, K), 1.0 / K, device="cuda", dtype=torch.bfloat16)
    os.environ["HYBRID_SERVE_MOE_ONE_ROW_TILES"] = "1"
    tensor_core = time_calls(x, weights, ids, topk_w)
    os.environ["HYBRID_SERVE_MOE_ONE_ROW_TILES"] = "skinny"
    default_tiles = skinny_experts.moe_skinny_tiles
    skinny = time_calls(x, weights, ids, topk_w)
    print(f"floor {floor_us:.2f} us; tensor-core one-row tiles {tensor_core:.2f} us ({floor_us / tensor_core:.1%}); "
          f"skinny, default tiles {skinny:.2f} us ({floor_us / skinny:.1%})", flush=True)
    result = {"device": device, "copy_rate_TBps": bw / 1e12, "floor_us": floor_us, "tensor_core_us": tensor_core,
              "skinny_default_us": skinny, "cases": []}
    for gated in (True, False):
        for spec in tile_list.split(","):
            tiles = tuple(int(v) for v in spec.split("x"))

            def swept(k_in: int, g: bool, tiles=tiles, want=gated) -> tuple[int, int, int]:
                return tiles if g == want else default_tiles(k_in, g)

            skinny_experts.moe_skinny_tiles = swept
            try:
                us = time_calls(x, weights, ids, topk_w)
            except Exception as e:  # noqa: BLE001  (a config Triton cannot compile: out of resources)
                print(f"  {'gate_up' if gated else 'down'} {spec}: failed {type(e).__name__}")
                continue
            finally:
                skinny_experts.moe_skinny_tiles = default_tiles
            result["cases"].append({"gemm": "gate_up" if gated else "down", "tiles": tiles, "us_per_call": us})
            print(f"  {'gate_up' if gated else 'down':7} BN x BK x warps {spec}: {us:.2f} us ({skinny - us:+.2f} vs "
                  f"skinny default, {tensor_core - us:+.2f} vs tensor cores)", flush=True)
    out_dir = os.environ.get("OUT", "./bench_out")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "moe_gemm_tune_skinny.json"), "w") as f:
        json.dump(result, f, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="1,4")
    ap.add_argument("--block-n", default="16,32,64")
    ap.add_argument("--block-k", default="64,128,256")
    ap.add_argument("--warps", default="2,4")
    ap.add_argument("--stages", default="3,4")
    ap.add_argument("--skinny", action="store_true", help="one token: the skinny experts' tiles (BNxBKxwarps)")
    ap.add_argument("--skinny-tiles", default="4x1024x4,4x512x4,8x512x4,8x256x4,16x512x8,16x256x4")
    args = ap.parse_args()
    if args.skinny:
        skinny_sweep(args.skinny_tiles)
        return
    os.environ["HYBRID_SERVE_MOE_ONE_ROW_TILES"] = "1"
    bw, device, gen, weights = card_and_weights()
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
