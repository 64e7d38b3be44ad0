# Shipped with every Hydra Ensemble model folder (remote code): imports only the standard library,
# torch, transformers and sibling files.
"""Hydra Ensemble of a ViT image classifier: M head-pruned members run as one model in one pass.

Shared patch/position embeddings feed M residual streams. Every layer is ViT's pre-LN layer with
per-member LayerNorms before the fused self-attention (all members' kept heads in one attention call)
and before the MLP (averaged across members, or kept per member). Every member has its own final
LayerNorm and classifier on its CLS token; the prediction is the mean of the members' softmaxes.

The pre-LN layer (``HydraPreLNLayer``) is in ``hydra_layers.py``; the encoder and classifier skeletons and
the weight initialisation are in ``hydra_skeletons.py``, shared with the other pre-LN image families (DeiT, BEiT,
DINOv2).

Input images: ``pixel_values (B, C, H, W)`` must have the base's channel count and, unless
``interpolate_pos_encoding=True`` (bicubic interpolation of the position embeddings, as in
transformers' ``ViTForImageClassification``), the base's image size; anything else raises a
``ValueError`` that says how to fix it. Use the image processor saved with the model.
"""

from __future__ import annotations

from transformers import ViTConfig
from transformers.models.vit.modeling_vit import ViTEmbeddings

from .configuration_hydra_vit import HydraEnsembleViTConfig
from .hydra_skeletons import HydraPreLNVisionModel, HydraVisionForImageClassification, HydraVisionPreTrainedModel


class HydraEnsembleViTPreTrainedModel(HydraVisionPreTrainedModel):
    config_class = HydraEnsembleViTConfig
    base_config_class = ViTConfig
    embeddings_class = ViTEmbeddings
    _no_split_modules = ["ViTEmbeddings", "HydraPreLNLayer"]


class HydraEnsembleViTModel(HydraEnsembleViTPreTrainedModel, HydraPreLNVisionModel):
    """The fused ViT encoder: shared ViT embeddings, M residual streams, per-member final LayerNorms.

    ``AutoModel.from_pretrained(folder, trust_remote_code=True)`` returns this class. (A stock
    ``ViTModel``'s pooler is not part of it: image classification reads the CLS token.)
    """


class HydraEnsembleForImageClassification(HydraEnsembleViTPreTrainedModel, HydraVisionForImageClassification):
    """M pruned ViT classifiers in one model. ``logits`` = log of the mean of the members' softmaxes.

    ``AutoModelForImageClassification.from_pretrained(folder, trust_remote_code=True)`` and
    ``pipeline("image-classification", model=folder, trust_remote_code=True)`` use this class.
    """

    encoder_class = HydraEnsembleViTModel
