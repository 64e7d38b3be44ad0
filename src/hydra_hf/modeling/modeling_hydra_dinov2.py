# Shipped with every DINOv2 Hydra Ensemble model folder (remote code): imports only the standard library,
# torch, transformers and sibling files.
"""Hydra Ensemble of a DINOv2 image classifier (with or without registers): M head-pruned members in one pass.

DINOv2 is a pre-LN ViT with *layer scale* (``layer_scale1/2.lambda1``, here ``lambda_1``/``lambda_2``
``(M, d)``: every member its own), optionally a SwiGLU MLP (``use_swiglu_ffn``: ``silu(gate) * up`` then
``down``; the fused ``fc1`` holds ``[gate; up]`` as the saved checkpoints' ``weights_in`` do), and, in the
with-registers variant, register tokens between the [CLS] token and the patch tokens. The classifier
reads ``[CLS ; mean of the patch tokens]`` (``2d`` features, registers excluded), as transformers'
``Dinov2ForImageClassification``. Any image size is accepted (the position embeddings are always
interpolated to the patch grid, as in transformers). ``logits`` = log of the mean of the members' softmaxes.
"""

# Route of forward: what HydraEnsembleDinov2ForImageClassification(...) runs, file: function,
# each call under its caller, in the order they first run (members of unequal widths; written by
# tools/route_maps.py, checked by tests/modeling/test_route_maps.py).
#   hydra_skeletons.py: HydraVisionForImageClassification.forward
#     hydra_skeletons.py: HydraVisionEncoder.forward
#       hydra_skeletons.py: resolve_output_flags
#       hydra_skeletons.py: check_pixel_values
#       hydra_skeletons.py: HydraPreLNVisionModel.encode
#         modeling_hydra_dinov2.py: HydraEnsembleDinov2Model.embed
#           transformers: Dinov2Embeddings.forward
#         hydra_skeletons.py: run_layers
#           hydra_layers.py: LayerOutputs.__init__
#           hydra_layers.py: HydraLayerScalePreLNLayer.forward
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
#             hydra_layers.py: HydraLayerScalePreLNLayer._branch
#               hydra_layers.py: drop_path
#             hydra_layers.py: HydraMLPBase.forward
#               hydra_layers.py: HydraMLP._mlp
#                 hydra_layers.py: rows_linear
#                 transformers: GELUActivation.forward
#           hydra_layers.py: LayerOutputs.add
#           hydra_layers.py: LayerOutputs.streams
#         hydra_layers.py: HydraLayerNorm.forward
#         modeling_hydra_dinov2.py: HydraEnsembleDinov2Model.pool
#       hydra_skeletons.py: encoder_output
#         hydra_skeletons.py: model_output
#           hydra_layers.py: LayerOutputs.output_fields
#     modeling_hydra_dinov2.py: HydraEnsembleDinov2ForImageClassification.member_logits
#       hydra_layers.py: HydraMemberLinear.forward
#     hydra_skeletons.py: classifier_output
#       hydra_layers.py: ensemble_outputs
#         hydra_formulas.py: ensemble_log_probs
#           hydra_formulas.py: log_mean_exp
# (end of the route map)

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Dinov2Config, Dinov2WithRegistersConfig
from transformers import initialization as init
from transformers.models.dinov2.modeling_dinov2 import Dinov2Embeddings
from transformers.models.dinov2_with_registers.modeling_dinov2_with_registers import Dinov2WithRegistersEmbeddings

from .configuration_hydra_dinov2 import HydraEnsembleDinov2Config
from .hydra_layers import (
    HydraLayerScalePreLNLayer,
    HydraLayerSpec,
    HydraMemberLinear,
    HydraMLP,
    HydraModelOutput,
    grouped_linear,
    layer_spec,
)
from .hydra_skeletons import HydraPreLNVisionModel, HydraVisionForImageClassification, HydraVisionPreTrainedModel


def swiglu_hidden_features(base: Dinov2Config) -> int:
    """Width of DINOv2's SwiGLU MLP: two thirds of ``hidden_size * mlp_ratio``, rounded up to a multiple of 8."""
    return (int(int(base.hidden_size * base.mlp_ratio) * 2 / 3) + 7) // 8 * 8


class HydraSwiGLUMLP(HydraMLP):
    """DINOv2's SwiGLU MLP, ``fc2(silu(gate) * up)`` with ``[gate; up] = fc1(x)``, averaged across members or
    per member like ``HydraMLP``: ``fc1_weight ([M,] 2I, d)``, ``fc2_weight ([M,] d, I)``; slim members keep
    neurons of the ``I = hidden_features`` (the gated layout of ``HydraMLPBase``)."""

    gated = True

    def __init__(self, spec: HydraLayerSpec, hidden_features: int) -> None:
        nn.Module.__init__(self)  # HydraMLP's parameters, with DINOv2's width and activation
        self.act = nn.SiLU()
        self._init_parameters(spec, hidden_features, bias=True)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        """Shared MLP on ``(N, d)`` rows, or per-member MLP on ``(M, N, d)``."""
        if not self.per_member:
            return F.linear(
                self._activate(F.linear(x, self.fc1_weight, self.fc1_bias)), self.fc2_weight, self.fc2_bias
            )
        h = self._activate(grouped_linear(x, self.fc1_weight.transpose(1, 2), self.fc1_bias))  # (M, N, I)
        return grouped_linear(h, self.fc2_weight.transpose(1, 2), self.fc2_bias)  # (M, N, d)


class HydraEnsembleDinov2PreTrainedModel(HydraVisionPreTrainedModel):
    config_class = HydraEnsembleDinov2Config
    embeddings_class = (Dinov2Embeddings, Dinov2WithRegistersEmbeddings)
    zero_tokens = ("mask_token", "register_tokens")
    _no_split_modules = ["Dinov2Embeddings", "Dinov2WithRegistersEmbeddings", "HydraLayerScalePreLNLayer"]

    @classmethod
    def base_config(cls, config: HydraEnsembleDinov2Config) -> Dinov2Config | Dinov2WithRegistersConfig:
        """The base configuration stored in ``config.base_config`` (with or without registers)."""
        with_registers = config.base_model_type == "dinov2_with_registers"
        return (Dinov2WithRegistersConfig if with_registers else Dinov2Config).from_dict(config.base_config)

    def init_own_weights(self, module: nn.Module) -> bool:
        if not isinstance(module, HydraLayerScalePreLNLayer):
            return False
        init.constant_(module.lambda_1, float(self.config.base_config.get("layerscale_value", 1.0)))
        init.constant_(module.lambda_2, float(self.config.base_config.get("layerscale_value", 1.0)))
        return True


class HydraEnsembleDinov2Model(HydraEnsembleDinov2PreTrainedModel, HydraPreLNVisionModel):
    """The fused DINOv2 encoder: shared embeddings (and register tokens), M residual streams, per-member
    final LayerNorms. Returns ``member_last_hidden_state (B, M, T, d)`` and ``member_pooler_output (B, M, d)``
    ([CLS]), and their members' means ``last_hidden_state (B, T, d)`` and ``pooler_output (B, d)``.
    Any image size is accepted: the position embeddings are always interpolated, as in transformers."""

    any_image_size = True

    def build_embeddings(self, base: Dinov2Config | Dinov2WithRegistersConfig) -> nn.Module:
        with_registers = self.config.base_model_type == "dinov2_with_registers"
        self.num_register_tokens = int(base.num_register_tokens) if with_registers else 0
        return (Dinov2WithRegistersEmbeddings if with_registers else Dinov2Embeddings)(base)

    def build_layers(self, config: HydraEnsembleDinov2Config, base: Dinov2Config) -> list[nn.Module]:
        layers = []
        for i in range(base.num_hidden_layers):
            spec = layer_spec(
                config.kept_heads, i, hidden_size=base.hidden_size, num_heads=base.num_attention_heads,
                intermediate_size=int(base.hidden_size * base.mlp_ratio), hidden_act=base.hidden_act,
                layer_norm_eps=base.layer_norm_eps, attention_dropout=base.attention_probs_dropout_prob,
                hidden_dropout=0.0, mlp_fusion=config.mlp_fusion, kept_neurons=config.kept_neurons,
            )  # DINOv2's layers have no dropout on their branches
            mlp = HydraSwiGLUMLP(spec, swiglu_hidden_features(base)) if base.use_swiglu_ffn else None
            layers.append(
                HydraLayerScalePreLNLayer(config, spec, layer_scale=True, drop_path=base.drop_path_rate, mlp=mlp)
            )
        return layers

    def embed(self, pixel_values: torch.Tensor, interpolate_pos_encoding: bool) -> torch.Tensor:
        return self.embeddings(pixel_values)  # (B, T, d): always interpolated

    def pool(self, last: torch.Tensor) -> torch.Tensor:
        return last[:, :, 0]  # (B, M, d): [CLS]


class HydraEnsembleDinov2ForImageClassification(HydraEnsembleDinov2PreTrainedModel, HydraVisionForImageClassification):
    """M pruned DINOv2 classifiers in one model: member m's classifier ``(M, C, 2d)`` reads its
    ``[CLS ; mean of the patch tokens]``. ``logits`` = log of the mean of the members' softmaxes.

    ``AutoModelForImageClassification`` and ``pipeline("image-classification", model=folder,
    trust_remote_code=True)`` use this class.
    """

    encoder_class = HydraEnsembleDinov2Model

    def add_head(self, config: HydraEnsembleDinov2Config, base: Dinov2Config) -> None:
        self.classifier = HydraMemberLinear(config.num_members, 2 * base.hidden_size, config.num_labels)

    def member_logits(self, outputs: HydraModelOutput) -> torch.Tensor:
        tokens = outputs.member_last_hidden_state.transpose(0, 1)  # (M, B, T, d)
        patches = tokens[:, :, 1 + self.hydra.num_register_tokens :]  # (M, B, P, d): registers excluded
        features = torch.cat([tokens[:, :, 0], patches.mean(dim=2)], dim=-1)  # (M, B, 2d)
        return self.classifier(features).transpose(0, 1)  # (B, M, C)
