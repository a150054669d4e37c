"""Deterministic replacements, one module per patched op.

Importing this package registers every patch with `tfdet._graph._patching`; it
installs nothing. `tfdet.enable()` installs the ones the running versions need
(see `tfdet/_graph/hazards.json`, `patches`). Each module cites the upstream issue it
answers and builds its replacement only from ops that are deterministic on
GPU and stay on the device.
"""

from tfdet.patches import (
    adjust_contrast,
    bincount,
    confusion_matrix_scatter,
    crop_and_resize_grad,
    cudnn_rnn,
    fused_batch_norm_frozen,
    resize_nearest_grad,
    sparse_dense_matmul,
    sparse_optimizer_update,
)

__all__ = [
    "adjust_contrast",
    "bincount",
    "confusion_matrix_scatter",
    "crop_and_resize_grad",
    "cudnn_rnn",
    "fused_batch_norm_frozen",
    "resize_nearest_grad",
    "sparse_dense_matmul",
    "sparse_optimizer_update",
]
