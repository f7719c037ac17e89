from .._common import HAS_TRITON, missing_triton
from .ref import commit_verified_state_ref, copy_state_slots_ref, replay_gdn_state_ref

if HAS_TRITON:
    from .triton_state_ops import commit_verified_state, copy_state_slots, replay_gdn_state
else:
    commit_verified_state = missing_triton("commit_verified_state")
    copy_state_slots = missing_triton("copy_state_slots")
    replay_gdn_state = missing_triton("replay_gdn_state")

__all__ = ["commit_verified_state", "commit_verified_state_ref", "copy_state_slots", "copy_state_slots_ref",
           "replay_gdn_state", "replay_gdn_state_ref"]
