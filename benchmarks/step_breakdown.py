"""Where an offline run's time goes, step by step, and the first-step check of issue 12.

    python benchmarks/step_breakdown.py [--model qwen3_5_2p3b] [--num-prompts 256] [--input-len 512]
        [--output-len 128] [--first-step-sweep 64] [--profile] [--json OUT.json]

1. `--first-step-sweep N` (acceptance "after warm-up, the first request at each batch size
   1..N takes no longer than 2x the steady step"): on the freshly started engine, for each
   batch size b = 1..N, b requests (32 random prompt tokens, 8 output tokens) through
   `LLM.generate`, twice (same shapes); the first call's slowest step against the second
   call's slowest step (a kernel compiled while serving shows there), and the first call's
   wall against the second's.
2. The offline workload of benchmarks/throughput.py (N requests at once), every engine step
   recorded: its kind (prefill only / mixed / pure decode), rows and tokens, wall, host time
   of scheduling, of launching (plan, forward and sampling queued) and of completing the
   step before (minus the wait for its tokens), and the forward's GPU time (CUDA events
   around the shard's execute). A summary table by kind.
3. `--profile`: the same workload again under the torch profiler (CUDA activity only), the
   kernels with the most GPU time.
4. `--profile-schedule`: the workload once more with every `Scheduler.schedule` call under
   cProfile (wall clock: a call that blocks shows where) and the garbage collector's passes
   inside them timed; the functions with the most time.
5. `--sync-debug N`: N requests of the workload's lengths (prefill and mixed steps) under
   torch's CUDA sync debug mode: every host <-> device synchronization the step path makes,
   by call site (the engine's one intended wait, for the previous step's tokens, is an event
   and does not show), then the same under the torch profiler with CPU activity: the host
   functions that cost the most.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))


def instrument(engine, log: list):
    """Wrap engine.step and its parts; each step appends a dict to `log`."""
    from hybrid_serve.device_io import PendingHostCopy

    sched, real_launch, real_complete = engine.scheduler, engine._launch, engine._complete
    real_schedule = sched.schedule
    real_wait = PendingHostCopy.wait
    cur: dict = {}

    def schedule():
        t, cpu = time.perf_counter(), time.thread_time()
        chunks = real_schedule()
        cur["schedule_ms"] = (time.perf_counter() - t) * 1e3
        cur["schedule_cpu_ms"] = (time.thread_time() - cpu) * 1e3  # this thread's CPU time: < wall = not running
        lens = [c.num_tokens for c in chunks]
        cur.update(rows=len(lens), tokens=sum(lens), decode_rows=sum(1 for n in lens if n == 1))
        return chunks

    def launch(chunks):
        t = time.perf_counter()
        out = real_launch(chunks)
        cur["launch_ms"] = (time.perf_counter() - t) * 1e3
        return out

    def complete(launched):
        t = time.perf_counter()
        out = real_complete(launched)
        cur["complete_ms"] = cur.get("complete_ms", 0.0) + (time.perf_counter() - t) * 1e3
        return out

    def wait(self):
        t = time.perf_counter()
        out = real_wait(self)
        cur["wait_ms"] = cur.get("wait_ms", 0.0) + (time.perf_counter() - t) * 1e3
        return out

    real_step = engine.step

    def step():
        cur.clear()
        n_timings = len(engine.step_timings) if engine.step_timings is not None else 0
        t = time.perf_counter()
        out = real_step()
        entry = dict(cur, wall_ms=(time.perf_counter() - t) * 1e3, running=len(sched.running),
                     waiting=len(sched.waiting))
        if engine.step_timings is not None and len(engine.step_timings) > n_timings:
            entry["timing"] = engine.step_timings[-1]
        log.append(entry)
        return out

    sched.schedule, engine._launch, engine._complete, engine.step = schedule, launch, complete, step
    PendingHostCopy.wait = wait


def kind_of(e: dict) -> str:
    if not e.get("rows"):
        return "empty"
    if e["decode_rows"] == e["rows"]:
        return "decode"
    return "prefill" if e["decode_rows"] == 0 else "mixed"


def summarize(log: list) -> dict:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    for e in log:
        t = e.pop("timing", None)
        if t is not None:
            e["gpu_ms"] = t["events"][0].elapsed_time(t["events"][1])
            e["execute_host_ms"] = t["execute_ms"]
        e["host_ms"] = e.get("schedule_ms", 0) + e.get("launch_ms", 0) + e.get("complete_ms", 0) - e.get("wait_ms", 0)
        e["kind"] = kind_of(e)
    table = {}
    for kind in ("prefill", "mixed", "decode", "empty"):
        es = [e for e in log if e["kind"] == kind]
        if not es:
            continue
        med = lambda k: statistics.median(e.get(k, 0.0) for e in es)  # noqa: E731
        table[kind] = {"steps": len(es), "wall_s": sum(e["wall_ms"] for e in es) / 1e3,
                       "gpu_s": sum(e.get("gpu_ms", 0.0) for e in es) / 1e3,
                       "host_s": sum(e["host_ms"] for e in es) / 1e3, "median_wall_ms": med("wall_ms"),
                       "median_gpu_ms": med("gpu_ms"), "median_host_ms": med("host_ms"),
                       "median_launch_ms": med("launch_ms"), "median_schedule_ms": med("schedule_ms"),
                       "median_schedule_cpu_ms": med("schedule_cpu_ms"),
                       "median_tokens": med("tokens"), "median_rows": med("rows"), "max_rows": max(e["rows"] for e in es)}
    return table


def print_table(table: dict) -> None:
    print(f"{'kind':8} {'steps':>5} {'wall s':>7} {'gpu s':>7} {'host s':>7} {'med wall':>9} {'med gpu':>8} "
          f"{'med host':>9} {'launch':>7} {'sched':>6} {'cpu':>5} {'tokens':>7} {'rows':>5} {'max rows':>8}")
    for kind, r in table.items():
        print(f"{kind:8} {r['steps']:5d} {r['wall_s']:7.2f} {r['gpu_s']:7.2f} {r['host_s']:7.2f} "
              f"{r['median_wall_ms']:9.2f} {r['median_gpu_ms']:8.2f} {r['median_host_ms']:9.2f} "
              f"{r['median_launch_ms']:7.2f} {r['median_schedule_ms']:6.2f} {r['median_schedule_cpu_ms']:5.2f} "
              f"{r['median_tokens']:7.0f} "
              f"{r['median_rows']:5.0f} {r['max_rows']:8d}")


def first_step_sweep(llm, log: list, max_batch: int, vocab: int) -> list[dict]:
    """Per batch size: first call's slowest step / second call's median decode step."""
    import random

    from hybrid_serve import SamplingParams

    rng = random.Random(1)
    rows = []
    for b in range(1, max_batch + 1):
        walls, steps = [], []
        for _ in range(2):
            prompts = [[rng.randrange(10, vocab) for _ in range(32)] for _ in range(b)]
            log.clear()
            t = time.perf_counter()
            llm.generate(prompts, [SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)] * b, use_tqdm=False)
            walls.append(time.perf_counter() - t)
            steps.append([(e["wall_ms"], e.get("decode_rows", 0) == e.get("rows", -1)) for e in log])
        decode = [[w for w, d in run if d] or [0.0] for run in steps]
        first_max, second_max = max(w for w, _ in steps[0]), max(w for w, _ in steps[1])
        rows.append({"batch": b, "first_max_step_ms": first_max, "second_max_step_ms": second_max,
                     "ratio": first_max / second_max, "steady_decode_step_ms": statistics.median(decode[1]),
                     "first_call_s": walls[0], "second_call_s": walls[1], "call_ratio": walls[0] / walls[1]})
    return rows


def sync_debug(llm, num: int, input_len: int, vocab: int) -> dict:
    """Host syncs by call site, and the host functions that cost most, over `num` requests."""
    import collections
    import cProfile
    import pstats
    import traceback
    import warnings

    import torch

    from hybrid_serve import SamplingParams
    from throughput import workload

    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    sites: collections.Counter = collections.Counter()

    def show(message, category, filename, lineno, file=None, line=None):
        frames = [f for f in traceback.extract_stack()[:-1] if "hybrid_serve" in f.filename or "/work" in f.filename
                  or "perf12" in f.filename]
        sites[" <- ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in frames[-1:-4:-1])
              + f" | {str(message)[:60]}"] += 1

    requests = workload(num, input_len, 4, 0.0, vocab, 21)
    old_show = warnings.showwarning
    warnings.showwarning = show
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            llm.generate([p for p, _ in requests], [params] * num, use_tqdm=False)
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = old_show
    print(f"\nsync debug ({num} requests of {input_len} tokens, 4 out): {sum(sites.values())} syncs")
    for site, n in sites.most_common(12):
        print(f"  {n:5d}x {site}")
    requests = workload(num, input_len, 4, 0.0, vocab, 22)
    prof = cProfile.Profile()
    prof.enable()
    llm.generate([p for p, _ in requests], [params] * num, use_tqdm=False)
    prof.disable()
    stats = pstats.Stats(prof)
    rows = sorted(((v[2], v[3], v[1], k) for k, v in stats.stats.items()), reverse=True)[:25]  # tottime
    print("host (Python) time by function, self / cumulative:")
    top = []
    for tottime, cumtime, calls, (file, line, name) in rows:
        where = f"{os.path.basename(file)}:{line} {name}"
        top.append({"function": where, "self_ms": tottime * 1e3, "cum_ms": cumtime * 1e3, "calls": calls})
        print(f"  {tottime * 1e3:8.1f} {cumtime * 1e3:8.1f} ms {calls:7d}x  {where[:90]}")
    return {"syncs": dict(sites.most_common(30)), "host_top": top}


def profile_schedule(llm, requests: list, params: list) -> dict:
    """`Scheduler.schedule` under cProfile for one run of `requests`, with the collector's
    passes inside it timed (gc.callbacks)."""
    import cProfile
    import gc
    import pstats
    import resource

    sched = llm.engine.scheduler
    real, prof = sched.schedule, cProfile.Profile()
    calls = {"n": 0, "wall_ms": 0.0, "cpu_ms": 0.0, "gc_ms": 0.0, "gc_passes": 0, "minor_faults": 0,
             "voluntary_switches": 0, "involuntary_switches": 0}
    usage = lambda: resource.getrusage(resource.RUSAGE_THREAD)  # noqa: E731
    inside, gc_start = [False], [0.0]

    def on_gc(phase, info):
        if not inside[0]:
            return
        if phase == "start":
            gc_start[0] = time.perf_counter()
        else:
            calls["gc_ms"] += (time.perf_counter() - gc_start[0]) * 1e3
            calls["gc_passes"] += 1

    def schedule(*a, **k):
        t, cpu, ru = time.perf_counter(), time.thread_time(), usage()
        inside[0] = True
        prof.enable()
        try:
            return real(*a, **k)
        finally:
            prof.disable()
            inside[0] = False
            calls["n"] += 1
            calls["wall_ms"] += (time.perf_counter() - t) * 1e3
            calls["cpu_ms"] += (time.thread_time() - cpu) * 1e3
            after = usage()
            calls["minor_faults"] += after.ru_minflt - ru.ru_minflt
            calls["voluntary_switches"] += after.ru_nvcsw - ru.ru_nvcsw  # blocked (a wait, the GIL)
            calls["involuntary_switches"] += after.ru_nivcsw - ru.ru_nivcsw  # preempted

    gc.callbacks.append(on_gc)
    sched.schedule = schedule
    try:
        llm.generate([p for p, _ in requests], params, use_tqdm=False)
    finally:
        sched.schedule = real
        gc.callbacks.remove(on_gc)
    print(f"\nschedule under cProfile: {calls['n']} calls, wall {calls['wall_ms']:.0f} ms, this thread's CPU "
          f"{calls['cpu_ms']:.0f} ms, collector {calls['gc_ms']:.1f} ms in {calls['gc_passes']} passes; "
          f"minor faults {calls['minor_faults']}, switches voluntary {calls['voluntary_switches']} / involuntary "
          f"{calls['involuntary_switches']}")
    top = []
    for (file, line, name), (_, calls_n, tottime, cumtime, _) in sorted(
            pstats.Stats(prof).stats.items(), key=lambda kv: -kv[1][2])[:15]:
        where = f"{os.path.basename(file)}:{line} {name}"
        top.append({"function": where, "self_ms": tottime * 1e3, "cum_ms": cumtime * 1e3, "calls": calls_n})
        print(f"  {tottime * 1e3:8.1f} {cumtime * 1e3:8.1f} ms {calls_n:7d}x  {where[:90]}")
    return {**calls, "top": top}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen3_5_2p3b")
    ap.add_argument("--num-prompts", type=int, default=256)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--first-step-sweep", type=int, default=0)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--profile-schedule", action="store_true")
    ap.add_argument("--sync-debug", type=int, default=0, help="requests for the sync / host-profile check")
    ap.add_argument("--engine-args", default="{}")
    ap.add_argument("--device", default="cuda", help="cpu (with --model demo): a smoke test of the script")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch

    from hybrid_serve import LLM, SamplingParams
    from model_configs import CONFIGS, write_model_dir
    from throughput import watch_compiles, workload

    cuda = args.device == "cuda"
    result: dict = {"model": args.model, "device": torch.cuda.get_device_name(0) if cuda else "cpu"}
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        kwargs = dict(device=args.device, **json.loads(args.engine_args))
        if args.model != "demo":
            kwargs.update(model=write_model_dir(args.model, tmp), dtype="bfloat16" if cuda else "float32",
                          load_format="dummy")
        llm = LLM(**kwargs)
        result["startup_s"] = time.perf_counter() - t
    engine = llm.engine
    setup = engine.pool_setup
    result["pool_setup"] = {k: v for k, v in vars(setup).items() if isinstance(v, (int, float, str))}
    graphs = engine.runner.decode_graphs
    result["decode_graph_sizes"] = sorted(graphs.graphs) if graphs is not None else []
    if cuda:
        from hybrid_serve.engine.runner.model_runner import cuda_memory_note
        result["memory_after_start"] = cuda_memory_note(engine.runner.device)
        print(f"after start-up: {result['memory_after_start']}")
    print(f"start-up {result['startup_s']:.1f} s; pools {result['pool_setup']}; decode graphs up to "
          f"{max(result['decode_graph_sizes'] or [0])} ({len(result['decode_graph_sizes'])} sizes)")
    vocab = 4096 if args.model == "demo" else CONFIGS[args.model]().vocab_size
    compiles: list = []
    watch_compiles(compiles)

    def report_compiles(where: str) -> None:
        print(f"{len(compiles)} Triton kernels compiled {where}" + "".join(f"\n  {w}" for _, w in compiles[:12]))
        result.setdefault("compiled_while_serving", {})[where] = [w for _, w in compiles]
        compiles.clear()

    log: list = []
    instrument(engine, log)
    if args.first_step_sweep:
        rows = first_step_sweep(llm, log, args.first_step_sweep, vocab)
        result["first_step_sweep"] = rows
        worst = max(rows, key=lambda r: r["ratio"])
        worst_c = max(rows, key=lambda r: r["call_ratio"])
        print(f"first-step sweep 1..{args.first_step_sweep} (same shapes twice): worst slowest step first / second "
              f"call = {worst['ratio']:.2f} at batch {worst['batch']} ({worst['first_max_step_ms']:.1f} / "
              f"{worst['second_max_step_ms']:.1f} ms), over 2x: {[r['batch'] for r in rows if r['ratio'] > 2]}; "
              f"worst call wall ratio {worst_c['call_ratio']:.2f} at batch {worst_c['batch']}")
        print("  " + ", ".join(f"b{r['batch']}:{r['ratio']:.2f}" for r in rows))
        report_compiles("in the first-step sweep")
    requests = workload(args.num_prompts, args.input_len, args.output_len, 0.0, vocab, 0)
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for _, n in requests]
    llm.generate([p for p, _ in requests[:8]], params[:8], use_tqdm=False)
    runs = {}
    for name in ("plain", "timed"):
        requests = workload(args.num_prompts, args.input_len, args.output_len, 0.0, vocab, 1 + len(runs))
        log.clear()
        engine.step_timings = [] if name == "timed" and cuda else None
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        outs = llm.generate([p for p, _ in requests], params, use_tqdm=False)
        elapsed = time.perf_counter() - t
        out_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        runs[name] = {"elapsed_s": elapsed, "output_tok_s": out_tokens / elapsed, "steps": len(log),
                      "by_kind": summarize(log)}
        print(f"\n{name} run: {elapsed:.2f} s, {out_tokens / elapsed:.0f} output tok/s, {len(log)} steps, "
              f"max running {max(e['running'] for e in log)}")
        print_table(runs[name]["by_kind"])
        slow = sorted(log, key=lambda e: -e["wall_ms"])[:5]
        print("slowest: " + "; ".join(f"{e['wall_ms']:.0f} ms ({e['kind']}, rows {e['rows']}, tokens {e['tokens']})"
                                      for e in slow))
        runs[name]["steps_log"] = log[:]
        report_compiles(f"in the {name} run")
        engine.step_timings = None
    result["runs"] = runs
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        requests = workload(args.num_prompts, args.input_len, args.output_len, 0.0, vocab, 9)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            t = time.perf_counter()
            llm.generate([p for p, _ in requests], params, use_tqdm=False)
            torch.cuda.synchronize()
            wall = time.perf_counter() - t
        events = [e for e in prof.key_averages() if e.device_time_total > 0]
        total = sum(e.self_device_time_total for e in events) / 1e6
        print(f"\nprofiled run: wall {wall:.2f} s, GPU kernel time {total:.2f} s")
        top = sorted(events, key=lambda e: -e.self_device_time_total)[:25]
        result["profile_top"] = [{"name": e.key[:100], "ms": e.self_device_time_total / 1e3, "count": e.count}
                                 for e in top]
        for e in top:
            print(f"  {e.self_device_time_total / 1e3:9.1f} ms {e.count:7d}x  {e.key[:90]}")
    if args.profile_schedule:
        requests = workload(args.num_prompts, args.input_len, args.output_len, 0.0, vocab, 10)
        result["profile_schedule"] = profile_schedule(llm, requests, params)
    if args.sync_debug:
        result["sync_debug"] = sync_debug(llm, args.sync_debug, args.input_len, vocab)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)


if __name__ == "__main__":
    main()
