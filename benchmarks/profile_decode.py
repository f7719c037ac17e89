"""Where a decode step of the 2.3B Qwen3.5-layout model goes, on a GPU.

    python benchmarks/profile_decode.py [--batch 1] [--graphs 1]

Prints (1) every GPU kernel of one eager decode step (name, launches per step, us per
step), (2) the host functions that dominate an engine step with CUDA graphs (cProfile),
(3) step wall time vs GPU time (CUDA events) with graphs on.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
from collections import defaultdict

import torch

sys.path.insert(0, os.path.dirname(__file__))
from model_configs import write_model_dir  # noqa: E402

from hybrid_serve import LLM  # noqa: E402
from hybrid_serve.engine.benchmarking import start_decode_batch  # noqa: E402


def kernel_table(engine, steps: int = 5) -> None:
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
    per = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_time_total > 0 and e.device_type.name == "CUDA":
            per[e.name][0] += 1
            per[e.name][1] += e.device_time_total
    total_n = sum(v[0] for v in per.values()) / steps
    total_t = sum(v[1] for v in per.values()) / steps
    print(f"[kernels] {total_n:.0f} launches/step, {total_t / 1e3:.3f} ms GPU/step")
    for name, (n, t) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        print(f"  {t / steps:8.1f} us  x{n / steps:5.1f}  {name[:110]}")


def host_profile(engine, steps: int = 50) -> None:
    pr = cProfile.Profile()
    torch.cuda.synchronize()
    pr.enable()
    for _ in range(steps):
        engine.step()
    torch.cuda.synchronize()
    pr.disable()
    st = pstats.Stats(pr)
    st.sort_stats("cumulative").print_stats(35)


def wall_vs_gpu(engine, steps: int = 30) -> None:
    walls, gpus = [], []
    for _ in range(steps):
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t = time.perf_counter()
        s.record()
        engine.step()
        e.record()
        e.synchronize()
        walls.append((time.perf_counter() - t) * 1e3)
        gpus.append(s.elapsed_time(e))
    walls.sort(), gpus.sort()
    print(f"[wall vs GPU] step wall {walls[len(walls) // 2]:.3f} ms, events span {gpus[len(gpus) // 2]:.3f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--graphs", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=256)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir("qwen3_5_2p3b", tmp)
        llm = LLM(model=model_dir, device="cuda", dtype="bfloat16", load_format="dummy", max_num_seqs=64,
                  max_num_batched_tokens=8192, chunked_prefill_size=2048, enable_prefix_caching=False,
                  max_model_len=2048, enable_cuda_graphs=bool(args.graphs))
        engine = llm.engine
        start_decode_batch(engine, args.batch, args.prompt, 400, token_high=150000, seed=args.batch)
        print(f"=== batch {args.batch}, graphs {args.graphs}", flush=True)
        wall_vs_gpu(engine)
        kernel_table(engine)
        host_profile(engine)


if __name__ == "__main__":
    main()
