from .ref import gated_delta_rule_varlen_ref, l2norm_ref

__all__ = ["gated_delta_rule_varlen_ref", "l2norm_ref"]
