"""Skinny linear (kernels/linear) vs cuBLAS at the 2.3B decode shapes, weights cold in HBM.

Each timing replays a CUDA graph of R calls on R distinct weights (R x weight >> L2), as a
decode step streams a new weight per layer; reported: us per call and the weight-read rate.
Then the whole decode step's linears (18 GDN in_proj, 6 q/k/v, 24 gate_up, 24 out/o_proj,
24 down_proj, the LM head) with cuBLAS and with the best configuration per shape.

    python benchmarks/linear_sweep.py [--rows 1,2,4,8] [--quick] [--model qwen3_next_80b_12l]
    python benchmarks/linear_sweep.py --few-rows [--rows 2,5,8,16]   # the tensor-core kernel

`--few-rows` times kernels.linear.few_rows_linear (2-16 rows: verify rows of K + 1 tokens, small
decode batches) over its tile / pipeline configurations against cuBLAS in the same run, then
the step's linears at each row count with cuBLAS, the default configuration and the best
configuration per shape.
"""
from __future__ import annotations

import argparse
import itertools
import json

import torch
import torch.nn.functional as F

from hybrid_serve.kernels.linear import few_rows_linear, skinny_linear, skinny_linear_ref

# (name, N, K, calls per decode step) for the 2.3B Qwen3.5 layout at tp=1
SHAPES = [("gdn_in_proj", 12352, 2048, 18), ("attn_qkv", 9216, 2048, 6), ("gate_up", 12288, 2048, 24),
          ("out_o_proj", 2048, 4096, 24), ("down_proj", 2048, 6144, 24), ("lm_head", 151936, 2048, 1)]
# the same for the 12-layer Qwen3-Next-80B-A3B slice (model_configs.qwen3_next_80b_12l, tp=1): 9 GDN
# and 3 attention layers, each MoE block's x projections (router 512 + shared gate 1 + shared
# gate/up 1024, fp32 sums in the model) and its shared expert's down projection
SHAPES_QWEN3_NEXT_12L = [("gdn_in_proj", 12352, 2048, 9), ("attn_qkv", 9216, 2048, 3), ("out_o_proj", 2048, 4096, 12),
                         ("moe_x_proj", 1537, 2048, 12), ("shared_down", 2048, 512, 12), ("lm_head", 151936, 2048, 1)]


def graph_time_us(fn, calls: int, reps: int = 20) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    times.sort()
    return times[len(times) // 2]


def best_config(kernel, variant: str, cfgs: list[dict], x, ws, ref, name: str, results: list,
                reps: int = 20) -> tuple[float, dict | None]:
    """(us per call, configuration) of the fastest of `cfgs` for kernel(x, w, **cfg) over the
    weights `ws` (each checked against `ref` first; a wrong or failing one is skipped); every
    timing is appended to `results`."""
    best = (float("inf"), None)
    ref = ref.float()
    for cfg in cfgs:
        try:
            err = (kernel(x, ws[0], **cfg).float() - ref).abs().max().item()
            if err > 0.02 * ref.abs().max().item() + 1e-3:
                print(f"  {name} m={x.shape[0]} {cfg}: WRONG (max err {err:.3g})")
                continue
            t = graph_time_us(lambda: [kernel(x, w, **cfg) for w in ws], len(ws), reps=reps)
        except Exception as e:  # noqa: BLE001  (a config that does not fit: skip it)
            print(f"  {name} m={x.shape[0]} {cfg}: skipped ({type(e).__name__}: {str(e)[:80]})")
            continue
        results.append(dict(shape=name, rows=x.shape[0], us=t, variant=variant, **cfg))
        if t < best[0]:
            best = (t, cfg)
    return best


def configs(m: int, quick: bool):
    """Around kernels.linear.skinny_config: tiles whose fp32 accumulator fits in <= 128
    registers a thread."""
    block_m = 1 << (m - 1).bit_length()
    out = [dict(block_n=bn, block_k=bk, num_warps=w)
           for bn, bk, w in itertools.product((2, 4, 8), (256, 512, 1024, 2048), (4, 8))
           if block_m * bn * bk // (32 * w) <= 128]
    return out[::3] if quick else out


def few_rows_configs():
    """Tensor-core few-rows tiles whose pipelined weight tiles fit in ~200 KB of shared memory."""
    out = []
    for w_left, bn, bk, warps, stages in itertools.product((False, True), (16, 32, 64, 128), (128, 256, 512),
                                                          (4, 8), (3, 4, 5)):
        if (bn + 16) * bk * 2 * stages > 200 * 1024 or (warps == 8 and bn * bk < 64 * 256):
            continue
        out.append(dict(w_left=w_left, block_n=bn, block_k=bk, num_warps=warps, num_stages=stages))
    return out


def few_rows_main(rows: list[int], json_path: str) -> None:
    """Sweep of the few-rows kernel (module doc)."""
    torch.manual_seed(0)
    dev = "cuda"
    results, cfgs = [], few_rows_configs()
    totals = {m: dict(cublas=0.0, default=0.0, best=0.0, best_shared=0.0) for m in rows}
    for name, n, k, per_step in SHAPES:
        reps_w = max(4, min(24, int(2e9 // (n * k * 2))))
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(reps_w)]
        gbytes = n * k * 2 / 1e9
        for m in rows:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            ref = skinny_linear_ref(x, ws[0]).float()
            t_cublas = graph_time_us(lambda: [F.linear(x, w) for w in ws], reps_w)
            t_default = graph_time_us(lambda: [few_rows_linear(x, w) for w in ws], reps_w)
            best = best_config(few_rows_linear, "few_rows", cfgs, x, ws, ref, name, results, reps=8)
            totals[m]["cublas"] += per_step * t_cublas
            totals[m]["default"] += per_step * t_default
            totals[m]["best"] += per_step * best[0]
            results.append(dict(shape=name, rows=m, us=t_cublas, variant="cublas"))
            results.append(dict(shape=name, rows=m, us=t_default, variant="few_rows_default"))
            print(f"m={m:2d} {name:12s} N={n:6d} K={k}: cuBLAS {t_cublas:7.2f} us ({gbytes / t_cublas * 1e3:5.2f} TB/s)  "
                  f"default {t_default:7.2f} us ({gbytes / t_default * 1e3:5.2f} TB/s)  "
                  f"best {best[0]:7.2f} us ({gbytes / best[0] * 1e3:5.2f} TB/s) {best[1]}", flush=True)
        del ws
    for m in rows:
        print(f"m={m:2d} step linears: cuBLAS {totals[m]['cublas']:.0f} us, few-rows default "
              f"{totals[m]['default']:.0f} us, best per shape {totals[m]['best']:.0f} us", flush=True)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(dict(results=results, totals=totals), f, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,2,4,8")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default="")
    ap.add_argument("--few-rows", action="store_true", help="sweep the tensor-core few-rows kernel")
    ap.add_argument("--model", choices=("qwen3_5_2p3b", "qwen3_next_80b_12l"), default="qwen3_5_2p3b",
                    help="whose decode-step linears (shapes and calls a step)")
    args = ap.parse_args()
    global SHAPES
    if args.model == "qwen3_next_80b_12l":
        SHAPES = SHAPES_QWEN3_NEXT_12L
    if args.few_rows:
        few_rows_main([int(r) for r in args.rows.split(",")], args.json)
        return
    torch.manual_seed(0)
    dev = "cuda"
    results = []
    for m in [int(r) for r in args.rows.split(",")]:
        step_cublas = step_best = step_default = 0.0
        for name, n, k, per_step in SHAPES:
            reps_w = max(4, min(24, int(2e9 // (n * k * 2))))  # ~>= 2 GB of weights per graph
            ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(reps_w)]
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            gbytes = n * k * 2 / 1e9
            ref = skinny_linear_ref(x, ws[0])
            t_cublas = graph_time_us(lambda: [F.linear(x, w) for w in ws], reps_w)
            t_default = graph_time_us(lambda: [skinny_linear(x, w) for w in ws], reps_w)
            best = best_config(skinny_linear, "skinny", configs(m, args.quick), x, ws, ref, name, results)
            step_cublas += per_step * t_cublas
            step_best += per_step * min(best[0], t_cublas)
            step_default += per_step * t_default
            print(f"m={m} {name:12s} N={n:6d} K={k}: cuBLAS {t_cublas:7.2f} us ({gbytes / t_cublas * 1e3:5.2f} TB/s)  "
                  f"default {t_default:7.2f} us ({gbytes / t_default * 1e3:5.2f} TB/s)  "
                  f"best {best[0]:7.2f} us ({gbytes / best[0] * 1e3:5.2f} TB/s) {best[1]}", flush=True)
            results.append(dict(shape=name, rows=m, us=t_cublas, variant="cublas"))
            results.append(dict(shape=name, rows=m, us=t_default, variant="default"))
            del ws
        print(f"m={m} decode-step linears: cuBLAS {step_cublas:.0f} us, skinny default {step_default:.0f} us, "
              f"best per shape {step_best:.0f} us", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
