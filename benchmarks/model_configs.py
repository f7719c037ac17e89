"""Model directories (config.json only; weights come from load_format="dummy") at real
architecture sizes, for the GPU benchmarks and the bf16 agreement check.

    python benchmarks/model_configs.py OUT_DIR   # writes OUT_DIR/<name>/config.json for every config
"""
from __future__ import annotations

import os
import sys


def qwen3_5_2p3b():
    """The decode benchmark's model: Qwen3.5 layout, 2.3B (hidden 2048, 24 layers, GDN:attn 3:1)."""
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(hidden_size=2048, num_hidden_layers=24, intermediate_size=6144, num_attention_heads=16,
                             num_key_value_heads=2, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=32,
                             linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
                             vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=False)


def qwen3_5_30m_cpu():
    """The demo's layout (8 layers, GDN:attention 3:1) at hidden 512: 29M parameters, 2.6x the
    demo's 11M. A CPU model whose prompt work, not the serving path around it, makes a
    multi-turn workload's TTFT (the router benchmark on a 2-core machine)."""
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(hidden_size=512, num_hidden_layers=8, intermediate_size=1536, num_attention_heads=8,
                             num_key_value_heads=2, head_dim=64, linear_num_key_heads=4, linear_num_value_heads=8,
                             linear_key_head_dim=64, linear_value_head_dim=64, linear_conv_kernel_dim=4,
                             vocab_size=4096, max_position_embeddings=8192, tie_word_embeddings=True)


def qwen3_5_1b():
    cfg = qwen3_5_2p3b()
    cfg.num_hidden_layers = 12
    cfg.layer_types = cfg.layer_types[:12]
    return cfg


def qwen3_next_1b():
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(hidden_size=1024, num_hidden_layers=12, num_attention_heads=8, num_key_value_heads=2,
                           head_dim=128, linear_num_key_heads=8, linear_num_value_heads=16, linear_key_head_dim=64,
                           linear_value_head_dim=64, num_experts=64, num_experts_per_tok=8, moe_intermediate_size=256,
                           shared_expert_intermediate_size=512, intermediate_size=2048, vocab_size=151936,
                           max_position_embeddings=32768, tie_word_embeddings=False)


def qwen3_next_80b_a3b():
    """Qwen3-Next-80B-A3B (Qwen/Qwen3-Next-80B-A3B-Instruct's config.json): 48 layers, full
    attention every 4th (16 heads of 256, 2 KV heads, gated output), Gated DeltaNet (16 key /
    32 value heads of 128), 512 experts of intermediate 512, top-10, + a shared expert of 512."""
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(hidden_size=2048, num_hidden_layers=48, num_attention_heads=16, num_key_value_heads=2,
                           head_dim=256, linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
                           linear_value_head_dim=128, linear_conv_kernel_dim=4, num_experts=512,
                           num_experts_per_tok=10, moe_intermediate_size=512, shared_expert_intermediate_size=512,
                           intermediate_size=5120, decoder_sparse_step=1, norm_topk_prob=True,
                           full_attention_interval=4, partial_rotary_factor=0.25, rope_theta=10_000_000.0,
                           rms_norm_eps=1e-6, vocab_size=151936, max_position_embeddings=262144,
                           tie_word_embeddings=False)


def qwen3_next_80b_12l():
    """A 12-layer slice of Qwen3-Next-80B-A3B (3 attention + 9 GDN layers), for one GPU."""
    cfg = qwen3_next_80b_a3b()
    cfg.num_hidden_layers = 12
    cfg.layer_types = cfg.layer_types[:12]
    return cfg


def lfm2_1b():
    from transformers import Lfm2Config

    attn = {2, 5, 8, 10, 12, 14}
    return Lfm2Config(hidden_size=2048, num_hidden_layers=16, intermediate_size=12288, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=65536, conv_L_cache=3, max_position_embeddings=32768,
                      layer_types=["full_attention" if i in attn else "conv" for i in range(16)])


def nemotron_h_1b():
    from transformers import NemotronHConfig

    return NemotronHConfig(hidden_size=1536, num_hidden_layers=16, hybrid_override_pattern="M-M-M*-M-M-M*-M-",
                           mamba_num_heads=48, mamba_head_dim=64, n_groups=8, ssm_state_size=128, conv_kernel=4,
                           intermediate_size=6144, num_attention_heads=12, num_key_value_heads=4, head_dim=128,
                           vocab_size=131072, max_position_embeddings=32768, tie_word_embeddings=False)


def qwen3_5_moe_35b_a3b():
    """Qwen3.5-35B-A3B class: 40 layers (GDN:attn 3:1), 256 experts top 8 + a shared expert."""
    from transformers import Qwen3_5MoeTextConfig

    return Qwen3_5MoeTextConfig(hidden_size=2048, num_hidden_layers=40, num_attention_heads=16, num_key_value_heads=2,
                                head_dim=256, linear_num_key_heads=16, linear_num_value_heads=32,
                                linear_key_head_dim=128, linear_value_head_dim=128, num_experts=256,
                                num_experts_per_tok=8, moe_intermediate_size=512, shared_expert_intermediate_size=512,
                                vocab_size=248320, max_position_embeddings=32768, tie_word_embeddings=False)


def lfm2_moe_8b_a1b():
    """LFM2-8B-A1B class: 24 layers (6 attention), 2 dense then MoE layers, 32 experts top 4."""
    from transformers import Lfm2MoeConfig

    attn = {2, 6, 10, 14, 18, 21}
    return Lfm2MoeConfig(hidden_size=2048, num_hidden_layers=24, intermediate_size=7168, moe_intermediate_size=1792,
                         num_dense_layers=2, num_experts=32, num_experts_per_tok=4, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=65536, conv_L_cache=3, max_position_embeddings=32768,
                         layer_types=["full_attention" if i in attn else "conv" for i in range(24)])


def bamba_9b():
    """Bamba-9B class: 32 layers, attention at 9, 18, 27; Mamba2 with 128 heads of 64, d_state 128."""
    from transformers import BambaConfig

    return BambaConfig(hidden_size=4096, num_hidden_layers=32, attn_layer_indices=[9, 18, 27], num_attention_heads=32,
                       num_key_value_heads=8, intermediate_size=14336, mamba_n_heads=128, mamba_d_head=64,
                       mamba_n_groups=1, mamba_d_state=128, mamba_d_conv=4, mamba_expand=2, vocab_size=128256,
                       max_position_embeddings=32768, tie_word_embeddings=False)


def granite_4_0_h_tiny():
    """Granite-4.0-H-Tiny class (7B, 1B active): 40 layers (4 attention, no rotary), 64 experts top 6
    + shared MLP, Granite's multipliers, tied embeddings."""
    from transformers import GraniteMoeHybridConfig

    attn = {5, 15, 25, 35}
    return GraniteMoeHybridConfig(
        hidden_size=1536, num_hidden_layers=40, num_attention_heads=12, num_key_value_heads=4, intermediate_size=512,
        shared_intermediate_size=1024, num_local_experts=64, num_experts_per_tok=6, mamba_n_heads=48, mamba_d_head=64,
        mamba_n_groups=1, mamba_d_state=128, mamba_d_conv=4, mamba_expand=2, vocab_size=100352,
        embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0078125, logits_scaling=6.0,
        position_embedding_type="nope", max_position_embeddings=32768, tie_word_embeddings=True,
        layer_types=["attention" if i in attn else "mamba" for i in range(40)])


def falcon_h1_0p5b():
    """Falcon-H1-0.5B class: 36 layers, each attention (8 heads, 2 KV) beside Mamba2 (24 heads of 64)."""
    from transformers import FalconH1Config

    return FalconH1Config(hidden_size=1024, num_hidden_layers=36, num_attention_heads=8, num_key_value_heads=2,
                          head_dim=64, intermediate_size=2048, mamba_d_ssm=1536, mamba_n_heads=24, mamba_d_head=64,
                          mamba_n_groups=1, mamba_d_state=128, mamba_d_conv=4, vocab_size=32784,
                          embedding_multiplier=5.66, lm_head_multiplier=0.039, key_multiplier=0.39,
                          attention_out_multiplier=0.94, ssm_out_multiplier=0.23, mlp_multipliers=[0.88, 0.59],
                          ssm_multipliers=[0.35, 0.25, 0.5, 0.35, 0.35], max_position_embeddings=32768,
                          tie_word_embeddings=False)


CONFIGS = {"qwen3_5_2p3b": qwen3_5_2p3b, "qwen3_5_1b": qwen3_5_1b, "qwen3_5_30m_cpu": qwen3_5_30m_cpu, "qwen3_next_1b": qwen3_next_1b,
           "qwen3_next_80b_a3b": qwen3_next_80b_a3b, "qwen3_next_80b_12l": qwen3_next_80b_12l,
           "lfm2_1b": lfm2_1b, "nemotron_h_1b": nemotron_h_1b, "qwen3_5_moe_35b_a3b": qwen3_5_moe_35b_a3b,
           "lfm2_moe_8b_a1b": lfm2_moe_8b_a1b, "bamba_9b": bamba_9b, "granite_4_0_h_tiny": granite_4_0_h_tiny,
           "falcon_h1_0p5b": falcon_h1_0p5b}


def write_model_dir(name: str, out_dir: str) -> str:
    path = os.path.join(out_dir, name)
    CONFIGS[name]().save_pretrained(path)
    return path


if __name__ == "__main__":
    for n in CONFIGS:
        print(write_model_dir(n, sys.argv[1]))
