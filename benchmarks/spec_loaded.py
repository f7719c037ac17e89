"""Speculative decoding under load (issue 13): what a user meets while other requests'
prompts keep arriving, with and without speculation, same workload, same run.

    python benchmarks/spec_loaded.py [--concurrency 1,16,64] [--num-prompts 8,112,448]
        [--input-len 512] [--output-len 128] [--k 4] [--acceptance 0.8] [--fixed]

For each concurrency C, a closed loop through the engine's public step API
(loaded_tpot.closed_loop): C requests in flight, each finished one replaced by the next, so
prompts are prefilled (chunks mixed with decode rows or verify rows) while others decode;
output lengths uniform in len*(1 +- 0.5). Per run: TPOT p50/mean of the steady-state requests,
TTFT p50, and output tokens per second over the whole loop. The plain engine runs first and
its greedy outputs are the synthetic drafter's true continuations (each draft right with
probability `--acceptance`); the dummy model is made tie-free (`spec_decode.peak_weights`) so
that both engines compute the same continuation. Speculation uses the adaptive depth unless
`--fixed` (K every step). Triton kernels compiled during a measured loop (shapes the warm-up
missed) are printed and recorded. On CPU (`--device cpu --model demo`) a smoke run.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from loaded_tpot import closed_loop  # noqa: E402
from model_configs import CONFIGS, write_model_dir  # noqa: E402
from spec_decode import peak_weights  # noqa: E402
from throughput import watch_compiles, workload  # noqa: E402

from hybrid_serve import LLM, SamplingParams  # noqa: E402


def loop(llm: LLM, requests, concurrency: int) -> dict:
    """closed_loop plus output tokens per second over the loop, and every Triton kernel compiled
    (or loaded from the disk cache) during it: a kernel shape the warm-up missed."""
    compiles: list = []
    stop_watch = watch_compiles(compiles)
    t = time.perf_counter()
    try:
        out = closed_loop(llm.engine, requests, concurrency)
    finally:
        stop_watch()
    wall = time.perf_counter() - t
    out["output_tok_s"] = sum(n for _, n in requests) / wall
    out["wall_s"] = wall
    out["compiles_while_serving"] = [f"{when - t:.3f} s: {what}" for when, what in compiles]
    for line in out["compiles_while_serving"]:
        print("  compiled while serving:", line, flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen3_5_2p3b", help="a benchmarks/model_configs.py name, or 'demo'")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--num-prompts", default="8,112,448", help="per concurrency")
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--acceptance", type=float, default=0.8)
    ap.add_argument("--fixed", action="store_true", help="K drafts every step (default: adaptive depth)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    counts = [int(n) for n in args.num_prompts.split(",")]
    if len(counts) != len(concurrencies):
        raise ValueError(f"--num-prompts needs one count per concurrency, got {counts} for {concurrencies}")
    tmp = tempfile.mkdtemp()
    kwargs = dict(device=args.device, max_num_seqs=max(64, max(concurrencies)), enable_prefix_caching=False)
    if args.model != "demo":
        kwargs.update(model=write_model_dir(args.model, tmp), load_format="dummy",
                      dtype="bfloat16" if args.device == "cuda" else "float32")
    if args.device == "cuda":
        kwargs["gpu_memory_utilization"] = 0.6
    vocab = 4096 if args.model == "demo" else CONFIGS[args.model]().vocab_size
    loads = {c: workload(n, args.input_len, args.output_len, 0.5, vocab, args.seed + c) for c, n in zip(concurrencies, counts)}

    def build(**extra) -> LLM:
        llm = LLM(**kwargs, **extra)
        if args.model != "demo":
            peak_weights(llm.engine.model)
        return llm

    plain = build()
    truth, plain_runs = {}, {}
    for c, reqs in loads.items():
        outs = plain.generate([p for p, _ in reqs], [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
                                                     for _, n in reqs])
        truth.update({tuple(p): o.outputs[0].token_ids for (p, _), o in zip(reqs, outs)})
        loop(plain, reqs[:c], c)  # warm the mixed shapes
        plain_runs[c] = loop(plain, reqs, c)
    del plain
    if args.device == "cuda":
        import torch

        torch.cuda.empty_cache()
    spec = build(speculative_config=dict(method="synthetic", num_speculative_tokens=args.k,
                                         acceptance_rate=args.acceptance, adaptive=not args.fixed,
                                         continuations=truth))
    rows = []
    for c, reqs in loads.items():
        loop(spec, reqs[:c], c)
        before = spec.engine.stats()
        run = loop(spec, reqs, c)
        after = spec.engine.stats()
        drafted = after["spec_draft_tokens"] - before["spec_draft_tokens"]
        base = plain_runs[c]
        row = dict(metric=f"spec_loaded_c{c}", concurrency=c, num_prompts=len(reqs),
                   tpot_p50_ratio=run["tpot_ms"]["p50"] / base["tpot_ms"]["p50"]
                   if run["tpot_ms"]["p50"] and base["tpot_ms"]["p50"] else None,
                   output_tok_s_ratio=run["output_tok_s"] / base["output_tok_s"],
                   spec=dict(tpot_ms=run["tpot_ms"], ttft_ms_p50=run["ttft_ms_p50"], output_tok_s=run["output_tok_s"],
                             steps=run["steps"], verify_rows=after["spec_verify_rows"] - before["spec_verify_rows"],
                             acceptance=(after["spec_accepted_tokens"] - before["spec_accepted_tokens"]) / max(drafted, 1),
                             compiles_while_serving=run["compiles_while_serving"]),
                   plain=dict(tpot_ms=base["tpot_ms"], ttft_ms_p50=base["ttft_ms_p50"],
                              output_tok_s=base["output_tok_s"], steps=base["steps"],
                              compiles_while_serving=base["compiles_while_serving"]),
                   workload=f"{args.model} dummy, closed loop of {c} in flight, {len(reqs)} requests, prompts "
                            f"{args.input_len} +-50%, outputs {args.output_len} +-50% greedy, synthetic drafter "
                            f"{args.acceptance}, K={args.k} {'fixed' if args.fixed else 'adaptive'}",
                   baseline="the same closed loop without speculation, same run",
                   device=args.device, tree=os.environ.get("TREE", ""), date=datetime.date.today().isoformat())
        if args.device == "cuda":
            import torch

            row["device"] = torch.cuda.get_device_name(0)
        rows.append(row)
        print(json.dumps(row), flush=True)
    os.makedirs(os.path.join(args.out, "results"), exist_ok=True)
    for row in rows:
        with open(os.path.join(args.out, "results", f"{row['metric']}.json"), "w") as f:
            json.dump(row, f, indent=1)
    print(f"{'concurrency':>11s} {'TPOT p50 plain':>14s} {'spec':>7s} {'ratio':>6s} {'tok/s plain':>11s} {'spec':>8s} "
          f"{'ratio':>6s} {'TTFT p50 plain':>14s} {'spec':>7s} {'accept':>6s}")
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731  (no steady requests: None)
    for r in rows:
        print(f"{r['concurrency']:11d} {fmt(r['plain']['tpot_ms']['p50'], '14.2f'):>14s} "
              f"{fmt(r['spec']['tpot_ms']['p50'], '7.2f'):>7s} {fmt(r['tpot_p50_ratio'], '6.2f'):>6s} "
              f"{r['plain']['output_tok_s']:11.1f} {r['spec']['output_tok_s']:8.1f} {r['output_tok_s_ratio']:6.2f} "
              f"{fmt(r['plain']['ttft_ms_p50'], '14.1f'):>14s} {fmt(r['spec']['ttft_ms_p50'], '7.1f'):>7s} "
              f"{r['spec']['acceptance']:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
