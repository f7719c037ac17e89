from .loader import check_tp_size, load_hf_config, load_model
from .registry import supported_architectures

__all__ = ["check_tp_size", "load_hf_config", "load_model", "supported_architectures"]
