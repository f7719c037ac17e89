"""Decode-row fusions on a GPU give the tokens of the launches they replace, in bf16 (the
skinny linear runs only in half dtypes), with decode graphs, for every family: a SwiGLU
MLP's activation inside its down projection's launch (`ops.linear(x_silu_and_mul=True)`), an
attention output gate inside o_proj's (`x_sigmoid_gate=`), a GDN causal conv inside the
in-projection's (`ops.linear_into_decode_conv`), and a MoE block's shared expert and experts'
sum in one launch (`ops.shared_expert_combine`). The unfused run sends these back to their
separate launches (`ops.skinny_row`); the GDN output norm inside out_proj, which may round
differently, stays fused in both (tests/models/test_triton_path.py compares it). Marker `gpu`."""
import os

import pytest
import torch

from hf_reference import FAMILIES
from hybrid_serve import LLM, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                       reason="needs a CUDA GPU with compiled Triton"),
]


def _generate(model_dir: str) -> tuple[list[list[int]], list[float | None]]:
    llm = LLM(model=model_dir, dtype="bfloat16", device="cuda", max_num_seqs=4, max_model_len=256,
              cache_memory_bytes=64 * 1024**2, cuda_graph_max_batch=4)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (6, 31, 12, 3)]
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, logprobs=0) for n in (14, 4, 9, 16)]
    outs = llm.generate(prompts, params)
    llm.shutdown()
    tokens = [o.outputs[0].token_ids for o in outs]
    logprobs = [o.outputs[0].cumulative_logprob for o in outs]
    return tokens, logprobs


def _unfuse(monkeypatch) -> None:
    """No row is the skinny kernel's for the fusions: the activation and the experts' sum run
    as their own launches (the plain skinny kernel still takes one row)."""
    from hybrid_serve.models.layers import ops

    monkeypatch.setattr(ops, "skinny_row", lambda x, weight: False)


@pytest.mark.parametrize("family", FAMILIES)
def test_fused_decode_rows_give_the_same_tokens(family, reference_models, monkeypatch):
    model_dir = reference_models(family)[0]
    fused = _generate(model_dir)
    _unfuse(monkeypatch)
    assert _generate(model_dir) == fused
