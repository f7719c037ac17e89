from .._common import HAS_TRITON, missing_triton
from .ref import ConvSnapshotIndex, causal_conv1d_varlen_ref, conv_snapshot_index, snapshot_conv_windows_ref

if HAS_TRITON:
    from .triton_conv import causal_conv1d_varlen, snapshot_conv_windows
else:
    causal_conv1d_varlen = missing_triton("causal_conv1d_varlen")
    snapshot_conv_windows = missing_triton("snapshot_conv_windows")

__all__ = ["ConvSnapshotIndex", "causal_conv1d_varlen", "causal_conv1d_varlen_ref", "conv_snapshot_index",
           "snapshot_conv_windows", "snapshot_conv_windows_ref"]
