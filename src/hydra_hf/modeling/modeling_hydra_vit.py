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

# Route of forward: what HydraEnsembleForImageClassification(...) runs, file: function,
# each call under its caller, in the order they first run (members of unequal widths; written by
# tools/route_maps.py, checked by tests/modeling/test_route_maps.py).
#   hydra_skeletons.py: HydraVisionForImageClassification.forward
#     hydra_skeletons.py: HydraVisionEncoder.forward
#       hydra_skeletons.py: resolve_output_flags
#       hydra_skeletons.py: check_pixel_values
#       hydra_skeletons.py: HydraPreLNVisionModel.encode
#         hydra_skeletons.py: HydraPreLNVisionModel.embed
#           transformers: ViTEmbeddings.forward
#         hydra_skeletons.py: run_layers
#           hydra_layers.py: LayerOutputs.__init__
#           hydra_layers.py: HydraPreLNLayer.forward
#             hydra_layers.py: HydraLayerNorm.forward
#             hydra_attention.py: HydraSelfAttention.forward
#               hydra_attention.py: HydraSelfAttention.folds_members
#               hydra_attention.py: HydraSelfAttention.project
#                 hydra_attention.py: HydraSelfAttention._member_rows
#                 hydra_attention.py: grouped_linear
#               hydra_attention.py: HydraSelfAttention.expand_kv
#               hydra_attention.py: HydraSelfAttention.attend
#                 transformers: sdpa_attention_forward
#               hydra_attention.py: HydraSelfAttention._project_out
#                 hydra_attention.py: HydraSelfAttention._member_rows
#                 hydra_attention.py: grouped_linear
#               hydra_attention.py: HydraSelfAttention.fold_mask
#             hydra_layers.py: HydraMLPBase.forward
#               hydra_layers.py: HydraMLP._mlp
#                 hydra_layers.py: rows_linear
#                 transformers: GELUActivation.forward
#           hydra_layers.py: LayerOutputs.add
#           hydra_layers.py: LayerOutputs.streams
#         hydra_layers.py: HydraLayerNorm.forward
#         hydra_skeletons.py: HydraPreLNVisionModel.pool
#       hydra_skeletons.py: encoder_output
#         hydra_skeletons.py: model_output
#           hydra_layers.py: LayerOutputs.output_fields
#     hydra_skeletons.py: HydraVisionForImageClassification.member_logits
#       hydra_layers.py: HydraMemberLinear.forward
#     hydra_skeletons.py: classifier_output
#       hydra_layers.py: ensemble_outputs
#         hydra_formulas.py: ensemble_log_probs
#           hydra_formulas.py: log_mean_exp
# (end of the route map)

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
