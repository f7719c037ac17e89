from .._common import HAS_TRITON, missing_triton
from .ref import selective_state_update_varlen_ref

if HAS_TRITON:
    from .triton_ssd import ssd_chunked
    from .triton_ssm import selective_state_update_varlen
else:
    selective_state_update_varlen = missing_triton("selective_state_update_varlen")
    ssd_chunked = missing_triton("ssd_chunked")

__all__ = ["selective_state_update_varlen", "selective_state_update_varlen_ref", "ssd_chunked"]
