"""Host cost of scheduling under load (issue 12, `loaded_tpot_bs64_over_decode_step`): the
scheduler's time per step in `loaded_tpot.py`'s closed loop, run on the CPU with the demo model
and CUDA's scheduling defaults (256 sequences, 8,192-token steps and chunks, prompts held for
16 steps) and a state pool of the 2.3B model's size on an H200 (792 slots), so that the tree
fills with checkpoints (prompt intervals and replies) and admissions evict, as on the card.
Only `Scheduler.schedule` is timed; the forward is the CPU's and takes most of the run.

    python benchmarks/schedule_cost.py [--num-prompts 320] [--state-slots 792]
        [--spare-max 0,32] [--json OUT.json]

`--first-wave-cached`: the first wave runs once before the timed loop, as in loaded_tpot.py, so
the timed loop's first step admits 64 cache hits at once (`first_step_schedule_ms`).
`--full-batch N`: instead of the closed loop, step_breakdown.py's firstreq run (session 48): the
prefix tree first filled as its first-step sweep fills it (b = 1..N requests of 32 random tokens
and 8 outputs, twice each), then 256 requests of 512 / 40 tokens submitted at once; the median
scheduling of the 256-row decode steps, wall and this thread's CPU time, and the dominated-only
evictions asked (each reply that reaches a page boundary without a resume slot asks for one).
`--spare-max`: values of `CacheManager.EVICT_SPARE_MAX` to run (set on each engine's cache
manager), each on a fresh engine with
the same workload (0: one eviction pass over the checkpoints per slot needed, as before
5c4ff91). The steps whose scheduling took over 2 ms are the admitting ones.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))


def cuda_like_llm(state_slots: int, **engine_args):
    """The demo model on the CPU (2 threads) with CUDA's scheduling defaults (256 sequences,
    8,192-token steps and chunks, prompts held for 16 steps) and `state_slots` state slots."""
    import torch

    from hybrid_serve import LLM

    torch.set_num_threads(2)
    return LLM(device="cpu", max_num_seqs=256, max_num_batched_tokens=8192, chunked_prefill_size=8192,
               prefill_hold_steps=16, num_state_slots_override=state_slots, **engine_args)


def run(num_prompts: int, state_slots: int, spare_max: int, seed: int, input_len: int = 512, output_len: int = 128,
        concurrency: int = 64, first_wave_cached: bool = False) -> dict:
    from loaded_tpot import closed_loop
    from throughput import workload

    llm = cuda_like_llm(state_slots, max_model_len=4096)
    engine = llm.engine
    engine.cache.EVICT_SPARE_MAX = spare_max  # this engine's cache manager only
    sched = engine.scheduler
    real, times, first_chunks = sched.schedule, [], []

    def schedule(*a, **k):
        t = time.perf_counter()
        chunks = real(*a, **k)
        times.append(time.perf_counter() - t)
        if len(times) == 1:
            first_chunks.extend((c.num_tokens, c.request.num_cached_tokens) for c in chunks)
        return chunks

    sched.schedule = schedule
    evictions = {"calls": 0}
    real_evict = engine.cache.tree.evict_state

    def evict_state(*a, **k):
        evictions["calls"] += 1
        return real_evict(*a, **k)

    engine.cache.tree.evict_state = evict_state
    requests = workload(num_prompts, input_len, output_len, 0.5, 4096, seed)
    if first_wave_cached:  # as loaded_tpot.py: its warm-up loop leaves the first wave's prompts cached
        sched.schedule = real
        closed_loop(engine, requests[:concurrency], concurrency)
        sched.schedule = schedule
        evictions["calls"] = 0
    t = time.perf_counter()
    closed_loop(engine, requests, concurrency)
    slow = [x for x in times if x > 0.002]
    return {"spare_max": spare_max, "loop_s": time.perf_counter() - t, "steps": len(times),
            "schedule_sum_ms": sum(times) * 1e3, "schedule_max_ms": max(times) * 1e3,
            "schedule_median_ms": statistics.median(times) * 1e3, "first_step_schedule_ms": times[0] * 1e3,
            "first_step": {"rows": len(first_chunks), "tokens": sum(n for n, _ in first_chunks),
                           "cached_tokens": sum(c or 0 for _, c in first_chunks)},
            "over_2ms": {"steps": len(slow), "sum_ms": sum(slow) * 1e3},
            "slowest_ms": [round(x * 1e3, 2) for x in sorted(times)[-10:]],
            "evict_state_calls": evictions["calls"], "checkpoints_evicted": engine.cache.stats.evicted_checkpoints}


def full_batch(state_slots: int, sweep: int, seed: int, num_prompts: int = 256, input_len: int = 512,
               output_len: int = 40) -> dict:
    """step_breakdown.py's firstreq run on the CPU: the tree filled by a first-step sweep of
    1..`sweep` requests, then `num_prompts` requests at once (the 2.3B model's 792 state slots,
    CUDA's scheduling defaults, overlapped scheduling)."""
    import random

    from hybrid_serve import SamplingParams
    from throughput import workload

    llm = cuda_like_llm(state_slots, async_scheduling=True, max_model_len=32768, num_kv_pages_override=60000)
    engine = llm.engine
    rng = random.Random(seed)
    for b in range(1, sweep + 1):
        prompts = [{"prompt_token_ids": [rng.randrange(3, 4096) for _ in range(32)]} for _ in range(b)]
        for _ in range(2):
            llm.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    sched, tree = engine.scheduler, engine.cache.tree
    real, real_evict, steps, asked = sched.schedule, tree.evict_state, [], {"n": 0}

    def schedule(*a, **k):
        t, cpu = time.perf_counter(), time.thread_time()
        chunks = real(*a, **k)
        steps.append(((time.perf_counter() - t) * 1e3, (time.thread_time() - cpu) * 1e3,
                      len(chunks), sum(c.num_tokens for c in chunks)))
        return chunks

    def evict_state(*a, **k):
        asked["n"] += bool(k.get("dominated_only"))
        return real_evict(*a, **k)

    sched.schedule, tree.evict_state = schedule, evict_state
    requests = workload(num_prompts, input_len, output_len, 0.0, 4096, seed + 1)
    llm.generate([{"prompt_token_ids": p} for p, _ in requests],
                 SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True))
    decode = [s for s in steps if s[2] == s[3] >= num_prompts * 3 // 4]  # decode steps of most of the batch
    return {"sweep": sweep, "state_slots": state_slots, "decode_steps": len(decode),
            "decode_schedule_median_ms": statistics.median(s[0] for s in decode),
            "decode_schedule_cpu_median_ms": statistics.median(s[1] for s in decode),
            "dominated_only_evictions_asked": asked["n"], "checkpoints_held": tree.num_state_slots}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-prompts", type=int, default=320)
    ap.add_argument("--state-slots", type=int, default=792)
    ap.add_argument("--spare-max", default="0,32")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--first-wave-cached", action="store_true",
                    help="run the first wave once before (loaded_tpot.py's warm-up): its prompts are then all "
                         "cache hits, admitted in the timed loop's first step")
    ap.add_argument("--json", default=None)
    ap.add_argument("--full-batch", type=int, default=0, metavar="SWEEP",
                    help="step_breakdown.py's firstreq run after a first-step sweep of 1..SWEEP requests")
    args = ap.parse_args()
    if args.full_batch:
        row = full_batch(args.state_slots, args.full_batch, args.seed)
        print(f"{row['decode_steps']} decode steps of >= 192 rows: scheduling median "
              f"{row['decode_schedule_median_ms']:.2f} ms (this thread's CPU {row['decode_schedule_cpu_median_ms']:.2f} "
              f"ms); dominated-only evictions asked {row['dominated_only_evictions_asked']}, checkpoints held "
              f"{row['checkpoints_held']}", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"benchmark": "schedule_cost --full-batch", **row}, f, indent=1)
        return
    rows = []
    for spare in (int(x) for x in args.spare_max.split(",")):
        row = run(args.num_prompts, args.state_slots, spare, args.seed, first_wave_cached=args.first_wave_cached)
        rows.append(row)
        print(f"EVICT_SPARE_MAX {spare:3d}: schedule sum {row['schedule_sum_ms']:.0f} ms over {row['steps']} steps, "
              f"max {row['schedule_max_ms']:.1f} ms; steps over 2 ms: {row['over_2ms']['steps']} "
              f"({row['over_2ms']['sum_ms']:.1f} ms); evict_state calls {row['evict_state_calls']}, "
              f"checkpoints evicted {row['checkpoints_evicted']}; first step {row['first_step_schedule_ms']:.1f} ms",
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "schedule_cost", "num_prompts": args.num_prompts, "state_slots": args.state_slots,
                       "first_wave_cached": args.first_wave_cached, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
