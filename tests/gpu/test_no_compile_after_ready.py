"""No Triton kernel is compiled (or loaded from Triton's disk cache) after the engine reports
ready (issue 12: "no compilation after the engine reports ready"). One family per kind of
state pool (GDN conv + SSM, Mamba2 conv + SSM, short conv alone), bf16 on the GPU, each in a
fresh process (kernels compiled by earlier tests in this one would hide a gap): a batch of
prompts whose chunks end at several state checkpoints in one step (one `copy_many` over
several slots), decode, then the same prompts again, extended, resuming from their
checkpoints, then sampled requests (temperature, top-p, top-k, min-p); once more with
speculative decoding (drafts of every length: verify steps, eager and from graphs, and their
commits). The hook is Triton's
`jit_cache_hook`, which runs on every miss of a kernel's in-memory cache. The GDN family runs a
second time at a real vocabulary (151,936 ids, dummy weights): the sampler's kernels specialize
on the logits' width, and the tiny configs' vocabularies met only what a small warm-up probe had
compiled (session 45: at 152k ids greedy_argmax's final kernel compiled after ready). Marker `gpu`."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                       reason="needs a CUDA GPU with compiled Triton"),
]

SERVE = r"""
import json, sys
from triton import knobs
from hybrid_serve import LLM, SamplingParams

spec = json.loads(sys.argv[3])
if spec:  # JSON has no tuple keys: the synthetic drafter's continuations come as [prompt, tokens] pairs
    spec["continuations"] = {tuple(p): c for p, c in spec["continuations"]}
llm = LLM(model=sys.argv[1], load_format=sys.argv[2], dtype="bfloat16", device="cuda", max_num_seqs=8,
          max_model_len=512, cache_memory_bytes=64 * 1024**2, state_checkpoint_interval=16, chunked_prefill_size=256,
          speculative_config=spec)
compiled = []
def hook(**kwargs):
    compiled.append(getattr(kwargs.get("fn"), "name", "?"))
    return False
knobs.runtime.jit_cache_hook = hook
prompts = json.loads(sys.argv[4])  # 48 tokens each: 3 checkpoints
greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
first = llm.generate(prompts, greedy)
again = llm.generate([p + o.outputs[0].token_ids for p, o in zip(prompts, first)], greedy)
sampled = [SamplingParams(max_tokens=4, temperature=0.8, seed=1),  # the Gumbel kernel without masking
           SamplingParams(max_tokens=4, temperature=0.7, top_p=0.9, seed=2),  # with it
           SamplingParams(max_tokens=4, temperature=1.0, top_k=5, min_p=0.05, seed=3)]
llm.generate(prompts[:3], sampled)
print(json.dumps({"compiled": compiled, "cached": [o.num_cached_tokens for o in again],
                  "draft_tokens": llm.engine.stats().get("spec_draft_tokens", 0)}))
"""


REAL_VOCAB = 151_936  # Qwen3.5 / Qwen3-Next's


def _with_vocab(model_dir: str, out_dir: str, vocab: int) -> str:
    """A copy of model_dir's config (no weights: load_format dummy) with `vocab` ids."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    (cfg["text_config"] if "vocab_size" in cfg.get("text_config", {}) else cfg)["vocab_size"] = vocab
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f)
    if os.path.exists(os.path.join(model_dir, "generation_config.json")):
        shutil.copy(os.path.join(model_dir, "generation_config.json"), out_dir)
    return out_dir


PROMPTS = [[(7 * p + 3 * i) % 250 + 1 for i in range(48)] for p in range(6)]  # SERVE's prompts
# drafts of every length 0..3 for SERVE's first prompts (mostly rejected: not the model's tokens), so
# that steps verify eagerly and from the verify graphs, and commit
SYNTHETIC = {"method": "synthetic", "num_speculative_tokens": 3, "adaptive": False, "vary_length": True,
             "acceptance_rate": 1.0, "continuations": [[p, [(p[-1] + 5 * j) % 250 + 1 for j in range(40)]]
                                                      for p in PROMPTS]}


@pytest.mark.parametrize("family,vocab,spec", [("qwen3_5", None, None), ("nemotron_h", None, None),
                                               ("lfm2", None, None), ("qwen3_5", REAL_VOCAB, None),
                                               ("qwen3_5", None, SYNTHETIC)],
                         ids=["qwen3_5", "nemotron_h", "lfm2", "qwen3_5-152k-vocab", "qwen3_5-speculative"])
def test_no_kernel_compiles_after_ready(family, vocab, spec, reference_models, tmp_path):
    """spec: speculative decoding on (verify steps: the state scratch, verify graphs, the commit
    and its graphs, beside the plain steps)."""
    model_dir, _ = reference_models(family)
    load_format = "auto"
    if vocab is not None:
        model_dir, load_format = _with_vocab(model_dir, str(tmp_path), vocab), "dummy"
    proc = subprocess.run([sys.executable, "-c", SERVE, model_dir, load_format, json.dumps(spec), json.dumps(PROMPTS)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(n > 0 for n in result["cached"]), result  # the second turn did resume from checkpoints
    if spec:
        assert result["draft_tokens"] > 0, result  # steps verified drafts
    assert result["compiled"] == [], f"compiled while serving: {result['compiled']}"
