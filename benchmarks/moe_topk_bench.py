"""Router top-k softmax (kernels/moe/triton_moe.py `moe_topk_softmax`): the kernel before issue
12's fix (kept here, verbatim, for the A/B) against the current one, at decode and prefill
token counts; plus a sweep of the current kernel's launch (tokens per program, warps) and a
variant selecting with Triton's bitonic `tl.topk` instead of k rounds of a max.

Two timings per case, both on the GPU:
  graph_us   a CUDA graph of 200 back-to-back calls of the whole function (launch gaps
             included, as in the engine's decode graphs), replayed; us per call
  kernel_us  device time per call of each kernel the function launches (torch profiler over
             eager calls): the old path launches its kernel and a cast of the weights to the
             logits' dtype, the new one its kernel alone

    python benchmarks/moe_topk_bench.py [--tokens 1,4,16,256,4096] [--dtype bfloat16]

The models' router logits are fp32 (models/layers/ops.py router_logits): --dtype float32
times that case; the first recorded run (RESULTS.md, 2026-11-27) used bfloat16.

JSON in $OUT (moe_topk_bench.json).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import triton
import triton.language as tl

from hybrid_serve.kernels._common import next_pow2
from hybrid_serve.kernels.moe import moe_topk_softmax, moe_topk_softmax_ref
from hybrid_serve.kernels.moe.triton_moe import _topk_softmax_kernel, topk_softmax_launch_config


# ---- the kernel as of 40e5082 (verbatim), and its launcher -----------------------------
@triton.jit(do_not_specialize=["num_tokens"])
def _old_topk_softmax_kernel(logits_ptr, w_ptr, ids_ptr, num_tokens, num_experts, stride_l,
                             TOP_K: tl.constexpr, BE: tl.constexpr, BT: tl.constexpr, RENORMALIZE: tl.constexpr):
    rows = tl.program_id(0) * BT + tl.arange(0, BT)
    offs_e = tl.arange(0, BE)
    row_ok = rows < num_tokens
    mask = row_ok[:, None] & (offs_e < num_experts)[None, :]
    logits = tl.load(logits_ptr + rows[:, None].to(tl.int64) * stride_l + offs_e[None, :], mask=mask,
                     other=float("-inf")).to(tl.float32)
    logits = tl.where(row_ok[:, None], logits, 0.0)  # padding rows: finite, never stored
    probs = tl.exp(logits - tl.max(logits, axis=1)[:, None])
    probs = probs / tl.sum(probs, axis=1)[:, None]
    total = tl.zeros([BT], dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        best = tl.argmax(probs, axis=1, tie_break_left=True)  # [BT]
        w = tl.max(probs, axis=1)
        total += w
        tl.store(w_ptr + rows * TOP_K + k, w, mask=row_ok)
        tl.store(ids_ptr + rows * TOP_K + k, best.to(tl.int64), mask=row_ok)
        probs = tl.where(offs_e[None, :] == best[:, None], -1.0, probs)
    if RENORMALIZE:
        for k in tl.static_range(TOP_K):
            w = tl.load(w_ptr + rows * TOP_K + k, mask=row_ok, other=0.0)
            tl.store(w_ptr + rows * TOP_K + k, w / total, mask=row_ok)


def old_topk_softmax(router_logits: torch.Tensor, top_k: int, renormalize: bool):
    num_tokens, num_experts = router_logits.shape
    weights = torch.empty(num_tokens, top_k, dtype=torch.float32, device=router_logits.device)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int64, device=router_logits.device)
    block_e = next_pow2(num_experts)
    block_t = max(1, min(16, 4096 // block_e))
    _old_topk_softmax_kernel[(triton.cdiv(num_tokens, block_t),)](
        router_logits, weights, ids, num_tokens, num_experts, router_logits.stride(0),
        TOP_K=top_k, BE=block_e, BT=block_t, RENORMALIZE=renormalize)
    return weights.to(router_logits.dtype), ids


# ---- variant: bitonic top-k (tl.topk) over the same packed keys --------------------------
@triton.jit(do_not_specialize=["num_tokens"])
def _sort_topk_softmax_kernel(logits_ptr, w_ptr, ids_ptr, num_tokens, num_experts, stride_l,
                              TOP_K: tl.constexpr, KP: tl.constexpr, BE: tl.constexpr, BT: tl.constexpr,
                              RENORMALIZE: tl.constexpr):
    rows = tl.program_id(0) * BT + tl.arange(0, BT)
    offs_e = tl.arange(0, BE)
    row_ok = rows < num_tokens
    col_ok = offs_e < num_experts
    logits = tl.load(logits_ptr + rows[:, None].to(tl.int64) * stride_l + offs_e[None, :],
                     mask=row_ok[:, None] & col_ok[None, :], other=float("-inf")).to(tl.float32)
    logits = tl.where(row_ok[:, None], logits, 0.0)
    probs = tl.exp(logits - tl.max(logits, axis=1)[:, None])
    probs = probs / tl.sum(probs, axis=1)[:, None]
    keys = (probs.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (BE - 1 - offs_e).to(tl.int64)[None, :]
    keys = tl.where(col_ok[None, :], keys, -1)
    top = tl.topk(keys, KP)  # [BT, KP], descending
    offs_k = tl.arange(0, KP)
    w = (top >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    ids = BE - 1 - (top & 0xFFFFFFFF)
    if RENORMALIZE:
        w = w / tl.sum(tl.where((offs_k < TOP_K)[None, :], w, 0.0), axis=1)[:, None]
    out_mask = row_ok[:, None] & (offs_k < TOP_K)[None, :]
    out_offs = rows[:, None].to(tl.int64) * TOP_K + offs_k[None, :]
    tl.store(w_ptr + out_offs, w.to(w_ptr.dtype.element_ty), mask=out_mask)
    tl.store(ids_ptr + out_offs, ids, mask=out_mask)


def launch(kernel, router_logits, top_k, renormalize, block_t, num_warps):
    num_tokens, num_experts = router_logits.shape
    weights = torch.empty(num_tokens, top_k, dtype=router_logits.dtype, device=router_logits.device)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int64, device=router_logits.device)
    kernel[(triton.cdiv(num_tokens, block_t),)](
        router_logits, weights, ids, num_tokens, num_experts, router_logits.stride(0),
        TOP_K=top_k, KP=next_pow2(top_k), BE=next_pow2(num_experts), BT=block_t, RENORMALIZE=renormalize,
        num_warps=num_warps)
    return weights, ids


# ---- timing ------------------------------------------------------------------------------
def graph_us(fn, calls: int = 200, reps: int = 7) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    del graph
    return statistics.median(times)


def kernel_us(fn, calls: int = 50) -> dict:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if e.self_device_time_total > 0:
            out[e.key[:60]] = round(e.self_device_time_total / calls, 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="1,4,16,256,4096")
    ap.add_argument("--shapes", default="512x10,128x8,64x4", help="experts x top_k; the sweep runs on the first")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--no-renormalize", action="store_true")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    renorm = not args.no_renormalize
    tokens = [int(t) for t in args.tokens.split(",")]
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    device = torch.cuda.get_device_name(0)
    print(f"{device}, {args.dtype} logits, renormalize={renorm}", flush=True)
    result = {"device": device, "dtype": args.dtype, "renormalize": renorm, "cases": []}
    gen = torch.Generator(device="cuda").manual_seed(0)
    for si, (E, K) in enumerate(shapes):
        default = topk_softmax_launch_config(E)
        variants = {"old": lambda x: old_topk_softmax(x, K, renorm), "new": lambda x: moe_topk_softmax(x, K, renorm)}
        if si == 0:
            for bt, nw in [(1, 1), (1, 2), (1, 4), (1, 8), (2, 4), (4, 4), (8, 8)]:
                if (bt, nw) != default:
                    variants[f"new_bt{bt}_w{nw}"] = (lambda bt, nw: lambda x: launch(
                        _topk_softmax_kernel, x, K, renorm, bt, nw))(bt, nw)
            for nw in (1, 4):
                variants[f"tl_topk_w{nw}"] = (lambda nw: lambda x: launch(
                    _sort_topk_softmax_kernel, x, K, renorm, 1, nw))(nw)
        for T in tokens:
            x = (2 * torch.randn(T, E, device="cuda", generator=gen)).to(dtype)
            ref_w, ref_ids = moe_topk_softmax_ref(x, K, renorm)
            old_w, old_ids = old_topk_softmax(x, K, renorm)
            case = {"experts": E, "top_k": K, "tokens": T, "default_launch": {"block_t": default[0],
                                                                               "num_warps": default[1]}}
            line = [f"E={E} k={K} T={T:5d}:"]
            for name, fn in variants.items():
                try:
                    w, ids = fn(x)
                    torch.cuda.synchronize()
                except Exception as exc:  # a variant that does not compile is reported, not fatal
                    case[name] = {"error": repr(exc)[:300]}
                    line.append(f"{name} failed")
                    continue
                row = {"graph_us": round(graph_us(lambda: fn(x)), 2), "kernel_us": kernel_us(lambda: fn(x)),
                       "ids_equal_old": bool(torch.equal(ids, old_ids)),
                       "ids_match_fraction_torch_topk": float((ids == ref_ids).float().mean()),
                       "weights_max_abs_diff_old": float((w.float() - old_w.float()).abs().max())}
                case[name] = row
                line.append(f"{name} {row['graph_us']:.2f}us")
            print("  ".join(line), flush=True)
            for name in ("old", "new"):
                print(f"      {name} kernels: {case[name].get('kernel_us')}", flush=True)
            result["cases"].append(case)
    out_dir = os.environ.get("OUT", "./bench_out")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "moe_topk_bench.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
