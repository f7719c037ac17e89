"""Fixes for Triton's CPU interpreter (TRITON_INTERPRET=1), applied on import when it is on.

Seen with triton 3.6 and NumPy 2.4; compiled (GPU) kernels never see any of this:

1. Scalars loaded from memory are 1-element arrays of shape (1,); the interpreter turns them
   into Python ints with `int(array)`, a TypeError since NumPy 2.4, so a loop such as
   `for t in range(start, end)` with loaded bounds fails. Read the single element instead.
2. `tl.dot` on bfloat16 operands multiplies their uint16 storage. Widen bf16 to fp32 (exact)
   first.
3. fp32 -> bf16 casts truncate. Round to nearest even, as the GPU does.

Each patch is skipped when the interpreter lacks the function it wraps (other versions).
"""
from __future__ import annotations

import os


def _wrap(owner, name: str, make_wrapper) -> None:
    """Replace owner.name by make_wrapper(original), once; skipped where owner lacks it."""
    original = getattr(owner, name, None)
    if original is None or getattr(original, "_hybrid_serve_compat", False):
        return
    wrapper = make_wrapper(original)
    wrapper._hybrid_serve_compat = True
    setattr(owner, name, wrapper)


def _patch_scalar_index(interpreter, np) -> None:
    def make(original):
        def patched(tensor, scope):
            original(tensor, scope)
            scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))
        return patched

    _wrap(interpreter, "_patch_lang_tensor", make)


def _patch_bf16_dot(interpreter, np, tl) -> None:
    def widen(h):
        if h.dtype != tl.bfloat16:
            return h
        bits = np.asarray(h.data).astype(np.uint32) << np.uint32(16)
        return interpreter.TensorHandle(bits.view(np.float32), tl.float32)

    def make(original):
        def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
            return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)
        return create_dot

    _wrap(getattr(interpreter, "InterpreterBuilder", None), "create_dot", make)


def _patch_bf16_rounding(interpreter, np, tl) -> None:
    def make(original):
        def cast_impl(self, src, dst_type):
            if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
                f32 = np.asarray(src.data, dtype=np.float32)
                bits = f32.view(np.uint32)
                rounded = (bits + (((bits >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF))) >> np.uint32(16)
                out = np.where(np.isnan(f32), np.uint32(0x7FC0), rounded).astype(np.uint16)
                return interpreter.TensorHandle(out, dst_type.scalar)
            return original(self, src, dst_type)
        return cast_impl

    _wrap(getattr(interpreter, "InterpreterBuilder", None), "cast_impl", make)


def apply() -> None:
    if os.environ.get("TRITON_INTERPRET", "0") != "1":
        return
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    _patch_scalar_index(interpreter, np)
    _patch_bf16_dot(interpreter, np, tl)
    _patch_bf16_rounding(interpreter, np, tl)


apply()
