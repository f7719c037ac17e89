"""What every model family provides to the engine, and the default weight loading.

A family subclasses `HybridForCausalLM` and sets, in `__init__`:
    self.layer_ids   : LayerIdMap (which global layers are attention / state)
and implements `forward(input_ids [T], positions [T], fb) -> hidden [T, H]`,
`state_spec(dtype)` and `kv_spec()`. Parameter names equal transformers' names after
`normalize_name`; each parameter may carry `weight_loader(param, full_tensor, name)`
that cuts this rank's shard.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

import torch
import torch.nn as nn

from ..mem_cache import StateSpec
from .layer_ids import LayerIdMap
from .layers.attention import AttentionHeads
from .layers.linear import copy_checked
from .layers.moe import PerExpertWeightLoader
from .forward_batch import ForwardBatch


@dataclass(frozen=True)
class KVSpec:
    num_kv_heads: int  # this rank's
    head_dim: int
    v_head_dim: int


class HybridForCausalLM(nn.Module):
    layer_ids: LayerIdMap
    # checkpoint prefixes rewritten before matching, first match wins: (pattern, replacement)
    name_rewrites: tuple[tuple[str, str], ...] = ()
    # checkpoint tensors that are knowingly not used (MTP heads, vision towers, ...)
    ignored_tensors: tuple[str, ...] = ()

    def state_spec(self, dtype: torch.dtype) -> StateSpec | None:
        raise NotImplementedError

    def kv_spec(self) -> KVSpec | None:
        """This rank's KV heads and head dims; None if the model has no attention layer."""
        if not self.layer_ids.num_attn_layers:
            return None
        heads = AttentionHeads.from_config(self.hf_config)
        return KVSpec(heads.num_kv_heads, heads.head_dim, heads.head_dim)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        raise NotImplementedError

    # ----- MTP heads (speculative decoding; models/mtp.py): submodule `mtp` once enabled --
    def enable_mtp(self) -> None:
        """Build the checkpoint's MTP layers (before loading weights), so `mtp.*` tensors load
        instead of being skipped. Families without MTP heads refuse."""
        raise ValueError(f"{type(self).__name__} has no MTP layers; speculative method 'mtp' needs a Qwen3-Next "
                         f"or Qwen3.5 checkpoint with mtp_num_hidden_layers >= 1")

    def mtp_forward(self, next_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                    fb: ForwardBatch) -> torch.Tensor:
        """One MTP step: next_ids [T] (x_{p+1}), hidden [T, H] (h_p or the previous step's
        output), positions [T] (p) -> the MTP hidden state [T, H] (see models/mtp.py)."""
        raise ValueError(f"{type(self).__name__} was built without MTP layers (enable_mtp)")

    @property
    def num_kv_layers(self) -> int:
        """KV pool layers: the target's attention layers, then the MTP layers' (if built)."""
        mtp = getattr(self, "mtp", None)
        return self.layer_ids.num_attn_layers + (mtp.num_kv_layers if mtp is not None else 0)

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """hidden: [N, H] -> logits [N, vocab] fp32 (written into out [N, vocab] when given)."""
        return self.lm_head(hidden, out=out)

    def normalize_name(self, name: str) -> str | None:
        """Checkpoint name -> parameter name; None for tensors we knowingly skip."""
        if any(re.match(p, name) for p in self.ignored_tensors):
            return None
        for pattern, repl in self.name_rewrites:
            if re.match(pattern, name):
                return re.sub(pattern, repl, name, count=1)
        return name

    def tied_embeddings(self) -> bool:
        return bool(getattr(self, "tie_word_embeddings", False))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load (name, tensor) pairs; returns the parameter names filled. Raises ValueError on
        an unexpected tensor or a shape mismatch, naming the tensor and both shapes."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        per_expert = PerExpertWeightLoader(self)  # one tensor per expert -> stacked experts
        for ckpt_name, tensor in weights:
            name = self.normalize_name(ckpt_name)
            if name is None or (name == "lm_head.weight" and self.tied_embeddings()):
                continue  # skipped on purpose; a tied head shares the embedding's parameter
            if per_expert(name, tensor, loaded):
                continue
            if name not in params:
                raise ValueError(f"unexpected tensor {ckpt_name!r} (shape {tuple(tensor.shape)}) in checkpoint")
            param = params[name]
            loader = getattr(param, "weight_loader", None)
            if loader is None:
                copy_checked(param, tensor, ckpt_name)
            else:
                loader(param, tensor, ckpt_name)
            loaded.add(name)
        return loaded

    def tie_weights(self) -> None:
        """With tied embeddings the LM head *is* the input embedding's parameter (one copy)."""
        if self.tied_embeddings():
            embeddings = [m for n, m in self.named_modules() if n.endswith("embed_tokens")]
            if len(embeddings) != 1:
                raise ValueError("tie_word_embeddings is set but the model has no single embed_tokens")
            self.lm_head.weight = embeddings[0].weight
