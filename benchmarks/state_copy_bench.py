"""State-slot copies on one GPU (reply checkpoints' snapshots, prefix-cache copy-on-write): the
2.3B decode model's state (18 GDN layers: conv 8,192 x 3 bf16, SSM 32 x 128 x 128 fp32; 38.6
MB a slot) in a 512-slot pool. Per variant, 16 copies (a batch-256 decode step's snapshots),
median GPU time per copy (CUDA events) and the host time to issue them; the ceiling is one
contiguous copy of the same bytes.

    python -m hybrid_serve.benchmarks.state_copy_bench [--copies 16] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def _time(fn, reps: int = 20) -> tuple[float, float]:
    """(median GPU ms, median host ms to issue) of fn()."""
    fn()
    torch.cuda.synchronize()
    gpu, host = [], []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e3)
        end.record()
        torch.cuda.synchronize()
        gpu.append(start.elapsed_time(end))
    return statistics.median(gpu), statistics.median(host)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--copies", type=int, default=16)
    ap.add_argument("--slots", type=int, default=512)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from hybrid_serve.mem_cache.state_pool import StatePool, StateSpec

    spec = StateSpec(conv_dim=8192, conv_width=3, ssm_shape=(32, 128, 128), conv_dtype=torch.bfloat16)
    pool = StatePool(args.slots, 18, spec, "cuda")
    n = args.copies
    src = list(range(1, n + 1))
    dst = list(range(n + 1, 2 * n + 1))
    src_t, dst_t = (torch.tensor(x, device="cuda") for x in (src, dst))
    nbytes = spec.bytes_per_slot(18)
    flat_src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda")
    flat_dst = torch.empty_like(flat_src)

    def per_slot():
        for s, d in zip(src, dst):
            pool.copy(s, d)

    def indexed():
        pool.conv_states[:, dst_t] = pool.conv_states[:, src_t]
        pool.ssm_states[:, dst_t] = pool.ssm_states[:, src_t]
        pool.layout_tag[dst_t] = pool.layout_tag[src_t]

    def ceiling():
        for _ in range(n):
            flat_dst.copy_(flat_src)

    rows = {}
    variants = {"per_slot (StatePool.copy)": per_slot, "indexed (one gather + scatter)": indexed,
                "ceiling (contiguous)": ceiling}
    if hasattr(pool, "copy_many"):
        variants["copy_many"] = lambda: pool.copy_many(src, dst)
    for name, fn in variants.items():
        gpu_ms, host_ms = _time(fn)
        rows[name] = {"gpu_us_per_copy": round(gpu_ms * 1e3 / n, 1), "host_us_per_copy": round(host_ms * 1e3 / n, 1),
                      "tb_s": round(2 * nbytes * n / (gpu_ms * 1e-3) / 1e12, 2)}
        print(f"{name:<32} GPU {rows[name]['gpu_us_per_copy']:>7.1f} us/copy  host {rows[name]['host_us_per_copy']:>6.1f}"
              f" us/copy  {rows[name]['tb_s']:.2f} TB/s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "bytes_per_slot": nbytes, "copies": n, "rows": rows},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
