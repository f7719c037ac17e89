"""Where a model's bf16 rounding noise comes from (issue 16): transformers' fp32 forward of a
checkpoint with bf16 rounding emulated at one kind of site at a time (a tensor rounded to bf16 and
back where a bf16 engine would hold it in bf16), and the mean next-token KL(fp32 || rounded) over
the positions of held-out prompts (teacher-forced, so no divergence hides a difference).

A CPU-only screen: it says how loud a candidate demo checkpoint is under bf16 before any GPU
time, and whether one site dominates (then keeping that one tensor in fp32 would be a lever) or
the noise is spread over the network (then only the weights are).

    python benchmarks/bf16_noise_sites.py [--model DIR] [--prompts 24]   # JSON into $OUT
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from hybrid_serve.benchmarks.provenance import cpu_device, git_commit


def _round(x):
    return x.to(torch.bfloat16).float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def _is_linear(name, module):
    return isinstance(module, torch.nn.Linear) and name != "lm_head"  # our LM head keeps fp32 sums


def _is_layer(name, module):
    return type(module).__name__.endswith("DecoderLayer")


def _is_norm(name, module):
    return "Norm" in type(module).__name__


def _suffix(*ends):
    return lambda name, module: isinstance(module, torch.nn.Linear) and name.endswith(ends)


# site -> [(where: "in" rounds a module's inputs, "out" its outputs, which modules)]
SITES = {
    "linear inputs and outputs (not the LM head)": [("in", _is_linear), ("out", _is_linear)],
    "linear outputs": [("out", _is_linear)],
    "residual stream (decoder layer outputs)": [("out", _is_layer)],
    "norm outputs": [("out", _is_norm)],
    "MLP gate/up outputs": [("out", _suffix("mlp.gate_proj", "mlp.up_proj"))],
    "MLP down outputs": [("out", _suffix("mlp.down_proj"))],
    "attention o_proj outputs": [("out", _suffix("self_attn.o_proj"))],
    "GDN out_proj outputs": [("out", _suffix("linear_attn.out_proj"))],
    "GDN in_proj outputs": [("out", lambda n, m: isinstance(m, torch.nn.Linear) and ".linear_attn.in_proj" in n)],
    "LM head outputs (logits in bf16)": [("out", lambda n, m: n == "lm_head")],
    "all of the above but the logits": [("in", _is_linear), ("out", _is_linear), ("out", _is_layer), ("out", _is_norm)],
}


def perturb_at(model, rules, perturb=_round) -> list:
    """Hooks that apply ``perturb`` (a tensor -> tensor; default: round to bf16 and back) at the
    sites ``rules`` pick (a SITES value); returns their handles, for the caller to remove."""
    hooks = []
    for name, module in model.named_modules():
        for where, pick in rules:
            if pick(name, module):
                if where == "out":
                    hooks.append(module.register_forward_hook(
                        lambda mod, args, out: tuple(map(perturb, out)) if isinstance(out, tuple) else perturb(out)))
                else:
                    hooks.append(module.register_forward_pre_hook(lambda mod, args: tuple(map(perturb, args))))
    return hooks


def mean_kl(model, prompts, ref, rules) -> float:
    hooks = perturb_at(model, rules)
    try:
        kls = []
        with torch.no_grad():
            for ids, ref_logp in zip(prompts, ref):
                logp = model(ids).logits.float().log_softmax(-1)
                kls.append(float((ref_logp.exp() * (ref_logp - logp)).sum(-1).mean()))
    finally:
        for h in hooks:
            h.remove()
    return statistics.mean(kls)


def main() -> None:
    from transformers import AutoModelForCausalLM

    from hybrid_serve.demo import DEMO_DIR
    from hybrid_serve.demo.corpus import heldout_prompts
    from hybrid_serve.engine.tokenizer import load_tokenizer

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEMO_DIR)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out-name", default="bf16_noise_sites.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tok = load_tokenizer(args.model)
    prompts = [torch.tensor([tok.encode(t, add_special_tokens=False)]) for t in heldout_prompts(args.prompts, seed=0)]
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    start = time.perf_counter()
    with torch.no_grad():
        ref = [model(ids).logits.float().log_softmax(-1) for ids in prompts]
    rows = {site: mean_kl(model, prompts, ref, rules) for site, rules in SITES.items()}
    result = {"metric": "bf16_noise_sites", "date": time.strftime("%Y-%m-%d"), "commit": git_commit(),
              "device": cpu_device(), "model": args.model,
              "workload": f"{args.prompts} held-out stdlib prompts (heldout_prompts seed 0), teacher-forced, "
                          "transformers fp32 with bf16 rounding emulated at one kind of site",
              "baseline": "the same forward with no rounding (KL 0)", "mean_kl": rows,
              "seconds": time.perf_counter() - start}
    out_dir = os.environ.get("OUT", "./bench_out")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, args.out_name), "w") as f:
        json.dump(result, f, indent=1)
    for site, kl in rows.items():
        print(f"{site:48} KL {kl:.2e}")


if __name__ == "__main__":
    main()
