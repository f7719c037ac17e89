from .._common import HAS_TRITON, missing_triton
from .ref import rotary_neox_ref

if HAS_TRITON:
    from .triton_rotary import rotary_neox
else:
    rotary_neox = missing_triton("rotary_neox")

__all__ = ["rotary_neox", "rotary_neox_ref"]
