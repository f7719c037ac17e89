from .loader import load_hf_config, load_model
from .registry import supported_architectures

__all__ = ["load_hf_config", "load_model", "supported_architectures"]
