"""Issue 17's GPU acceptance for every family we serve: decode and prefill through the public
`LLM` API on one GPU with the Triton path and CUDA graphs, greedy tokens with graphs on vs
off, prefill throughput of one 4096-token prompt, and the batch-1 decode step against its
bytes-moved roofline.

    python benchmarks/family_gpu_check.py [--families qwen3_5,bamba,...] [--json OUT.json]

Per family (each in its own process, so a CUDA fault stays with its family), on a real-size
config of `benchmarks/model_configs.py` with dummy bf16 weights (Qwen3.5-35B-A3B as a
12-layer slice with its 3:1 GDN:attention mix: the whole model does not fit one H100 twice):

  (a) 5 prompts of 100-2000 random tokens together, greedy, 32 tokens each (`ignore_eos`),
      with `enable_cuda_graphs=True` (decode steps replay the graph of 8 rows, 3 padding) and
      then in a second engine with `enable_cuda_graphs=False`: identical prompts / 5 and the
      fraction of tokens before the first difference; how many of the chosen tokens' logprobs
      are bit-equal (and the largest difference) before it; at a difference, both runs' top-2
      logprob gap there (a near-tie flipped by rounding vs a wrong result).
      `--prompt-lens` changes the prompts (8 prompts: no padding rows in the graph);
      `--match-only` runs (a) alone, without the warm-up.
  (b) TTFT of one 4096-token prompt (`generate(max_tokens=1)`, a fresh prompt per run, median
      of 3 after a warm-up; one 4096-token step), as prompt tok/s and as a fraction of the
      measured bf16 matmul rate (FLOPs: 2 x tokens x active linear weights, experts at
      top_k / E, embeddings / LM head / conv excluded, + causal attention).
  (c) the decode step at batch 1 (512-token prompt, median of 48 engine steps back to back, as
      `decode_bench.py` times them), and the GPU time of the size-1 graph's replay alone.

Roofline of a batch-1 decode step = bytes moved / measured copy rate (METHOD.md: a large
device-to-device copy, read + write), where bytes moved = the weights the step reads (every
parameter once; the input embedding table only as its one row unless it is the tied LM head;
of each MoE block's stacked experts only top_k of E) + the recurrent state read and written
(2 x one state slot: conv windows + SSM states) + the KV cache read at the mean context (and
the one token written). `decode_bench.py`'s older roofline counted the whole embedding table.

Dummy weights are drawn on the GPU here (`torch.randn` with a CUDA generator seeded per
tensor name, the loader's distribution and bf16 rounding), not on the CPU as
`models/loader.py` draws them: the CPU draws ~100M values/s, minutes per engine for these
sizes. Both engines of a family get the same weights.

Writes the table last and one JSON (--json, default $OUT/family_gpu_check.json).
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_configs import CONFIGS

# family -> (config in model_configs.py, layers kept or None for all, what the config is)
FAMILIES = {
    "qwen3_5": ("qwen3_5_2p3b", None, "Qwen3.5 layout 2.3B (24 layers, GDN:attn 3:1)"),
    "qwen3_next": ("qwen3_next_1b", None, "Qwen3-Next layout 1B (12 layers, GDN:attn 3:1, 64 experts top 8 + shared)"),
    "lfm2": ("lfm2_1b", None, "LFM2 1B class (16 layers, 6 attention)"),
    "nemotron_h": ("nemotron_h_1b", None, "Nemotron-H 1B class (16 layers: 8 Mamba2, 2 attention, 6 MLP)"),
    "qwen3_5_moe": ("qwen3_5_moe_35b_a3b", 12,
                    "Qwen3.5-35B-A3B shapes, 12 of 40 layers (9 GDN + 3 attention), 256 experts top 8 + shared"),
    "lfm2_moe": ("lfm2_moe_8b_a1b", None, "LFM2-8B-A1B class (24 layers, 6 attention, 2 dense, 32 experts top 4)"),
    "bamba": ("bamba_9b", None, "Bamba-9B class (32 layers, attention at 9/18/27)"),
    "granite_moe_hybrid": ("granite_4_0_h_tiny", None,
                           "Granite-4.0-H-Tiny class (40 layers, 4 attention nope, 64 experts top 6 + shared MLP)"),
    "falcon_h1": ("falcon_h1_0p5b", None, "Falcon-H1-0.5B class (36 layers, attention beside Mamba2)"),
}
PROMPT_LENS = (100, 300, 700, 1200, 2000)
GEN_TOKENS = 32
PREFILL_LEN = 4096
DECODE_PROMPT = 512
DECODE_STEPS = 48
H100_DATASHEET_BW = 3.35e12


def write_config(family: str, out_dir: str) -> str:
    name, layers, _ = FAMILIES[family]
    cfg = CONFIGS[name]()
    if layers is not None:  # a layer slice that keeps the family's layer mix
        cfg.num_hidden_layers = layers
        cfg.layer_types = cfg.layer_types[:layers]
    path = os.path.join(out_dir, family)
    cfg.save_pretrained(path)
    return path


def weight_accounting(model, hf_config) -> dict:
    """Bytes a batch-1 decode step reads, and the active linear parameters of a prefill token."""
    total = active = 0
    expert_total = expert_active = 0
    seen = set()
    moe_blocks = [m for m in model.modules() if hasattr(m, "experts") and hasattr(m, "top_k")]
    expert_params = {}
    for block in moe_blocks:
        num_experts = getattr(block.experts, "num_experts", None)
        for p in block.experts.parameters():
            expert_params[id(p)] = block.top_k / (num_experts or p.shape[0])
    from hybrid_serve.models.layers.vocab import VocabParallelEmbedding

    head = getattr(model, "lm_head", None)
    embs = [m for m in model.modules() if isinstance(m, VocabParallelEmbedding) and m is not head]
    emb_weight = embs[0].weight
    tied = head is not None and getattr(head, "weight", None) is emb_weight
    linear_active = 0.0  # parameters a prefill token multiplies (embeddings, LM head, conv excluded)
    for n, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        b = p.numel() * p.element_size()
        total += b
        frac = expert_params.get(id(p), 1.0)
        if id(p) in expert_params:
            expert_total += b
            expert_active += b * frac
        if p is emb_weight and not tied:
            active += p.shape[-1] * p.element_size()  # one row
        else:
            active += b * frac
        if p.dim() >= 2 and p is not emb_weight and "lm_head" not in n and "conv" not in n:
            linear_active += p.numel() * frac
    return {"weight_bytes_total": total, "weight_bytes_step_b1": int(active), "expert_bytes_total": expert_total,
            "expert_bytes_active_b1": int(expert_active), "tied_embeddings": bool(tied),
            "embedding_bytes": emb_weight.numel() * emb_weight.element_size(), "linear_params_active": linear_active,
            "params_total": sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())}


def run_prompts(llm, prompts, logprobs: int = 2) -> list[dict]:
    from hybrid_serve import SamplingParams

    params = SamplingParams(max_tokens=GEN_TOKENS, temperature=0.0, ignore_eos=True, logprobs=logprobs)
    outs = llm.generate(prompts, params)
    res = []
    for o in outs:
        c = o.outputs[0]
        gaps, chosen = [], []
        for tok, d in zip(c.token_ids, c.logprobs or []):
            top = sorted((lp.logprob for lp in d.values()), reverse=True)
            gaps.append(top[0] - top[1] if len(top) > 1 else None)
            chosen.append(d[tok].logprob if tok in d else None)
        res.append({"tokens": list(c.token_ids), "top2_gap": gaps, "logprob": chosen})
    return res


def decode_step_ms(llm, vocab: int) -> tuple[float, list[float], float]:
    """Median wall time of batch-1 decode steps back to back (ms), all steps, graph replay GPU ms."""
    from decode_bench import cuda_ms
    from hybrid_serve.engine.benchmarking import start_decode_batch

    engine = llm.engine
    ids = start_decode_batch(engine, 1, DECODE_PROMPT, DECODE_STEPS + 16, token_high=vocab, seed=1, prefix="dec-")
    times = []
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(DECODE_STEPS):
        engine.step()
        now = time.perf_counter()
        times.append((now - t) * 1e3)
        t = now
    graphs = engine.runner.decode_graphs
    replay = float("nan")
    if graphs is not None and 1 in getattr(graphs, "graphs", {}):
        replay = cuda_ms(graphs.graphs[1].replay)  # re-runs the last step's meta: the request is aborted next
    for seq_id in ids:
        engine.abort(seq_id)
    engine.step()
    return statistics.median(times), times, replay


def release() -> None:
    """Return the dropped engine's memory to the device (the next engine sizes its cache from free memory)."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def measure(llm, engine, cfg, acct, layout, kv_per_token, prefill_len, bw, tflops, rec, dump) -> None:
    """(b) prefill of one prompt and (c) the batch-1 decode step against its roofline, into rec."""
    from prefill_bench import ttft_ms

    vocab = cfg.vocab_size
    runs = ttft_ms(llm, prefill_len, vocab, runs=3, seed=5)
    ttft = statistics.median(runs)
    flops = 2.0 * prefill_len * acct["linear_params_active"]
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    flops += layout.num_attn_layers * 2.0 * prefill_len**2 * heads * head_dim  # causal: half of 4 T^2 H d
    rec["prefill"] = {"tokens": prefill_len, "ttft_ms": round(ttft, 2), "runs_ms": [round(r, 2) for r in runs],
                      "prompt_tok_per_s": round(prefill_len / ttft * 1e3), "tflop": round(flops / 1e12, 3),
                      "matmul_fraction": round(flops / (ttft / 1e3) / (tflops * 1e12), 4)}
    dump()
    # (c) decode at batch 1
    step, times, replay = decode_step_ms(llm, vocab)
    ctx = DECODE_PROMPT + 3 + DECODE_STEPS // 2
    state_rw = 2 * layout.state_bytes_per_slot
    kv_rw = kv_per_token * (ctx + 1)
    moved = acct["weight_bytes_step_b1"] + state_rw + kv_rw
    rec["decode_b1"] = {"step_ms": round(step, 4), "steps_ms": [round(x, 4) for x in times],
                        "graph_replay_gpu_ms": round(replay, 4), "tok_per_s": round(1e3 / step, 1),
                        "context_mean": ctx, "bytes_weights": acct["weight_bytes_step_b1"],
                        "bytes_state_rw": state_rw, "bytes_kv": kv_rw, "bytes_moved": moved,
                        "roofline_ms": round(moved / bw * 1e3, 4),
                        "fraction": round(moved / bw * 1e3 / step, 4),
                        "roofline_ms_datasheet_3p35": round(moved / H100_DATASHEET_BW * 1e3, 4)}
    dump()


def child(family: str, out_path: str, bw: float, tflops: float, small: bool, prompt_lens: tuple[int, ...],
          match_only: bool) -> None:
    from hybrid_serve import LLM
    from hybrid_serve.kernels._common import HAS_TRITON

    rec: dict = {"family": family, "config": FAMILIES[family][0], "layers_kept": FAMILIES[family][1],
                 "what": FAMILIES[family][2], "triton": bool(HAS_TRITON),
                 "kernels_env": os.environ.get("HYBRID_SERVE_KERNELS", "auto")}

    def dump():
        with open(out_path, "w") as f:
            json.dump(rec, f)

    prefill_len = 256 if small else PREFILL_LEN
    prompt_lens = (50, 120) if small else prompt_lens
    rec["match_only"] = match_only
    args = {"device": os.environ.get("FAMILY_CHECK_DEVICE", "cuda"), "dtype": "bfloat16", "load_format": "dummy",
            "max_num_seqs": 8, "max_num_batched_tokens": prefill_len, "chunked_prefill_size": prefill_len,
            "max_model_len": prefill_len + 512}
    rec["engine_args"] = dict(args)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_config(family, tmp)
        gen = torch.Generator().manual_seed(17)
        try:
            t = time.perf_counter()
            llm = LLM(model=model_dir, enable_cuda_graphs=True, warm_up=not match_only, **args)
            rec["start_s_graphs_on"] = round(time.perf_counter() - t, 1)
            engine = llm.engine
            cfg = engine.hf_config
            vocab = cfg.vocab_size
            prompts = [torch.randint(10, vocab, (n,), generator=gen).tolist() for n in prompt_lens]
            graphs = engine.runner.decode_graphs
            rec["graph_sizes"] = sorted(getattr(graphs, "graphs", {})) if graphs is not None else []
            acct = weight_accounting(engine.model, cfg)
            rec.update(acct)
            layout = engine.shard.pool_layout()
            rec["num_attn_layers"], rec["num_state_layers"] = layout.num_attn_layers, layout.num_state_layers
            rec["state_bytes_per_slot"] = layout.state_bytes_per_slot
            kv_per_token = layout.kv_bytes_per_page // engine.config.page_size if layout.kv_bytes_per_page else 0
            rec["kv_bytes_per_token"] = kv_per_token
            rec["gpu_mem_after_start_GiB"] = round(torch.cuda.memory_allocated() / 2**30, 2)
            dump()
            # (a) graphs on
            on = run_prompts(llm, prompts)
            dump()
            if match_only:
                llm = engine = graphs = None
                release()
            else:
                measure(llm, engine, cfg, acct, layout, kv_per_token, prefill_len, bw, tflops, rec, dump)
                llm = engine = graphs = None
                release()
            rec["gpu_mem_after_free_GiB"] = round(torch.cuda.memory_allocated() / 2**30, 2)
            # (a) graphs off, a second engine (warm-up skipped: no timing here)
            t = time.perf_counter()
            llm = LLM(model=model_dir, enable_cuda_graphs=False, warm_up=False, **args)
            rec["start_s_graphs_off"] = round(time.perf_counter() - t, 1)
            rec["graphs_off_has_graphs"] = llm.engine.runner.decode_graphs is not None
            off = run_prompts(llm, prompts)
            llm = None
            release()
            same = 0
            prefix_tokens = 0
            diffs = []
            lp_diffs = []  # |logprob on - off| of the chosen token where both runs had the same history
            lp_equal = lp_total = 0
            for i, (a, b) in enumerate(zip(on, off)):
                n = next((k for k, (x, y) in enumerate(zip(a["tokens"], b["tokens"])) if x != y), None)
                for k in range(n if n is not None else len(a["tokens"])):
                    if a["logprob"][k] is not None and b["logprob"][k] is not None:
                        lp_diffs.append(abs(a["logprob"][k] - b["logprob"][k]))
                        lp_equal += a["logprob"][k] == b["logprob"][k]
                        lp_total += 1
                if n is None and len(a["tokens"]) == len(b["tokens"]):
                    same += 1
                    prefix_tokens += len(a["tokens"])
                    continue
                n = n if n is not None else min(len(a["tokens"]), len(b["tokens"]))
                prefix_tokens += n
                gap_on = a["top2_gap"][n] if n < len(a["top2_gap"]) else None
                gap_off = b["top2_gap"][n] if n < len(b["top2_gap"]) else None
                diffs.append({"prompt": i, "prompt_len": prompt_lens[i], "first_diff": n, "top2_gap_on": gap_on,
                              "top2_gap_off": gap_off})
            total = sum(len(a["tokens"]) for a in on)
            rec["graphs_on_off"] = {"prompts": list(prompt_lens), "identical_prompts": same, "num_prompts": len(on),
                                    "token_match_fraction": round(prefix_tokens / total, 4), "diffs": diffs,
                                    "min_top2_gap_on": min((g for a in on for g in a["top2_gap"] if g is not None),
                                                           default=None),
                                    "logprob_max_abs_diff": max(lp_diffs, default=None),
                                    "logprob_bit_equal": f"{lp_equal}/{lp_total}",
                                    "tokens_on": [a["tokens"] for a in on], "tokens_off": [b["tokens"] for b in off],
                                    "logprob_on": [a["logprob"] for a in on], "logprob_off": [b["logprob"] for b in off],
                                    "top2_gap_on": [a["top2_gap"] for a in on],
                                    "top2_gap_off": [b["top2_gap"] for b in off]}
            rec["ok"] = True
        except Exception as e:  # noqa: BLE001 - reported per family
            rec["ok"] = False
            rec["error"] = f"{type(e).__name__}: {e}"
            rec["traceback"] = traceback.format_exc()[-4000:]
        dump()


def copy_bandwidth() -> float:
    from decode_bench import copy_bandwidth as bw

    return bw()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--json", default=None)
    ap.add_argument("--timeout", type=int, default=240, help="seconds per family")
    ap.add_argument("--budget", type=int, default=540, help="seconds for all families (later ones skipped)")
    ap.add_argument("--small", action="store_true", help="short prompts (a smoke run)")
    ap.add_argument("--prompt-lens", default=",".join(map(str, PROMPT_LENS)), help="(a)'s prompts, run together")
    ap.add_argument("--match-only", action="store_true", help="(a) alone: no warm-up, no prefill / decode timing")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--bw", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--tflops", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.child_out, args.bw, args.tflops, args.small,
              tuple(int(n) for n in args.prompt_lens.split(",")), args.match_only)
        return
    from prefill_bench import matmul_tflops

    out_dir = os.environ.get("OUT", "./bench_out")
    os.makedirs(out_dir, exist_ok=True)
    json_path = args.json or os.path.join(out_dir, "family_gpu_check.json")
    device = torch.cuda.get_device_name(0)
    bw = copy_bandwidth()
    tflops = matmul_tflops()
    torch.cuda.empty_cache()
    print(f"{device}: copy rate {bw / 1e12:.3f} TB/s (read+write), bf16 matmul {tflops:.0f} TFLOP/s", flush=True)
    result = {"date": datetime.date.today().isoformat(), "commit": os.environ.get("COMMIT", "unknown"),
              "device": device, "device_kind": os.environ.get("DEVICE_KIND", "unknown"),
              "copy_bandwidth_TBps": round(bw / 1e12, 3), "matmul_TFLOPs": round(tflops, 1),
              "torch": torch.__version__, "workload": __doc__.split("\n\n")[2].strip(), "families": {}}
    families = [f for f in args.families.split(",") if f]
    t_all = time.perf_counter()
    for fam in families:
        t = time.perf_counter()
        left = args.budget - (t - t_all)
        if left < 30:
            result["families"][fam] = {"family": fam, "ok": False, "error": "skipped: out of the run's time budget"}
            continue
        child_out = os.path.join(tempfile.gettempdir(), f"fam_{fam}.json")
        if os.path.exists(child_out):
            os.remove(child_out)
        cmd = [sys.executable, os.path.abspath(__file__), "--child", fam, "--child-out", child_out, "--bw", str(bw),
               "--tflops", str(tflops), "--prompt-lens", args.prompt_lens] + (["--small"] if args.small else []) \
            + (["--match-only"] if args.match_only else [])
        log_path = os.path.join(out_dir, "family_gpu_check.log")
        with open(log_path, "a") as log:
            log.write(f"\n===== {fam} =====\n")
            log.flush()
            try:
                rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=min(args.timeout, left),
                                    check=False).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        rec = {"family": fam}
        if os.path.exists(child_out):
            with open(child_out) as f:
                rec = json.load(f)
        rec["rc"] = rc
        rec["wall_s"] = round(time.perf_counter() - t, 1)
        if rc != 0 and rec.get("ok") is not False:
            rec["ok"] = False
            rec.setdefault("error", f"child exited {rc}")
        result["families"][fam] = rec
        brief = {k: rec.get(k) for k in ("ok", "error", "wall_s", "start_s_graphs_on")}
        g = rec.get("graphs_on_off", {})
        print(f"[{fam}] {json.dumps(brief)} match {g.get('identical_prompts')}/{g.get('num_prompts')} "
              f"{g.get('token_match_fraction')} logprob bit-equal {g.get('logprob_bit_equal')} max |diff| "
              f"{g.get('logprob_max_abs_diff')} prefill {rec.get('prefill', {}).get('ttft_ms')} ms "
              f"decode {rec.get('decode_b1', {}).get('step_ms')} ms", flush=True)
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1)
    print(f"\n{device}, copy rate {bw / 1e12:.2f} TB/s, matmul {tflops:.0f} TFLOP/s")
    print(f"{'family':<19} {'params':>7} {'graphs on=off':>13} {'prefill 4k ms':>13} {'tok/s':>7} {'mm%':>5} "
          f"{'step ms':>8} {'replay':>7} {'MB moved':>8} {'roof ms':>8} {'%roof':>6}")
    for fam, rec in result["families"].items():
        if not rec.get("ok"):
            print(f"{fam:<19} FAILED: {rec.get('error', '')[:150]}")
            continue
        g = rec["graphs_on_off"]
        if rec.get("match_only"):
            print(f"{fam:<19} {rec['params_total'] / 1e9:6.2f}B {g['identical_prompts']}/{g['num_prompts']} "
                  f"{100 * g['token_match_fraction']:5.1f}%  chosen-token logprob bit-equal {g['logprob_bit_equal']}, "
                  f"max |diff| {g['logprob_max_abs_diff']}, diffs {g['diffs']}")
            continue
        p, d = rec["prefill"], rec["decode_b1"]
        print(f"{fam:<19} {rec['params_total'] / 1e9:6.2f}B {g['identical_prompts']}/{g['num_prompts']} "
              f"{100 * g['token_match_fraction']:5.1f}%  {p['ttft_ms']:13.1f} {p['prompt_tok_per_s']:7d} "
              f"{100 * p['matmul_fraction']:4.0f}% {d['step_ms']:8.3f} {d['graph_replay_gpu_ms']:7.3f} "
              f"{d['bytes_moved'] / 1e6:8.0f} {d['roofline_ms']:8.3f} {100 * d['fraction']:5.1f}%")
    print(f"JSON: {json_path}")


if __name__ == "__main__":
    main()
