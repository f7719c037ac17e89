"""Marking the varlen ops: where piecewise CUDA graphs cut (engine/runner/piecewise_graph.py).

Most ops of a step depend only on its token count T; the ops marked `varlen_op` depend on its
rows (their lengths, slots, checkpoints: the ForwardBatch). Piecewise CUDA graphs capture
everything between them per padded T and run them eagerly. While a capture runs,
VARLEN_HOOK[0] is its callback.
"""
from __future__ import annotations

import functools
import inspect

import torch

VARLEN_HOOK: list = [None]


def varlen_op(out_spec):
    """Mark a varlen op. out_spec(arguments by name) -> (shape, dtype) of its one output tensor
    (what a capture allocates inside the graph before running the op eagerly). A varlen op
    takes `out=`, a buffer of that shape its kernel path writes (its reference path may
    return a new tensor instead)."""
    def mark(fn):
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def run(*args, **kwargs):
            hook = VARLEN_HOOK[0]
            if hook is None:
                return fn(*args, **kwargs)
            return hook(fn, signature.bind(*args, **kwargs), out_spec)
        return run
    return mark


def out_like_v(a: dict) -> tuple[tuple[int, ...], torch.dtype]:
    """out_spec of an op whose output is shaped like its `v` argument."""
    return tuple(a["v"].shape), a["v"].dtype
