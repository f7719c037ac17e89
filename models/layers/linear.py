"""TP-aware linears. Weights keep transformers' names and layouts ([out, in]); each param
carries a `weight_loader(param, full_tensor)` that takes this rank's slice of the checkpoint.

ColumnParallelLinear may be made of several segments (`output_sizes`, e.g. GDN's q|k|v):
each segment is split across ranks on its own, so rank r holds [q_r | k_r | v_r].
"""
from __future__ import annotations

import torch
import torch.nn as nn

from . import ops
from ...distributed import all_reduce, divide, partial_sum_dtype, tp_rank, tp_size


def copy_checked(param: torch.Tensor, loaded: torch.Tensor, name: str = "") -> None:
    if tuple(param.shape) != tuple(loaded.shape):
        raise ValueError(f"shape mismatch for {name or 'tensor'}: model {tuple(param.shape)}, checkpoint {tuple(loaded.shape)}")
    param.data.copy_(loaded.to(param.dtype))


def heads_per_rank(total_heads: int, name: str) -> int:
    """Heads of one kind on this rank: split when tp divides them; with more ranks than heads
    each rank keeps one head, replicated tp/total_heads times (as GQA's KV heads)."""
    tp = tp_size()
    if total_heads >= tp:
        return divide(total_heads, tp, name)
    if tp % total_heads:
        raise ValueError(f"tp_size={tp} must divide or be a multiple of {name}={total_heads}")
    return 1


def segment_slice(seg: int, heads: int | None, rank: int, size: int) -> tuple[int, int]:
    """(start, length) of rank `rank`'s part of a segment of `seg` rows made of `heads` heads
    (None: any split). With more ranks than heads, rank r gets head r // (size / heads)::

        heads=2, size=4:   ranks 0 1 | 2 3
                           head  0 0 | 1 1
    """
    if heads is None or heads >= size:
        per_rank = divide(seg, size, "segment size")
        return rank * per_rank, per_rank
    if size % heads:
        raise ValueError(f"tp_size={size} must divide or be a multiple of {heads} heads")
    head_rows = divide(seg, heads, "segment rows per head")
    return rank // (size // heads) * head_rows, head_rows


def segmented_shard(full: torch.Tensor, sizes: list[int], dim: int, rank: int, size: int,
                    heads: list[int | None] | None = None) -> torch.Tensor:
    """This rank's slice of each segment along `dim`, concatenated. `heads[i]`: the number of
    heads segment i is made of, when a rank may hold a replica of one (`segment_slice`)."""
    if sum(sizes) != full.shape[dim]:
        raise ValueError(f"segments {sizes} do not add up to dim {dim} of shape {tuple(full.shape)}")
    parts, start = [], 0
    for seg, num_heads in zip(sizes, heads or [None] * len(sizes)):
        offset, length = segment_slice(seg, num_heads, rank, size)
        parts.append(full.narrow(dim, start + offset, length))
        start += seg
    return torch.cat(parts, dim=dim)


def segments_per_rank(sizes: list[int], heads: list[int | None] | None = None) -> int:
    """Rows this rank holds of the segments (`segmented_shard`'s output length)."""
    return sum(segment_slice(seg, h, 0, tp_size())[1] for seg, h in zip(sizes, heads or [None] * len(sizes)))


def attach_segmented_loader(param: nn.Parameter, sizes: list[int], dim: int,
                            heads: list[int | None] | None = None) -> None:
    def loader(p: torch.Tensor, full: torch.Tensor, name: str = "") -> None:
        if full.shape[dim] != sum(sizes):
            raise ValueError(
                f"shape mismatch for {name}: model expects {sum(sizes)} along dim {dim} before sharding, "
                f"checkpoint {tuple(full.shape)}"
            )
        copy_checked(p, segmented_shard(full, sizes, dim, tp_rank(), tp_size(), heads), name)

    param.weight_loader = loader


class ColumnParallelLinear(nn.Module):
    """y = x W^T (+b), output features split across ranks. Weight: [sum(out)/tp, in].
    `heads`: per segment, the heads it is made of, where a rank may hold a replica of one
    (more ranks than heads, e.g. GDN's 2 key heads at tp=4: `segment_slice`)."""

    def __init__(self, input_size: int, output_sizes: int | list[int], bias: bool = False,
                 heads: list[int | None] | None = None) -> None:
        super().__init__()
        sizes = [output_sizes] if isinstance(output_sizes, int) else list(output_sizes)
        self.output_sizes = sizes
        self.output_size_per_rank = segments_per_rank(sizes, heads)
        self.weight = nn.Parameter(torch.empty(self.output_size_per_rank, input_size))
        attach_segmented_loader(self.weight, sizes, dim=0, heads=heads)
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(self.output_size_per_rank))
            attach_segmented_loader(self.bias, sizes, dim=0, heads=heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = all_reduce(x_r W_r^T) (+b), input features split across ranks. Weight: [out, in/tp]."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__()
        self.input_size_per_rank = divide(input_size, tp_size(), "input size")
        self.weight = nn.Parameter(torch.empty(output_size, self.input_size_per_rank))
        attach_segmented_loader(self.weight, [input_size], dim=1)
        self.bias = nn.Parameter(torch.empty(output_size)) if bias else None

    def forward(self, x: torch.Tensor, x_silu_and_mul: bool = False, **x_op) -> torch.Tensor:
        """x_silu_and_mul: x is [..., 2 * in/tp] (gate | up) and the input is silu(gate) * up;
        x_op: `x_sigmoid_gate=` or `x_gated_norm=`, another operation on x giving the input
        (ops.linear: each in the skinny kernel's launch at one row)."""
        model_dtype = self.weight.dtype if x_silu_and_mul else x.dtype
        if partial_sum_dtype(model_dtype) != model_dtype:  # fp32 partial sums, rounded once after the reduce
            y = all_reduce(ops.linear(x, self.weight, out_dtype=torch.float32,
                                      x_silu_and_mul=x_silu_and_mul, **x_op)).to(model_dtype)
        else:
            y = all_reduce(ops.linear(x, self.weight, x_silu_and_mul=x_silu_and_mul, **x_op))
        return y if self.bias is None else y + self.bias

    def partial(self, x: torch.Tensor, out_dtype: torch.dtype, x_silu_and_mul: bool = False) -> torch.Tensor:
        """x_r W_r^T in out_dtype, not reduced (the caller all-reduces; no bias: it would be
        added once per rank). x_silu_and_mul: as `forward`."""
        if self.bias is not None:
            raise ValueError("a partial sum of a row-parallel linear with a bias is not defined")
        return ops.linear(x, self.weight, out_dtype=out_dtype, x_silu_and_mul=x_silu_and_mul)


class ReplicatedLinear(nn.Module):
    """Same weight on every rank (small projections, routers)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(output_size, input_size))
        self.bias = nn.Parameter(torch.empty(output_size)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.linear(x, self.weight, self.bias)


def kv_heads_per_rank(total_kv_heads: int) -> int:
    """KV heads on this rank: split when tp divides them; with more ranks than KV heads each
    rank keeps one head, replicated tp/num_kv_heads times (GQA with tp > num_kv_heads)."""
    return heads_per_rank(total_kv_heads, "num_key_value_heads")


class KVParallelLinear(nn.Module):
    """k_proj / v_proj: output heads split across ranks, or, when tp > num_kv_heads, rank r
    holds the single head r // (tp / num_kv_heads). Weight: [heads_on_rank * head_dim, in]."""

    def __init__(self, input_size: int, total_kv_heads: int, head_dim: int, bias: bool = False) -> None:
        super().__init__()
        self.num_heads = kv_heads_per_rank(total_kv_heads)
        tp = tp_size()
        first_head = tp_rank() * self.num_heads if total_kv_heads >= tp else tp_rank() // (tp // total_kv_heads)
        rows = slice(first_head * head_dim, (first_head + self.num_heads) * head_dim)
        out = total_kv_heads * head_dim

        def loader(p: torch.Tensor, full: torch.Tensor, name: str = "") -> None:
            if full.shape[0] != out:
                raise ValueError(f"shape mismatch for {name}: model expects {out} rows before sharding, "
                                 f"checkpoint {tuple(full.shape)}")
            copy_checked(p, full[rows], name)

        self.weight = nn.Parameter(torch.empty(self.num_heads * head_dim, input_size))
        self.weight.weight_loader = loader
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(self.num_heads * head_dim))
            self.bias.weight_loader = loader

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.linear(x, self.weight, self.bias)


class LinearGroup:
    """Linears over the same input, run as one GEMM once `fuse()` has re-pointed their weights
    into one tensor (after loading). The parts keep their parameters, names and loaders;
    before `fuse()` (e.g. in unit tests) each part runs on its own. Not an nn.Module, so the
    parameters are not registered twice. Call returns one output per part."""

    def __init__(self, parts: list[nn.Module]) -> None:
        self.parts = parts
        self.weight: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None
        self.sizes: list[int] = []

    def fuse(self) -> None:
        weights = [p.weight for p in self.parts]
        if any(w.device != weights[0].device or w.dtype != weights[0].dtype for w in weights):
            raise ValueError("a linear group must share device and dtype")
        self.sizes = [w.shape[0] for w in weights]
        fused = torch.cat([w.data for w in weights])  # [sum(out), in]
        for w, view in zip(weights, fused.split(self.sizes)):
            w.data = view  # one storage: no second copy of the weights
        self.weight = fused
        biases = [p.bias for p in self.parts]
        if all(b is not None for b in biases):
            self.bias = torch.cat([b.data for b in biases])
            for b, view in zip(biases, self.bias.split(self.sizes)):
                b.data = view
        elif any(b is not None for b in biases):
            raise ValueError("a linear group needs biases on all parts or none")

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        if self.weight is None:
            return [p(x) for p in self.parts]
        return list(ops.linear(x, self.weight, self.bias).split(self.sizes, dim=-1))  # column slices

    def concatenated(self, x: torch.Tensor) -> torch.Tensor:
        """The parts' outputs side by side, [..., sum(out)]: one GEMM once fused."""
        if self.weight is None:
            return torch.cat([p(x) for p in self.parts], dim=-1)
        return ops.linear(x, self.weight, self.bias)
