"""Converters: checkpoints of stock models -> Hydra Ensemble state dicts and models.

Pure state-dict functions live in the per-source readers (each family's :class:`Reader`: ``hf_bert``,
``hf_vit`` ...) and ``fuse``; ``build`` holds the
build helpers every family uses (read and check folders, labels, load the fused tensors); ``gguf`` turns a GGUF
checkpoint into a cached plain folder (:func:`materialize_gguf`). Nothing here
knows the family registry: :func:`hydra_hf.assemble.convert_checkpoint` (the stage that detects the
family and saves the folder) sits above it.
"""

from .build import base_config_dict, check_same_architecture, full_config, label_arguments, load_fused
from .fuse import fuse_layer, head_rows, shared_tensor, unfuse_layer
from .gguf import is_gguf, materialize_gguf
from .hf_bert import bert_member_from_state_dict, fuse_bert, unfuse_bert
from .hf_clip import CLIPMember, clip_member_from_state_dict, fuse_clip, unfuse_clip
from .hf_vit import ViTMember, fuse_vit, unfuse_vit, vit_member_from_state_dict
from .io import read_config, read_state_dict
from .open_clip import clip_tokenizer_from_open_clip, open_clip_member_from_state_dict
from .reader import Reader
from .timm_vit import timm_vit_member_from_state_dict

__all__ = [
    "CLIPMember",
    "Reader",
    "ViTMember",
    "bert_member_from_state_dict",
    "clip_member_from_state_dict",
    "clip_tokenizer_from_open_clip",
    "fuse_clip",
    "fuse_vit",
    "open_clip_member_from_state_dict",
    "timm_vit_member_from_state_dict",
    "unfuse_clip",
    "unfuse_vit",
    "vit_member_from_state_dict",
    "base_config_dict",
    "check_same_architecture",
    "full_config",
    "label_arguments",
    "load_fused",
    "fuse_bert",
    "fuse_layer",
    "head_rows",
    "is_gguf",
    "materialize_gguf",
    "read_config",
    "read_state_dict",
    "shared_tensor",
    "unfuse_bert",
    "unfuse_layer",
]
