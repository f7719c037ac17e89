from .._common import HAS_TRITON, missing_triton
from .ref import skinny_linear_ref

if HAS_TRITON:
    from .triton_linear import SKINNY_MAX_ROWS, skinny_linear
else:
    SKINNY_MAX_ROWS = 0
    skinny_linear = missing_triton("skinny_linear")

__all__ = ["SKINNY_MAX_ROWS", "skinny_linear", "skinny_linear_ref"]
