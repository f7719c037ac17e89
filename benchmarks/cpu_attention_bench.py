"""The CPU path's paged attention (kernels/attention/cpu.py, torch's fused SDPA) against the
reference it replaced (paged_attention_ref) and against itself as it gathered K/V before session
34 (advanced indexing, `k_cache[slots]`, ~4x slower than `index_select` on one core), on one
thread: the op alone at the 30M model's head layout, then through `LLM.generate` with the 30M
model (`model_configs.qwen3_5_30m_cpu`, fp32 dummy weights), then one replica's chat turns
(`chat_replica_bench.run_conversations`, `--chat-reps`); the variants alternate in one process
(the machine's speed drifts).

    python -m hybrid_serve.benchmarks.cpu_attention_bench [--reps 3] [--chat-reps 2]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time

import torch

from .provenance import cpu_device, git_commit


def paged_attention_cpu_advanced_index(*args):
    """The baseline: `paged_attention_cpu` with each request's K/V gathered as before session 34
    (advanced indexing, `cache[slots]`), by swapping the kernel module's one gather."""
    from hybrid_serve.kernels.attention import cpu

    gather = cpu.gather_kv_rows
    cpu.gather_kv_rows = lambda cache, kv_slots: cache[kv_slots]
    try:
        return cpu.paged_attention_cpu(*args)
    finally:
        cpu.gather_kv_rows = gather


def op_rows() -> list[dict]:
    from hybrid_serve.kernels.attention import paged_attention_cpu, paged_attention_ref

    torch.manual_seed(0)
    heads, kv_heads, dim = 8, 2, 64
    rows = []
    for new, context, batch in [(1, 1400, 4), (1, 2560, 8), (256, 1300, 1), (256, 2560, 1)]:
        slots = batch * context + 16
        k_cache, v_cache = torch.randn(slots, kv_heads, dim), torch.randn(slots, kv_heads, dim)
        req_to_token = torch.zeros(batch + 1, 4096, dtype=torch.int32)
        for b in range(batch):
            req_to_token[b + 1, :context] = torch.randperm(slots - 1)[:context] + 1
        q = torch.randn(batch * new, heads, dim)
        args = (q, k_cache, v_cache, req_to_token, list(range(1, batch + 1)), [context - new] * batch, [new] * batch,
                dim ** -0.5)
        row = {"new_tokens_a_row": new, "context_tokens": context, "rows": batch,
               "max_abs_diff": float((paged_attention_cpu(*args) - paged_attention_ref(*args)).abs().max())}
        slots_b = req_to_token[1, :context].long()  # one request's K gather alone, both ways
        for name, fn in (("cpu_ms", paged_attention_cpu), ("cpu_advanced_index_ms", paged_attention_cpu_advanced_index),
                         ("ref_ms", paged_attention_ref),
                         ("gather_index_select_us", lambda *_: k_cache.index_select(0, slots_b)),
                         ("gather_advanced_index_us", lambda *_: k_cache[slots_b])):
            fn(*args)
            start = time.perf_counter()
            for _ in range(20):
                fn(*args)
            unit = 1e6 if name.endswith("_us") else 1e3
            row[name] = round(unit * (time.perf_counter() - start) / 20, 2)
        print(row, flush=True)
        rows.append(row)
    return rows


def engine_rows(reps: int) -> dict:
    import hybrid_serve.kernels.attention as attention
    from hybrid_serve import LLM, SamplingParams

    from .model_configs import write_model_dir
    from .synthetic_tokenizer import write_tokenizer

    fns = {"cpu": attention.paged_attention_cpu, "cpu_advanced_index": paged_attention_cpu_advanced_index,
           "ref": attention.paged_attention_ref}
    tmp = tempfile.mkdtemp()
    llm = LLM(model=write_model_dir("qwen3_5_30m_cpu", tmp), load_format="dummy", dtype="float32",
              tokenizer=write_tokenizer(os.path.join(tmp, "tok"), 4096), max_model_len=4096, max_num_seqs=8)
    rng = random.Random(0)
    system = [rng.randrange(10, 4000) for _ in range(1024)]

    def tokens(n):
        return [rng.randrange(10, 4000) for _ in range(n)]

    llm.generate([{"prompt_token_ids": system + tokens(256)}], SamplingParams(max_tokens=4, temperature=0))
    times = {name: {"prompt": [], "decode": []} for name in fns}
    try:
        for _ in range(reps):
            for name, fn in fns.items():
                attention.paged_attention_cpu = fn  # (models/layers/ops.py looks it up at each call)
                start = time.perf_counter()
                llm.generate([{"prompt_token_ids": system + tokens(384)}], SamplingParams(max_tokens=1, temperature=0))
                times[name]["prompt"].append(time.perf_counter() - start)
                prompts = [{"prompt_token_ids": system + tokens(400)} for _ in range(4)]
                llm.generate(prompts, SamplingParams(max_tokens=1, temperature=0))  # (cached for the decode run)
                start = time.perf_counter()
                llm.generate(prompts, SamplingParams(max_tokens=33, temperature=0, ignore_eos=True))
                times[name]["decode"].append((time.perf_counter() - start) / 32)
    finally:
        attention.paged_attention_cpu = fns["cpu"]
    out = {name: {"prompt_384_after_1024_cached_ms": round(1e3 * statistics.median(t["prompt"]), 1),
                  "decode_batch4_ms_per_step": round(1e3 * statistics.median(t["decode"]), 1)}
           for name, t in times.items()}
    print(out, flush=True)
    return out


def chat_rows(reps: int) -> list[dict]:
    """One replica's chat turns (8 conversations x 5 turns, seed 0, 128 MiB) with the gather
    before and after session 34, alternating."""
    import hybrid_serve.kernels.attention as attention
    from hybrid_serve import LLM

    from .chat_replica_bench import run_conversations
    from .model_configs import write_model_dir
    from .synthetic_tokenizer import write_tokenizer

    fns = {"cpu": attention.paged_attention_cpu, "cpu_advanced_index": paged_attention_cpu_advanced_index}
    tmp = tempfile.mkdtemp()
    model, tokenizer = write_model_dir("qwen3_5_30m_cpu", tmp), write_tokenizer(os.path.join(tmp, "tok"), 4096)
    rows = []
    try:
        for rep in range(reps):
            for name, fn in fns.items():
                attention.paged_attention_cpu = fn
                llm = LLM(model=model, load_format="dummy", dtype="float32", tokenizer=tokenizer, max_model_len=4096,
                          max_num_seqs=8, cache_memory_bytes=128 << 20)
                rows.append({"attention": name, "rep": rep, **run_conversations(llm, seed=0)})
                print(rows[-1], flush=True)
                del llm
    finally:
        attention.paged_attention_cpu = fns["cpu"]
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--chat-reps", type=int, default=2, help="alternations of the chat workload (0: none)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "cpu_attention.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    result = {"metric": "CPU paged attention: fused SDPA (cpu) against the reference (ref), one thread",
              "date": time.strftime("%Y-%m-%d"),
              "commit": git_commit(),
              "device": cpu_device(torch_threads=1),
              "workload": "op: 8 query heads, 2 KV heads, head dim 64, scattered KV slots, 20 calls; engine: 30M model "
                          "fp32, a 384-token prompt after a 1,024-token cached prefix (TTFT through LLM.generate) and "
                          "32 decode steps of 4 rows at ~1.4k context; medians of --reps alternations; chat: "
                          "chat_replica_bench.run_conversations (8 conversations x 5 turns, 1,024-token system prompt, "
                          "256-token turns, 128-token replies, think 2-4 s, seed 0), --chat-reps alternations",
              "baseline": "paged_attention_ref (the reference the CPU path ran before session 32) and "
                          "paged_attention_cpu_advanced_index (the CPU path before session 34), same process",
              "op": op_rows(), "engine": engine_rows(args.reps),
              "chat": chat_rows(args.chat_reps) if args.chat_reps else []}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
