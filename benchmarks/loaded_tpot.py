"""TPOT under load (issue 12, `loaded_tpot_bs64_over_decode_step`): the time per output token a
user sees while other requests' prompts keep arriving, against the pure-decode step of the
same batch size, measured on the same engine in the same run.

    python benchmarks/loaded_tpot.py [--model qwen3_5_2p3b] [--concurrency 64] [--num-prompts 448]
        [--input-len 512] [--output-len 128] [--range-ratio 0.5] [--json OUT.json]

1. Pure decode: `--concurrency` requests prefilled, then decode steps of the whole batch back
   to back (CUDA graphs, as served): the median time between steps.
2. Loaded: a closed loop through the engine's public step API. `--concurrency` requests are
   kept in flight; whenever one finishes, the next is added, so the batch stays at the
   concurrency and every finishing request brings a prompt into the following steps
   (prefill chunks mixed with the decode rows). Output lengths are uniform in
   len*(1 +- ratio), so the arrivals spread over the steps instead of coming in waves.
   TPOT of a request = (last token time - first token time) / (tokens - 1), from the
   engine's own timestamps; counted for requests that started after the first wave had
   finished and ended before the loop stopped adding requests (the steady state).
On CPU (`--device cpu --model demo`) it runs the same code on a tiny workload: a smoke test.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))


def pure_decode_step_ms(engine, batch: int, prompt_len: int, vocab: int, steps: int) -> float:
    """Median wall time between back-to-back steps of `batch` decode rows."""
    from hybrid_serve.engine.benchmarking import start_decode_batch

    ids = start_decode_batch(engine, batch, prompt_len, steps + 8, token_high=vocab, seed=7, prefix="pure-")
    times, t = [], time.perf_counter()
    for _ in range(steps):
        engine.step()
        now = time.perf_counter()
        times.append(now - t)
        t = now
    for seq_id in ids:
        engine.abort(seq_id)
    while engine.has_unfinished():
        engine.step()
    return statistics.median(times) * 1e3


def closed_loop(engine, requests, concurrency: int) -> dict:
    """Keep `concurrency` requests in flight until all are added; every step's wall and what it
    carried; TPOT of the steady-state requests."""
    from hybrid_serve import SamplingParams

    pending = list(enumerate(requests))
    live: dict[str, tuple[int, object]] = {}
    added_at: dict[int, int] = {}  # request index -> step number it was added at
    finished: dict[int, object] = {}
    steps: list[tuple[float, int, int]] = []  # (wall s, rows, tokens)
    first_wave_done_step = None
    last_add_step = None

    def add(step_no: int) -> None:
        idx, (prompt, out_len) = pending.pop(0)
        params = SamplingParams(max_tokens=out_len, temperature=0.0, ignore_eos=True)
        (seq_id,) = engine.add_request(f"load-{idx}", prompt, params)
        live[seq_id] = (idx, engine.get_request(seq_id))
        added_at[idx] = step_no

    sched = engine.scheduler
    real_schedule, cur = sched.schedule, {}

    def schedule(*a, **k):  # what each step carried and what scheduling it cost
        t0 = time.perf_counter()
        chunks = real_schedule(*a, **k)
        lens = [c.num_tokens for c in chunks]
        cur.update(schedule_ms=(time.perf_counter() - t0) * 1e3, tokens=sum(lens),
                   prefill_tokens=sum(n for n in lens if n > 1))
        return chunks

    sched.schedule = schedule
    while len(live) < concurrency and pending:
        add(0)
    step_no = 0
    while live or pending:
        step_no += 1
        cur.clear()
        t = time.perf_counter()
        engine.step()
        steps.append((time.perf_counter() - t, len(sched.running), dict(cur)))
        for seq_id in [s for s, (_, req) in live.items() if req.finished]:
            idx, req = live.pop(seq_id)
            finished[idx] = (req.first_token_time, req.finished_time, len(req.output_token_ids), req.arrival_time)
        if first_wave_done_step is None and all(i in finished for i in range(concurrency)):
            first_wave_done_step = step_no
        while len(live) < concurrency and pending:
            add(step_no)
            last_add_step = step_no
    steady = [i for i, (t0, t1, n, _) in finished.items()
              if i >= concurrency and first_wave_done_step is not None and added_at[i] >= first_wave_done_step
              and last_add_step is not None and n > 1 and i < len(requests) - concurrency]
    tpots = [(finished[i][1] - finished[i][0]) / (finished[i][2] - 1) for i in steady]
    ttfts = sorted(finished[i][0] - finished[i][3] for i in steady)
    del sched.schedule
    walls = [w for w, _, _ in steps]
    mixed = [(w, c) for w, _, c in steps if c.get("prefill_tokens")]
    decode = [w for w, _, c in steps if c.get("tokens") and not c.get("prefill_tokens")]
    slowest = sorted(steps, key=lambda s: -s[0])[:8]
    print(f"{len(mixed)} steps with prompt tokens (median {statistics.median(w for w, _ in mixed) * 1e3:.1f} ms, "
          f"sum {sum(w for w, _ in mixed):.2f} s, median prompt tokens "
          f"{statistics.median(c['prefill_tokens'] for _, c in mixed):.0f}), {len(decode)} pure decode steps "
          f"(median {statistics.median(decode) * 1e3:.2f} ms, sum {sum(decode):.2f} s); slowest: "
          + ", ".join(f"{w * 1e3:.0f} ms (sched {c.get('schedule_ms', 0):.1f}, {c.get('prefill_tokens', 0)} prompt "
                      f"tokens)" for w, _, c in slowest) if mixed and decode else "", flush=True)
    return {"steps": len(steps), "median_step_ms": statistics.median(walls) * 1e3, "steady_requests": len(steady),
            "tpot_ms": {"p50": statistics.median(tpots) * 1e3 if tpots else None,
                        "mean": statistics.mean(tpots) * 1e3 if tpots else None,
                        "p90": sorted(tpots)[int(0.9 * len(tpots))] * 1e3 if tpots else None},
            "running_median": statistics.median(r for _, r, _ in steps),
            "ttft_ms_p50": ttfts[len(ttfts) // 2] * 1e3 if ttfts else None,
            "mixed_steps": len(mixed), "mixed_median_ms": statistics.median(w for w, _ in mixed) * 1e3 if mixed else None,
            "mixed_sum_s": sum(w for w, _ in mixed), "decode_steps": len(decode), "decode_sum_s": sum(decode),
            "median_prompt_tokens_per_mixed_step": statistics.median(c["prefill_tokens"] for _, c in mixed) if mixed else None,
            "median_schedule_ms": statistics.median(c.get("schedule_ms", 0) for _, _, c in steps),
            "max_schedule_ms": max(c.get("schedule_ms", 0) for _, _, c in steps)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen3_5_2p3b", help="a benchmarks/model_configs.py name, or 'demo'")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--num-prompts", type=int, default=448)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--range-ratio", type=float, default=0.5)
    ap.add_argument("--decode-steps", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--engine-args", default="{}", help="JSON of extra LLM(...) arguments")
    ap.add_argument("--hold-steps", default="", help="comma-separated prefill_hold_steps values, each a loaded run "
                    "on the same engine (engine/config.py: prompts held while all running requests decode); "
                    "default: the engine's own (16 on CUDA, 0 on CPU). The first is the headline figure")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from model_configs import CONFIGS, write_model_dir
    from throughput import workload

    from hybrid_serve import LLM

    with tempfile.TemporaryDirectory() as tmp:
        kwargs = dict(device=args.device, **json.loads(args.engine_args))
        if args.model != "demo":
            kwargs.update(model=write_model_dir(args.model, tmp), load_format="dummy",
                          dtype="bfloat16" if args.device == "cuda" else "float32")
        vocab = 4096 if args.model == "demo" else CONFIGS[args.model]().vocab_size
        llm = LLM(**kwargs)
        engine = llm.engine
        requests = workload(args.num_prompts, args.input_len, args.output_len, args.range_ratio, vocab, args.seed)
        closed_loop(engine, requests[:args.concurrency], args.concurrency)  # warm the mixed shapes
        decode_ms = pure_decode_step_ms(engine, args.concurrency, args.input_len, vocab, args.decode_steps)
        runs = {}
        holds = [int(h) for h in args.hold_steps.split(",")] if args.hold_steps else [engine.config.prefill_hold_steps]
        for hold in holds:
            engine.scheduler.config = dataclasses.replace(engine.config, prefill_hold_steps=hold)
            runs[hold] = closed_loop(engine, requests, args.concurrency)
            ttft = runs[hold].get("ttft_ms_p50")
            print(f"prefill_hold_steps={hold}: TPOT p50 {runs[hold]['tpot_ms']['p50']:.2f} ms, TTFT p50 {ttft:.1f} ms",
                  flush=True)
        engine.scheduler.config = engine.config
        loaded = runs[holds[0]]
        decode_ms_after = pure_decode_step_ms(engine, args.concurrency, args.input_len, vocab, args.decode_steps)
    base = min(decode_ms, decode_ms_after)
    ratio = loaded["tpot_ms"]["p50"] / base if loaded["tpot_ms"]["p50"] else None
    result = {"metric": "loaded_tpot_bs64_over_decode_step" if args.concurrency == 64 else
              f"loaded_tpot_bs{args.concurrency}_over_decode_step", "value": ratio, "unit": "x",
              "target": "<= 1.5", "model": args.model, "device": args.device, "concurrency": args.concurrency,
              "num_prompts": args.num_prompts, "input_len": args.input_len, "output_len": args.output_len,
              "range_ratio": args.range_ratio, "pure_decode_step_ms": [decode_ms, decode_ms_after],
              "prefill_hold_steps": holds[0],
              "loaded": loaded, "by_prefill_hold_steps": runs, "config": {k: getattr(llm.config, k) for k in (
                  "max_num_seqs", "max_num_batched_tokens", "chunked_prefill_size", "enable_prefix_caching",
                  "async_scheduling")}}
    if args.device == "cuda":
        import torch

        result["device"] = torch.cuda.get_device_name(0)
    print(f"pure decode step at batch {args.concurrency}: {decode_ms:.2f} ms (again after: {decode_ms_after:.2f}); "
          f"loaded TPOT p50 {loaded['tpot_ms']['p50']:.2f} ms mean {loaded['tpot_ms']['mean']:.2f} ms "
          f"p90 {loaded['tpot_ms']['p90']:.2f} ms over {loaded['steady_requests']} steady requests "
          f"-> {ratio:.2f}x (target <= 1.5x); {loaded['steps']} steps, median {loaded['median_step_ms']:.2f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
