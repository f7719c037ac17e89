"""Offline throughput in the style of vLLM's benchmark_throughput: N requests submitted at
once to the public `LLM` API, fixed or random input / output lengths from a seed; output and
total tokens per second, TTFT and TPOT percentiles from the engine's own timestamps
(`RequestOutput.metrics`), and transformers' `generate` on the same workload in the same run
(with fla when importable, and without) as the baseline, run first in their own processes.
`--step-log` adds every step's wall time and the Triton kernels compiled while serving.

    python benchmarks/throughput.py [--model qwen3_5_2p3b] [--num-prompts 256] [--input-len 512]
        [--output-len 128] [--range-ratio 0.0] [--seed 0] [--baseline fla,torch|none]
        [--engine-args '{"max_num_seqs": 64}'] [--json OUT.json]

On CPU (`--device cpu`, the demo model with `--model demo`) it runs the same code on a
tiny workload: a smoke test of the script, not a figure.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))


def workload(num: int, input_len: int, output_len: int, ratio: float, vocab: int, seed: int):
    """(prompt token ids, output length) per request: lengths uniform in [len*(1-r), len*(1+r)]."""
    rng = random.Random(seed)
    span = lambda n: max(1, rng.randint(int(n * (1 - ratio)), int(n * (1 + ratio))))  # noqa: E731
    return [([rng.randrange(10, vocab) for _ in range(span(input_len))], span(output_len)) for _ in range(num)]


def percentiles(values: list[float]) -> dict:
    values = sorted(values)
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))] * 1e3  # noqa: E731
    return {"p50_ms": pick(0.5), "p90_ms": pick(0.9), "p99_ms": pick(0.99), "mean_ms": statistics.mean(values) * 1e3}


def watch_compiles(log: list):
    """Record every Triton kernel compiled (or loaded from the disk cache) in this process
    from now on: (kernel, specialization) in `log`. Returns a function that stops it."""
    try:
        from triton import knobs
    except ImportError:
        return lambda: None

    def hook(**kwargs):
        try:
            text = str(kwargs.get("repr", ""))
            log.append((time.perf_counter(), f"{getattr(kwargs.get('fn'), 'name', '?')}: {text[text.find('('):][:300]}"))
        except Exception:  # never let the log break a launch
            pass
        return False

    previous, knobs.runtime.jit_cache_hook = knobs.runtime.jit_cache_hook, hook
    return lambda: setattr(knobs.runtime, "jit_cache_hook", previous)


def run_ours(model_dir: str | None, device: str, requests, engine_args: dict, step_log: bool = False) -> dict:
    from hybrid_serve import LLM, SamplingParams

    kwargs = dict(device=device, **engine_args)
    if model_dir is not None:
        kwargs.update(model=model_dir, dtype="bfloat16" if device == "cuda" else "float32", load_format="dummy")
    llm = LLM(**kwargs)
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for _, n in requests]
    warm = min(8, len(requests))
    llm.generate([p for p, _ in requests[:warm]], params[:warm])  # compile / warm the shapes
    engine, steps, compiles = llm.engine, [], []
    stop_watch = watch_compiles(compiles) if step_log else (lambda: None)
    if step_log and engine is not None:  # wall time of every engine step and what it carried
        real_step = engine.step

        def timed_step():
            t = time.perf_counter()
            scheduler = engine.scheduler
            running, waiting = len(scheduler.running), len(scheduler.waiting)
            out = real_step()
            steps.append((time.perf_counter() - t, running, waiting))
            return out

        engine.step = timed_step
    start = time.perf_counter()
    outs = llm.generate([p for p, _ in requests], params)
    elapsed = time.perf_counter() - start
    stop_watch()
    if step_log:
        print(f"{len(compiles)} Triton kernels compiled while serving"
              + "".join(f"\n  +{t - start:.2f} s {what}" for t, what in compiles[:20]))
    if steps:
        walls = sorted(s[0] for s in steps)
        print(f"{len(steps)} steps: median {walls[len(walls) // 2] * 1e3:.1f} ms, sum {sum(walls):.2f} s; slowest:",
              ", ".join(f"{w * 1e3:.0f} ms (running {r}, waiting {q})" for w, r, q in sorted(steps)[-6:]))
    out_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    in_tokens = sum(len(p) for p, _ in requests)
    ttft = [o.metrics.first_token_time - o.metrics.arrival_time for o in outs]
    tpot = [(o.metrics.finished_time - o.metrics.first_token_time) / (len(o.outputs[0].token_ids) - 1)
            for o in outs if len(o.outputs[0].token_ids) > 1]
    cfg = llm.config
    del llm, engine, outs
    import gc

    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()  # the baselines run in other processes on the same card
    extra = {"compiled_while_serving": [w for _, w in compiles], "steps": len(steps),
             "median_step_ms": sorted(s[0] for s in steps)[len(steps) // 2] * 1e3,
             "slowest_steps_ms": [round(s[0] * 1e3, 1) for s in sorted(steps)[-6:]]} if step_log and steps else {}
    return {"elapsed_s": elapsed, "output_tok_s": out_tokens / elapsed, "total_tok_s": (in_tokens + out_tokens) / elapsed,
            "requests_s": len(requests) / elapsed, "ttft": percentiles(ttft), "tpot": percentiles(tpot), **extra,
            "config": {k: getattr(cfg, k) for k in ("max_num_seqs", "max_num_batched_tokens", "chunked_prefill_size",
                                                    "enable_prefix_caching", "async_scheduling")}}


def run_transformers(model_name: str, requests, use_fla: bool, batch: int, timeout: float = 1500) -> dict:
    """transformers' generate on the same requests (random bf16 weights), `batch` at a time,
    left-padded, greedy, in a fresh process (fla importable or not there)."""
    path = tempfile.mktemp(suffix=".json")
    with open(path, "w") as f:
        json.dump(requests, f)
    code = f"""
import sys, time, json, torch
if not {use_fla}:
    sys.modules["fla"] = None
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
from model_configs import CONFIGS
from transformers import AutoModelForCausalLM
cfg = CONFIGS[{model_name!r}]()
torch.manual_seed(0)
with torch.device("cuda"):
    m = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
m.generation_config.eos_token_id = None; m.generation_config.pad_token_id = 0
reqs = json.load(open({path!r}))
torch.cuda.synchronize(); start = time.perf_counter(); out_tokens = 0
for i in range(0, len(reqs), {batch}):
    part = reqs[i:i + {batch}]
    width = max(len(p) for p, _ in part)
    ids = torch.tensor([[0] * (width - len(p)) + p for p, _ in part], device="cuda")
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in part], device="cuda")
    new = max(n for _, n in part)
    with torch.no_grad():
        m.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    out_tokens += sum(n for _, n in part)
torch.cuda.synchronize(); elapsed = time.perf_counter() - start
print("RESULT", json.dumps({{"elapsed_s": elapsed, "output_tok_s": out_tokens / elapsed, "batch": {batch}}}))
"""
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    finally:
        os.unlink(path)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": proc.stderr[-2000:]}


def run_async(model_dir: str | None, device: str, requests, engine_args: dict, engine_process: bool,
              arrival_spread_s: float = 0.0) -> dict:
    """The same requests through `AsyncLLMEngine`, as a served replica drives it (the engine in
    an engine process of its own, or on a thread of this one), all submitted at once from one
    event loop, each read delta by delta as the replica streams it: the engine's front end
    without Ray Serve or HTTP. TTFT and TPOT from this process's clock at each delta.
    `arrival_spread_s`: request i is submitted i / N of that many seconds after the first (as an
    HTTP burst reaches the replica over a few hundred ms), each TTFT from its own submission."""
    import asyncio

    from hybrid_serve import SamplingParams
    from hybrid_serve.engine.async_engine import AsyncLLMEngine
    from hybrid_serve.engine.config import EngineConfig

    kwargs = dict(device=device, **engine_args)
    if model_dir is not None:
        kwargs.update(model=model_dir, dtype="bfloat16" if device == "cuda" else "float32", load_format="dummy")
    else:
        from hybrid_serve.demo import DEMO_DIR

        kwargs.update(model=DEMO_DIR)
    engine = AsyncLLMEngine.from_config(EngineConfig(**kwargs), model_name="bench", replica="r0",
                                        engine_process=engine_process)

    async def one(request_id: str, ids: list[int], n: int, delay_s: float = 0.0) -> tuple[float, float, float, int]:
        if delay_s:
            await asyncio.sleep(delay_s)
        sent, first, tokens = time.perf_counter(), None, 0
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        async for delta in engine.generate(ids, params, request_id):
            got = sum(len(s.token_ids) for s in delta.seqs)
            if got and first is None:
                first = time.perf_counter()
            tokens += got
        return sent, first, time.perf_counter(), tokens

    async def run_all(tag: str, reqs, spread_s: float) -> tuple[float, list]:
        start = time.perf_counter()
        done = await asyncio.gather(*(one(f"{tag}-{i}", ids, n, spread_s * i / len(reqs))
                                      for i, (ids, n) in enumerate(reqs)))
        return time.perf_counter() - start, done

    async def warm_then_measure():
        await run_all("warm", requests[:min(8, len(requests))], 0.0)  # compile / warm the shapes
        return await run_all("run", requests, arrival_spread_s)

    try:
        elapsed, done = asyncio.run(warm_then_measure())
    finally:
        engine.shutdown()
    out_tokens = sum(d[3] for d in done)
    in_tokens = sum(len(p) for p, _ in requests)
    ttft = [first - sent for sent, first, _, _ in done]
    tpot = [(end - first) / (n - 1) for _, first, end, n in done if n > 1]
    if device == "cuda":
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()
    return {"api": "async_process" if engine_process else "async_thread", "arrival_spread_s": arrival_spread_s,
            "elapsed_s": elapsed,
            "output_tok_s": out_tokens / elapsed, "total_tok_s": (in_tokens + out_tokens) / elapsed,
            "requests_s": len(requests) / elapsed, "ttft": percentiles(ttft), "tpot": percentiles(tpot)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen3_5_2p3b", help="a benchmarks/model_configs.py name, or 'demo'")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--num-prompts", type=int, default=256)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--range-ratio", type=float, default=0.0, help="lengths uniform in len*(1 +- ratio)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--baseline", default="fla,torch", help="transformers baselines: fla, torch, or none")
    ap.add_argument("--baseline-batch", type=int, default=64, help="requests per transformers generate call")
    ap.add_argument("--baseline-timeout", type=float, default=1500, help="seconds for each baseline process")
    ap.add_argument("--engine-args", default="{}", help="JSON of extra LLM(...) arguments")
    ap.add_argument("--step-log", action="store_true", help="print per-step wall times (slowest steps)")
    ap.add_argument("--api", default="llm",
                    help="comma-separated: llm (LLM.generate), async_process (AsyncLLMEngine with an engine "
                         "process, as a served replica on CUDA), async_thread (its engine on a thread); "
                         "'async_process@0.5': submissions spread over 0.5 s; the first is 'ours', each other "
                         "one is reported beside it")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from model_configs import CONFIGS, write_model_dir

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = None if args.model == "demo" else write_model_dir(args.model, tmp)
        vocab = 4096 if args.model == "demo" else CONFIGS[args.model]().vocab_size
        requests = workload(args.num_prompts, args.input_len, args.output_len, args.range_ratio, vocab, args.seed)
        result = {"model": args.model, "device": args.device, "num_prompts": args.num_prompts,
                  "input_len": args.input_len, "output_len": args.output_len, "range_ratio": args.range_ratio,
                  "seed": args.seed}
        if args.device == "cuda":  # the baselines first, in their own processes: the card is all theirs
            import torch

            result["device"] = torch.cuda.get_device_name(0)
            for kind in [b for b in args.baseline.split(",") if b in ("fla", "torch")]:
                result[f"transformers_{kind}"] = run_transformers(args.model, requests, kind == "fla",
                                                                  args.baseline_batch, args.baseline_timeout)
        engine_args = json.loads(args.engine_args)
        for i, api in enumerate(args.api.split(",")):
            if api == "llm":
                row = run_ours(model_dir, args.device, requests, engine_args, args.step_log)
            elif api.split("@")[0] in ("async_process", "async_thread"):  # "async_process@0.5": arrivals over 0.5 s
                kind, _, spread = api.partition("@")
                row = run_async(model_dir, args.device, requests, engine_args, kind == "async_process",
                                float(spread or 0))
            else:
                raise SystemExit(f"--api: unknown front end {api!r} (llm, async_process, async_thread)")
            result["ours" if i == 0 else api] = row
            if i:
                print(f"{api}: {row['elapsed_s']:.2f} s, output {row['output_tok_s']:.0f} tok/s "
                      f"({row['output_tok_s'] / result['ours']['output_tok_s']:.3f} of the first), "
                      f"TTFT p50 {row['ttft']['p50_ms']:.0f} ms, TPOT p50 {row['tpot']['p50_ms']:.2f} ms")
    o = result["ours"]
    print(f"{args.num_prompts} requests, {args.input_len} in / {args.output_len} out: {o['elapsed_s']:.2f} s, "
          f"output {o['output_tok_s']:.0f} tok/s, total {o['total_tok_s']:.0f} tok/s, "
          f"TTFT p50 {o['ttft']['p50_ms']:.0f} ms p99 {o['ttft']['p99_ms']:.0f} ms, "
          f"TPOT p50 {o['tpot']['p50_ms']:.2f} ms p99 {o['tpot']['p99_ms']:.2f} ms")
    for kind in ("fla", "torch"):
        base = result.get(f"transformers_{kind}")
        if base and "error" not in base:
            print(f"transformers ({kind}, batches of {base['batch']}): output {base['output_tok_s']:.0f} tok/s "
                  f"-> ours {o['output_tok_s'] / base['output_tok_s']:.1f}x")
        elif base:
            print(f"transformers ({kind}) failed: {base['error'][-600:]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
