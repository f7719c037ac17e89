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


CONFIGS = {"qwen3_5_2p3b": qwen3_5_2p3b, "qwen3_5_1b": qwen3_5_1b, "qwen3_next_1b": qwen3_next_1b,
           "lfm2_1b": lfm2_1b, "nemotron_h_1b": nemotron_h_1b}


def write_model_dir(name: str, out_dir: str) -> str:
    path = os.path.join(out_dir, name)
    CONFIGS[name]().save_pretrained(path)
    return path


if __name__ == "__main__":
    for n in CONFIGS:
        print(write_model_dir(n, sys.argv[1]))
