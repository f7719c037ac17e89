"""Tiny Nemotron-H config: Mamba2, attention (no rotary), relu2 MLP and a routed MoE layer."""
HF_CLASS = "NemotronHForCausalLM"


def config(**kw):
    from transformers import NemotronHConfig

    base = dict(
        vocab_size=256, hidden_size=64, hybrid_override_pattern="M*-ME", num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=96, mamba_num_heads=4, mamba_head_dim=16,
        n_groups=2, ssm_state_size=16, conv_kernel=4, chunk_size=16, n_routed_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, moe_shared_expert_intermediate_size=48, n_group=1, topk_group=1,
        routed_scaling_factor=1.5, max_position_embeddings=1024, tie_word_embeddings=False,
    )
    base.update(kw)
    return NemotronHConfig(**base)
