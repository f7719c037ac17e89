"""Per-step control overhead of a tensor-parallel replica (step wall time, steps back to back,
minus rank 0's GPU time of the step: the time the GPU waits for the host) and replica start-up time, on the 2.3B Qwen3.5-layout model with dummy weights.

    python benchmarks/tp_overhead.py --tp 4 [--batches 1,16] [--graphs 1]    # on a 4-GPU machine
Writes $OUT/results/tp4_step_control_overhead_ms.json (baseline: the same at tp=1 in the run).
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

import ray
import torch

sys.path.insert(0, os.path.dirname(__file__))
from model_configs import write_model_dir  # noqa: E402



def measure(model_dir: str, tp: int, batches: list[int], graphs: bool) -> dict:
    """One replica of `tp` ranks as Ray actors (tp=1 too, so both pay the same actor path)."""
    from hybrid_serve.actors.offline import ReplicaSet
    from hybrid_serve.engine.config import EngineConfig

    config = EngineConfig(model=model_dir, device="cuda", dtype="bfloat16", load_format="dummy", max_num_seqs=64,
                          enable_prefix_caching=False, max_model_len=2048, enable_cuda_graphs=graphs)
    t = time.perf_counter()
    replicas = ReplicaSet(config, tp, 1)
    startup_s = time.perf_counter() - t
    out = {"tp": tp, "startup_s": startup_s, "batches": {}}
    for batch in batches:
        rows = ray.get(replicas.replicas[0].benchmark_decode.remote(batch, 256, 30))
        step = statistics.median(r["step_ms"] for r in rows)
        gpu = statistics.median(r["gpu_ms"] for r in rows)
        out["batches"][batch] = {"step_ms": step, "gpu_ms": gpu, "overhead_ms": step - gpu,
                                 "broadcast_ms": statistics.median(r["broadcast_ms"] for r in rows)}
        print(json.dumps({"tp": tp, "batch": batch, **out["batches"][batch]}), flush=True)
    replicas.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--graphs", type=int, default=1)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    ray.init(num_gpus=torch.cuda.device_count(), include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir("qwen3_5_2p3b", tmp)
        base = measure(model_dir, 1, batches, bool(args.graphs))
        tp = measure(model_dir, args.tp, batches, bool(args.graphs))
    device = torch.cuda.get_device_name(0)
    out_dir = os.path.join(os.environ.get("OUT", "./bench_out"), "results")
    os.makedirs(out_dir, exist_ok=True)
    b1 = tp["batches"][batches[0]]
    record = {"metric": f"tp{args.tp}_step_control_overhead_ms", "value": round(b1["overhead_ms"], 3), "unit": "ms",
              "device": f"{torch.cuda.device_count()}x {device}", "commit": os.environ.get("COMMIT", "unknown"),
              "date": datetime.date.today().isoformat(),
              "workload": f"qwen3_5_2p3b bf16 dummy, decode batch {batches[0]}, prompt 256, median of 30 steps, "
                          f"CUDA graphs {'on' if args.graphs else 'off'}, steps back to back with overlapped scheduling; "
                          f"overhead = step wall - rank-0 GPU time of the step",
              "tp_detail": tp, "baseline": {"tp1": base}}
    json.dump(record, open(os.path.join(out_dir, f"{record['metric']}.json"), "w"), indent=1)
    print(f"{'tp':>3} {'batch':>5} {'step ms':>8} {'gpu ms':>7} {'overhead':>8} {'bcast':>6} start s")
    for r in (base, tp):
        for b, v in r["batches"].items():
            print(f"{r['tp']:3d} {b:5d} {v['step_ms']:8.2f} {v['gpu_ms']:7.2f} {v['overhead_ms']:8.3f} "
                  f"{v['broadcast_ms']:6.3f} {r['startup_s']:.1f}")


if __name__ == "__main__":
    main()
