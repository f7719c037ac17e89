"""Decode step time of the 2.3B Qwen3.5-layout model (bf16 weights, fp32 GDN state, dummy
weights) at batch 1 / 16 / 64 against the HBM roofline, with CUDA graphs.

    python benchmarks/decode_bench.py [--batches 1,16,64] [--prompt 512]     # on a GPU
Roofline (as in shared/tools/hf_baseline.py): (weight bytes + batch * GDN state bytes read and
written) / measured copy bandwidth; `roofline_kv` adds the KV bytes read. Writes one JSON per
metric to $OUT/results (metric, value, unit, device, commit, date, workload, baseline).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from model_configs import write_model_dir  # noqa: E402

from hybrid_serve import LLM  # noqa: E402
from hybrid_serve.engine.benchmarking import start_decode_batch  # noqa: E402


def copy_bandwidth() -> float:
    x = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        y.copy_(x)
    torch.cuda.synchronize()
    bw = 20 * 2 * x.numel() / (time.perf_counter() - t)
    del x, y
    torch.cuda.empty_cache()
    return bw


def profile_steps(engine, batch: int, steps: int = 10) -> None:
    """GPU kernel time per step vs wall time per step, and the top kernels (torch profiler)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    t = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
    wall = (time.perf_counter() - t) / steps
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    gpu = sum(e.self_device_time_total for e in events) / steps / 1e3
    print(f"[profile bs={batch}] wall/step {wall * 1e3:.2f} ms (under the profiler), GPU kernels/step {gpu:.2f} ms")
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:14]:
        print(f"   {e.self_device_time_total / steps / 1e3:7.3f} ms/step  x{e.count // steps:<4d} {e.key[:90]}")


def cuda_ms(fn, reps: int = 20) -> float:
    """Median GPU-side time of fn() in ms (events around each call, after a warm-up)."""
    fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def breakdown(engine, batch: int) -> None:
    """Where a decode step's time goes: the captured graph alone, the LM head, the rest."""
    runner = engine.runner
    graphs = runner.decode_graphs
    size = graphs.padded_size([1] * batch) if graphs is not None else None
    hidden = torch.zeros(batch, engine.hf_config.hidden_size, dtype=engine.dtype, device="cuda")
    head_ms = cuda_ms(lambda: engine.model.compute_logits(hidden))
    step_ms = cuda_ms(engine.step)
    graph_ms = cuda_ms(graphs.graphs[size].replay) if size in getattr(graphs, "graphs", {}) else float("nan")
    print(f"[breakdown bs={batch}] step (synchronized) {step_ms:.3f} ms; graph replay {graph_ms:.3f} ms (of which "
          f"LM head {head_ms:.3f}); other {step_ms - graph_ms:.3f} (host work, metadata, sampling)", flush=True)


def decode_step_times(llm: LLM, batch: int, prompt_len: int, steps: int, profile: bool = False) -> list[float]:
    engine = llm.engine
    ids = start_decode_batch(engine, batch, prompt_len, steps + 8, token_high=150000, seed=batch, prefix=f"b{batch}-")
    # back to back, as served: with overlapped scheduling a step returns once the previous
    # step's tokens are read, so the time between returns is the time per generated token
    times = []
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        engine.step()
        now = time.perf_counter()
        times.append(now - t)
        t = now
    if profile:
        breakdown(engine, batch)
        profile_steps(engine, batch)
    for seq_id in ids:
        engine.abort(seq_id)
    engine.step()
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--graphs", type=int, default=1)
    ap.add_argument("--profile", action="store_true", help="print a kernel breakdown per batch size")
    ap.add_argument("--async-scheduling", type=int, default=1, help="overlap host work with the GPU (default on)")
    args = ap.parse_args()
    out_dir = os.path.join(os.environ.get("OUT", "./bench_out"), "results")
    os.makedirs(out_dir, exist_ok=True)
    device = torch.cuda.get_device_name(0)
    bw = copy_bandwidth()
    print(f"{device}: copy bandwidth {bw / 1e12:.2f} TB/s (read+write)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir("qwen3_5_2p3b", tmp)
        t = time.perf_counter()
        llm = LLM(model=model_dir, device="cuda", dtype="bfloat16", load_format="dummy", max_num_seqs=64,
                  max_num_batched_tokens=8192, chunked_prefill_size=2048, enable_prefix_caching=False,
                  max_model_len=2048, enable_cuda_graphs=bool(args.graphs),
                  async_scheduling=bool(args.async_scheduling))
        print(f"engine start {time.perf_counter() - t:.1f} s", flush=True)
        model = llm.engine.model
        cfg = llm.engine.hf_config
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        n_gdn = model.layer_ids.num_state_layers
        n_attn = model.layer_ids.num_attn_layers
        state_bytes = n_gdn * cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4 * 2
        results = []
        for batch in [int(b) for b in args.batches.split(",")]:
            times = decode_step_times(llm, batch, args.prompt, args.steps + (10 if args.profile else 0), args.profile)
            step = statistics.median(times)
            ctx = args.prompt + args.steps // 2
            kv_bytes = n_attn * ctx * cfg.num_key_value_heads * cfg.head_dim * 2 * 2
            roof = (weight_bytes + batch * state_bytes) / bw
            roof_kv = (weight_bytes + batch * (state_bytes + kv_bytes)) / bw
            row = {"batch": batch, "step_ms": step * 1e3, "tok_per_s": batch / step, "roofline_ms": roof * 1e3,
                   "fraction": roof / step, "roofline_kv_ms": roof_kv * 1e3, "fraction_kv": roof_kv / step}
            results.append(row)
            print(json.dumps(row), flush=True)
    commit = os.environ.get("COMMIT", "unknown")
    date = datetime.date.today().isoformat()
    workload = (f"qwen3_5_2p3b bf16 dummy weights, fp32 GDN state, prompt {args.prompt} random tokens, greedy decode, "
                f"median of {args.steps} engine steps back to back, CUDA graphs {'on' if args.graphs else 'off'}, "
                f"overlapped scheduling {'on' if args.async_scheduling else 'off'}")
    for row in results:
        if row["batch"] in (1, 64) and args.graphs and args.async_scheduling:  # the targets' configuration
            record = {"metric": f"decode_roofline_fraction_bs{row['batch']}", "value": round(row["fraction"], 4),
                      "unit": "fraction of HBM roofline", "device": device, "commit": commit, "date": date,
                      "workload": workload, "step_ms": round(row["step_ms"], 3),
                      "roofline_ms": round(row["roofline_ms"], 3), "copy_bandwidth_TBps": round(bw / 1e12, 3),
                      "baseline": os.environ.get("BASELINE", "see hf_baseline.log of the same run")}
            json.dump(record, open(os.path.join(out_dir, f"{record['metric']}.json"), "w"), indent=1)
    print(f"{'batch':>5} {'step ms':>8} {'tok/s':>8} {'roof ms':>8} {'% roof':>7} {'% roof+KV':>9}")
    for r in results:
        print(f"{r['batch']:5d} {r['step_ms']:8.2f} {r['tok_per_s']:8.0f} {r['roofline_ms']:8.2f} "
              f"{100 * r['fraction']:6.1f}% {100 * r['fraction_kv']:8.1f}%")


if __name__ == "__main__":
    main()
