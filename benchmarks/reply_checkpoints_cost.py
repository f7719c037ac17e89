"""What reply checkpoints (EngineConfig.reply_checkpoints) cost a loaded engine: every decoding
request copies its state into its snapshot slot each time its reply crosses a page boundary
(one copy every 16 tokens a request; 38.6 MB fp32 of the 2.3B model's state per copy). One
engine through the public `LLM` API, the option toggled between runs of the same workload
(fresh random prompts each run: no prefix hits), alternating on / off `--repeats` times so that
drift hits both alike. Workloads: throughput.py's 256 x 512 in / 128 out (prompts arriving
while others decode), and a decode-heavy batch (64 x 128 in / 512 out). Reported per workload:
output tokens/s on and off (median), their ratio, and TPOT p50.

    python -m hybrid_serve.benchmarks.reply_checkpoints_cost [--model qwen3_5_2p3b] [--repeats 3] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

WORKLOADS = {"256x512/128": (256, 512, 128), "64x128/512": (64, 128, 512)}


def _run(llm, requests) -> dict:
    from hybrid_serve import SamplingParams

    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for _, n in requests]
    start = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p, _ in requests], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    tpot = sorted((o.metrics.finished_time - o.metrics.first_token_time) / (len(o.outputs[0].token_ids) - 1)
                  for o in outs)
    return {"elapsed_s": round(elapsed, 3),
            "output_tok_s": round(sum(len(o.outputs[0].token_ids) for o in outs) / elapsed, 1),
            "tpot_p50_ms": round(tpot[len(tpot) // 2] * 1e3, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3_5_2p3b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every count and length (CPU smoke runs)")
    ap.add_argument("--engine-args", default="{}", help="JSON of extra LLM(...) arguments")
    ap.add_argument("--profile", action="store_true", help="print the GPU kernels of a short run, on and off")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from hybrid_serve import LLM

    from .model_configs import CONFIGS, write_model_dir
    from .throughput import workload

    tmp = tempfile.mkdtemp()
    model_dir = write_model_dir(args.model, tmp)
    vocab = CONFIGS[args.model]().vocab_size
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    llm = LLM(model=model_dir, load_format="dummy", dtype=dtype, device=args.device, **json.loads(args.engine_args))
    config = llm.engine.config
    rows, seed = {}, 0
    for name in args.workloads:
        num, input_len, output_len = (max(1, int(x * args.scale)) for x in WORKLOADS[name])
        _run(llm, workload(min(num, 8), input_len, output_len, 0.0, vocab, 10_000))  # warm-up
        runs = {True: [], False: []}
        for _ in range(args.repeats):
            for on in (True, False):
                seed += 1
                object.__setattr__(config, "reply_checkpoints", on)  # read at each step
                llm.engine.cache.reset_prefix_cache()
                runs[on].append(_run(llm, workload(num, input_len, output_len, 0.0, vocab, seed)))
                print(name, "on " if on else "off", runs[on][-1], flush=True)
        med = {on: statistics.median(r["output_tok_s"] for r in runs[on]) for on in runs}
        rows[name] = {"on": runs[True], "off": runs[False], "output_tok_s_on": med[True],
                      "output_tok_s_off": med[False], "on_over_off": round(med[True] / med[False], 4),
                      "tpot_p50_ms_on": statistics.median(r["tpot_p50_ms"] for r in runs[True]),
                      "tpot_p50_ms_off": statistics.median(r["tpot_p50_ms"] for r in runs[False])}
    object.__setattr__(config, "reply_checkpoints", True)
    if args.profile:  # where the difference goes: GPU kernels of a short decode-heavy run, on and off
        from torch.profiler import ProfilerActivity, profile

        for on in (True, False):
            object.__setattr__(config, "reply_checkpoints", on)
            llm.engine.cache.reset_prefix_cache()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                _run(llm, workload(64, 128, 64, 0.0, vocab, 99))
            print(f"reply_checkpoints={on}: top GPU time")
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60))
        object.__setattr__(config, "reply_checkpoints", True)
    print(f"{'workload':<14} {'on tok/s':>10} {'off tok/s':>10} {'on/off':>7} {'TPOT on':>8} {'TPOT off':>8}")
    for name, r in rows.items():
        print(f"{name:<14} {r['output_tok_s_on']:>10.0f} {r['output_tok_s_off']:>10.0f} {r['on_over_off']:>7.3f} "
              f"{r['tpot_p50_ms_on']:>8.2f} {r['tpot_p50_ms_off']:>8.2f}")
    if args.json:
        import torch

        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(__file__)).stdout.strip()
        device = torch.cuda.get_device_name(0) if args.device == "cuda" else f"cpu ({os.cpu_count()} cores)"
        with open(args.json, "w") as f:
            json.dump({"metric": "output tokens/s with reply checkpoints on and off, one engine",
                       "date": time.strftime("%Y-%m-%d"), "commit": commit, "device": device, "model": args.model,
                       "repeats": args.repeats, "engine_args": json.loads(args.engine_args), "workloads": rows}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
