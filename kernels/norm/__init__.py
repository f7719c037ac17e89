from .._common import HAS_TRITON, missing_triton
from .ref import add_rms_norm_ref, gated_rms_norm_ref, grouped_gated_rms_norm_ref, rms_norm_ref

if HAS_TRITON:
    from .triton_norm import add_rms_norm, gated_rms_norm, grouped_gated_rms_norm, rms_norm
else:
    rms_norm = missing_triton("rms_norm")
    add_rms_norm = missing_triton("add_rms_norm")
    gated_rms_norm = missing_triton("gated_rms_norm")
    grouped_gated_rms_norm = missing_triton("grouped_gated_rms_norm")

__all__ = [
    "add_rms_norm", "add_rms_norm_ref", "gated_rms_norm", "gated_rms_norm_ref", "grouped_gated_rms_norm",
    "grouped_gated_rms_norm_ref", "rms_norm", "rms_norm_ref",
]
