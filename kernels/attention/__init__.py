from .ref import paged_attention_ref, store_kv_ref

__all__ = ["paged_attention_ref", "store_kv_ref"]
