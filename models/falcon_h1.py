"""Falcon-H1 (TII): every layer runs attention and Mamba2 side by side on the same normed input,
then a SwiGLU MLP, with muP multipliers throughout:

    h = embed(ids) * embedding_multiplier
    x = input_layernorm(h)
    h = h + mamba(x) * ssm_out_multiplier + self_attn(x * attention_in_multiplier) * attention_out_multiplier
    h = h + feed_forward(pre_ff_layernorm(h))      down(up(y) * silu(gate(y) * m_gate)) * m_down
    logits = lm_head(final_layernorm(h)) * lm_head_multiplier

Matches transformers' FalconH1ForCausalLM. Attention: Llama-style, keys times `key_multiplier`,
rotary over the whole head. Mamba2 (`mamba.*`): inner width `mamba_d_ssm` (or mamba_expand *
hidden), `in_proj(x * ssm_in_multiplier)` scaled per segment [z | x | B | C | dt] by
`ssm_multipliers`; the output is gated `y * silu(z)` with no norm unless `mamba_rms_norm`
(then a grouped RMSNorm, before or after the gate as `mamba_norm_before_gate` says);
`out_proj` has bias `projectors_bias`.

Each layer has a KV layer and a state layer: the layer-id map lists two sublayers per layer,
Mamba2 at 2i and attention at 2i+1, so layer i reads state-local id i and attention-local id i.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .base import HybridForCausalLM
from .bamba import BambaAttention, BambaBackbone, BambaMixer, check_silu
from .layers import ColumnParallelLinear, ParallelLMHead, RMSNorm, RowParallelLinear
from .layers import ops
from .layers.attention import AttentionHeads
from .layers.linear import LinearGroup
from .layer_ids import ATTENTION, STATE, LayerIdMap
from .forward_batch import ForwardBatch


def mamba_inner_size(hf_config) -> int:
    d_ssm = getattr(hf_config, "mamba_d_ssm", None)
    return int(d_ssm) if d_ssm is not None else int(hf_config.mamba_expand * hf_config.hidden_size)


class FalconH1Mixer(BambaMixer):
    """Bamba's Mamba2 with Falcon-H1's input multipliers, optional output norm and out_proj bias."""

    def __init__(self, hf_config, state_layer_id: int) -> None:
        inner = mamba_inner_size(hf_config)
        super().__init__(hf_config, state_layer_id, intermediate_size=inner)
        if bool(getattr(hf_config, "projectors_bias", False)) != (self.out_proj.bias is not None):
            self.out_proj = RowParallelLinear(inner, hf_config.hidden_size, bias=bool(hf_config.projectors_bias))
        self.ssm_in_multiplier = float(hf_config.ssm_in_multiplier)
        self.use_norm = bool(hf_config.mamba_rms_norm)
        self.norm_before_gate = bool(getattr(hf_config, "mamba_norm_before_gate", True))
        if not self.use_norm:
            self.norm = None  # no norm weight in the checkpoint
        # this rank's in_proj segments [z | x | B | C | dt], each scaled by its ssm multiplier
        sizes = [self.inner, self.inner, self.bc_dim, self.bc_dim, self.num_heads]
        if len(hf_config.ssm_multipliers) != 5:
            raise ValueError(f"ssm_multipliers must have 5 entries, got {hf_config.ssm_multipliers}")
        mup = torch.cat([torch.full((n,), float(m)) for n, m in zip(sizes, hf_config.ssm_multipliers)])
        self.register_buffer("mup_vector", mup, persistent=False)  # [in_proj rows / tp]

    def output_norm(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """y: [T, H*P] fp32 scan output; z: [T, H*P] gate -> [T, H*P] fp32."""
        if not self.use_norm:
            return y * F.silu(z.float())
        if not self.norm_before_gate:  # gate, then normalise per group
            return self.norm(y, z, torch.float32)
        return self.norm.normalize(y) * F.silu(z.float())  # normalise per group, then gate

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """hidden: [T, hidden] (normed) -> [T, hidden]. Reads and updates this layer's pooled state."""
        num_tokens = hidden.shape[0]
        conv_states = fb.state_pool.conv_states[self.state_layer_id]  # [S+1, conv_dim, K-1]
        ssm_states = fb.state_pool.ssm_states[self.state_layer_id]  # [S+1, H, P, N]
        projected = self.in_proj(hidden * self.ssm_in_multiplier) * self.mup_vector
        conv_dim = self.inner + 2 * self.bc_dim
        z, xbc, dt = torch.split(projected, [self.inner, conv_dim, self.num_heads], dim=-1)
        xbc = ops.causal_conv1d(xbc, self.conv1d.weight[:, 0, :], self.conv1d.bias, conv_states, fb, "silu")
        x, B, C = torch.split(xbc, [self.inner, self.bc_dim, self.bc_dim], dim=-1)
        y = ops.selective_state_update(
            x.reshape(num_tokens, self.num_heads, self.head_dim), dt, self.decay_rate(),
            B.reshape(num_tokens, self.num_groups, self.d_state), C.reshape(num_tokens, self.num_groups, self.d_state),
            self.D, self.dt_bias, ssm_states, fb, dt_softplus=True, dt_limit=self.dt_limit, out_dtype=torch.float32,
        )  # [T, H, P] fp32
        y = self.output_norm(y.reshape(num_tokens, self.inner), z)
        return self.out_proj(y.to(hidden.dtype))


class FalconH1MLP(nn.Module):
    """down(up(x) * silu(gate(x) * gate_multiplier)) * down_multiplier; gate/up column-parallel."""

    def __init__(self, hf_config) -> None:
        super().__init__()
        h, i, bias = hf_config.hidden_size, hf_config.intermediate_size, bool(getattr(hf_config, "mlp_bias", False))
        self.gate_multiplier, self.down_multiplier = (float(m) for m in hf_config.mlp_multipliers)
        self.gate_proj = ColumnParallelLinear(h, i, bias=bias)
        self.up_proj = ColumnParallelLinear(h, i, bias=bias)
        self.down_proj = RowParallelLinear(i, h, bias=bias)
        self.gate_up = LinearGroup([self.gate_proj, self.up_proj])

    def post_load(self) -> None:
        self.gate_up.fuse()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x)  # [T, I/tp] each
        return self.down_proj(up * F.silu(gate * self.gate_multiplier)) * self.down_multiplier


class FalconH1DecoderLayer(nn.Module):
    def __init__(self, hf_config, layer_id: int, layer_ids: LayerIdMap) -> None:
        super().__init__()
        h, eps = hf_config.hidden_size, hf_config.rms_norm_eps
        self.mamba = FalconH1Mixer(hf_config, layer_ids.state_local(2 * layer_id))
        self.self_attn = BambaAttention(hf_config, layer_ids.attn_local(2 * layer_id + 1),
                                        AttentionHeads.from_config(hf_config).head_dim,
                                        key_multiplier=hf_config.key_multiplier)
        self.feed_forward = FalconH1MLP(hf_config)
        self.input_layernorm = RMSNorm(h, eps)
        self.pre_ff_layernorm = RMSNorm(h, eps)
        self.attention_in_multiplier = float(hf_config.attention_in_multiplier)
        self.attention_out_multiplier = float(hf_config.attention_out_multiplier)
        self.ssm_out_multiplier = float(hf_config.ssm_out_multiplier)

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden: the previous layer's MLP output (or the scaled embeddings, with residual None);
        returns (this layer's MLP output, the residual stream before it)."""
        x, residual = self.input_layernorm.add_and_norm(hidden, residual)
        mixed = self.mamba(x, positions, fb) * self.ssm_out_multiplier
        attended = self.self_attn(x * self.attention_in_multiplier, positions, fb) * self.attention_out_multiplier
        hidden, residual = self.pre_ff_layernorm.add_and_norm(mixed + attended, residual)
        return self.feed_forward(hidden), residual


class FalconH1ForCausalLM(HybridForCausalLM):
    def __init__(self, hf_config) -> None:
        super().__init__()
        check_silu(hf_config)
        self.hf_config = hf_config
        self.embedding_multiplier = float(hf_config.embedding_multiplier)
        self.lm_head_multiplier = float(hf_config.lm_head_multiplier)
        num_layers = hf_config.num_hidden_layers
        self.layer_ids = LayerIdMap([STATE, ATTENTION] * num_layers)  # (mamba, attention) per layer
        layers = [FalconH1DecoderLayer(hf_config, i, self.layer_ids) for i in range(num_layers)]
        self.model = BambaBackbone(hf_config, layers)
        self.lm_head = ParallelLMHead(hf_config.vocab_size, hf_config.hidden_size)
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))

    def state_spec(self, dtype: torch.dtype):
        return BambaMixer.state_spec(self.hf_config, dtype, intermediate_size=mamba_inner_size(self.hf_config))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """input_ids, positions: [T] -> hidden [T, H] after the final norm."""
        hidden, residual = self.model.embed_tokens(input_ids) * self.embedding_multiplier, None
        for layer in self.model.layers:
            hidden, residual = layer(hidden, positions, fb, residual)
        return self.model.final_layernorm.add_and_norm(hidden, residual)[0]

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """hidden: [N, H] -> logits [N, vocab] fp32, times `lm_head_multiplier` (into out when given)."""
        if out is not None:
            return self.lm_head(hidden, out=out).mul_(self.lm_head_multiplier)
        return self.lm_head(hidden) * self.lm_head_multiplier
