from .._common import HAS_TRITON, missing_triton
from .ref import gated_delta_rule_varlen_chunked_ref, gated_delta_rule_varlen_ref, gdn_gating_ref, l2norm_ref

if HAS_TRITON:
    from .triton_chunk import chunked_recurrence, gated_delta_rule_chunked
    from .triton_gating import gdn_gating
    from .triton_recurrent import gated_delta_rule_recurrent
else:
    chunked_recurrence = missing_triton("chunked_recurrence")
    gated_delta_rule_chunked = missing_triton("gated_delta_rule_chunked")
    gated_delta_rule_recurrent = missing_triton("gated_delta_rule_recurrent")
    gdn_gating = missing_triton("gdn_gating")

__all__ = ["chunked_recurrence", "gated_delta_rule_chunked", "gated_delta_rule_recurrent",
           "gated_delta_rule_varlen_chunked_ref", "gated_delta_rule_varlen_ref", "gdn_gating", "gdn_gating_ref",
           "l2norm_ref"]
