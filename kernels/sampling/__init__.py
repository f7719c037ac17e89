from .._common import HAS_TRITON, missing_triton
from .ref import masked_logits_ref, masked_logits_row_ref

if HAS_TRITON:
    from .triton_sampling import masked_logits, sample_tokens
else:
    masked_logits = missing_triton("masked_logits")
    sample_tokens = missing_triton("sample_tokens")

__all__ = ["masked_logits", "masked_logits_ref", "masked_logits_row_ref", "sample_tokens"]
