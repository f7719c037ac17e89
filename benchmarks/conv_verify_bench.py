"""The causal conv kernel on a speculative verify step's shapes (GPU): B rows of K+1 tokens,
the 2.3B Qwen3.5 layout's GDN conv (8,192 channels, width 4, bf16), the window after each
token to the scratch and the last to the pool (`update_pool`), against a plain decode step
of B rows (the cost a verify step adds per GDN layer). Times are CUDA-graph replays
(`triton.testing.do_bench_cudagraph`, median), so host launch cost is left out.

With `--old MODULE` (e.g. `hybrid_serve.kernels.causal_conv1d._old_conv`, a copy of an
earlier triton_conv.py), that kernel is timed beside and its outputs compared.

    python benchmarks/conv_verify_bench.py [--batches 1,16,64] [--k 4] [--old MODULE] [--sweep] [--out DIR]
"""
from __future__ import annotations

import argparse
import importlib
import json
import os

import torch
import triton

from hybrid_serve.kernels.causal_conv1d import triton_conv


def _inputs(batch: int, tokens: int, steps: int, dim: int, width: int, dtype: torch.dtype):
    g = torch.Generator(device="cuda").manual_seed(batch * 131 + tokens)
    x = torch.randn(batch * tokens, dim, device="cuda", dtype=dtype, generator=g)
    w = torch.randn(dim, width, device="cuda", dtype=dtype, generator=g)
    b = torch.randn(dim, device="cuda", dtype=dtype, generator=g)
    pool = torch.randn(batch + 1, dim, width - 1, device="cuda", dtype=dtype, generator=g)
    scratch = torch.zeros(batch, steps, dim, width - 1, device="cuda", dtype=dtype)
    slots = torch.arange(1, batch + 1, device="cuda", dtype=torch.int32)
    cu = torch.arange(0, batch * tokens + 1, tokens, device="cuda", dtype=torch.int32)
    return x, w, b, pool, scratch, slots, cu


def _verify_call(mod, x, w, b, pool, scratch, slots, cu, **tuning):
    return lambda: mod.causal_conv1d_varlen(x, w, b, pool, slots, cu, "silu", intermediate_conv_windows=scratch,
                                            update_pool=True, **tuning)


def _time_us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    return 1e3 * triton.testing.do_bench_cudagraph(fn, rep=200, return_mode="median")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--k", type=int, default=4, help="drafts per row: rows of K+1 tokens, K scratch steps")
    ap.add_argument("--dim", type=int, default=8192)
    ap.add_argument("--old", default=None)
    ap.add_argument("--sweep", action="store_true", help="also time block_d x num_warps variants (us)")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    args = ap.parse_args()
    old = importlib.import_module(args.old) if args.old else None
    rows = []
    for batch in [int(v) for v in args.batches.split(",")]:
        tokens, steps, width = args.k + 1, args.k, 4
        row = {"batch": batch, "tokens_per_row": tokens, "dim": args.dim}
        x, w, b, pool, scratch, slots, cu = _inputs(batch, tokens, steps, args.dim, width, torch.bfloat16)
        pool0 = pool.clone()
        row["verify_us"] = round(_time_us(_verify_call(triton_conv, x, w, b, pool, scratch, slots, cu)), 2)
        # one clean call for the comparison (the timing loop rewrote the pool many times)
        pool.copy_(pool0)
        y_new = _verify_call(triton_conv, x, w, b, pool, scratch, slots, cu)()
        got = (y_new.clone(), scratch.clone(), pool.clone())
        if old is not None:
            pool.copy_(pool0)
            row["old_verify_us"] = round(_time_us(_verify_call(old, x, w, b, pool, scratch, slots, cu)), 2)
            pool.copy_(pool0)
            scratch.zero_()
            y_old = _verify_call(old, x, w, b, pool, scratch, slots, cu)()
            row["equal_to_old"] = bool(torch.equal(got[0], y_old) and torch.equal(got[1], scratch)
                                       and torch.equal(got[2], pool))
        if args.sweep:
            row["sweep_us"] = {}
            for block_d in (32, 64, 128, 256):
                for warps in (2, 4, 8):
                    fn = _verify_call(triton_conv, x, w, b, pool, scratch, slots, cu, block_d=block_d, num_warps=warps)
                    row["sweep_us"][f"d{block_d}w{warps}"] = round(_time_us(fn), 2)
        xd, wd, bd, pd, _, sd, cud = _inputs(batch, 1, 1, args.dim, width, torch.bfloat16)
        row["plain_decode_us"] = round(_time_us(lambda: triton_conv.causal_conv1d_varlen(xd, wd, bd, pd, sd, cud,
                                                                                         "silu")), 2)
        scratch_bytes = scratch.numel() * scratch.element_size()
        row["scratch_write_GBps"] = round(scratch_bytes / (row["verify_us"] * 1e3), 1)
        print(json.dumps(row), flush=True)
        rows.append(row)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "conv_verify_bench.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "k": args.k, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
