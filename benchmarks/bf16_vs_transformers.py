"""How far bf16 greedy decoding drifts from fp32 on a random-weight model, for transformers
itself and for hybrid-serve, on the same weights and prompts (CPU, no fla):

    python benchmarks/bf16_vs_transformers.py [--prompts 64] [--layers 8]

A Qwen3.5-layout model (hidden 512, GDN:attention 3:1) with transformers' own random init,
weights rounded to bf16 values so both dtypes compute on the same weights. Prints the share
of prompts whose first 16 greedy tokens are equal in bf16 and fp32, and of tokens, for
transformers' `generate` and for hybrid-serve's `LLM` (reference ops on CPU). If transformers'
own bf16 drifts as far as ours, the drift is bf16 rounding amplified by the random model, not
a kernel error.
"""
from __future__ import annotations

import argparse
import tempfile

import torch
from transformers import AutoModelForCausalLM, Qwen3_5TextConfig

from hybrid_serve import LLM, SamplingParams


def agreement(a: list[list[int]], b: list[list[int]]) -> tuple[float, float]:
    prompts = sum(x == y for x, y in zip(a, b)) / len(a)
    tokens = sum(u == v for x, y in zip(a, b) for u, v in zip(x, y)) / sum(len(x) for x in a)
    return prompts, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prompts", type=int, default=64, help="random prompts compared")
    ap.add_argument("--layers", type=int, default=8, help="layers of the random Qwen3.5-layout model")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = Qwen3_5TextConfig(hidden_size=512, num_hidden_layers=args.layers, intermediate_size=1536,
                            num_attention_heads=8, num_key_value_heads=2, head_dim=64, linear_num_key_heads=4,
                            linear_num_value_heads=8, linear_key_head_dim=64, linear_value_head_dim=64,
                            vocab_size=16384, tie_word_embeddings=False,
                            layer_types=(["linear_attention"] * 3 + ["full_attention"]) * (args.layers // 4))
    torch.manual_seed(0)
    m32 = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for p in m32.parameters():
            p.copy_(p.to(torch.bfloat16).float())  # bf16-representable: the same weights in both dtypes
    m16 = AutoModelForCausalLM.from_config(cfg).eval()
    m16.load_state_dict(m32.state_dict())
    m16 = m16.to(torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 16000, (int(torch.randint(16, 100, (1,), generator=g)),), generator=g).tolist()
               for _ in range(args.prompts)]
    hf = {}
    for name, model in (("float32", m32), ("bfloat16", m16)):
        with torch.no_grad():
            hf[name] = [model.generate(torch.tensor([p]), max_new_tokens=16, min_new_tokens=16,
                                       do_sample=False)[0, len(p):].tolist() for p in prompts]
    ours = {}
    with tempfile.TemporaryDirectory() as d:
        m32.save_pretrained(d)
        params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
        for name in ("float32", "bfloat16"):
            llm = LLM(model=d, dtype=name, max_num_seqs=args.prompts, enable_prefix_caching=False)
            ours[name] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    for label, res in (("transformers", hf), ("hybrid-serve", ours)):
        p, t = agreement(res["float32"], res["bfloat16"])
        print(f"{label:13s} bf16 vs fp32: prompts with 16/16 equal {p:.1%}, tokens equal {t:.1%}")
    p, t = agreement(hf["float32"], ours["float32"])
    print(f"fp32: hybrid-serve vs transformers: prompts with 16/16 equal {p:.1%}, tokens equal {t:.1%}")


if __name__ == "__main__":
    main()
