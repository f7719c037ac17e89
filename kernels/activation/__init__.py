from .._common import HAS_TRITON, missing_triton
from .ref import sigmoid_gate_mul_ref, silu_and_mul_ref

if HAS_TRITON:
    from .triton_activation import sigmoid_gate_mul, silu_and_mul
else:
    silu_and_mul = missing_triton("silu_and_mul")
    sigmoid_gate_mul = missing_triton("sigmoid_gate_mul")

__all__ = ["sigmoid_gate_mul", "sigmoid_gate_mul_ref", "silu_and_mul", "silu_and_mul_ref"]
