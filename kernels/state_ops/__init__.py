from .._common import HAS_TRITON, missing_triton
from .ref import commit_verified_state_ref, copy_state_slots_ref

if HAS_TRITON:
    from .triton_state_ops import commit_verified_state, copy_state_slots
else:
    commit_verified_state = missing_triton("commit_verified_state")
    copy_state_slots = missing_triton("copy_state_slots")

__all__ = ["commit_verified_state", "commit_verified_state_ref", "copy_state_slots", "copy_state_slots_ref"]
