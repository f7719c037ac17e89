"""Where a speculative verify step's time goes on a GPU (2.3B Qwen3.5 layout, dummy bf16
weights drawn on the GPU): wall time per engine step of a verify step (batch B, K drafts
each) against a plain decode step with and without CUDA graphs, and the CUDA kernels of a
few verify steps (torch.profiler: launches per step, GPU-busy time, top kernels). Informs
verify CUDA graphs (issue 13).

    python benchmarks/verify_step_profile.py [--batch 1] [--k 4] [--out DIR]
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
from model_configs import write_model_dir  # noqa: E402

from hybrid_serve import SamplingParams  # noqa: E402


def step_times(engine, prompts, tokens: int) -> tuple[list[float], list[float]]:
    """(verify step ms, plain decode step ms) over decode-only steps."""
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}-{time.monotonic_ns()}", p, params)
    verify, plain = [], []
    while engine.has_unfinished():
        decode_only = all(r.num_tokens_to_compute == 1 for r in engine.scheduler.running) and not engine.scheduler.waiting
        rows = engine.stats().get("spec_verify_rows", 0)
        torch.cuda.synchronize()
        t = time.perf_counter()
        engine.step()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t) * 1e3
        if decode_only and engine.scheduler.running:
            (verify if engine.stats().get("spec_verify_rows", 0) > rows else plain).append(ms)
    return verify, plain


def host_profile(LLM, base: dict, prompts, k: int) -> int:
    """cProfile of 6 eager decode steps and 6 verify steps (K drafts, all rejected): where the
    host time of an eager step goes."""
    import cProfile
    import pstats

    cont = {tuple(p): [1] * 200 for p in prompts}
    for spec in (None, dict(method="synthetic", num_speculative_tokens=k, adaptive=False, acceptance_rate=0.0,
                            continuations=cont)):
        llm = LLM(**base, enable_cuda_graphs=False, warm_up=False, speculative_config=spec)
        engine = llm.engine
        params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
        for i, p in enumerate(prompts):
            engine.add_request(f"p{i}", p, params)
        for _ in range(8):
            engine.step()
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(6):
            engine.step()
        torch.cuda.synchronize()
        prof.disable()
        while engine.has_unfinished():
            engine.step()
        print(f"==== {'verify' if spec else 'eager decode'} steps x6 ====")
        stats = pstats.Stats(prof).sort_stats("tottime")
        stats.print_stats(28)
        stats.sort_stats("cumulative").print_stats(30)
        del llm
        torch.cuda.empty_cache()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--cprofile", action="store_true", help="only: the host (Python) profile of eager steps")
    args = ap.parse_args()
    from hybrid_serve import LLM

    model_dir = write_model_dir("qwen3_5_2p3b", tempfile.mkdtemp())
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 30000, (256,), generator=gen).tolist() for _ in range(args.batch)]
    base = dict(model=model_dir, load_format="dummy", dtype="bfloat16", device="cuda", max_num_seqs=max(args.batch, 8),
                enable_prefix_caching=False, gpu_memory_utilization=0.5)
    if args.cprofile:
        return host_profile(LLM, base, prompts, args.k)
    out = {}
    plain_kernels = None
    for graphs in (True, False):
        llm = LLM(**base, enable_cuda_graphs=graphs, warm_up=False)
        step_times(llm.engine, prompts, 8)
        _, plain = step_times(llm.engine, prompts, 40)
        out[f"plain_decode_ms_graphs_{'on' if graphs else 'off'}"] = round(statistics.median(plain), 3)
        if graphs:  # the decode graph's kernels: the baseline of the verify graph's
            plain_kernels = kernel_profile(llm.engine, prompts)
        del llm
        torch.cuda.empty_cache()
    # always K drafts, all rejected: every verify step carries K + 1 tokens per row
    cont = {tuple(p): [1] * 200 for p in prompts}
    spec = dict(method="synthetic", num_speculative_tokens=args.k, adaptive=False, acceptance_rate=0.0,
                continuations=cont)
    llm = LLM(**base, enable_cuda_graphs=True, warm_up=False, speculative_config=spec)
    step_times(llm.engine, prompts, 8)
    verify, _ = step_times(llm.engine, prompts, 24)
    out["verify_step_ms"] = round(statistics.median(verify), 3)
    verify_kernels = kernel_profile(llm.engine, prompts)
    out["verify_kernel_launches_per_step"] = round(sum(c for c, _ in verify_kernels.values()), 1)
    out["verify_gpu_busy_ms_per_step"] = round(sum(ms for _, ms in verify_kernels.values()), 3)
    out["plain_kernel_launches_per_step"] = round(sum(c for c, _ in plain_kernels.values()), 1)
    out["plain_gpu_busy_ms_per_step"] = round(sum(ms for _, ms in plain_kernels.values()), 3)
    names = set(verify_kernels) | set(plain_kernels)
    diff = sorted(names, key=lambda n: -(verify_kernels.get(n, (0, 0))[1] - plain_kernels.get(n, (0, 0))[1]))
    out["kernels_verify_vs_plain"] = [
        dict(name=n[:90], verify_calls=verify_kernels.get(n, (0, 0))[0], verify_ms=verify_kernels.get(n, (0, 0))[1],
             plain_calls=plain_kernels.get(n, (0, 0))[0], plain_ms=plain_kernels.get(n, (0, 0))[1]) for n in diff[:25]]
    out.update(batch=args.batch, k=args.k, device=torch.cuda.get_device_name(), model="qwen3_5_2p3b dummy bf16")
    os.makedirs(os.path.join(args.out, "results"), exist_ok=True)
    with open(os.path.join(args.out, "results", f"verify_step_profile_bs{args.batch}.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps({k: v for k, v in out.items() if k != "kernels_verify_vs_plain"}))
    print("per step: verify ms (calls) | plain decode ms (calls) | kernel, by what the verify step adds")
    for k in out["kernels_verify_vs_plain"]:
        print(f"{k['verify_ms']:8.3f} ({k['verify_calls']:5.1f}) | {k['plain_ms']:8.3f} ({k['plain_calls']:5.1f}) | {k['name']}")
    return 0


def kernel_profile(engine, prompts, steps: int = 3) -> dict[str, tuple[float, float]]:
    """kernel name -> (launches, GPU ms) per step over `steps` decode-phase steps (torch
    profiler; kernels replayed from CUDA graphs are traced one by one)."""
    params = SamplingParams(max_tokens=steps + 12, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"prof{i}-{time.monotonic_ns()}", p, params)
    while any(r.num_tokens_to_compute > 1 for r in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    for _ in range(2):  # past the first decode steps
        engine.step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
    while engine.has_unfinished():
        engine.step()
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    return {e.key: (round(e.count / steps, 1), round(e.device_time_total / steps / 1e3, 4)) for e in events}


if __name__ == "__main__":
    raise SystemExit(main())
