"""tp=8 on CPU (gloo, eight ranks on one node of a local Ray): a tiny Qwen3-Next with
Qwen3-Next-80B-A3B's head layout (16 attention heads over 2 KV heads, 16 Gated DeltaNet key
heads over 32 value heads, experts split 8 ways) gives tp=1's greedy tokens at tp=8 in fp32
(the multi-GPU issue's tp=8 check, on a reduced config; tp=4 with replicated KV and GDN key
heads: test_tensor_parallel.py)."""
import pytest
import ray
import torch

from hf_reference import build_reference
from hybrid_serve import LLM, SamplingParams

GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
HEADS_OF_THE_80B = dict(  # the 80B's head and expert counts (model_configs.qwen3_next_80b_a3b), tiny widths
    hidden_size=64, num_attention_heads=16, num_key_value_heads=2, head_dim=8, linear_num_key_heads=16,
    linear_num_value_heads=32, linear_key_head_dim=8, linear_value_head_dim=8, num_experts=16,
    num_experts_per_tok=4, moe_intermediate_size=16, shared_expert_intermediate_size=24, intermediate_size=48,
)


@pytest.fixture(scope="module")
def eight_cpu_ray():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.slow
def test_tp8_equals_tp1_with_the_80b_head_layout(tmp_path, eight_cpu_ray):
    model_dir = str(tmp_path / "qwen3_next_80b_heads")
    build_reference("qwen3_next", model_dir, **HEADS_OF_THE_80B)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 256, (int(n),), generator=gen).tolist() for n in (5, 23, 61)]
    want = [o.outputs[0].token_ids for o in LLM(model=model_dir, dtype="float32").generate(prompts, GREEDY)]
    llm = LLM(model=model_dir, dtype="float32", tp_size=8)
    try:
        got = llm.generate(prompts, GREEDY)
    finally:
        llm.shutdown()
    assert [o.error for o in got] == [None] * len(prompts)
    assert [o.outputs[0].token_ids for o in got] == want
