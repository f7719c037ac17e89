from .._common import HAS_TRITON, missing_triton
from .ref import DecodeFields, decode_batch_fields_ref

if HAS_TRITON:
    from .triton_batch_meta import decode_batch_fields
else:
    decode_batch_fields = missing_triton("decode_batch_fields")

__all__ = ["DecodeFields", "decode_batch_fields", "decode_batch_fields_ref"]
