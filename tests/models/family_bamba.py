"""Tiny Bamba config: Mamba2 layers (8 heads in one group, as the released models have, so under
tp=2 the group and its output norm span both ranks; 16-token chunks in transformers' scan) and
one attention layer with half-rotary heads (Bamba's fixed partial_rotary_factor 0.5),
a SwiGLU MLP after each."""
HF_CLASS = "BambaForCausalLM"


def config(**kw):
    from transformers import BambaConfig

    base = dict(
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, attn_layer_indices=[1], mamba_n_heads=8, mamba_n_groups=1, mamba_d_state=16,
        mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=16, mamba_conv_bias=True, mamba_proj_bias=False,
        max_position_embeddings=1024, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
    )
    base.update(kw)
    return BambaConfig(**base)
