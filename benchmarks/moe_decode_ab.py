"""MoE decode at small batch (issues 12 and 18): decode step time of a MoE model slice against
its bytes-moved roofline, with fused_moe's one-row tiles on and off in the same run
(HYBRID_SERVE_MOE_ONE_ROW_TILES: the tile layout is chosen when the decode graphs are captured,
so each setting gets its own engine). Default: the 12-layer slice of Qwen3-Next-80B-A3B (512
experts, top-10), dummy bf16 weights, one GPU.

    python benchmarks/moe_decode_ab.py [--model qwen3_next_80b_12l] [--batches 1,4,16] [--profile]
    python benchmarks/moe_decode_ab.py --ab pdl --repeats 2   # one-row tiles, HYBRID_SERVE_PDL 0 / 1
    python benchmarks/moe_decode_ab.py --ab add_norm          # HYBRID_SERVE_FUSE_ADD_NORM default / 0

`--ab pdl` compares programmatic dependent launch off and on (kernels/_launch.py), both with
one-row tiles, in alternating processes' engines (off, on, off, on, ...); the table gives each
setting's median over its repeats. `--ab add_norm` compares a decoder layer's residual add and
norm inside the next projection's launch (models/layers/ops.py's PendingAddNorm) against their
own launch.

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
    if not num_experts:  # a dense model
        return acct["weight_bytes_step_b1"]
    distinct = num_experts * (1 - (1 - top_k / num_experts) ** batch)
    expert_frac = distinct / num_experts
    other = acct["weight_bytes_step_b1"] - acct["expert_bytes_active_b1"]
    return other + acct["expert_bytes_total"] * expert_frac


AB_SETTINGS = {  # --ab: the two settings compared, (label, environment) each
    "one_row": (("1", {"HYBRID_SERVE_MOE_ONE_ROW_TILES": "1"}), ("0", {"HYBRID_SERVE_MOE_ONE_ROW_TILES": "0"})),
    "pdl": (("pdl0", {"HYBRID_SERVE_MOE_ONE_ROW_TILES": "1", "HYBRID_SERVE_PDL": "0"}),
            ("pdl1", {"HYBRID_SERVE_MOE_ONE_ROW_TILES": "1", "HYBRID_SERVE_PDL": "1"})),
    "add_norm": (("default", {}), ("separate", {"HYBRID_SERVE_FUSE_ADD_NORM": "0"})),
    "add_norm_kinds": (("all", {"HYBRID_SERVE_FUSE_ADD_NORM": "1"}), ("none", {"HYBRID_SERVE_FUSE_ADD_NORM": "0"}),
                       ("gdn", {"HYBRID_SERVE_FUSE_ADD_NORM": "gdn"}),
                       ("attn_mlp_moe", {"HYBRID_SERVE_FUSE_ADD_NORM": "attention,mlp,moe"})),
    "none": (("default", {}),),  # one engine per repeat with every setting at its default (tree A/B runs)
}


def run(model_dir: str, env: dict, batches: list[int], steps: int, profile: bool, unset: set = frozenset()) -> dict:
    for key in unset:
        os.environ.pop(key, None)  # the other settings' variables: back to the defaults
    os.environ.update(env)  # read when the decode graphs are captured
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
    ap.add_argument("--ab", choices=sorted(AB_SETTINGS), default="one_row")
    ap.add_argument("--repeats", type=int, default=1, help="engines per setting, alternating")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    bw = copy_bandwidth()
    device = torch.cuda.get_device_name(0)
    print(f"{device}: copy rate {bw / 1e12:.3f} TB/s", flush=True)
    settings = AB_SETTINGS[args.ab]
    result = {"metric": f"moe_decode_{args.ab}_ab", "device": device, "model": args.model,
              "copy_rate_TBps": bw / 1e12, "settings": dict(settings), "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir(args.model, tmp)
        for repeat in range(args.repeats):
            for label, env in settings:
                unset = {k for _, e in settings for k in e}
                result["runs"].setdefault(label, []).append(run(model_dir, env, batches, args.steps, args.profile,
                                                                unset))
                print(f"{label} #{repeat}: {result['runs'][label][-1]['step_ms']}", flush=True)
    labels = [label for label, _ in settings]
    acct = result["runs"][labels[0]][0]["accounting"]
    hf = CONFIGS[args.model]()
    print(f"{'batch':>5} " + " ".join(f"{label + ' ms':>11}" for label in labels) + f" {'roofline ms':>12} fraction")
    for b in batches:
        floor = step_bytes(acct, getattr(hf, "num_experts_per_tok", 0), getattr(hf, "num_experts", 0), b) / bw * 1e3
        row = {"batch": b, "roofline_ms": floor}
        for label in labels:
            row[f"{label}_ms"] = statistics.median(r["step_ms"][b] for r in result["runs"][label])
            row[f"fraction_{label}"] = floor / row[f"{label}_ms"]
        result.setdefault("table", []).append(row)
        print(f"{b:>5} " + " ".join(f"{row[label + '_ms']:>11.3f}" for label in labels) + f" {floor:>12.3f} "
              + " / ".join(f"{row['fraction_' + label]:.1%}" for label in labels))
    out_dir = os.environ.get("OUT", "./bench_out")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"moe_decode_{args.ab}_ab_{args.model}.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)


if __name__ == "__main__":
    main()
