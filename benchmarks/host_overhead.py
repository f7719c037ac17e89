"""Host cost of an eager (not graph-replayed) multi-token step on a GPU (issue 12: "host time
per step at 2,048 tokens <= 15% of its GPU time"), and the price of one launch on this host.

    python benchmarks/host_overhead.py launches            # Triton / torch launch costs
    python benchmarks/host_overhead.py steps [--tokens 512,2048,8192]
    python benchmarks/host_overhead.py loop --tokens 2048 --seconds 8   # run under py-spy

`launches`: host microseconds per launch of a trivial Triton kernel with 12 arguments through
`kernel[grid](...)`, through the compiled kernel's own launcher (what a cached launch path
would pay), and of a small torch op. `steps`: one prompt of N tokens as one step
(`LLM.generate(max_tokens=1)` on the 2.3B model, dummy bf16): wall, host time to queue the
step (launch), GPU time (CUDA events around the forward), kernels launched (profiler).
`loop`: the same step repeated for a while (for a sampling profiler). JSON to --json.
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


def launch_costs(n: int = 3000) -> dict:
    import triton
    import triton.language as tl

    @triton.jit
    def touch(a, b, c, d, e, f, g, h, n1, n2, n3, n4, BLOCK: tl.constexpr):
        i = tl.program_id(0)
        if i < 0:
            tl.store(a + i, tl.load(b + i) + n1 + n2 + n3 + n4)

    xs = [torch.zeros(1024, device="cuda") for _ in range(8)]
    args = (*xs, 3, 5, 7, 11)
    compiled = touch[(1,)](*args, BLOCK=64)
    torch.cuda.synchronize()
    out = {}
    t = time.perf_counter()
    for _ in range(n):
        touch[(1,)](*args, BLOCK=64)
    out["triton_jit_us"] = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    stream = torch.cuda.current_stream().cuda_stream
    run, fn, meta = compiled.run, compiled.function, compiled.packed_metadata
    t = time.perf_counter()
    for _ in range(n):
        run(1, 1, 1, stream, fn, meta, None, None, None, *args, 64)  # bound args include the constexpr
    out["triton_compiled_run_us"] = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    from hybrid_serve.kernels._launch import FastLaunch  # HYBRID_SERVE_TRITON_FAST_LAUNCH's path

    fast = FastLaunch(touch)
    for _ in range(3):
        fast[(1,)](*args, BLOCK=64)
    t = time.perf_counter()
    for _ in range(n):
        fast[(1,)](*args, BLOCK=64)
    out["triton_fast_launch_us"] = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    y = xs[0]
    t = time.perf_counter()
    for _ in range(n):
        y.add_(1.0)
    out["torch_add_us"] = (time.perf_counter() - t) / n * 1e6
    t = time.perf_counter()
    for _ in range(n):
        torch.empty(1024, device="cuda")
    out["torch_empty_us"] = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return out


def make_llm(model: str, engine_args: dict):
    from model_configs import write_model_dir

    from hybrid_serve import LLM

    tmp = tempfile.mkdtemp()
    return LLM(model=write_model_dir(model, tmp), load_format="dummy", dtype="bfloat16", device="cuda",
               enable_prefix_caching=False, **engine_args)


def one_step(llm, tokens: int, seed: int) -> dict:
    """One prompt of `tokens` as one step: wall, launch (host) and GPU ms."""
    from hybrid_serve import SamplingParams

    engine = llm.engine
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(10, engine.hf_config.vocab_size, (tokens,), generator=gen).tolist()  # the model's vocabulary
    engine.add_request(f"s{seed}", prompt, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    real_launch, times = engine._launch, {}

    def launch(chunks):
        t = time.perf_counter()
        res = real_launch(chunks)
        times["launch_ms"] = max(times.get("launch_ms", 0.0), (time.perf_counter() - t) * 1e3)  # the forward's
        return res

    engine._launch = launch
    n_timings = len(engine.step_timings) if engine.step_timings is not None else 0
    torch.cuda.synchronize()
    t = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    torch.cuda.synchronize()
    times["wall_ms"] = (time.perf_counter() - t) * 1e3
    del engine._launch
    if engine.step_timings is not None and len(engine.step_timings) > n_timings:
        ev = engine.step_timings[n_timings]["events"]
        times["gpu_ms"] = ev[0].elapsed_time(ev[1])
    return times


def count_launches(llm, tokens: int) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        one_step(llm, tokens, 99)
        torch.cuda.synchronize()
    return sum(e.count for e in prof.key_averages() if e.device_time_total > 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["launches", "steps", "loop"])
    ap.add_argument("--model", default="qwen3_5_2p3b")
    ap.add_argument("--tokens", default="512,2048,8192")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--engine-args", default="{}")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    result: dict = {"mode": args.mode, "device": torch.cuda.get_device_name(0)}
    if args.mode == "launches":
        result.update(launch_costs())
        print(" ".join(f"{k} {v:.1f}" for k, v in result.items() if k.endswith("_us")))
    else:
        llm = make_llm(args.model, json.loads(args.engine_args))
        if llm.engine.step_timings is None:
            llm.engine.step_timings = []
        lengths = [int(x) for x in args.tokens.split(",")]
        if args.mode == "steps":
            rows = []
            for n in lengths:
                runs = [one_step(llm, n, s) for s in range(6)][1:]
                row = {"tokens": n, **{k: statistics.median(r.get(k, float("nan")) for r in runs)
                                       for k in ("wall_ms", "launch_ms", "gpu_ms")},
                       "kernels": count_launches(llm, n)}
                row["launch_over_gpu"] = row["launch_ms"] / row["gpu_ms"]
                rows.append(row)
                print(f"{n:6d} tokens: wall {row['wall_ms']:.1f} ms, launch (host) {row['launch_ms']:.1f} ms, "
                      f"GPU {row['gpu_ms']:.1f} ms, launch/GPU {row['launch_over_gpu']:.2f}, "
                      f"{row['kernels']} kernels", flush=True)
            result["steps"] = rows
        else:
            n, end, count = lengths[0], time.perf_counter() + args.seconds, 0
            one_step(llm, n, 0)
            print("LOOP START", flush=True)
            while time.perf_counter() < end:
                one_step(llm, n, count + 1)
                count += 1
            print(f"LOOP END {count} steps of {n} tokens", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
