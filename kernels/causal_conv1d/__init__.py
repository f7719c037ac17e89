from .ref import causal_conv1d_varlen_ref

__all__ = ["causal_conv1d_varlen_ref"]
