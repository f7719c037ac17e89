"""Vocabulary-parallel embedding and LM head: rank r holds rows [r*V/tp, (r+1)*V/tp)."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import ops
from .linear import copy_checked
from ...distributed import all_gather_last_dim, all_reduce, tp_rank, tp_size


def _padded_vocab(vocab_size: int) -> int:
    return -(-vocab_size // tp_size()) * tp_size()


def _vocab_loader(vocab_size: int):
    def loader(param: torch.Tensor, full: torch.Tensor, name: str = "") -> None:
        if full.shape[0] != vocab_size or full.shape[1:] != param.shape[1:]:
            raise ValueError(
                f"shape mismatch for {name}: model ({vocab_size}, {param.shape[1]}), checkpoint {tuple(full.shape)}"
            )
        per_rank = param.shape[0]
        start = tp_rank() * per_rank
        part = full[start : min(start + per_rank, vocab_size)]
        param.data.zero_()
        copy_checked(param.data[: part.shape[0]], part, name)

    return loader


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.per_rank = _padded_vocab(vocab_size) // tp_size()
        self.start = tp_rank() * self.per_rank
        self.weight = nn.Parameter(torch.empty(self.per_rank, hidden_size))
        self.weight.weight_loader = _vocab_loader(vocab_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if tp_size() == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.start
        mask = (local < 0) | (local >= self.per_rank)
        out = F.embedding(local.masked_fill(mask, 0), self.weight)
        out = out.masked_fill(mask[:, None], 0)
        return all_reduce(out)


class ParallelLMHead(nn.Module):
    """logits = hidden W^T, gathered over ranks and cut to the true vocab size, in fp32 (the
    GEMM's fp32 accumulation kept, also for a bf16 model)."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.weight = nn.Parameter(torch.empty(_padded_vocab(vocab_size) // tp_size(), hidden_size))
        self.weight.weight_loader = _vocab_loader(vocab_size)

    def forward(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """hidden [T, H] -> logits [T, vocab] fp32; out: a [T, vocab] fp32 tensor to write them into
        (and return): on one rank without vocabulary padding the GEMM stores them there itself."""
        # fp32 sums, never rounded to bf16: bf16 logits are 1/16 apart near 10, so close
        # candidates tie exactly and the greedy pick turned on that rounding
        if out is not None and tp_size() == 1 and self.weight.shape[0] == self.vocab_size:
            return ops.linear_out(hidden, self.weight, out, out_dtype=torch.float32)
        logits = all_gather_last_dim(ops.linear(hidden, self.weight, out_dtype=torch.float32))
        logits = logits if logits.shape[-1] == self.vocab_size else logits[..., : self.vocab_size].contiguous()
        return logits if out is None else out.copy_(logits)
