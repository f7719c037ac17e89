from .._common import HAS_TRITON, missing_triton
from .ref import fused_moe_ref, moe_topk_softmax_ref

if HAS_TRITON:
    from .triton_moe import fused_moe, moe_topk_softmax
else:
    fused_moe = missing_triton("fused_moe")
    moe_topk_softmax = missing_triton("moe_topk_softmax")

__all__ = ["fused_moe", "fused_moe_ref", "moe_topk_softmax", "moe_topk_softmax_ref"]
