from .._common import HAS_TRITON, missing_triton
from .ref import ADD_NORM_MAX_K, AddNormInput, skinny_linear_ref

if HAS_TRITON:
    from .triton_linear import FEW_ROWS_MAX_ROWS, SKINNY_MAX_ROWS, few_rows_linear, skinny_linear
else:
    SKINNY_MAX_ROWS = FEW_ROWS_MAX_ROWS = 0
    skinny_linear = missing_triton("skinny_linear")
    few_rows_linear = missing_triton("few_rows_linear")

__all__ = ["ADD_NORM_MAX_K", "AddNormInput", "FEW_ROWS_MAX_ROWS", "SKINNY_MAX_ROWS", "few_rows_linear", "skinny_linear",
           "skinny_linear_ref"]
