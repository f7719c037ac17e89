"""Ways to read a weight into L2 ahead of its one-row linear, and what the skinny linear gains
from an L2 that already holds its weight (issue 12, session 45: an L2 prefetch before the
latency-bound kernels of a decode step, tried and not adopted; benchmarks/RESULTS.md). One GPU
(Hopper or later), weights cold (L2 flushed by a 256 MiB read before each trial; run with
HYBRID_SERVE_PDL=0 so that the events time each launch alone). The prefetch kernels live here.

Per weight shape and variant, per trial: flush; [prefetch kernel]; a gap (torch.cuda._sleep, the
latency-bound kernels a prefetch would hide behind); the linear. Median over trials of: the
prefetch kernel alone (events around it: its launch to its end; a bulk prefetch may still be in
flight after), the linear alone, and prefetch + gap + linear. Variants:
  none         no prefetch (the cold linear)
  warm         the linear run just before (no flush in between): the linear from L2, the bound
  bulk<C>      cp.async.bulk.prefetch.L2 (Hopper's bulk prefetch), C bytes a lane, 32 lanes a program
  line         one `prefetch.global.L2::evict_last` per 128-byte line, 1,024 lines a program
  load         plain 16-byte loads of every byte (evict_last), summed and dropped: a copy kernel's read

    python benchmarks/l2_prefetch_bench.py [--gap-us 4] [--trials 30] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch
import triton
import triton.language as tl

from hybrid_serve.kernels.linear import skinny_linear

SHAPES = {  # name: (N, K), the Qwen3-Next-80B slice's one-row projections
    "out_proj 2048x4096": (2048, 4096),
    "moe x-proj 1537x2048": (1537, 2048),
    "gdn in_proj 12352x2048": (12352, 2048),
}


@triton.jit
def _bulk_kernel(ptr, nbytes, CHUNK: tl.constexpr, LANES: tl.constexpr):
    base = ptr.to(tl.pointer_type(tl.int8))
    offs = (tl.program_id(0) * LANES + tl.arange(0, LANES)).to(tl.int64) * CHUNK
    size = tl.minimum(tl.maximum(nbytes - offs, 0), CHUNK).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [base + offs, size], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _line_kernel(ptr, nbytes, LINES: tl.constexpr):
    base = ptr.to(tl.pointer_type(tl.int8))
    offs = (tl.program_id(0) * LINES + tl.arange(0, LINES)).to(tl.int64) * 128
    ok = (offs < nbytes).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0; }",
        "=r,l,r", [base + offs, ok], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _load_kernel(ptr, sink_ptr, n_words, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(ptr + offs, mask=offs < n_words, other=0, eviction_policy="evict_last")
    s = tl.sum(v ^ (v >> 3), axis=0)
    if s == 0x7F3A9C21:  # never in practice: keeps the loads
        tl.store(sink_ptr, s)


def run_prefetch(variant: str, w: torch.Tensor, sink: torch.Tensor) -> None:
    nbytes = w.numel() * w.element_size()
    if variant.startswith("bulk"):
        chunk = int(variant[4:])
        _bulk_kernel[(triton.cdiv(nbytes, chunk * 32),)](w, nbytes, CHUNK=chunk, LANES=32, num_warps=1)
    elif variant == "line":
        _line_kernel[(triton.cdiv(nbytes, 128 * 1024),)](w, nbytes, LINES=1024, num_warps=4)
    elif variant == "load":
        words = w.view(-1).view(torch.int32)
        _load_kernel[(triton.cdiv(words.numel(), 4096),)](words, sink, words.numel(), BLOCK=4096, num_warps=8)


def trial(variant: str, w, x, flush, sink, cycles: int) -> tuple[float, float, float]:
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
    torch.cuda._sleep(int(300e3 * 1.98))  # ~300 us: the host queues the whole trial before the GPU reaches it
    flush.sum()  # reads 256 MiB: L2 holds none of w, and no dirty lines to write back
    if variant == "warm":
        skinny_linear(x, w)
    ev[0].record()
    run_prefetch(variant, w, sink)
    ev[1].record()
    torch.cuda._sleep(cycles)
    ev[2].record()
    skinny_linear(x, w)
    ev[3].record()
    torch.cuda.synchronize()
    return ev[0].elapsed_time(ev[1]) * 1e3, ev[2].elapsed_time(ev[3]) * 1e3, ev[0].elapsed_time(ev[3]) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gap-us", type=float, default=4.0)
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--variants", default="none,warm,bulk4096,bulk512,bulk65536,line,load")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    dev = torch.cuda.get_device_name(0)
    cycles = int(args.gap_us * 1.98e3)  # ~1.98 GHz
    flush = torch.ones(64 * 1024**2, dtype=torch.float32, device="cuda")
    sink = torch.zeros(1, dtype=torch.int32, device="cuda")
    variants = args.variants.split(",")
    for _ in range(200):  # clocks up
        flush.sum()
    rows = []
    print(f"{dev}, gap {args.gap_us} us, {args.trials} trials; per variant: prefetch us / linear us (TB/s) / total us")
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        res = {v: [] for v in variants}
        for v in variants:  # compile
            trial(v, w, x, flush, sink, cycles)
        for _ in range(args.trials):
            for v in variants:
                res[v].append(trial(v, w, x, flush, sink, cycles))
        mb = w.numel() * 2 / 1e6
        row = {"shape": name, "MB": mb}
        cells = []
        for v in variants:
            pf, lin, tot = (statistics.median(t[i] for t in res[v]) for i in range(3))
            row[v] = {"prefetch_us": pf, "linear_us": lin, "total_us": tot, "linear_TBps": mb / lin}
            cells.append(f"{v} {pf:.1f}/{lin:.1f} ({mb / lin:.2f})/{tot:.1f}")
        rows.append(row)
        print(f"{name} ({mb:.1f} MB): " + "; ".join(cells), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": dev, "gap_us": args.gap_us, "trials": args.trials, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
