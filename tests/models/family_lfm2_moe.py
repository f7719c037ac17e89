"""Tiny LFM2-MoE config: short-conv and full-attention layers; a dense SwiGLU feed-forward on
layer 0 (num_dense_layers=1), sigmoid-routed MoE (8 experts, top 2, expert bias for the choice,
renormalised, scaled by 1.5) after both kinds of mixer; tied embeddings. The expert bias is a
buffer in transformers: `perturb_buffers` perturbs it too, so the routing choice depends on it."""
HF_CLASS = "Lfm2MoeForCausalLM"


def config(**kw):
    from transformers import Lfm2MoeConfig

    base = dict(
        vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, conv_L_cache=3, conv_bias=False,
        num_dense_layers=1, num_experts=8, num_experts_per_tok=2, use_expert_bias=True, routed_scaling_factor=1.5,
        norm_topk_prob=True, layer_types=["conv", "full_attention", "conv", "conv"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=True,
    )
    base.update(kw)
    return Lfm2MoeConfig(**base)


def perturb_buffers(model, gen):
    """The routing bias is a persistent buffer (saved, not a parameter): give it values."""
    import torch

    for name, buf in sorted(model.named_buffers()):
        if name.endswith("expert_bias"):
            buf.add_(0.5 * torch.randn(buf.shape, generator=gen))
