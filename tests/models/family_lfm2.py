"""Tiny LFM2 config: short-conv and full-attention layers, tied embeddings, auto-adjusted MLP.

MLP width as transformers derives it: int(2 * 100 / 3) = 66 -> int(1.3 * 66) = 85 -> rounded up
to a multiple of 24 = 96 (exercises every step of the rule).
"""
HF_CLASS = "Lfm2ForCausalLM"


def config(**kw):
    from transformers import Lfm2Config

    base = dict(
        vocab_size=256, hidden_size=64, intermediate_size=100, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, conv_L_cache=3, conv_bias=False,
        block_auto_adjust_ff_dim=True, block_ffn_dim_multiplier=1.3, block_multiple_of=24,
        layer_types=["conv", "full_attention", "conv", "conv"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
    )
    base.update(kw)
    return Lfm2Config(**base)
