"""MoE decode at small batch (issues 12 and 18): decode step time of a MoE model slice against
its bytes-moved roofline, with fused_moe's one-row tiles on and off in the same run
(HYBRID_SERVE_MOE_ONE_ROW_TILES: the tile layout is chosen when the decode graphs are captured,
so each setting gets its own engine). Default: the 12-layer slice of Qwen3-Next-80B-A3B (512
experts, top-10), dummy bf16 weights, one GPU.

    python benchmarks/moe_decode_ab.py [--model qwen3_next_80b_12l] [--batches 1,4,16] [--profile]

Roofline: the bytes a step reads (family_gpu_check.weight_accounting: every weight but the
experts once, top_k / E of the experts at batch 1, the embedding's one row; at batch B the
experts of B tokens, at most all) over the copy rate measured in the same run. JSON in $OUT.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(__file__))
from decode_bench import copy_bandwidth, decode_step_times, profile_steps  # noqa: E402
from family_gpu_check import weight_accounting  # noqa: E402
from model_configs import CONFIGS, write_model_dir  # noqa: E402

from hybrid_serve import LLM  # noqa: E402


def step_bytes(acct: dict, top_k: int, num_experts: int, batch: int) -> float:
    """Bytes a decode step of `batch` rows reads: the expected distinct experts of batch x top_k
    uniform picks, the rest once."""
    distinct = num_experts * (1 - (1 - top_k / num_experts) ** batch)
    expert_frac = distinct / num_experts
    other = acct["weight_bytes_step_b1"] - acct["expert_bytes_active_b1"]
    return other + acct["expert_bytes_total"] * expert_frac


def run(model_dir: str, one_row: str, batches: list[int], steps: int, profile: bool) -> dict:
    os.environ["HYBRID_SERVE_MOE_ONE_ROW_TILES"] = one_row
    llm = LLM(model=model_dir, device="cuda", dtype="bfloat16", load_format="dummy", max_num_seqs=max(batches),
              max_num_batched_tokens=4096, chunked_prefill_size=2048, enable_prefix_caching=False,
              max_model_len=2048)
    out = {}
    for b in batches:
        times = decode_step_times(llm, b, 256, steps)
        out[b] = statistics.median(times[5:]) * 1e3
        if profile:
            profile_steps(llm.engine, b)
    acct = weight_accounting(llm.engine.model, llm.engine.hf_config)
    llm.shutdown()
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return {"step_ms": out, "accounting": acct}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen3_next_80b_12l")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    bw = copy_bandwidth()
    device = torch.cuda.get_device_name(0)
    print(f"{device}: copy rate {bw / 1e12:.3f} TB/s", flush=True)
    result = {"metric": "moe_decode_one_row_tiles_ab", "device": device, "model": args.model,
              "copy_rate_TBps": bw / 1e12, "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir(args.model, tmp)
        for one_row in ("1", "0"):
            result["runs"][one_row] = run(model_dir, one_row, batches, args.steps, args.profile)
    acct = result["runs"]["1"]["accounting"]
    hf = CONFIGS[args.model]()
    print(f"{'batch':>5} {'one-row ms':>11} {'grouped ms':>11} {'roofline ms':>12} {'fraction':>9}")
    for b in batches:
        floor = step_bytes(acct, hf.num_experts_per_tok, hf.num_experts, b) / bw * 1e3
        on, off = result["runs"]["1"]["step_ms"][b], result["runs"]["0"]["step_ms"][b]
        result.setdefault("table", []).append({"batch": b, "one_row_ms": on, "grouped_ms": off, "roofline_ms": floor,
                                               "fraction_one_row": floor / on})
        print(f"{b:>5} {on:>11.3f} {off:>11.3f} {floor:>12.3f} {floor / on:>9.1%}")
    out_dir = os.environ.get("OUT", "./bench_out")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"moe_decode_ab_{args.model}.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)


if __name__ == "__main__":
    main()
