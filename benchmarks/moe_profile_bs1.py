"""Where a batch-1 decode step of the Qwen3-Next 12-layer slice spends its time (issue 12's
`qwen3_next_layers_bs1_roofline_fraction`): the same engine as benchmarks/moe_decode_ab.py
(one-row MoE tiles on, dummy bf16), one request decoding, then the torch profiler over steps
that all carry that request (moe_decode_ab.py's own --profile runs after its requests end),
and decode_bench.breakdown (graph replay vs the step). JSON in $OUT.

    python benchmarks/moe_profile_bs1.py [--model qwen3_next_80b_12l] [--batch 1] [--steps 20] [--sequence]

--sequence also lists one step's kernels in launch order with their durations and grids (from
the profiler's trace), to set two settings' steps side by side kernel by kernel.
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
from decode_bench import breakdown  # noqa: E402
from model_configs import write_model_dir  # noqa: E402

from hybrid_serve import LLM  # noqa: E402
from hybrid_serve.engine.benchmarking import start_decode_batch  # noqa: E402


def step_sequence(prof, steps: int) -> list[dict]:
    """The kernels of the profiled steps' middle step, in start order: name, duration (us) and
    grid, from the profiler's Chrome trace."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.load(open(f.name))
    kernels = sorted((e for e in trace["traceEvents"] if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    starts = [i for i, e in enumerate(kernels) if "decode_fields" in e["name"]]  # one a step, in the graph
    if len(starts) >= 3:
        middle = kernels[starts[len(starts) // 2]: starts[len(starts) // 2 + 1]]
    else:
        per_step = len(kernels) // steps
        middle = kernels[per_step * (steps // 2): per_step * (steps // 2 + 1)]
    return [{"kernel": e["name"][:60], "us": e["dur"], "grid": e.get("args", {}).get("grid")} for e in middle]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen3_next_80b_12l")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--top", type=int, default=20, help="kernels listed, longest first")
    ap.add_argument("--sequence", action="store_true", help="one step's kernels in order (JSON)")
    ap.add_argument("--tag", default="", help="suffix of the JSON's name")
    args = ap.parse_args()
    os.environ.setdefault("HYBRID_SERVE_MOE_ONE_ROW_TILES", "1")
    from torch.profiler import ProfilerActivity, profile

    with tempfile.TemporaryDirectory() as tmp:
        llm = LLM(model=write_model_dir(args.model, tmp), device="cuda", dtype="bfloat16", load_format="dummy",
                  max_num_seqs=16, max_num_batched_tokens=4096, chunked_prefill_size=2048,
                  enable_prefix_caching=False, max_model_len=2048)
    engine = llm.engine
    start_decode_batch(engine, args.batch, 256, 4 * args.steps + 64, token_high=150000, seed=1, prefix="p-")
    for _ in range(10):
        engine.step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(args.steps):
        engine.step()
    torch.cuda.synchronize()
    step_ms = (time.perf_counter() - t) / args.steps * 1e3
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            engine.step()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    gpu_ms = sum(e.self_device_time_total for e in events) / args.steps / 1e3
    top = [{"kernel": e.key[:120], "ms_per_step": e.self_device_time_total / args.steps / 1e3,
            "calls_per_step": e.count / args.steps}
           for e in sorted(events, key=lambda e: -e.self_device_time_total)[:args.top]]
    print(f"bs={args.batch}: step {step_ms:.3f} ms (no profiler), GPU kernels {gpu_ms:.3f} ms/step, "
          f"{sum(e.count for e in events) / args.steps:.0f} kernels a step (profiler)")
    for row in top:
        print(f"  {row['ms_per_step']:7.3f} ms/step  x{row['calls_per_step']:<5.0f} {row['kernel'][:100]}")
    sequence = step_sequence(prof, args.steps) if args.sequence else []
    breakdown(engine, args.batch)
    out_dir = os.environ.get("OUT", "./bench_out")
    os.makedirs(out_dir, exist_ok=True)
    name = f"moe_profile_bs{args.batch}_{args.model}_pdl{os.environ.get('HYBRID_SERVE_PDL', '1')}{args.tag}.json"
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "model": args.model, "batch": args.batch,
                   "step_ms": step_ms, "gpu_kernels_ms_per_step": gpu_ms,
                   "kernels_per_step": sum(e.count for e in events) / args.steps, "top_kernels": top,
                   "step_sequence": sequence}, f, indent=1)
    llm.shutdown()


if __name__ == "__main__":
    main()
