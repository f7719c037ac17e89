from .._common import HAS_TRITON, missing_triton
from .ref import greedy_argmax_ref, masked_logits_ref, masked_logits_row_ref

if HAS_TRITON:
    from .triton_sampling import greedy_argmax, masked_logits, sample_tokens
else:
    greedy_argmax = missing_triton("greedy_argmax")
    masked_logits = missing_triton("masked_logits")
    sample_tokens = missing_triton("sample_tokens")

__all__ = ["greedy_argmax", "greedy_argmax_ref", "masked_logits", "masked_logits_ref", "masked_logits_row_ref",
           "sample_tokens"]
