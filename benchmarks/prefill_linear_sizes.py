"""What a multi-token step's linears cost at each token count (issue 12: a piecewise graph pads a
step to its size, and cuBLAS picks its kernel by the padded M).

    python benchmarks/prefill_linear_sizes.py [--tokens 4096:5120:64] [--extra 4608,4672,4864] [--json OUT]

For each token count M: the 2.3B Qwen3.5 layout's prompt-step linears at tp=1 (18 GDN
in-projections, 6 attention q/k/v, 24 gate/up, 24 out / o projections, 24 down projections;
the LM head reads only the last rows and is left out), each shape timed alone with CUDA events
(median of --reps after a warm-up), summed with its calls a step: the step's linear time in ms,
per token in us, and its rate in TFLOP/s. What a padded step pays is the row of its padded
size; what an exact-size launch would pay is the row of its own count.
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F

import linear_sweep

# (name, N, K, calls a step): linear_sweep's 2.3B shapes at tp=1 but the LM head (a prompt step
# computes the logits of its last rows only)
SHAPES = [shape for shape in linear_sweep.SHAPES if shape[0] != "lm_head"]


def time_linear_ms(m: int, n: int, k: int, reps: int) -> float:
    """Median ms of one bf16 F.linear of (m, k) by (n, k) weights."""
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
    for _ in range(3):
        F.linear(x, w)
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        F.linear(x, w)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def parse_tokens(spec: str, extra: str) -> list[int]:
    lo, hi, step = (int(v) for v in spec.split(":"))
    if step < 1 or lo < 1 or hi < lo:
        raise ValueError(f"--tokens wants LO:HI:STEP with 1 <= LO <= HI and STEP >= 1, got {spec!r}")
    return sorted(set(range(lo, hi + 1, step)) | {int(v) for v in extra.split(",") if v})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="4096:5120:64", help="LO:HI:STEP token counts")
    ap.add_argument("--extra", default="4608,4672,4864", help="more token counts, comma-separated")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    rows = []
    for m in parse_tokens(args.tokens, args.extra):
        per_shape = {name: time_linear_ms(m, n, k, args.reps) for name, n, k, _ in SHAPES}
        step_ms = sum(per_shape[name] * calls for name, _, _, calls in SHAPES)
        flops = sum(2 * m * n * k * calls for _, n, k, calls in SHAPES)
        rows.append(dict(tokens=m, step_linears_ms=step_ms, us_per_token=step_ms * 1e3 / m,
                         tflops=flops / step_ms / 1e9, per_shape_ms=per_shape))
        print(f"M {m:5d}: step linears {step_ms:7.3f} ms  {step_ms * 1e3 / m:6.3f} us/token  "
              f"{flops / step_ms / 1e9:6.1f} TFLOP/s  " + "  ".join(f"{k} {v * 1e3:6.1f}" for k, v in per_shape.items()),
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), shapes=SHAPES, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
