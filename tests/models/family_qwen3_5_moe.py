"""Tiny Qwen3.5-MoE (text) config: GDN (separate qkv / z / b / a projections, HV = 2 * H) and
gated attention, partial rotary 0.25; a sparse MoE (8 experts, top 2, gated shared expert) on
every layer, so MoE follows both a GDN and an attention mixer."""
HF_CLASS = "Qwen3_5MoeForCausalLM"


def config(**kw):
    from transformers import Qwen3_5MoeTextConfig

    base = dict(
        vocab_size=256, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=8, linear_conv_kernel_dim=4, max_position_embeddings=1024,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
        tie_word_embeddings=False,
    )
    base.update(kw)
    return Qwen3_5MoeTextConfig(**base)
