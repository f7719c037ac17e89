from .ref import selective_state_update_varlen_ref

__all__ = ["selective_state_update_varlen_ref"]
