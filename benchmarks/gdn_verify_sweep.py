"""The recurrent Gated DeltaNet kernel in a verify step (deferred mode: K + 1 tokens a row,
no state written) over its value-block width and warps, against the decode step's launch
(one token a row, state in place) in the same run; 2.3B layout (16 key / 32 value heads of
128), bf16 inputs, fp32 states, 18 layers' pools distinct (states cold in L2), each timing a
CUDA graph of the 18 layers' calls.

    python benchmarks/gdn_verify_sweep.py [--batches 1,16,64] [--k 4]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from linear_sweep import graph_time_us  # noqa: E402

from hybrid_serve.kernels.gated_delta import gated_delta_rule_recurrent  # noqa: E402

H, HV, D, LAYERS = 16, 32, 128, 18


def inputs(batch: int, tokens_per_row: int, dev: str = "cuda"):
    t = batch * tokens_per_row
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(t, H, D, device=dev, generator=g).bfloat16()
    k = torch.randn(t, H, D, device=dev, generator=g).bfloat16()
    v = torch.randn(t, HV, D, device=dev, generator=g).bfloat16()
    a = torch.randn(t, HV, device=dev, generator=g).bfloat16()
    b = torch.randn(t, HV, device=dev, generator=g).bfloat16()
    gating = (torch.randn(HV, device=dev, generator=g), torch.randn(HV, device=dev, generator=g))
    pools = [torch.randn(batch + 1, HV, D, D, device=dev, generator=g) * 0.1 for _ in range(LAYERS)]
    slots = torch.arange(1, batch + 1, device=dev, dtype=torch.int32)
    cu = torch.arange(0, t + 1, tokens_per_row, device=dev, dtype=torch.int32)
    return q, k, v, a, b, gating, pools, slots, cu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    rows = []
    for batch in [int(x) for x in args.batches.split(",")]:
        q, k, v, a, b, gating, pools, slots, cu = inputs(batch, 1)
        t_decode = graph_time_us(lambda: [gated_delta_rule_recurrent(q, k, v, a, b, p, slots, cu, gating=gating)
                                          for p in pools], LAYERS)
        decode_line = [f"batch {batch:3d}: decode (one token a row, state in place) by block_v x warps:"]
        for bv, warps in ((16, 1), (16, 2), (32, 1), (32, 2), (32, 4), (64, 2), (64, 4)):
            t = graph_time_us(lambda: [gated_delta_rule_recurrent(q, k, v, a, b, p, slots, cu, gating=gating,
                                                                  block_v=bv, num_warps=warps) for p in pools], LAYERS)
            rows.append(dict(batch=batch, mode="decode", block_v=bv, num_warps=warps, us_per_layer=t))
            decode_line.append(f"  bv={bv:3d} w={warps}: {t:6.2f}")
        print("\n".join(decode_line), flush=True)
        q, k, v, a, b, gating, pools, slots, cu = inputs(batch, args.k + 1)
        replay = (torch.zeros(batch, args.k + 1, HV, D, device="cuda"), torch.zeros(batch, args.k + 1, HV, D, device="cuda"),
                  torch.zeros(batch, args.k + 1, 2, HV, device="cuda"))
        want = gated_delta_rule_recurrent(q, k, v, a, b, pools[0], slots, cu, gating=gating, replay=replay)
        line = [f"batch {batch:3d}: decode {t_decode:6.2f} us/layer; verify (K={args.k}, deferred) by block_v x warps:"]
        for bv in (8, 16, 32, 64, 128):
            for warps in (1, 2, 4, 8):
                if bv * D // (32 * warps) > 256 or bv * D // (32 * warps) < 4:
                    continue
                got = gated_delta_rule_recurrent(q, k, v, a, b, pools[0], slots, cu, gating=gating, replay=replay,
                                                 block_v=bv, num_warps=warps)
                ok = torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-2)
                t = graph_time_us(lambda: [gated_delta_rule_recurrent(q, k, v, a, b, p, slots, cu, gating=gating,
                                                                      replay=replay, block_v=bv, num_warps=warps)
                                           for p in pools], LAYERS)
                rows.append(dict(batch=batch, block_v=bv, num_warps=warps, us_per_layer=t, ok=ok, decode_us=t_decode))
                line.append(f"  bv={bv:3d} w={warps}: {t:6.2f}{'' if ok else ' WRONG'}")
        default = gated_delta_rule_recurrent  # the default launch, for reference
        t_def = graph_time_us(lambda: [default(q, k, v, a, b, p, slots, cu, gating=gating, replay=replay)
                                       for p in pools], LAYERS)
        line.append(f"  default: {t_def:6.2f}")
        rows.append(dict(batch=batch, default=True, us_per_layer=t_def, decode_us=t_decode))
        print("\n".join(line), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
