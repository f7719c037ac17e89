from .._common import HAS_TRITON, missing_triton
from .ref import gated_delta_rule_varlen_ref, gdn_gating_ref, l2norm_ref

if HAS_TRITON:
    from .triton_gating import gdn_gating
    from .triton_recurrent import gated_delta_rule_recurrent
else:
    gated_delta_rule_recurrent = missing_triton("gated_delta_rule_recurrent")
    gdn_gating = missing_triton("gdn_gating")

__all__ = ["gated_delta_rule_recurrent", "gated_delta_rule_varlen_ref", "gdn_gating", "gdn_gating_ref", "l2norm_ref"]
