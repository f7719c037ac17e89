"""Tiny transformers reference models, saved with save_pretrained, every weight perturbed.

Kernel packages (fla, causal-conv1d, mamba-ssm) are blocked before transformers is
imported so that it takes its own torch path: the reference must be transformers' code.
"""
from __future__ import annotations

import sys

for _pkg in ("fla", "causal_conv1d", "mamba_ssm"):
    sys.modules.setdefault(_pkg, None)

import torch  # noqa: E402


def perturb_(model: torch.nn.Module, seed: int = 0, scale: float = 0.1) -> None:
    """p += scale * randn for every parameter, so default norms/gates cannot hide a missing weight."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            p.add_(scale * torch.randn(p.shape, generator=gen, dtype=torch.float32).to(p.dtype))


def build_reference(family: str, out_dir: str, seed: int = 0, **overrides):
    """Build, perturb and save a tiny fp32 model of `family`; returns the transformers model."""
    import transformers

    torch.manual_seed(seed)
    config = family_config(family, **overrides)
    cls = getattr(transformers, family_class_name(family))
    model = cls(config).eval()
    perturb_(model, seed)
    perturb_buffers = getattr(_family_module(family), "perturb_buffers", None)
    if perturb_buffers is not None:  # saved buffers a family's forward reads (e.g. a routing bias)
        with torch.no_grad():
            perturb_buffers(model, torch.Generator().manual_seed(seed + 1))
    model.save_pretrained(out_dir)
    return model


def _family_module(family: str):
    import importlib

    return importlib.import_module(f"family_{family}")


def family_config(family: str, **overrides):
    """The tiny transformers config of `family` (tests/models/family_<family>.py: `config(**kw)`)."""
    return _family_module(family).config(**overrides)


def family_class_name(family: str) -> str:
    return _family_module(family).HF_CLASS


FAMILIES = ("qwen3_5", "qwen3_next", "lfm2", "nemotron_h", "qwen3_5_moe", "lfm2_moe", "bamba",
            "granite_moe_hybrid", "falcon_h1")
