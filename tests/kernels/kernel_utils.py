"""Helpers for the kernel tests (imported by the test modules, which sit beside it)."""
from __future__ import annotations

import os

import pytest
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
DEVICE = "cpu" if INTERPRET or not torch.cuda.is_available() else "cuda"
HAS_CUDA_COMPILE = torch.cuda.is_available() and not INTERPRET


def require_triton():
    return pytest.importorskip("triton", reason="triton is not installed: the Triton kernels cannot be tested")


def gpu(fn):
    """Serving-shape test: marker `gpu`, skipped without a CUDA device (or under the interpreter)."""
    fn = pytest.mark.skipif(not HAS_CUDA_COMPILE, reason="needs a CUDA GPU with compiled Triton")(fn)
    return pytest.mark.gpu(fn)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """Relative RMS error; raises first if `got` has NaNs (= elements the kernel never wrote)."""
    assert got.shape == want.shape, f"shape {tuple(got.shape)} != {tuple(want.shape)}"
    nan = torch.isnan(got) & ~torch.isnan(want)
    assert not nan.any(), f"{int(nan.sum())} of {got.numel()} elements are NaN (not written?)"
    got, want = got.double(), want.double()
    denom = want.pow(2).mean().sqrt().clamp_min(1e-30)
    return float((got - want).pow(2).mean().sqrt() / denom)


def cu_seqlens(lens: list[int], device=DEVICE) -> torch.Tensor:
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def lens_id(lens) -> str:
    return "x".join(map(str, lens)) if len(lens) <= 6 else f"{len(lens)}rows"
