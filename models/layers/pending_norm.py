"""A decoder layer's residual add and the RMSNorm after it, left to the projection that reads
the normed rows at a decode row (`RMSNorm.add_and_norm(defer_to=kind)`): ops.linear (and
`linear_into_decode_conv`, `router_logits`) runs them inside its skinny launch. Re-exported by
ops.py, which decides where a launch can take them (`ops.add_norm_fusable`).
"""
from __future__ import annotations

import torch

from ...kernels.switch import fuse_add_norm_allowed, skinny_rows_limit, use_triton
from ...kernels import linear as _linear
from ...kernels import norm as _norm


class PendingAddNorm:
    """A decoder layer's residual add and the RMSNorm after it, left to the projection that reads
    the normed rows (`RMSNorm.add_and_norm(defer_to=kind)` at a decode row, `defer_add_norm`): the
    next `linear` (or `linear_into_decode_conv`, `router_logits`) runs the norm inside its skinny
    launch (kernels/linear's x_add_norm; the norm's sums of squares may add in another order than
    kernels/norm's, so a normed value can differ from the separate launch's by a rounding), which
    stores the normed and summed rows into `normed` and `summed`. Any other reader takes
    `tensor()`, which runs kernels/norm's add_rms_norm into the same tensors if no launch did yet.
    `summed` is the residual stream the layer keeps: filled, in stream order, before anything
    after the projection reads it."""

    __slots__ = ("x", "residual", "weight", "eps", "zero_centered", "summed", "normed", "done")

    def __init__(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 zero_centered: bool) -> None:
        self.x, self.residual, self.weight, self.eps, self.zero_centered = x, residual, weight, eps, zero_centered
        self.summed = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        self.normed = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        self.done = False

    @property
    def shape(self) -> torch.Size:
        return self.x.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.x.dtype

    @property
    def device(self) -> torch.device:
        return self.x.device

    @property
    def is_cuda(self) -> bool:
        return self.x.is_cuda

    def numel(self) -> int:
        return self.x.numel()

    def tensor(self) -> torch.Tensor:
        """The normed rows (their own launch unless a projection's launch computed them)."""
        if not self.done:
            _norm.add_rms_norm(self.x, self.residual, self.weight, self.eps, self.zero_centered,
                               out=(self.normed, self.summed))
            self.done = True
        return self.normed

    def kernel_input(self) -> "_linear.AddNormInput":
        """skinny_linear's x_add_norm; the norm counts as done from this launch on."""
        self.done = True
        return _linear.AddNormInput(self.residual, self.weight, self.eps, self.zero_centered, False,
                                    self.summed, self.normed)


def defer_add_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, zero_centered: bool,
                   consumer: str) -> bool:
    """Whether `RMSNorm.add_and_norm(x, residual, defer_to=consumer)` leaves the add and norm to the next
    projection's launch (a PendingAddNorm): a skinny row ([1, D] at batch-1 decode) on the kernel
    path, x and residual in one half dtype, a zero-centered norm or a weight in that dtype, D up to
    the kernel's whole-row limit, and HYBRID_SERVE_FUSE_ADD_NORM allowing the consumer's kind
    (kernels/switch.py's ADD_NORM_CONSUMERS: the module that reads the normed rows)."""
    return (x.dim() == 2 and 0 < x.shape[0] <= skinny_rows_limit() and use_triton(x)
            and x.dtype in (torch.bfloat16, torch.float16) and residual.dtype == x.dtype
            and residual.shape == x.shape and x.stride(-1) == 1 and residual.stride(-1) == 1
            and (zero_centered or weight.dtype == x.dtype) and x.shape[1] <= _linear.ADD_NORM_MAX_K
            and fuse_add_norm_allowed(consumer))


def resolve(x: "torch.Tensor | PendingAddNorm") -> torch.Tensor:
    """x itself, or a PendingAddNorm's normed rows (`PendingAddNorm.tensor`)."""
    return x.tensor() if isinstance(x, PendingAddNorm) else x
