"""Tiny Granite-4.0-H config: Mamba2 layers and one attention layer (softmax scale
attention_multiplier, no rotary as in the released models), each followed by a top-2-of-8 MoE
plus a shared SwiGLU MLP; every multiplier (embedding, residual, attention, logits) away from 1."""
HF_CLASS = "GraniteMoeHybridForCausalLM"


def config(**kw):
    from transformers import GraniteMoeHybridConfig

    base = dict(
        vocab_size=256, hidden_size=64, intermediate_size=32, shared_intermediate_size=48, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, layer_types=["mamba", "attention", "mamba", "mamba"],
        mamba_n_heads=8, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=16,
        mamba_conv_bias=True, mamba_proj_bias=False, num_local_experts=8, num_experts_per_tok=2,
        embedding_multiplier=3.0, residual_multiplier=0.6, attention_multiplier=0.09, logits_scaling=2.5,
        position_embedding_type="nope", max_position_embeddings=1024, tie_word_embeddings=True,
    )
    base.update(kw)
    return GraniteMoeHybridConfig(**base)
