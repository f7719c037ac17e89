"""Nemotron-H: a stack of single-mixer blocks, each `h = h + mixer(rmsnorm(h))`, where the mixer
is Mamba2 ('M'), attention without rotary ('*'), a relu2 MLP ('-') or a relu2 MoE ('E').

Matches transformers' NemotronHForCausalLM. Checkpoints name the backbone `backbone.`
(transformers renames it `model.`); MoE experts come per expert
(`experts.{e}.up_proj.weight`) or merged (`experts.up_proj [E, I, H]`): both load.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .base import HybridForCausalLM
from .layer_ids import ATTENTION, NONE, STATE, LayerIdMap
from .layers import (
    ColumnParallelLinear, PagedAttention, ParallelLMHead, ReplicatedLinear, RMSNorm, RowParallelLinear,
    VocabParallelEmbedding, copy_checked,
)
from .layers import ops
from .layers.attention import AttentionHeads
from .layers.linear import KVParallelLinear, LinearGroup, attach_segmented_loader, segmented_shard
from .layers.mamba2 import Mamba2Mixer
from ..distributed import all_reduce, divide, partial_sum_dtype, tp_rank, tp_size
from .forward_batch import ForwardBatch

# block type names (transformers 5 names, legacy names, pattern characters) -> pattern character
_BLOCK_CODES = {
    "linear_attention": "M", "mamba": "M", "M": "M",
    "full_attention": "*", "attention": "*", "*": "*",
    "mlp": "-", "-": "-",
    "moe": "E", "E": "E",
}
_LAYER_KIND = {"M": STATE, "*": ATTENTION, "-": NONE, "E": NONE}


def block_pattern(hf_config) -> str:
    """One character per layer ('M', '*', '-', 'E') from `layers_block_type` or `hybrid_override_pattern`."""
    types = getattr(hf_config, "layers_block_type", None)
    if not isinstance(types, (list, tuple)):
        types = list(getattr(hf_config, "hybrid_override_pattern", "") or "")
    bad = sorted({t for t in types if t not in _BLOCK_CODES})
    if bad or not types:
        raise ValueError(f"unsupported Nemotron-H block types {bad or types}; supported {sorted(_BLOCK_CODES)}")
    return "".join(_BLOCK_CODES[t] for t in types)


class NemotronHRMSNorm(RMSNorm):
    """`(w.float() * norm(x.float())).to(x.dtype)`: the weight multiply stays in fp32."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps, fp32_weight=True)


class NemotronHAttention(nn.Module):
    """Plain GQA attention: no rotary (position comes from the Mamba layers), no q/k norm, no bias."""

    def __init__(self, hf_config, attn_layer_id: int) -> None:
        super().__init__()
        heads = AttentionHeads.from_config(hf_config)
        self.head_dim, self.num_heads, self.num_kv_heads = heads.head_dim, heads.num_heads, heads.num_kv_heads
        total_heads, total_kv = heads.total_heads, heads.total_kv_heads
        h = hf_config.hidden_size
        self.q_proj = ColumnParallelLinear(h, total_heads * self.head_dim)
        self.k_proj = KVParallelLinear(h, total_kv, self.head_dim)
        self.v_proj = KVParallelLinear(h, total_kv, self.head_dim)
        self.o_proj = RowParallelLinear(total_heads * self.head_dim, h)
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim**-0.5, attn_layer_id)
        self.qkv = LinearGroup([self.q_proj, self.k_proj, self.v_proj])  # one GEMM after loading

    def post_load(self) -> None:
        self.qkv.fuse()

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        q, k, v = self.qkv(hidden)  # column slices of one output
        q = q.reshape(num_tokens, self.num_heads, self.head_dim)  # [T, Hq, D]
        k = k.reshape(num_tokens, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        return self.o_proj(self.attn(q, k, v, fb).reshape(num_tokens, -1))


class NemotronHMLP(nn.Module):
    """down_proj(relu2(up_proj(x))): no gate projection."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False) -> None:
        super().__init__()
        self.up_proj = ColumnParallelLinear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor, positions=None, fb: ForwardBatch | None = None) -> torch.Tensor:
        return self.down_proj(ops.relu2(self.up_proj(x)))


class NemotronHRouter(nn.Module):
    """Sigmoid scores; choice adds `e_score_correction_bias` and keeps the best `topk_group`
    of `n_group` groups (a group scores the sum of its best two); weights are the plain scores
    of the chosen experts, renormalised if `norm_topk_prob`, times `routed_scaling_factor`.
    Weight and bias are fp32 whatever the model dtype (as in transformers)."""

    def __init__(self, hf_config) -> None:
        super().__init__()
        self.num_experts = hf_config.n_routed_experts
        self.top_k = hf_config.num_experts_per_tok
        self.num_groups = hf_config.n_group
        self.topk_group = hf_config.topk_group
        self.norm_topk_prob = hf_config.norm_topk_prob
        self.scaling = float(hf_config.routed_scaling_factor)
        divide(self.num_experts, self.num_groups, "n_routed_experts / n_group")
        self.weight = nn.Parameter(torch.empty(self.num_experts, hf_config.hidden_size, dtype=torch.float32))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(self.num_experts, dtype=torch.float32))

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden: [T, hidden] -> (topk_weights [T, k] fp32, topk_ids [T, k] int64)."""
        scores = ops.router_logits(hidden, self.weight).sigmoid()  # [T, E]
        choice = scores + self.e_score_correction_bias.float()
        grouped = choice.view(-1, self.num_groups, self.num_experts // self.num_groups)  # [T, Gr, E/Gr]
        group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1)[0].sum(dim=-1)  # [T, Gr]
        group_ids = group_scores.topk(self.topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores).scatter_(1, group_ids, 1.0).bool()  # [T, Gr]
        expert_mask = group_mask[:, :, None].expand_as(grouped).reshape(-1, self.num_experts)
        choice = choice.masked_fill(~expert_mask, float("-inf"))
        topk_ids = choice.topk(self.top_k, dim=-1, sorted=False)[1]  # [T, k]
        topk_weights = scores.gather(1, topk_ids)
        if self.norm_topk_prob:
            topk_weights = topk_weights / (topk_weights.sum(dim=-1, keepdim=True) + 1e-20)
        return topk_weights * self.scaling, topk_ids


class NemotronHExperts(nn.Module):
    """Non-gated relu2 experts, weights merged as transformers keeps them:
    up_proj [E, I/tp, Hin], down_proj [E, Hin, I/tp] (intermediate dim split across ranks)."""

    def __init__(self, num_experts: int, input_dim: int, intermediate_size: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.intermediate_size = intermediate_size  # full, before sharding
        per_rank = divide(intermediate_size, tp_size(), "moe_intermediate_size")
        self.up_proj = nn.Parameter(torch.empty(num_experts, per_rank, input_dim))
        attach_segmented_loader(self.up_proj, [intermediate_size], dim=1)
        self.down_proj = nn.Parameter(torch.empty(num_experts, input_dim, per_rank))
        attach_segmented_loader(self.down_proj, [intermediate_size], dim=2)

    def load_expert(self, expert_id: int, proj: str, full: torch.Tensor, name: str) -> str:
        """One expert's checkpoint matrix (`PerExpertWeightLoader`): up_proj [I, Hin] (split
        on dim 0) or down_proj [Hin, I] (split on dim 1). Returns the parameter it wrote to."""
        if proj not in ("up_proj", "down_proj"):
            raise ValueError(f"unexpected tensor {name!r}: relu2 experts have no {proj}")
        if not 0 <= expert_id < self.num_experts:
            raise ValueError(f"{name}: expert {expert_id} out of range 0..{self.num_experts - 1}")
        part = segmented_shard(full, [self.intermediate_size], 0 if proj == "up_proj" else 1, tp_rank(), tp_size())
        copy_checked(getattr(self, proj).data[expert_id], part, name)
        return proj

    @staticmethod
    def checkpoint_parts(attr: str) -> int:
        return 1

    def forward(self, hidden: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """hidden: [T, Hin]; topk_*: [T, k] (fp32 weights: fp32 accumulation). Returns this rank's
        partial sum [T, Hin] (before all-reduce, in `partial_sum_dtype`):
        sum_k w[t, k] * down_e(relu2(up_e(hidden[t])))."""
        return ops.fused_moe(hidden, self.up_proj, self.down_proj, topk_weights, topk_ids, activation="relu2",
                             out_dtype=partial_sum_dtype(hidden.dtype))


class NemotronHMoE(nn.Module):
    """routed (optionally through a latent projection) + shared relu2 MLP."""

    def __init__(self, hf_config) -> None:
        super().__init__()
        h, bias = hf_config.hidden_size, bool(getattr(hf_config, "mlp_bias", False))
        latent = getattr(hf_config, "moe_latent_size", None)
        self.gate = NemotronHRouter(hf_config)
        self.experts = NemotronHExperts(hf_config.n_routed_experts, latent or h, hf_config.moe_intermediate_size)
        self.shared_experts = NemotronHMLP(h, hf_config.moe_shared_expert_intermediate_size, bias=bias)
        self.fc1_latent_proj = ReplicatedLinear(h, latent, bias=bias) if latent else None
        self.fc2_latent_proj = ReplicatedLinear(latent, h, bias=bias) if latent else None

    def forward(self, hidden: torch.Tensor, positions=None, fb: ForwardBatch | None = None) -> torch.Tensor:
        topk_weights, topk_ids = self.gate(hidden)
        routed = hidden if self.fc1_latent_proj is None else self.fc1_latent_proj(hidden)
        routed = all_reduce(self.experts(routed, topk_weights, topk_ids)).to(hidden.dtype)  # [T, Hin]
        if self.fc2_latent_proj is not None:
            routed = self.fc2_latent_proj(routed)
        return routed + self.shared_experts(hidden)


class NemotronHBlock(nn.Module):
    def __init__(self, hf_config, code: str, layer_id: int, layer_ids: LayerIdMap) -> None:
        super().__init__()
        self.norm = NemotronHRMSNorm(hf_config.hidden_size, hf_config.layer_norm_epsilon)
        if code == "M":
            self.mixer = Mamba2Mixer(hf_config, layer_ids.state_local(layer_id))
        elif code == "*":
            self.mixer = NemotronHAttention(hf_config, layer_ids.attn_local(layer_id))
        elif code == "-":
            self.mixer = NemotronHMLP(hf_config.hidden_size, hf_config.intermediate_size, bool(hf_config.mlp_bias))
        else:
            self.mixer = NemotronHMoE(hf_config)

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch,
                residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """`residual + mixer(norm(residual))` with the add deferred: takes the previous block's
        (mixer output, residual) and returns its own, the add fused into this block's norm
        (`ops.add_rms_norm`: the same bits as adding in the model dtype, then the norm).
        The first block passes its input as `hidden` and no residual."""
        if residual is None:
            normed, residual = self.norm(hidden), hidden
        else:
            normed, residual = ops.add_rms_norm(hidden, residual, self.norm.weight, self.norm.eps, fp32_weight=True)
        return self.mixer(normed, positions, fb), residual


class _Backbone(nn.Module):
    def __init__(self, hf_config, layers: list[nn.Module]) -> None:
        super().__init__()
        self.embeddings = VocabParallelEmbedding(hf_config.vocab_size, hf_config.hidden_size)
        self.layers = nn.ModuleList(layers)
        self.norm_f = NemotronHRMSNorm(hf_config.hidden_size, hf_config.layer_norm_epsilon)


class NemotronHForCausalLM(HybridForCausalLM):
    name_rewrites = ((r"^backbone\.", "model."),)
    ignored_tensors = (r"^mtp\.", r"^(backbone|model)\.mtp\.")

    def __init__(self, hf_config) -> None:
        super().__init__()
        mlp_act = getattr(hf_config, "mlp_hidden_act", "relu2")
        if mlp_act != "relu2":
            raise ValueError(f"mlp_hidden_act={mlp_act!r} is not supported (supported: 'relu2')")
        self.hf_config = hf_config
        self.pattern = block_pattern(hf_config)
        self.layer_ids = LayerIdMap([_LAYER_KIND[c] for c in self.pattern])
        layers = [NemotronHBlock(hf_config, c, i, self.layer_ids) for i, c in enumerate(self.pattern)]
        self.model = _Backbone(hf_config, layers)
        self.lm_head = ParallelLMHead(hf_config.vocab_size, hf_config.hidden_size)
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))

    def tied_embeddings(self) -> bool:
        # transformers' Nemotron-H never ties (`_tied_weights_keys = {}`): lm_head.weight is its own
        # tensor even with tie_word_embeddings=True; load_weights falls back to a copy if it is absent.
        return False

    def load_weights(self, weights):
        loaded = super().load_weights(weights)
        emb = "model.embeddings.weight"
        if self.tie_word_embeddings and "lm_head.weight" not in loaded and emb in loaded:
            self.lm_head.weight.data.copy_(self.model.embeddings.weight.data)
            loaded.add("lm_head.weight")
        return loaded

    def state_spec(self, dtype: torch.dtype):
        if self.layer_ids.num_state_layers == 0:
            return None
        return Mamba2Mixer.state_spec(self.hf_config, dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        hidden, residual = self.model.embeddings(input_ids), None  # [T, hidden]
        for layer in self.model.layers:
            hidden, residual = layer(hidden, positions, fb, residual)
        norm_f = self.model.norm_f
        return ops.add_rms_norm(hidden, residual, norm_f.weight, norm_f.eps, fp32_weight=True)[0]
