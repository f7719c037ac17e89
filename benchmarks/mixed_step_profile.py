"""One mixed step, taken apart (issue 12: why a step carrying prompt tokens next to decode
rows costs far more than either alone).

    python benchmarks/mixed_step_profile.py [--model qwen3_5_2p3b] [--variants 0x1x512,63x1x512,...]
        [--json OUT.json]

A variant `DxPxL` is D decode rows (prefilled before, decoding) plus P new prompts of L tokens,
scheduled together as one step (synchronous engine, so the step is timed alone). Per variant,
after one occurrence of its shape that warms: the step's wall (synchronized; the median of
--repeats samples, each a fresh batch of the same shape), then
the same shape under the torch profiler: GPU kernel time, kernels launched and the kernels with
the most GPU time; then its GPU time once more with the host queued ahead of the device (a
sleep kernel first, events around the step: the cross-check where the profiler sees no
kernels inside CUDA graphs). The step's host share is wall - GPU time.
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


SLEEP_CYCLES = 4e8  # ~200 ms at an H100's ~1.8 GHz: longer than any step's host work here


def run_variant(engine, decode_rows: int, prompts: int, prompt_len: int, vocab: int, seed: int,
                profile: bool, cpu_profile: bool = False, py_profile: bool = False,
                queued_ahead: bool = False) -> dict:
    """Prefill `decode_rows` requests and let them decode, then add the prompts and time the one
    step that carries them all."""
    from hybrid_serve import SamplingParams
    from hybrid_serve.engine.benchmarking import start_decode_batch

    ids = start_decode_batch(engine, decode_rows, 256, 400, token_high=vocab, seed=seed, prefix=f"d{seed}-") \
        if decode_rows else []
    gen = torch.Generator().manual_seed(seed + 1)
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    for i in range(prompts):
        prompt = torch.randint(10, vocab, (prompt_len,), generator=gen).tolist()
        ids += engine.add_request(f"p{seed}-{i}", prompt, params)
    torch.cuda.synchronize()
    out = {}
    retries = torch.cuda.memory_stats().get("num_alloc_retries", 0)
    if py_profile:  # Python functions by own time (cProfile: every call pays its overhead)
        import cProfile
        import pstats
        prof = cProfile.Profile()
        prof.enable()
        engine.step()
        torch.cuda.synchronize()
        prof.disable()
        stats = pstats.Stats(prof)
        rows = [(f"{os.path.basename(fn)}:{line} {name}"[:70], round(tt * 1e3, 3), nc)
                for (fn, line, name), (cc, nc, tt, ct, _) in stats.stats.items()]
        out["py_top"] = sorted(rows, key=lambda r: -r[1])[:16]
        out["py_total_ms"] = round(sum(r[1] for r in rows), 2)
    elif cpu_profile:
        from torch.profiler import ProfilerActivity, profile as torch_profile
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            engine.step()
            torch.cuda.synchronize()
        table = prof.key_averages()
        out["cpu_top"] = sorted(([e.key[:60], round(e.self_cpu_time_total / 1e3, 3), e.count] for e in table),
                                key=lambda r: -r[1])[:14]
    elif profile:
        from torch.profiler import ProfilerActivity, profile as torch_profile
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            engine.step()
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        by_name: dict[str, list] = {}
        for e in kernels:
            rec = by_name.setdefault(e.name[:70], [0.0, 0])
            rec[0] += e.device_time_total / 1e3 if hasattr(e, "device_time_total") else e.cuda_time_total / 1e3
            rec[1] += 1
        out["gpu_ms"] = sum(v[0] for v in by_name.values())
        out["kernels"] = sum(v[1] for v in by_name.values())
        out["top"] = sorted(([k, round(v[0], 3), v[1]] for k, v in by_name.items()), key=lambda r: -r[1])[:40]
    elif queued_ahead:
        # GPU time with the host run ahead: a sleep kernel holds the stream while the step queues
        # its launches, then events time the queued work (the end event follows the step's own
        # read-back, so a few tens of us of return latency are included). Valid while the step
        # does not wait for the device before its last launch; `queued_before_sleep_end` says so.
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(int(SLEEP_CYCLES))
        start.record()
        t = time.perf_counter()
        engine.step()
        end.record()
        torch.cuda.synchronize()
        out["gpu_queued_ms"] = start.elapsed_time(end)
        out["host_step_ms_behind_sleep"] = (time.perf_counter() - t) * 1e3
    else:
        t = time.perf_counter()
        engine.step()
        torch.cuda.synchronize()
        out["wall_ms"] = (time.perf_counter() - t) * 1e3
        out["alloc_retries"] = torch.cuda.memory_stats().get("num_alloc_retries", 0) - retries
    for seq_id in ids:
        engine.abort(seq_id)
    while engine.has_unfinished():
        engine.step()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen3_5_2p3b")
    ap.add_argument("--variants", default="0x1x512,63x0x0,63x1x512,63x1x64,63x4x512,0x4x512,63x8x512,0x8x512,"
                                          "0x1x2048,63x1x2048")
    ap.add_argument("--cpu-profile", default="", help="comma-separated variants to run once more under the "
                    "torch profiler's CPU activity (host functions by self time)")
    ap.add_argument("--py-profile", default="", help="comma-separated variants to run once more under cProfile")
    ap.add_argument("--no-cudnn-sdp", action="store_true", help="torch SDPA without its cuDNN backend")
    ap.add_argument("--engine-args", default="{}", help="JSON of extra LLM(...) arguments")
    ap.add_argument("--repeats", type=int, default=5, help="timed samples per variant (the median is reported)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from model_configs import CONFIGS, write_model_dir

    from hybrid_serve import LLM

    torch.set_num_threads(4)
    if args.no_cudnn_sdp:
        torch.backends.cuda.enable_cudnn_sdp(False)
    tmp = tempfile.mkdtemp()
    # prefill_hold_steps=0: the prompts join the decode rows' next step (CUDA's default, 16, holds
    # them back while the rows decode, and the timed step would be a pure decode step)
    kwargs = dict(model=write_model_dir(args.model, tmp), load_format="dummy", dtype="bfloat16", device="cuda",
                  async_scheduling=False, prefill_hold_steps=0)
    kwargs.update(json.loads(args.engine_args))
    engine = LLM(**kwargs).engine
    from hybrid_serve.engine.runner.model_runner import cuda_memory_note
    memory = cuda_memory_note(engine.runner.device)
    print(f"after start-up: {memory}", flush=True)
    vocab = min(CONFIGS[args.model]().vocab_size, 32000)
    rows = []
    for k, spec in enumerate(args.variants.split(",")):
        d, p, n = (int(x) for x in spec.split("x"))
        run_variant(engine, d, p, n, vocab, 100 * k, profile=False)  # warms the shape
        walls = [run_variant(engine, d, p, n, vocab, 100 * k + 30 + r, profile=False) for r in range(args.repeats)]
        timed = dict(wall_ms=statistics.median(w["wall_ms"] for w in walls),
                     wall_samples_ms=[round(w["wall_ms"], 3) for w in walls],
                     alloc_retries=sum(w["alloc_retries"] for w in walls))
        prof = run_variant(engine, d, p, n, vocab, 100 * k + 60, profile=True)
        queued = [run_variant(engine, d, p, n, vocab, 100 * k + 70 + r, profile=False, queued_ahead=True)
                  for r in range(3)]
        row = dict(variant=spec, decode_rows=d, prompts=p, prompt_len=n, **timed, **prof,
                   gpu_queued_ms=statistics.median(q["gpu_queued_ms"] for q in queued),
                   gpu_queued_samples_ms=[round(q["gpu_queued_ms"], 3) for q in queued])
        if spec in args.py_profile.split(","):
            row.update(run_variant(engine, d, p, n, vocab, 100 * k + 80, profile=False, py_profile=True))
        if spec in args.cpu_profile.split(","):
            row.update(run_variant(engine, d, p, n, vocab, 100 * k + 90, profile=False, cpu_profile=True))
        rows.append(row)
        if not row["kernels"]:
            print(f"{spec:>10}: the profiler recorded no kernels on this machine: no GPU time, no host share")
        print(f"{spec:>10}: wall {row['wall_ms']:7.2f} ms (samples {row['wall_samples_ms']})  GPU {row['gpu_ms']:7.2f} ms  kernels {row['kernels']:4d}  "
              f"host share {max(0.0, row['wall_ms'] - row['gpu_ms']):6.2f} ms  alloc retries {row['alloc_retries']}",
              flush=True)
        print(f"{'':>10}  GPU with the host queued ahead {row['gpu_queued_ms']:7.2f} ms "
              f"(samples {row['gpu_queued_samples_ms']}): host share "
              f"{max(0.0, row['wall_ms'] - row['gpu_queued_ms']):6.2f} ms = "
              f"{max(0.0, row['wall_ms'] - row['gpu_queued_ms']) / row['gpu_queued_ms']:.1%} of it", flush=True)
        for name, ms, count in row["top"][:6]:
            print(f"             {ms:8.3f} ms {count:4d}x {name}")
        if "py_top" in row:
            print(f"        python total (own time) {row['py_total_ms']} ms")
        for name, ms, count in row.get("py_top", []):
            print(f"          py {ms:8.3f} ms {count:5d}x {name}")
        for name, ms, count in row.get("cpu_top", []):
            print(f"        host {ms:8.3f} ms {count:4d}x {name}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(model=args.model, device=torch.cuda.get_device_name(), rows=rows, memory_after_start=memory,
                           config=kwargs | dict(model=args.model)), f, indent=1)


if __name__ == "__main__":
    main()
