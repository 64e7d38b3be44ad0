# Shipped with every BEiT Hydra Ensemble model folder (remote code): imports only the standard library,
# torch, transformers and sibling files.
"""Hydra Ensemble of a BEiT image classifier: M head-pruned members run as one model in one pass.

BEiT is a pre-LN ViT with three twists, each kept per member here:

- a *relative position bias* added to the attention scores, one ``(T, T)`` map per head, read from a
  table ``(R, H)`` shared by all layers (``use_shared_relative_position_bias``) and/or one table per
  layer (``use_relative_position_bias``). The bias belongs to its head: the fused layer keeps the
  columns of the heads each member keeps (``relative_position_bias_table (R, K_l)`` in member order;
  the shared table is ``(M, R, H)``, one per member) and passes a per-kept-head bias ``(1, K_l, T, T)``
  to the fused attention;
- *layer scale*: ``lambda_1``, ``lambda_2`` ``(M, d)`` scale the attention and MLP branches;
- pooling: with ``use_mean_pooling`` the mean of the patch tokens through a pooler LayerNorm, else the
  [CLS] token after the final LayerNorm (both LayerNorms per member).

BEiT's key projection has no bias (the fused key bias is zero, and adding a constant to a key changes
no attention weight). Stochastic depth (``drop_path_rate``) drops each member's branch per sample in
training, as each stock member would. ``logits`` = log of the mean of the members' softmaxes.
"""

# Route of forward: what HydraEnsembleBeitForImageClassification(...) runs, file: function,
# each call under its caller, in the order they first run (members of unequal widths; written by
# tools/route_maps.py, checked by tests/modeling/test_route_maps.py).
#   hydra_skeletons.py: HydraVisionForImageClassification.forward
#     hydra_skeletons.py: HydraVisionEncoder.forward
#       hydra_skeletons.py: resolve_output_flags
#       hydra_skeletons.py: check_pixel_values
#       modeling_hydra_beit.py: HydraEnsembleBeitModel.encode
#         transformers: BeitEmbeddings.forward
#         hydra_layers.py: LayerOutputs.__init__
#         modeling_hydra_beit.py: HydraBeitLayer.head_bias
#           modeling_hydra_beit.py: relative_position_bias
#         hydra_layers.py: HydraLayerScalePreLNLayer.forward
#           hydra_layers.py: HydraLayerNorm.forward
#           hydra_attention.py: HydraSelfAttention.forward
#             hydra_attention.py: HydraSelfAttention.folds_members
#             hydra_attention.py: HydraSelfAttention.project
#               hydra_attention.py: HydraSelfAttention._member_rows
#               hydra_attention.py: grouped_linear
#             hydra_attention.py: HydraSelfAttention.expand_kv
#             hydra_attention.py: HydraSelfAttention.attend
#               transformers: sdpa_attention_forward
#             hydra_attention.py: HydraSelfAttention._project_out
#               hydra_attention.py: HydraSelfAttention._member_rows
#               hydra_attention.py: grouped_linear
#             hydra_attention.py: HydraSelfAttention.fold_mask
#           hydra_layers.py: HydraLayerScalePreLNLayer._branch
#             hydra_layers.py: drop_path
#           hydra_layers.py: HydraMLPBase.forward
#             hydra_layers.py: HydraMLP._mlp
#               hydra_layers.py: rows_linear
#               transformers: GELUActivation.forward
#         hydra_layers.py: LayerOutputs.add
#         hydra_layers.py: LayerOutputs.streams
#         hydra_layers.py: HydraLayerNorm.forward
#       hydra_skeletons.py: encoder_output
#         hydra_skeletons.py: model_output
#           hydra_layers.py: LayerOutputs.output_fields
#     modeling_hydra_beit.py: HydraEnsembleBeitForImageClassification.member_logits
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
from transformers import BeitConfig
from transformers import initialization as init
from transformers.models.beit.modeling_beit import BeitEmbeddings, BeitRelativePositionBias

from .configuration_hydra_beit import HydraEnsembleBeitConfig
from .hydra_layers import (
    HydraLayerNorm,
    HydraLayerScalePreLNLayer,
    HydraLayerSpec,
    HydraModelOutput,
    LayerOutputs,
    base_layer_specs,
)
from .hydra_skeletons import HydraVisionEncoder, HydraVisionForImageClassification, HydraVisionPreTrainedModel


def window_of(base: BeitConfig) -> tuple[int, int]:
    """The patch grid ``(Wh, Ww)`` of the base's image size, which its bias tables are laid out for."""
    size = base.image_size if isinstance(base.image_size, (tuple, list)) else (base.image_size, base.image_size)
    return size[0] // base.patch_size, size[1] // base.patch_size


def num_relative_distances(window: tuple[int, int]) -> int:
    """Rows ``R`` of a relative position bias table: every 2-D offset, plus cls->token, token->cls, cls->cls."""
    return (2 * window[0] - 1) * (2 * window[1] - 1) + 3


def relative_position_bias(
    table: torch.Tensor, base_window: tuple[int, int], window: tuple[int, int], interpolate: bool, dim_size: int
) -> torch.Tensor:
    """Per-column attention bias from a relative position bias table, as transformers'
    ``BeitRelativePositionBias.forward`` computes it, for a table with any number of columns (heads).

    Shape: ``table (R, n)`` -> ``(1, n, T, T)`` with ``T = window[0] * window[1] + 1``.
    """
    old_height, old_width = 2 * base_window[0] - 1, 2 * base_window[1] - 1
    new_height, new_width = 2 * window[0] - 1, 2 * window[1] - 1
    rows = table.shape[0]
    sub = table[: rows - 3].reshape(1, old_width, old_height, -1).permute(0, 3, 1, 2)  # (1, n, w, h)
    sub = F.interpolate(sub, size=(new_height, new_width), mode="bilinear")  # identity at the base's size
    sub = sub.permute(0, 2, 3, 1).reshape(new_height * new_width, -1)
    table = torch.cat([sub, table[rows - 3 :]])  # (R', n)
    index = BeitRelativePositionBias.generate_relative_position_index(window)  # (T, T)
    tokens = window[0] * window[1] + 1
    bias = table[index.view(-1)].view(tokens, tokens, -1).permute(2, 0, 1).contiguous()  # (n, T, T)
    if interpolate:
        bias = F.interpolate(
            bias.unsqueeze(1), size=(dim_size, dim_size), mode="bilinear", align_corners=False
        ).squeeze(1)
    return bias.unsqueeze(0)


class HydraBeitLayer(HydraLayerScalePreLNLayer):
    """BEiT's layer for M members: pre-LN, per-member layer scale, and the relative position bias of the
    heads each member keeps.

    Parameters beyond the pre-LN layer's: ``relative_position_bias_table (R, K)`` (this layer's own
    table, columns = the kept heads in member order) when the base has per-layer tables.
    """

    def __init__(self, config, spec: HydraLayerSpec, base: BeitConfig, drop_path: float) -> None:
        super().__init__(config, spec, layer_scale=base.layer_scale_init_value > 0, drop_path=drop_path)
        K = sum(spec.widths)
        rows = num_relative_distances(window_of(base))
        self.relative_position_bias_table = (
            nn.Parameter(torch.zeros(rows, K)) if base.use_relative_position_bias else None
        )
        # column (member m, head h) of the members' shared tables, flattened as m * H + h, in member order
        self.shared_columns = [m * spec.num_heads + h for m, heads in enumerate(spec.kept_heads) for h in heads]

    def head_bias(
        self, shared_table: torch.Tensor | None, base_window: tuple[int, int], window: tuple[int, int],
        interpolate: bool, dim_size: int,
    ) -> torch.Tensor | None:
        """The additive attention bias of every kept head, ``(1, K, T, T)`` in member order (None if the
        base has no relative position bias). ``shared_table``: the members' shared tables ``(M, R, H)``."""
        if not self.shared_columns:  # no member keeps a head here
            return None
        bias = None
        if shared_table is not None:
            M, rows, H = shared_table.shape
            columns = torch.tensor(self.shared_columns, device=shared_table.device)
            table = shared_table.permute(1, 0, 2).reshape(rows, M * H).index_select(1, columns)  # (R, K)
            bias = relative_position_bias(table, base_window, window, interpolate, dim_size)
        if self.relative_position_bias_table is not None:
            own = relative_position_bias(self.relative_position_bias_table, base_window, window, interpolate, dim_size)
            bias = own if bias is None else bias + own  # the stock order: shared + layer's own
        return bias


class HydraEnsembleBeitPreTrainedModel(HydraVisionPreTrainedModel):
    config_class = HydraEnsembleBeitConfig
    embeddings_class = BeitEmbeddings
    trunc_normal_tokens = ("cls_token", "position_embeddings")
    _no_split_modules = ["BeitEmbeddings", "HydraBeitLayer"]

    @classmethod
    def base_config(cls, config: HydraEnsembleBeitConfig) -> BeitConfig:
        """The base BEiT configuration stored in ``config.base_config`` (without a mask token: masked image
        modeling is not part of a classifier)."""
        return BeitConfig.from_dict({**config.base_config, "use_mask_token": False})

    def init_own_weights(self, module: nn.Module) -> bool:
        if isinstance(module, HydraBeitLayer):
            if module.lambda_1 is not None:
                init.constant_(module.lambda_1, float(self.config.base_config.get("layer_scale_init_value", 0.1)))
                init.constant_(module.lambda_2, float(self.config.base_config.get("layer_scale_init_value", 0.1)))
            if module.relative_position_bias_table is not None:
                init.zeros_(module.relative_position_bias_table)
        elif isinstance(module, HydraEnsembleBeitModel):
            if module.shared_relative_position_bias_table is not None:
                init.zeros_(module.shared_relative_position_bias_table)
        else:
            return False
        return True


class HydraEnsembleBeitModel(HydraEnsembleBeitPreTrainedModel, HydraVisionEncoder):
    """The fused BEiT encoder: shared embeddings, M residual streams, per-member pooling.

    Returns ``member_last_hidden_state (B, M, T, d)`` (after the final LayerNorm; without it under mean
    pooling, as in transformers' BEiT) and ``member_pooler_output (B, M, d)``, and their members' means
    ``last_hidden_state (B, T, d)`` and ``pooler_output (B, d)``. Like transformers' BEiT, it takes any image
    size (the bias tables are resized to the patch grid).
    """

    any_image_size = True

    def __init__(self, config: HydraEnsembleBeitConfig) -> None:
        super().__init__(config)
        base = self.base_config(config)
        M, d, L = config.num_members, base.hidden_size, base.num_hidden_layers
        self.base_window = window_of(base)
        self.patch_size = base.patch_size
        self.embeddings = BeitEmbeddings(base)
        rows = num_relative_distances(self.base_window)
        self.shared_relative_position_bias_table = (
            nn.Parameter(torch.zeros(M, rows, base.num_attention_heads))
            if base.use_shared_relative_position_bias
            else None
        )
        rates = [base.drop_path_rate * i / max(L - 1, 1) for i in range(L)]  # the stock schedule
        specs = base_layer_specs(config, base)
        self.layers = nn.ModuleList(HydraBeitLayer(config, specs[i], base, rates[i]) for i in range(L))
        self.use_mean_pooling = bool(base.use_mean_pooling)
        self.layernorm = None if self.use_mean_pooling else HydraLayerNorm(M, d, base.layer_norm_eps)
        self.pooler_layernorm = HydraLayerNorm(M, d, base.layer_norm_eps) if self.use_mean_pooling else None
        self.post_init()

    def encode(
        self, pixel_values, interpolate_pos_encoding, output_attentions, output_hidden_states
    ) -> tuple[torch.Tensor, torch.Tensor, LayerOutputs]:
        embeddings = self.embeddings(pixel_values)  # (B, T, d)
        T = embeddings.shape[1]
        window = (pixel_values.shape[2] // self.patch_size, pixel_values.shape[3] // self.patch_size)
        outs = LayerOutputs(embeddings, self.config.num_members, output_hidden_states, output_attentions)
        for layer in self.layers:
            table = self.shared_relative_position_bias_table
            bias = layer.head_bias(table, self.base_window, window, interpolate_pos_encoding, T)
            outs.add(*layer(outs.input, bias))  # (M, B, T, d); bias (1, K, T, T) per kept head
        hidden = outs.streams()
        if self.use_mean_pooling:
            pooled = self.pooler_layernorm(hidden[:, :, 1:].mean(dim=2))  # (M, B, d): mean of the patch tokens
        else:
            hidden = self.layernorm(hidden)
            pooled = hidden[:, :, 0]  # (M, B, d): [CLS]
        return hidden.transpose(0, 1), pooled.transpose(0, 1), outs


class HydraEnsembleBeitForImageClassification(HydraEnsembleBeitPreTrainedModel, HydraVisionForImageClassification):
    """M pruned BEiT classifiers in one model (every member's classifier on its pooled output).
    ``logits`` = log of the mean of the members' softmaxes.

    ``AutoModelForImageClassification`` and ``pipeline("image-classification", model=folder,
    trust_remote_code=True)`` use this class.
    """

    encoder_class = HydraEnsembleBeitModel

    def member_logits(self, outputs: HydraModelOutput) -> torch.Tensor:
        return self.classifier(outputs.member_pooler_output.transpose(0, 1)).transpose(0, 1)  # (B, M, C)
