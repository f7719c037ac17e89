"""Load a Hugging Face model directory: config, (sharded) safetensors, or dummy weights.

    model_dir/config.json
    model_dir/model.safetensors                      one file, or
    model_dir/model.safetensors.index.json + shards  ("weight_map": name -> file)
"""
from __future__ import annotations

import json
import os
import zlib
from typing import Iterator

import torch
from safetensors import safe_open
from tqdm.auto import tqdm

from ..distributed import tp_context
from .registry import model_class, resolve_architecture

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


def load_hf_config(model_dir: str, trust_remote_code: bool = False):
    """The transformers config of `model_dir`; the text config for multimodal wrappers.
    `trust_remote_code` lets transformers run the directory's own config code (off unless asked)."""
    from transformers import AutoConfig

    if not os.path.isdir(model_dir) or not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise ValueError(f"{model_dir!r} is not a model directory (no config.json)")
    try:
        config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    except Exception as exc:  # unknown model_type, malformed JSON, ...
        raise ValueError(f"cannot read the config of {model_dir!r}: {exc}") from exc
    arch = resolve_architecture(config)
    text_config = getattr(config, "text_config", None)
    # a multimodal wrapper, or its top-level config written by hand for the text model
    # (Qwen3_5Config with architectures=["Qwen3_5ForCausalLM"]): the text fields live below
    if text_config is not None and (arch.endswith("ForConditionalGeneration") or not hasattr(config, "hidden_size")):
        text_config.architectures = [arch]
        return text_config
    if not hasattr(config, "hidden_size") and not hasattr(config, "d_model"):
        raise ValueError(f"the config of {model_dir!r} ({type(config).__name__}, architectures={[arch]}) has no "
                         f"hidden_size: not a causal LM config")
    return config


def build_model(cls, hf_config, enable_mtp: bool = False):
    """`cls(hf_config)` in the current device/TP context (with its MTP layers if `enable_mtp`);
    a config lacking a field the architecture reads is a ValueError naming it, not an
    AttributeError from deep inside."""
    try:
        model = cls(hf_config)
        if enable_mtp:
            model.enable_mtp()
        return model
    except AttributeError as exc:
        missing = getattr(exc, "name", None) or str(exc)
        raise ValueError(f"{type(hf_config).__name__} lacks {missing!r}, which {cls.__name__} needs; "
                         f"is the config written for this architecture?") from exc


def resolve_dtype(dtype: str | torch.dtype, hf_config) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        cfg = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
        if isinstance(cfg, torch.dtype):
            return cfg
        return _DTYPES.get(str(cfg), torch.float32) if cfg else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {dtype!r}")
    return _DTYPES[dtype]


def checkpoint_files(model_dir: str) -> list[str]:
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        return [os.path.join(model_dir, name) for name in sorted(set(weight_map.values()))]
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.isfile(single):
        return [single]
    files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
    if not files:
        raise ValueError(f"no safetensors weights in {model_dir!r} (use load_format='dummy' for random weights)")
    return [os.path.join(model_dir, f) for f in files]


def iterate_checkpoint(model_dir: str, progress: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    files = checkpoint_files(model_dir)
    names_per_file = []
    for path in files:
        with safe_open(path, framework="pt") as f:
            names_per_file.append(list(f.keys()))
    total = sum(len(n) for n in names_per_file)
    bar = tqdm(total=total, desc="Loading weights", unit="tensor", disable=not progress)
    for path, names in zip(files, names_per_file):
        with safe_open(path, framework="pt") as f:
            for name in names:
                yield name, f.get_tensor(name)
                bar.update(1)
    bar.close()


def dummy_checkpoint(cls, hf_config, seed: int, device, enable_mtp: bool = False
                     ) -> Iterator[tuple[str, torch.Tensor]]:
    """Random full-size weights, as a checkpoint would hold them: each tensor drawn from its own
    generator seeded by (seed, name), so every TP rank gets the same model. N(0, 0.02) for
    matrices, N(0, 0.1) for vectors, 1 + N(0, 0.1) for norm weights that multiply (not zero-centered ones),
    rounded to bf16 values as a released bf16 checkpoint holds them (an fp32 model then computes on exactly
    the weights a bf16 one has).

    On a CUDA device the draw runs there (an 80B model's weights in seconds rather than the
    minutes a CPU generator takes per rank): equal on every GPU of one model, which is what the
    ranks of a replica are, but not equal to the CPU draw, which CPU runs and tests keep."""
    device = torch.device(device)
    draw_on = device if device.type == "cuda" else torch.device("cpu")
    with tp_context(rank=0, size=1), torch.device("meta"):  # the full model's names and shapes
        full = build_model(cls, hf_config, enable_mtp)
    full.tie_weights()
    modules = dict(full.named_modules())
    for name, param in full.named_parameters():
        gen = torch.Generator(device=draw_on).manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
        std = 0.02 if param.dim() > 1 else 0.1
        values = torch.randn(param.shape, generator=gen, device=draw_on).mul_(std)
        owner = name.rsplit(".", 1)[0]
        if param.dim() == 1 and "norm" in owner.rsplit(".", 1)[-1] and not getattr(modules.get(owner), "zero_centered", False):
            values += 1.0  # a norm that multiplies by its weight starts near 1, as trained ones are
        yield name, values.to(torch.bfloat16).float().to(device)
        del values


# config fields whose heads/groups are split across tensor-parallel ranks
_TP_SPLIT_FIELDS = ("num_attention_heads", "num_key_value_heads", "linear_num_key_heads", "linear_num_value_heads",
                    "mamba_num_heads", "n_groups", "intermediate_size")


def check_tp_size(model_dir: str, tp_size: int, trust_remote_code: bool = False) -> None:
    """Raise ValueError (naming the numbers) if tp_size does not divide the model's heads,
    experts or vocabulary shards; builds the model on the meta device, nothing is loaded."""
    if not isinstance(tp_size, int) or tp_size < 1:
        raise ValueError(f"tp_size must be an integer >= 1, got {tp_size!r}")
    hf_config = load_hf_config(model_dir, trust_remote_code)
    for attr in _TP_SPLIT_FIELDS:
        value = getattr(hf_config, attr, None)
        if attr in ("num_key_value_heads", "linear_num_key_heads") and isinstance(value, int) and value \
                and tp_size % value == 0:
            continue  # more ranks than KV / GDN key heads: each rank keeps a replica of one head
        if isinstance(value, int) and value % tp_size:
            raise ValueError(f"tp_size={tp_size} does not divide the model's {attr}={value}")
    cls = model_class(resolve_architecture(hf_config))
    with tp_context(rank=0, size=tp_size), torch.device("meta"):
        build_model(cls, hf_config)


def load_model(
    model_dir: str,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "cpu",
    load_format: str = "auto",
    seed: int = 0,
    progress: bool = True,
    trust_remote_code: bool = False,
    enable_mtp: bool = False,
):
    """Returns (model, hf_config, torch dtype). Raises ValueError naming any missing tensor.
    `enable_mtp`: also build and load the checkpoint's MTP layers (`mtp.*`, models/mtp.py)."""
    hf_config = load_hf_config(model_dir, trust_remote_code)
    torch_dtype = resolve_dtype(dtype, hf_config)
    cls = model_class(resolve_architecture(hf_config))
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch_dtype)
    try:
        with torch.device(device):
            model = build_model(cls, hf_config, enable_mtp)
    finally:
        torch.set_default_dtype(prev)
    model.tie_weights()
    if load_format in ("auto", "safetensors", "dummy"):
        weights = (dummy_checkpoint(cls, hf_config, seed, device, enable_mtp) if load_format == "dummy"
                   else iterate_checkpoint(model_dir, progress))
        loaded = model.load_weights(weights)
        missing = sorted(set(dict(model.named_parameters())) - loaded)
        if missing:
            params = dict(model.named_parameters())
            shown = ", ".join(f"{n} {tuple(params[n].shape)}" for n in missing[:10])
            raise ValueError(f"checkpoint {model_dir!r} lacks {len(missing)} tensors: {shown}")
    else:
        raise ValueError(f"load_format must be auto, safetensors or dummy, got {load_format!r}")
    for module in model.modules():  # e.g. fuse projections of the same input into one GEMM
        if hasattr(module, "post_load"):
            module.post_load()
    return model.eval(), hf_config, torch_dtype
