"""Tiny Falcon-H1 config: attention and Mamba2 side by side in every layer (Mamba2 inner width
mamba_d_ssm=64, narrower than expand * hidden; 4 heads in one group, as released; gated output
without norm, as mamba_rms_norm=False), every muP multiplier away from 1."""
HF_CLASS = "FalconH1ForCausalLM"


def config(**kw):
    from transformers import FalconH1Config

    base = dict(
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, mamba_d_ssm=64, mamba_n_heads=4, mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4,
        mamba_expand=2, mamba_chunk_size=16, mamba_conv_bias=True, mamba_proj_bias=False, mamba_rms_norm=False,
        projectors_bias=False, max_position_embeddings=1024,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        embedding_multiplier=2.0, lm_head_multiplier=0.7, mlp_multipliers=[1.3, 0.8], key_multiplier=0.6,
        attention_in_multiplier=1.2, attention_out_multiplier=0.9, ssm_multipliers=[1.1, 0.9, 1.2, 0.8, 1.05],
        ssm_in_multiplier=1.15, ssm_out_multiplier=0.85, tie_word_embeddings=False,
    )
    base.update(kw)
    return FalconH1Config(**base)
