"""Converters: checkpoints of stock models -> Hydra Ensemble state dicts and models.

Pure state-dict functions live in the per-source readers (``hf_bert``) and ``fuse``; ``api``
reads files, validates and builds models.
"""

from .api import SUPPORTED_ARCHS, convert_checkpoint, detect_arch
from .fuse import fuse_layer, head_rows, shared_tensor, unfuse_layer
from .hf_bert import bert_member_from_state_dict, fuse_bert, unfuse_bert
from .io import read_config, read_state_dict

__all__ = [
    "SUPPORTED_ARCHS",
    "bert_member_from_state_dict",
    "convert_checkpoint",
    "detect_arch",
    "fuse_bert",
    "fuse_layer",
    "head_rows",
    "read_config",
    "read_state_dict",
    "shared_tensor",
    "unfuse_bert",
    "unfuse_layer",
]
