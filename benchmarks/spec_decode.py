"""Speculative decoding speed on a GPU: decode tok/s with a synthetic drafter (the true
continuation, each token right with probability 0.8, K = 4) against no speculation, in the
same run, through the public `LLM` API; and greedy agreement of the two.

    python benchmarks/spec_decode.py [--model qwen3_5_2p3b] [--batches 1,16,64] [--out DIR]

Per batch size B: B prompts of `--prompt` tokens, `--tokens` greedy tokens each. The plain
run gives the continuations the synthetic drafter proposes; decode tok/s = B * (tokens - 1)
/ (end-to-end time - time to first token of the last request), i.e. prefill excluded.
B = 64 runs with adaptive depth (the metric `spec_speedup_bs64_adaptive`), the others with
K = 4 fixed. Plain dummy weights give near-tie next-token distributions, where bf16 rounding of
the verify kernels vs the decode kernels flips greedy tokens and the speculative run leaves the
plain run's path (then the drafter's "true continuation" is wrong and the acceptance measured
is not the one configured). So by default (`--weights peaked`) the dummy model is made to
predict without ties, at the same shapes and cost: the token embedding is scaled up until it
dominates the residual stream, and the LM head reads it back through a fixed random
permutation (next token = perm(current token), a margin of ~90% of the top logit), so every
kernel path computes the same greedy continuation. `--weights sharpened` is the older setting
(LM head x`--sharpen`; with `--continuation verify` the drafter then proposes the verify path's
own greedy tokens, from a run with acceptance 0 first).
Writes one JSON per metric (metric, value, baseline, device, commit, date).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from model_configs import write_model_dir  # noqa: E402

from hybrid_serve import LLM, SamplingParams  # noqa: E402


def peak_weights(model, seed: int = 0, scale: float = 2000.0) -> None:
    """Dummy weights without near ties (see the module doc): embedding x `scale` (N(0, 0.02)
    entries become ~40 against a residual contribution of a few units from all layers), LM
    head = the unscaled embedding's rows in a fixed random order."""
    emb = model.model.embed_tokens.weight
    perm = torch.randperm(emb.shape[0], generator=torch.Generator().manual_seed(seed)).to(emb.device)
    model.lm_head.weight.data.copy_(emb.data[perm])
    emb.data.mul_(scale)


def prepare_weights(llm: LLM, args) -> None:
    if args.weights == "peaked":
        peak_weights(llm.engine.model)
    else:
        llm.engine.model.lm_head.weight.data.mul_(args.sharpen)


def decode_rate(llm: LLM, prompts: list[list[int]], tokens: int, one_at_a_time: bool = False
                ) -> tuple[float, list[list[int]], float]:
    """(decode tok/s excluding prefill, outputs, wall s); `one_at_a_time`: each prompt as its
    own batch of 1, the rate over all of them."""
    if one_at_a_time:
        runs = [decode_rate(llm, [p], tokens) for p in prompts]
        decode_s = sum((tokens - 1) / rate for rate, _, _ in runs)
        return len(prompts) * (tokens - 1) / decode_s, [r[1][0] for r in runs], sum(r[2] for r in runs)
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    wall = time.perf_counter() - t0
    first = max(o.metrics.first_token_time for o in outs) - min(o.metrics.arrival_time for o in outs)
    decode_s = max(wall - first, 1e-9)
    return len(prompts) * (tokens - 1) / decode_s, [o.outputs[0].token_ids for o in outs], wall


def step_breakdown(llm: LLM, prompts: list[list[int]], tokens: int) -> dict:
    """Median wall time of a decode-phase step against the GPU time of its forward (CUDA events
    around the shard's execute) and the host time of the execute call: where a verify step
    goes beyond its graph."""
    engine = llm.engine
    engine.step_timings, walls, real_step = [], [], engine.step

    def timed():
        n = len(engine.step_timings)
        t = time.perf_counter()
        out = real_step()
        walls.append((time.perf_counter() - t, n))
        return out

    engine.step = timed
    decode_rate(llm, prompts, tokens)
    del engine.step
    torch.cuda.synchronize()
    rows = []
    for wall, n in walls[len(walls) // 3:]:  # past the prefill
        if len(engine.step_timings) > n:
            t = engine.step_timings[n]
            rows.append((wall * 1e3, t["events"][0].elapsed_time(t["events"][1]), t["execute_ms"]))
    engine.step_timings = None
    med = lambda i: sorted(r[i] for r in rows)[len(rows) // 2] if rows else float("nan")  # noqa: E731
    out = {"steps": len(rows), "median_wall_ms": med(0), "median_forward_gpu_ms": med(1),
           "median_execute_host_ms": med(2)}
    print("step breakdown:", json.dumps(out), flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3_5_2p3b")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--acceptance", type=float, default=0.8)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--weights", default="peaked", choices=["peaked", "sharpened"],
                    help="dummy weights made tie-free (peaked) or the LM head multiplied by --sharpen")
    ap.add_argument("--sharpen", type=float, default=16.0, help="LM-head weight multiplier (--weights sharpened)")
    ap.add_argument("--dtype", default="bfloat16", help="bfloat16, or float32 (verify and decode kernels then "
                    "agree to rounding, so the plain run's continuation stays the true one)")
    ap.add_argument("--continuation", default="plain", choices=["verify", "plain"],
                    help="what the synthetic drafter proposes at fixed K: the verify path's own greedy tokens "
                         "(a run with acceptance 0 first) or the plain run's")
    ap.add_argument("--breakdown", action="store_true", help="wall vs GPU time of the first batch size's steps")
    ap.add_argument("--bs1-prompts", type=int, default=4,
                    help="batch 1 runs this many prompts one after another (the acceptance of one 128-token "
                         "run varies by +-0.06 around its mean at 0.8 per token)")
    ap.add_argument("--adaptive-from", type=int, default=64, help="batch sizes from this one run with adaptive depth")
    ap.add_argument("--cprofile", type=int, default=0, help="print the host profile of a speculative run at this batch size")
    ap.add_argument("--verify-graphs", type=int, default=1, help="verify steps through CUDA graphs (1) or eagerly (0)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    model_dir = write_model_dir(args.model, tempfile.mkdtemp())
    device = torch.cuda.get_device_name()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    engine = dict(model=model_dir, load_format="dummy", dtype=args.dtype, device="cuda", max_num_seqs=64,
                  enable_prefix_caching=False, gpu_memory_utilization=0.6)
    gen = torch.Generator().manual_seed(0)
    batches = [int(b) for b in args.batches.split(",")]
    prompts = {b: [torch.randint(10, 30000, (args.prompt,), generator=gen).tolist()
                   for _ in range(args.bs1_prompts if b == 1 else b)] for b in batches}
    singles = lambda b: b == 1  # noqa: E731  (batch 1: the prompts one after another)
    plain = LLM(**engine)
    prepare_weights(plain, args)
    decode_rate(plain, prompts[batches[0]][:1], 8)  # warm
    base = {b: decode_rate(plain, prompts[b], args.tokens, singles(b))[:2] for b in batches}
    del plain
    torch.cuda.empty_cache()
    continuations = {tuple(p): w for b in batches for p, w in zip(prompts[b], base[b][1])}
    rows = []
    for adaptive in (False, True):
        runs = [b for b in batches if (b >= args.adaptive_from) == adaptive]
        if not runs:
            continue
        spec_cfg = dict(method="synthetic", num_speculative_tokens=args.k, acceptance_rate=args.acceptance,
                        adaptive=adaptive, max_num_seqs=64, continuations=continuations)
        spec = LLM(**engine, speculative_config=spec_cfg, enable_verify_graphs=bool(args.verify_graphs))
        prepare_weights(spec, args)
        decode_rate(spec, prompts[runs[0]][:1], 8)
        for batch in runs:
            if not adaptive and args.continuation == "verify":
                # the verify path's own greedy continuation (all drafts wrong: every step a verify
                # step of K+1 tokens per row), which a run at any acceptance computes with the
                # same kernels and shapes: on dummy bf16 weights the plain run's tokens are not
                # that continuation (near ties round differently in verify and decode kernels)
                drafter = spec.engine.spec.drafter
                drafter.acceptance_rate = 0.0
                own = decode_rate(spec, prompts[batch], args.tokens, singles(batch))[1]
                drafter.continuations.update({tuple(p): w for p, w in zip(prompts[batch], own)})
                drafter.acceptance_rate = args.acceptance
            spec.engine.spec.depth.trace = []
            before = spec.engine.stats()
            graph_steps = spec.engine.runner.num_verify_graph_steps if spec.engine.runner is not None else 0
            spec_rate, got, _ = decode_rate(spec, prompts[batch], args.tokens, singles(batch))
            if spec.engine.runner is not None:
                graph_steps = spec.engine.runner.num_verify_graph_steps - graph_steps
            st = {k: v - before.get(k, 0) for k, v in spec.engine.stats().items() if k.startswith("spec_")}
            base_rate, want = base[batch]
            depth = spec.engine.spec.depth
            rates = {f"bs<={(1 << b) - 1}": dict(plain_tok_s=round(r.plain, 1), spec_tok_s=round(r.spec, 1),
                                                 plain_steps=r.plain_steps, spec_steps=r.spec_steps)
                     for b, r in sorted(depth._rates.items())}
            metric = f"spec_speedup_bs{batch}_adaptive" if adaptive else f"spec_speedup_bs{batch}_a08_k{args.k}"
            trace, spec.engine.spec.depth.trace = spec.engine.spec.depth.trace, None
            row = dict(metric=metric, value=round(spec_rate / base_rate, 3), unit="x", batch=batch,
                       spec_decode_tok_s=round(spec_rate, 1), baseline_decode_tok_s=round(base_rate, 1),
                       measured_acceptance=round(st["spec_accepted_tokens"] / max(st["spec_draft_tokens"], 1), 3),
                       greedy_identical_fraction=sum(g == w for g, w in zip(got, want)) / len(want),
                       first16_identical=sum(g[:16] == w[:16] for g, w in zip(got, want)) / len(want),
                       verify_rows=st["spec_verify_rows"], verify_graph_steps=graph_steps, device=device,
                       prompts=len(prompts[batch]), adaptive_depth_rates=rates if adaptive else None,
                       steps_ms=trace, verify_graph_sizes=list(getattr(getattr(spec.engine.runner, "verify_graphs", None),
                                                                         "sizes", []) or []),
                       commit=commit, tree=os.environ.get("TREE", commit),
                       date=datetime.date.today().isoformat(),
                       workload=f"{args.model} dummy {args.dtype}, {batch} prompts x {args.prompt} tokens, {args.tokens} "
                                f"greedy tokens, synthetic drafter acceptance {args.acceptance}, K={args.k}"
                                + (" adaptive" if adaptive else " fixed")
                                + (", peaked dummy weights" if args.weights == "peaked" else f", LM head x{args.sharpen:g}")
                                + (", verify graphs" if args.verify_graphs else ", verify eager")
                                + ("" if adaptive else f", drafts from the {args.continuation} run's continuation"),
                       baseline="no speculation, same engine settings, same run")
            if args.cprofile and batch == args.cprofile:
                import cProfile
                import pstats

                prof = cProfile.Profile()
                prof.enable()
                decode_rate(spec, prompts[batch][:batch], args.tokens)
                prof.disable()
                pstats.Stats(prof).sort_stats("tottime").print_stats(25)
                pstats.Stats(prof).sort_stats("cumulative").print_stats(45)
            if args.breakdown and batch == runs[0]:
                row["step_breakdown"] = step_breakdown(spec, prompts[batch], 48)
            rows.append(row)
            print(json.dumps(row), flush=True)
        del spec
        torch.cuda.empty_cache()
    os.makedirs(os.path.join(args.out, "results"), exist_ok=True)
    for row in rows:
        with open(os.path.join(args.out, "results", f"{row['metric']}.json"), "w") as f:
            json.dump(row, f, indent=1)
    print(f"{'metric':32s} {'spec tok/s':>10s} {'plain tok/s':>11s} {'speedup':>8s} {'accept':>7s} {'same':>5s}")
    for r in rows:
        print(f"{r['metric']:32s} {r['spec_decode_tok_s']:10.1f} {r['baseline_decode_tok_s']:11.1f} "
              f"{r['value']:8.2f} {r['measured_acceptance']:7.2f} {r['greedy_identical_fraction']:5.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
