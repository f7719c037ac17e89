"""The demo model's architecture: its config (a Qwen3.5-layout hybrid, Gated DeltaNet and gated
full attention 3:1, 11.1M parameters with the MTP layer) and the multi-token-prediction layer
that ``train.py`` trains beside transformers' ``Qwen3_5ForCausalLM``, in the checkpoints'
``mtp.*`` names."""
from __future__ import annotations

import copy

import torch
import torch.nn as nn

LAYER_TYPES = (["linear_attention"] * 3 + ["full_attention"]) * 2

# the shipped demo (config.json): 11.1M parameters with the MTP layer, 22 MB in bf16
MODEL_CONFIG = {
    "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "vocab_size": 4096,
    "hidden_size": 320, "intermediate_size": 768, "num_hidden_layers": 8, "layer_types": LAYER_TYPES,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 64,
    "linear_value_head_dim": 64, "linear_conv_kernel_dim": 4, "hidden_act": "silu",
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-06, "attention_bias": False, "attention_dropout": 0.0,
    "initializer_range": 0.02, "use_cache": True, "tie_word_embeddings": True,
    "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False,
    "dtype": "float32",  # weights are stored in bf16; the CPU demo computes in fp32 unless --dtype says otherwise
    "bos_token_id": None, "eos_token_id": 2, "pad_token_id": 0,
}
TINY_OVERRIDES = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "layer_types": LAYER_TYPES[:4],
                  "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "linear_num_key_heads": 1,
                  "linear_num_value_heads": 2, "linear_key_head_dim": 32, "linear_value_head_dim": 32}


class MTPHead(nn.Module):
    """One Qwen3-Next / Qwen3.5 MTP layer (checkpoint names ``mtp.<name>``): from the main
    model's last hidden state at t (after its final norm) and the embedding of token t+1, the
    logits of token t+2::

        x_t = fc(cat[pre_fc_norm_embedding(embed(tok_{t+1})), pre_fc_norm_hidden(h_t)])  # [.., 2H] -> [.., H]
        logits_{t+2} = lm_head(norm(layers[0](x_t, rope position t)))   # layers[0]: a full-attention decoder layer

    ``embed`` and ``lm_head`` are the main model's (shared, not stored under ``mtp.``). The
    concatenation order (embedding first) is that of vLLM's and SGLang's qwen3_next_mtp."""

    def __init__(self, config) -> None:
        super().__init__()
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

        layer_config = copy.deepcopy(config)
        layer_config.layer_types = ["full_attention"]
        layer_config._attn_implementation = "sdpa"  # no mask is passed: sdpa then attends causally
        h, eps = config.hidden_size, config.rms_norm_eps
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(h, eps=eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(h, eps=eps)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(layer_config, 0)])
        self.norm = Qwen3_5RMSNorm(h, eps=eps)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=config.initializer_range)

    def forward(self, next_embeds: torch.Tensor, hidden: torch.Tensor, position_embeddings) -> torch.Tensor:
        """next_embeds, hidden: [B, T, H]; returns the normed MTP hidden state [B, T, H]."""
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(next_embeds), self.pre_fc_norm_hidden(hidden)], dim=-1))
        out = self.layers[0](x, position_embeddings=position_embeddings, attention_mask=None)
        return self.norm(out[0] if isinstance(out, tuple) else out)


def build(config_dict: dict, device: str):
    """(main model, MTP head), fp32, initialised from the current torch seed."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    fields = {k: v for k, v in config_dict.items() if k not in ("architectures", "model_type", "dtype")}
    config = Qwen3_5TextConfig(**fields)
    config._attn_implementation = "sdpa"
    model = Qwen3_5ForCausalLM(config).to(device)
    return model, MTPHead(model.config).to(device)


def load(model_dir: str, device: str = "cpu"):
    """(main model, MTP head), fp32, from a directory ``train.save`` wrote: the main model through
    transformers (its LM head tied to the embeddings), the MTP layer from the ``mtp.*`` tensors."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    tensors = load_file(f"{model_dir}/model.safetensors")
    mtp = MTPHead(model.config)
    mtp.load_state_dict({k[len("mtp."):]: v.float() for k, v in tensors.items() if k.startswith("mtp.")}, strict=True)
    return model, mtp.to(device)
