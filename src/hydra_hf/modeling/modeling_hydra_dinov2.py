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

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Dinov2Config, Dinov2WithRegistersConfig
from transformers import initialization as init
from transformers.models.dinov2.modeling_dinov2 import Dinov2Embeddings
from transformers.models.dinov2_with_registers.modeling_dinov2_with_registers import Dinov2WithRegistersEmbeddings

from .configuration_hydra import HydraEnsembleDinov2Config
from .hydra_layers import (
    HydraClassifierOutput,
    HydraLayerNorm,
    HydraLayerScalePreLNLayer,
    HydraLayerSpec,
    HydraMemberLinear,
    HydraMLP,
    HydraModelOutput,
    HydraPreTrainedModel,
    check_pixel_values,
    ensemble_outputs,
    grouped_linear,
    init_hydra_weights,
    layer_spec,
    run_layers,
)


def dinov2_base_config(config: HydraEnsembleDinov2Config) -> Dinov2Config | Dinov2WithRegistersConfig:
    """The base configuration stored in ``config.base_config``."""
    cls = Dinov2WithRegistersConfig if config.base_model_type == "dinov2_with_registers" else Dinov2Config
    return cls.from_dict(config.base_config)


def swiglu_hidden_features(base: Dinov2Config) -> int:
    """Width of DINOv2's SwiGLU MLP: two thirds of ``hidden_size * mlp_ratio``, rounded up to a multiple of 8."""
    return (int(int(base.hidden_size * base.mlp_ratio) * 2 / 3) + 7) // 8 * 8


class HydraSwiGLUMLP(HydraMLP):
    """DINOv2's SwiGLU MLP, ``fc2(silu(gate) * up)`` with ``[gate; up] = fc1(x)``, averaged across members or
    per member like ``HydraMLP``: ``fc1_weight ([M,] 2I, d)``, ``fc2_weight ([M,] d, I)``."""

    def __init__(self, spec: HydraLayerSpec, hidden_features: int) -> None:
        super().__init__(dataclasses.replace(spec, intermediate_size=2 * hidden_features))
        lead = (spec.num_members,) if self.per_member else ()
        self.fc2_weight = nn.Parameter(torch.empty(*lead, spec.hidden_size, hidden_features))

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        """Shared MLP on ``(N, d)`` rows, or per-member MLP on ``(M, N, d)``."""
        if not self.per_member:
            gate, up = F.linear(x, self.fc1_weight, self.fc1_bias).chunk(2, dim=-1)  # (N, I) each
            return F.linear(F.silu(gate) * up, self.fc2_weight, self.fc2_bias)
        gate, up = grouped_linear(x, self.fc1_weight.transpose(1, 2), self.fc1_bias).chunk(2, dim=-1)  # (M, N, I)
        return grouped_linear(F.silu(gate) * up, self.fc2_weight.transpose(1, 2), self.fc2_bias)  # (M, N, d)


class HydraEnsembleDinov2PreTrainedModel(HydraPreTrainedModel):
    config_class = HydraEnsembleDinov2Config
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    _no_split_modules = ["Dinov2Embeddings", "Dinov2WithRegistersEmbeddings", "HydraLayerScalePreLNLayer"]

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        base = self.config.base_config
        std = base.get("initializer_range", 0.02)
        if init_hydra_weights(module, std):
            return
        if isinstance(module, HydraLayerScalePreLNLayer):
            init.constant_(module.lambda_1, float(base.get("layerscale_value", 1.0)))
            init.constant_(module.lambda_2, float(base.get("layerscale_value", 1.0)))
        elif isinstance(module, (Dinov2Embeddings, Dinov2WithRegistersEmbeddings)):
            init.trunc_normal_(module.position_embeddings, mean=0.0, std=std)
            init.trunc_normal_(module.cls_token, mean=0.0, std=std)
            if module.mask_token is not None:
                init.zeros_(module.mask_token)
            if getattr(module, "register_tokens", None) is not None:
                init.zeros_(module.register_tokens)
        elif isinstance(module, (nn.Linear, nn.Conv2d, nn.LayerNorm)):
            super()._init_weights(module)


class HydraEnsembleDinov2Model(HydraEnsembleDinov2PreTrainedModel):
    """The fused DINOv2 encoder: shared embeddings (and register tokens), M residual streams, per-member
    final LayerNorms. Returns ``last_hidden_state (B, M, T, d)`` and ``pooler_output (B, M, d)`` ([CLS])."""

    def __init__(self, config: HydraEnsembleDinov2Config) -> None:
        super().__init__(config)
        base = dinov2_base_config(config)
        with_registers = config.base_model_type == "dinov2_with_registers"
        self.num_register_tokens = int(base.num_register_tokens) if with_registers else 0
        self.embeddings = (Dinov2WithRegistersEmbeddings if with_registers else Dinov2Embeddings)(base)
        inner = int(base.hidden_size * base.mlp_ratio)
        layers = []
        for i in range(base.num_hidden_layers):
            spec = layer_spec(
                config.kept_heads, i, hidden_size=base.hidden_size, num_heads=base.num_attention_heads,
                intermediate_size=inner, hidden_act=base.hidden_act, layer_norm_eps=base.layer_norm_eps,
                attention_dropout=base.attention_probs_dropout_prob, hidden_dropout=0.0, mlp_fusion=config.mlp_fusion,
            )  # DINOv2's layers have no dropout on their branches
            mlp = HydraSwiGLUMLP(spec, swiglu_hidden_features(base)) if base.use_swiglu_ffn else None
            layers.append(HydraLayerScalePreLNLayer(config, spec, layer_scale=True, drop_path=base.drop_path_rate, mlp=mlp))
        self.layers = nn.ModuleList(layers)
        self.layernorm = HydraLayerNorm(config.num_members, base.hidden_size, base.layer_norm_eps)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.embeddings.patch_embeddings

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> HydraModelOutput | tuple:
        output_attentions = self.config.output_attentions if output_attentions is None else output_attentions
        output_hidden_states = self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        return_dict = self.config.return_dict if return_dict is None else return_dict
        patch = self.embeddings.patch_embeddings
        check_pixel_values(pixel_values, patch.num_channels, patch.image_size, True)  # any size, as in transformers
        embeddings = self.embeddings(pixel_values.to(patch.projection.weight.dtype))  # (B, T, d)
        hidden, all_hidden, all_attentions = run_layers(
            self.layers, embeddings, self.config.num_members, None, output_hidden_states, output_attentions
        )  # (M, B, T, d)
        last = self.layernorm(hidden).transpose(0, 1)  # (B, M, T, d)
        pooled = last[:, :, 0]  # (B, M, d): [CLS]
        if not return_dict:
            return tuple(v for v in (last, pooled, all_hidden, all_attentions) if v is not None)
        return HydraModelOutput(
            last_hidden_state=last, pooler_output=pooled, hidden_states=all_hidden, attentions=all_attentions
        )


class HydraEnsembleDinov2ForImageClassification(HydraEnsembleDinov2PreTrainedModel):
    """M pruned DINOv2 classifiers in one model: member m's classifier ``(M, C, 2d)`` reads its
    ``[CLS ; mean of the patch tokens]``. ``logits`` = log of the mean of the members' softmaxes.

    ``AutoModelForImageClassification`` and ``pipeline("image-classification", model=folder,
    trust_remote_code=True)`` use this class.
    """

    def __init__(self, config: HydraEnsembleDinov2Config) -> None:
        super().__init__(config)
        base = dinov2_base_config(config)
        self.num_labels = config.num_labels
        self.hydra = HydraEnsembleDinov2Model(config)
        self.classifier = HydraMemberLinear(config.num_members, 2 * base.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> HydraClassifierOutput | tuple:
        return_dict = self.config.return_dict if return_dict is None else return_dict
        outputs = self.hydra(
            pixel_values, output_attentions=output_attentions, output_hidden_states=output_hidden_states, return_dict=True
        )
        tokens = outputs.last_hidden_state.transpose(0, 1)  # (M, B, T, d)
        patches = tokens[:, :, 1 + self.hydra.num_register_tokens :]  # (M, B, P, d): registers excluded
        features = torch.cat([tokens[:, :, 0], patches.mean(dim=2)], dim=-1)  # (M, B, 2d)
        member_logits = self.classifier(features).transpose(0, 1)  # (B, M, C)
        logits, loss = ensemble_outputs(member_logits, labels, self.config)
        if not return_dict:
            out = (logits, member_logits, outputs.hidden_states, outputs.attentions)
            out = tuple(v for v in out if v is not None)
            return ((loss,) + out) if loss is not None else out
        return HydraClassifierOutput(
            loss=loss,
            logits=logits,
            member_logits=member_logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
