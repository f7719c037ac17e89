"""Time to first token of one long prompt through the public `LLM` API on one GPU, against
transformers' own forward (with fla's kernels when importable, and without) in the same run,
and the measured bf16 matmul rate.

    python benchmarks/prefill_bench.py [--model qwen3_5_2p3b] [--lengths 1024,8192,32768]
                                       [--baseline fla,torch] [--json OUT.json]

The model: a `benchmarks/model_configs.py` config with dummy bf16 weights. TTFT = wall time
of `llm.generate([prompt], max_tokens=1)` (prompts of random token ids, a different one per
run, so the prefix cache never hits), median of 3 after a warm-up of the same length. The
matmul fraction = (linear + attention FLOPs of the prompt) / TTFT / measured matmul rate,
where linear FLOPs = 2 x tokens x linear weights (embeddings and LM head excluded) and
causal attention FLOPs = 2 x tokens^2 x q heads x head dim per attention layer.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from model_configs import CONFIGS, write_model_dir  # noqa: E402


def matmul_tflops() -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return 2 * 8192**3 / statistics.median(times) / 1e9


def prompt_flops(model, hf_config, tokens: int) -> float:
    """Linear + causal attention FLOPs of a prefill of `tokens` tokens (see the module docstring)."""
    linear = sum(p.numel() for n, p in model.named_parameters()
                 if p.dim() >= 2 and "embed" not in n and "lm_head" not in n and "conv" not in n)
    attn_layers = model.layer_ids.num_attn_layers
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    return 2.0 * tokens * linear + attn_layers * 2.0 * tokens**2 * hf_config.num_attention_heads * head_dim


def ttft_ms(llm, length: int, vocab: int, runs: int = 3, seed: int = 0) -> list[float]:
    from hybrid_serve import SamplingParams

    gen = torch.Generator().manual_seed(seed)
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    out = []
    for _ in range(runs + 1):  # the first is the warm-up
        prompt = torch.randint(10, vocab, (length,), generator=gen).tolist()
        torch.cuda.synchronize()
        t = time.perf_counter()
        llm.generate([prompt], params)
        out.append((time.perf_counter() - t) * 1e3)
    return out[1:]


def ours(model_dir: str, lengths: list[int], engine_args: dict) -> dict:
    from hybrid_serve import LLM

    engine_args = {"max_model_len": max(lengths) + 16, **engine_args}  # the 32k prompt and its token
    llm = LLM(model=model_dir, device="cuda", dtype="bfloat16", load_format="dummy", **engine_args)
    cfg = llm.engine.hf_config
    res = {"engine_args": engine_args, "config": {k: getattr(llm.engine.config, k) for k in (
        "max_num_batched_tokens", "chunked_prefill_size", "max_num_seqs", "enable_prefix_caching")}}
    for n in lengths:
        times = ttft_ms(llm, n, cfg.vocab_size)
        res[n] = {"ttft_ms": statistics.median(times), "runs_ms": times,
                  "flops": prompt_flops(llm.engine.model, cfg, n)}
    del llm
    torch.cuda.empty_cache()
    return res


def profile_ttft(model_dir: str, lengths: list[int], engine_args: dict, top: int = 18) -> None:
    """Where one prompt's TTFT goes: wall vs GPU kernel time, the top kernels (torch
    profiler), and the host's top functions (cProfile), per length."""
    import cProfile
    import pstats

    from torch.profiler import ProfilerActivity, profile

    from hybrid_serve import LLM, SamplingParams

    engine_args = {"max_model_len": max(lengths) + 16, **engine_args}
    llm = LLM(model=model_dir, device="cuda", dtype="bfloat16", load_format="dummy", **engine_args)
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    gen = torch.Generator().manual_seed(1)
    for n in lengths:
        vocab = llm.engine.hf_config.vocab_size
        llm.generate([torch.randint(10, vocab, (n,), generator=gen).tolist()], params)  # warm-up
        prompt = torch.randint(10, vocab, (n,), generator=gen).tolist()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t = time.perf_counter()
            llm.generate([prompt], params)
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t) * 1e3
        events = [e for e in prof.key_averages() if e.self_device_time_total > 0]
        gpu = sum(e.self_device_time_total for e in events) / 1e3
        print(f"[profile {n} tokens] wall {wall:.1f} ms (under the profiler), GPU kernels {gpu:.1f} ms")
        for e in sorted(events, key=lambda e: -e.self_device_time_total)[:top]:
            print(f"   {e.self_device_time_total / 1e3:8.2f} ms  x{e.count:<5d} {e.key[:95]}")
        prompt = torch.randint(10, vocab, (n,), generator=gen).tolist()
        torch.cuda.synchronize()
        host = cProfile.Profile()
        host.enable()
        llm.generate([prompt], params)
        torch.cuda.synchronize()
        host.disable()
        stats = pstats.Stats(host)
        stats.sort_stats("tottime").print_stats(top)


def transformers_forward(model_name: str, lengths: list[int], use_fla: bool) -> dict:
    """transformers' forward of the same config (random bf16 weights), in a fresh process so
    that fla is importable or not there."""
    code = f"""
import sys, time, statistics, json, torch
if not {use_fla}:
    sys.modules["fla"] = None
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
from model_configs import CONFIGS
from transformers import AutoModelForCausalLM
cfg = CONFIGS[{model_name!r}]()
torch.manual_seed(0)
with torch.device("cuda"):
    m = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
out = {{}}
for n in {lengths!r}:
    times = []
    for r in range(4):
        ids = torch.randint(10, cfg.vocab_size, (1, n), device="cuda")
        torch.cuda.synchronize(); t = time.perf_counter()
        with torch.no_grad():
            m(ids, logits_to_keep=1)
        torch.cuda.synchronize(); times.append((time.perf_counter() - t) * 1e3)
    out[n] = {{"ttft_ms": statistics.median(times[1:]), "runs_ms": times[1:]}}
print("RESULT", json.dumps(out))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return {int(k): v for k, v in json.loads(line[7:]).items()}
    return {"error": proc.stderr[-2000:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="qwen3_5_2p3b", choices=sorted(CONFIGS))
    ap.add_argument("--lengths", default="1024,8192,32768")
    ap.add_argument("--baseline", default="fla,torch", help="transformers baselines: fla, torch, or none")
    ap.add_argument("--engine-args", default="{}", help="JSON of extra LLM(...) arguments")
    ap.add_argument("--cache-compare", type=int, default=1, help="also time 8k with the prefix cache off")
    ap.add_argument("--profile", default=None, help="comma-separated lengths: profile them instead of the table")
    ap.add_argument("--profile-top", type=int, default=18, help="kernels and host functions listed per profile")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    if args.profile:
        with tempfile.TemporaryDirectory() as tmp:
            profile_ttft(write_model_dir(args.model, tmp), [int(x) for x in args.profile.split(",")],
                         json.loads(args.engine_args), top=args.profile_top)
        return
    device = torch.cuda.get_device_name(0)
    rate = matmul_tflops()
    print(f"{device}: bf16 matmul {rate:.0f} TFLOP/s", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir(args.model, tmp)
        result = {"device": device, "model": args.model, "matmul_tflops": rate,
                  "ours": ours(model_dir, lengths, json.loads(args.engine_args))}
        if args.cache_compare and 8192 in lengths:
            result["ours_cache_off"] = ours(model_dir, [8192], {**json.loads(args.engine_args),
                                                                "enable_prefix_caching": False})
    for kind in [b for b in args.baseline.split(",") if b in ("fla", "torch")]:
        result[f"transformers_{kind}"] = transformers_forward(args.model, lengths, use_fla=kind == "fla")
    print(f"{'tokens':>7s} {'ours ms':>9s} {'TFLOP/s':>8s} {'% matmul':>9s} {'tf+fla ms':>10s} {'vs fla':>7s} "
          f"{'tf ms':>8s} {'vs tf':>6s}")
    for n in lengths:
        o = result["ours"][n]
        tflops = o["flops"] / o["ttft_ms"] / 1e9
        fla = result.get("transformers_fla", {}).get(n, {}).get("ttft_ms", float("nan"))
        tf = result.get("transformers_torch", {}).get(n, {}).get("ttft_ms", float("nan"))
        print(f"{n:7d} {o['ttft_ms']:9.1f} {tflops:8.0f} {100 * tflops / rate:8.1f}% {fla:10.1f} "
              f"{fla / o['ttft_ms']:6.2f}x {tf:8.1f} {tf / o['ttft_ms']:5.2f}x")
    if "ours_cache_off" in result:
        print(f"8k prefix cache on {result['ours'][8192]['ttft_ms']:.1f} ms, off "
              f"{result['ours_cache_off'][8192]['ttft_ms']:.1f} ms")
    for key in ("transformers_fla", "transformers_torch"):
        if "error" in result.get(key, {}):
            print(key, "failed:", result[key]["error"][-800:])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
