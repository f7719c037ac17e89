from .._common import HAS_TRITON, missing_triton
from .cpu import paged_attention_cpu
from .ref import merge_attention_parts_ref, paged_attention_ref, store_kv_ref
from .sdpa_extend import extend_attention_sdpa

if HAS_TRITON:
    from .triton_extend import extend_attention
    from .triton_merge import merge_attention_parts
    from .triton_paged import paged_attention, store_kv, warm_up_paged_attention
else:
    extend_attention = missing_triton("extend_attention")
    merge_attention_parts = missing_triton("merge_attention_parts")
    paged_attention = missing_triton("paged_attention")
    store_kv = missing_triton("store_kv")
    warm_up_paged_attention = missing_triton("warm_up_paged_attention")

__all__ = ["extend_attention", "extend_attention_sdpa", "merge_attention_parts", "merge_attention_parts_ref",
           "paged_attention", "paged_attention_cpu", "paged_attention_ref", "store_kv", "store_kv_ref", "warm_up_paged_attention"]
