from .._common import HAS_TRITON, missing_triton
from .ref import silu_and_mul_ref

if HAS_TRITON:
    from .triton_activation import silu_and_mul
else:
    silu_and_mul = missing_triton("silu_and_mul")

__all__ = ["silu_and_mul", "silu_and_mul_ref"]
