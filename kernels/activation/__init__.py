from .._common import HAS_TRITON, missing_triton
from .ref import relu2_ref, sigmoid_gate_mul_ref, silu_and_mul_ref

if HAS_TRITON:
    from .triton_activation import relu2, sigmoid_gate_mul, silu_and_mul
else:
    silu_and_mul = missing_triton("silu_and_mul")
    sigmoid_gate_mul = missing_triton("sigmoid_gate_mul")
    relu2 = missing_triton("relu2")

__all__ = ["relu2", "relu2_ref", "sigmoid_gate_mul", "sigmoid_gate_mul_ref", "silu_and_mul", "silu_and_mul_ref"]
