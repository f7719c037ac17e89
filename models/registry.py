"""Model registry: config `architectures` / `model_type` -> our implementation (lazy import)."""
from __future__ import annotations

import importlib

# architecture name -> (module, class)
_ARCHITECTURES: dict[str, tuple[str, str]] = {
    "Qwen3_5ForCausalLM": ("qwen3_5", "Qwen3_5ForCausalLM"),
    "Qwen3_5ForConditionalGeneration": ("qwen3_5", "Qwen3_5ForCausalLM"),
    "Qwen3_5MoeForCausalLM": ("qwen3_5_moe", "Qwen3_5MoeForCausalLM"),
    "Qwen3_5MoeForConditionalGeneration": ("qwen3_5_moe", "Qwen3_5MoeForCausalLM"),
    "Qwen3NextForCausalLM": ("qwen3_next", "Qwen3NextForCausalLM"),
    "Lfm2ForCausalLM": ("lfm2", "Lfm2ForCausalLM"),
    "Lfm2MoeForCausalLM": ("lfm2_moe", "Lfm2MoeForCausalLM"),
    "NemotronHForCausalLM": ("nemotron_h", "NemotronHForCausalLM"),
    "BambaForCausalLM": ("bamba", "BambaForCausalLM"),
    "GraniteMoeHybridForCausalLM": ("granite_moe_hybrid", "GraniteMoeHybridForCausalLM"),
    "FalconH1ForCausalLM": ("falcon_h1", "FalconH1ForCausalLM"),
}
# model_type -> architecture, for configs without `architectures`
_MODEL_TYPES: dict[str, str] = {
    "qwen3_5_text": "Qwen3_5ForCausalLM",
    "qwen3_5": "Qwen3_5ForConditionalGeneration",
    "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
    "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
    "qwen3_next": "Qwen3NextForCausalLM",
    "lfm2": "Lfm2ForCausalLM",
    "lfm2_moe": "Lfm2MoeForCausalLM",
    "nemotron_h": "NemotronHForCausalLM",
    "bamba": "BambaForCausalLM",
    "granitemoehybrid": "GraniteMoeHybridForCausalLM",
    "falcon_h1": "FalconH1ForCausalLM",
}


def supported_architectures() -> list[str]:
    return sorted(_ARCHITECTURES)


def resolve_architecture(hf_config) -> str:
    for arch in getattr(hf_config, "architectures", None) or []:
        if arch in _ARCHITECTURES:
            return arch
    model_type = getattr(hf_config, "model_type", None)
    if model_type in _MODEL_TYPES:
        return _MODEL_TYPES[model_type]
    raise ValueError(
        f"unsupported model: architectures={getattr(hf_config, 'architectures', None)}, "
        f"model_type={model_type!r}; supported architectures: {', '.join(supported_architectures())}"
    )


def model_class(architecture: str):
    module_name, class_name = _ARCHITECTURES[architecture]
    module = importlib.import_module(f"{__package__}.{module_name}")
    return getattr(module, class_name)
