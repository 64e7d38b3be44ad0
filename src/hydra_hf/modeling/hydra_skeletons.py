# Shipped with every Hydra Ensemble model folder (remote code): imports only the standard library,
# torch, transformers and sibling files.
"""Model skeletons of a Hydra Ensemble: the encoder, classifier and tower classes that the family
modeling files subclass, built from the fused layers of ``hydra_layers.py``.

A family's modeling file declares only what is its own, as class attributes and small hooks (base
config class, embeddings, head, dropout flags); the skeletons hold the signatures, the input checks,
the layer loop, the outputs and the ensemble. A family class lists its own pre-trained class first,
then the skeleton::

    class HydraEnsembleRobertaModel(HydraEnsembleRobertaPreTrainedModel, HydraPostLNTextModel): ...

Three kinds: post-LN text encoders and classifiers (BERT, RoBERTa, ELECTRA, DistilBERT, ALBERT; the
public side reused by DeBERTa-v2 and ModernBERT), pre-LN image encoders and classifiers (ViT, DeiT,
BEiT, DINOv2) and two-tower models (CLIP, SigLIP). Notation as in ``hydra_layers.py``: M members,
B batch, T tokens, d hidden size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import initialization as init
from transformers.utils import ModelOutput

from .hydra_layers import (
    HydraClassificationHead,
    HydraClassifierOutput,
    HydraLayerNorm,
    HydraLayerSpec,
    HydraMemberLinear,
    HydraModelOutput,
    HydraPostLNLayer,
    HydraPreLNLayer,
    HydraPreTrainedModel,
    LayerOutputs,
    base_layer_specs,
    ensemble_outputs,
    init_hydra_weights,
    layer_spec,
    padding_mask_to_additive,
)


# ------------------------------------------------------------------ inputs, the layer loop, outputs
def check_pixel_values(
    pixel_values: torch.Tensor | None, num_channels: int, image_size: tuple[int, int], interpolate_pos_encoding: bool
) -> None:
    """``ValueError`` (with the fix) unless ``pixel_values`` is ``(B, num_channels, *image_size)``; any
    size is accepted with ``interpolate_pos_encoding``."""
    if pixel_values is None:
        raise ValueError("pixel_values is required: (batch, channels, height, width) from the model's image processor")
    if not isinstance(pixel_values, torch.Tensor):
        raise TypeError(f"pixel_values must be a torch.Tensor, got {type(pixel_values).__name__}")
    if pixel_values.dim() != 4:
        raise ValueError(
            f"pixel_values must have shape (batch, {num_channels}, {image_size[0]}, {image_size[1]}), got "
            f"{tuple(pixel_values.shape)}; add the batch dimension with pixel_values.unsqueeze(0)"
        )
    _, channels, height, width = pixel_values.shape
    if channels != num_channels:
        raise ValueError(
            f"pixel_values has {channels} channels but the model takes {num_channels}; convert the images "
            f"(e.g. image.convert('RGB') for grayscale/RGBA) and use the model's image processor"
        )
    if not interpolate_pos_encoding and (height, width) != tuple(image_size):
        raise ValueError(
            f"pixel_values are {height}x{width} but the model takes {image_size[0]}x{image_size[1]} images; resize "
            "them with the model's image processor, or pass interpolate_pos_encoding=True to interpolate the "
            "position embeddings"
        )


def run_layers(
    layers: nn.ModuleList, embeddings: torch.Tensor, num_members: int, attention_mask: torch.Tensor | None,
    output_hidden_states: bool, output_attentions: bool,
) -> tuple[torch.Tensor, LayerOutputs]:
    """Run the fused layers on shared ``embeddings (B, T, d)`` (see ``LayerOutputs``).

    Returns the members' streams ``(M, B, T, d)`` and the ``LayerOutputs`` that recorded the hidden states
    and attention weights per layer (when asked for). As in transformers' models, attention weights are only
    returned by eager attention: with sdpa the attention function warns and ``attentions`` is an empty tuple.
    """
    outs = LayerOutputs(embeddings, num_members, output_hidden_states, output_attentions)
    for layer in layers:
        # hidden and mask positional: what GradientCheckpointingLayer checkpoints
        outs.add(*layer(outs.input, attention_mask, output_attentions=output_attentions))  # (M, B, T, d)
    return outs.streams(), outs


def classifier_output(
    member_logits: torch.Tensor,
    labels: torch.Tensor | None,
    config,
    encoder_output: HydraModelOutput,
    return_dict: bool,
) -> HydraClassifierOutput | tuple:
    """The output of a fused classifier from its ``member_logits (B, M, C)``: ensemble logits, loss."""
    logits, loss = ensemble_outputs(member_logits, labels, config)
    out = HydraClassifierOutput(
        loss=loss,
        logits=logits,
        member_logits=member_logits,
        hidden_states=encoder_output.hidden_states,
        attentions=encoder_output.attentions,
        member_hidden_states=encoder_output.member_hidden_states,
    )
    return out if return_dict else out.to_tuple()


def resolve_output_flags(
    config, output_attentions: bool | None, output_hidden_states: bool | None, return_dict: bool | None
) -> tuple[bool, bool, bool]:
    """The call's ``output_attentions``, ``output_hidden_states`` and ``return_dict``, the config's where None."""
    return (
        config.output_attentions if output_attentions is None else output_attentions,
        config.output_hidden_states if output_hidden_states is None else output_hidden_states,
        config.return_dict if return_dict is None else return_dict,
    )


def model_output(
    member_last: torch.Tensor, member_pooled: torch.Tensor | None, outs: LayerOutputs, tie_last: bool = False,
    output_hidden_states: bool = True, output_member_hidden_states: bool = False,
) -> HydraModelOutput:
    """A fused encoder's output from every member's ``member_last (B, M, T, d)`` and ``member_pooled (B, M, d)``
    (or None) and the layers' record ``outs``: the standard fields are the members' mean (see ``HydraModelOutput``;
    ``tie_last`` and the two flags, which of the recorded per-layer fields to return, as in
    ``LayerOutputs.output_fields``)."""
    return HydraModelOutput(
        pooler_output=member_pooled.mean(dim=1) if member_pooled is not None else None,  # (B, d)
        attentions=outs.attentions,
        member_pooler_output=member_pooled,
        **outs.output_fields(
            member_last, tie_last, hidden_states=output_hidden_states, member_hidden_states=output_member_hidden_states
        ),
    )


def encoder_output(
    member_last: torch.Tensor, member_pooled: torch.Tensor | None, outs: LayerOutputs, return_dict: bool,
    tie_last: bool = False, output_hidden_states: bool = True, output_member_hidden_states: bool = False,
) -> HydraModelOutput | tuple:
    """``model_output`` as a ``HydraModelOutput`` or, without ``return_dict``, a tuple of its fields."""
    out = model_output(member_last, member_pooled, outs, tie_last, output_hidden_states, output_member_hidden_states)
    return out if return_dict else out.to_tuple()


# ------------------------------------------------------------------ text skeletons
class HydraTextPreTrainedModel(HydraPreTrainedModel):
    """The base of a post-LN text family's classes (BERT, RoBERTa, ELECTRA, DistilBERT, ALBERT). The
    family's own subclass sets ``config_class``, ``base_config_class`` (e.g. ``BertConfig``) and
    ``embeddings_class`` (e.g. ``BertEmbeddings``, whose buffers it initialises)."""

    _no_split_modules = ["HydraPostLNLayer"]
    embeddings_class: type

    def init_family_weights(self, module: nn.Module, std: float) -> bool:
        if not isinstance(module, self.embeddings_class):
            return False
        init.copy_(module.position_ids, torch.arange(module.position_ids.shape[-1]).expand((1, -1)))
        if hasattr(module, "token_type_ids"):  # DistilBERT's embeddings have none
            init.zeros_(module.token_type_ids)
        return True


class HydraTextEncoder(HydraPreTrainedModel):
    """The public side of every fused text encoder: ``forward``'s signature, the output flags, the input
    check and the output (``HydraModelOutput`` or a tuple). The family computes in ``encode``; a base
    without token types sets ``forward = HydraTextEncoder.forward_without_token_types``.
    """

    # The family's class defines ``encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
    # output_attentions, output_hidden_states)`` -> every member's final hidden states ``(B, M, T, d)``, pooled
    # output ``(B, M, d)`` or None, and the ``LayerOutputs`` of its layer loop. ``tie_last_hidden_state``: the
    # last of the returned hidden states is the final one, after a final norm (ModernBERT), as in transformers.

    tie_last_hidden_state = False

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.word_embeddings = value

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        output_member_hidden_states: bool = False,
        **kwargs,
    ) -> HydraModelOutput | tuple:
        """``output_member_hidden_states``: also return every member's per-layer streams,
        ``member_hidden_states`` (``output_hidden_states`` returns only the standard ``hidden_states``)."""
        output_attentions, output_hidden_states, return_dict = resolve_output_flags(
            self.config, output_attentions, output_hidden_states, return_dict
        )
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        outputs = self.encode(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            output_attentions,
            output_hidden_states or output_member_hidden_states,  # the layers record the streams for either
        )
        return encoder_output(
            *outputs, return_dict, tie_last=self.tie_last_hidden_state, output_hidden_states=output_hidden_states,
            output_member_hidden_states=output_member_hidden_states,
        )

    def forward_without_token_types(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        output_member_hidden_states: bool = False,
        **kwargs,
    ) -> HydraModelOutput | tuple:
        """``forward`` for a base without token types (DistilBERT, ModernBERT), so that its signature names
        only the inputs the model reads (ONNX export reads it)."""
        return HydraTextEncoder.forward(
            self, input_ids, attention_mask, None, position_ids, inputs_embeds, output_attentions,
            output_hidden_states, return_dict, output_member_hidden_states,
        )


class HydraPostLNTextModel(HydraTextPreTrainedModel, HydraTextEncoder):
    """The fused post-LN text encoder: shared embeddings, M residual streams through ``HydraPostLNLayer``s,
    and (``has_pooler``: BERT, ALBERT) per-member tanh poolers on the first token.

    Family hooks: ``add_input_projection`` (a shared projection between the embeddings and the layers,
    registered between them: ELECTRA, ALBERT), ``embed`` (the embeddings call), ``layer_specs`` and the
    flags ``attention_output_dropout`` / ``mlp_output_dropout`` of ``HydraPostLNLayer``.
    """

    has_pooler = False
    attention_output_dropout = True
    mlp_output_dropout = True

    def __init__(self, config, add_pooling_layer: bool = True) -> None:
        super().__init__(config)
        base = self.base_config(config)
        self.embeddings = self.embeddings_class(base)
        self.add_input_projection(base)
        self.layers = nn.ModuleList(
            HydraPostLNLayer(
                config, spec, attention_output_dropout=self.attention_output_dropout,
                mlp_output_dropout=self.mlp_output_dropout,
            )
            for spec in self.layer_specs(config, base)
        )
        if self.has_pooler and add_pooling_layer:
            self.pooler = HydraMemberLinear(config.num_members, base.hidden_size, base.hidden_size)
        else:
            self.pooler = None
        self.post_init()

    def add_input_projection(self, base) -> None:
        """Register a shared module between the embeddings and the layers (none by default)."""

    @staticmethod
    def layer_specs(config, base) -> list[HydraLayerSpec]:
        return base_layer_specs(config, base)

    def embed(
        self, input_ids: torch.Tensor | None, token_type_ids: torch.Tensor | None, position_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
    ) -> torch.Tensor:
        """The shared input of the first layer, ``(B, T, d)``."""
        return self.embeddings(
            input_ids=input_ids, token_type_ids=token_type_ids, position_ids=position_ids, inputs_embeds=inputs_embeds
        )

    def encode(
        self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, output_attentions,
        output_hidden_states,
    ) -> tuple[torch.Tensor, torch.Tensor | None, LayerOutputs]:
        embeddings = self.embed(
            input_ids, token_type_ids, position_ids, inputs_embeds
        )  # (B, T, d), shared by all members
        mask = padding_mask_to_additive(attention_mask, embeddings.dtype, embeddings.shape[1])  # (B, 1, 1, T) or None
        hidden, outs = run_layers(
            self.layers, embeddings, self.config.num_members, mask, output_hidden_states, output_attentions
        )  # (M, B, T, d)
        pooled = (
            torch.tanh(self.pooler(hidden[:, :, 0])).transpose(0, 1) if self.pooler is not None else None
        )  # (B, M, d)
        return hidden.transpose(0, 1), pooled, outs


class HydraTextForSequenceClassification(HydraPreTrainedModel):
    """M pruned text classifiers in one model. ``logits`` = log of the mean of the members' softmaxes (see
    ``ensemble_outputs``). A family's classifier subclasses its own pre-trained class and this one.

    ``encoder_class`` is the family's encoder; ``add_head`` registers every member's head and
    ``member_logits`` computes ``(B, M, C)`` from the encoder's output. The default head, by
    ``head_activation``: None (BERT, ALBERT): dropout and a per-member ``classifier`` on the pooled output;
    ``"tanh"`` / ``"gelu"`` / ``"relu"``: a per-member ``HydraClassificationHead`` on the first token
    (``head_dropout_first``: dropout before its ``dense`` too). ``classifier_dropout`` reads the head's
    dropout from the base config.
    """

    encoder_class: type
    head_activation: str | None = None
    head_dropout_first = True

    def __init__(self, config) -> None:
        super().__init__(config)
        base = self.base_config(config)
        self.num_labels = config.num_labels
        self.hydra = self.encoder_class(config)
        self.add_head(config, base)
        self.post_init()

    def add_head(self, config, base) -> None:
        M, d, C = config.num_members, base.hidden_size, config.num_labels
        if self.head_activation is None:
            self.dropout = nn.Dropout(self.classifier_dropout(base))
            self.classifier = HydraMemberLinear(M, d, C)
        else:
            self.classifier = HydraClassificationHead(
                M, d, C, self.head_activation, self.classifier_dropout(base), dropout_first=self.head_dropout_first
            )

    @staticmethod
    def classifier_dropout(base) -> float:
        return base.classifier_dropout if base.classifier_dropout is not None else base.hidden_dropout_prob

    def get_input_embeddings(self) -> nn.Embedding:
        return self.hydra.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.hydra.set_input_embeddings(value)

    def member_logits(self, outputs: HydraModelOutput, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """The members' logits ``(B, M, C)`` from the encoder's output (``attention_mask``: the ``(B, T)`` input)."""
        if self.head_activation is None:
            pooled = outputs.member_pooler_output.transpose(0, 1)  # (M, B, d)
            return self.classifier(self.dropout(pooled)).transpose(0, 1)  # (B, M, C)
        first = outputs.member_last_hidden_state[:, :, 0].transpose(0, 1)  # (M, B, d): every member's first token
        return self.classifier(first).transpose(0, 1)  # (B, M, C)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        output_member_hidden_states: bool = False,
        **kwargs,
    ) -> HydraClassifierOutput | tuple:
        return_dict = self.config.return_dict if return_dict is None else return_dict
        outputs = self.hydra(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
            position_ids=position_ids, inputs_embeds=inputs_embeds, output_attentions=output_attentions,
            output_hidden_states=output_hidden_states, return_dict=True,
            output_member_hidden_states=output_member_hidden_states,
        )
        member_logits = self.member_logits(outputs, attention_mask)  # (B, M, C)
        return classifier_output(member_logits, labels, self.config, outputs, return_dict)

    def forward_without_token_types(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        output_member_hidden_states: bool = False,
        **kwargs,
    ) -> HydraClassifierOutput | tuple:
        """``forward`` for a base without token types (see ``HydraTextEncoder.forward_without_token_types``)."""
        return HydraTextForSequenceClassification.forward(
            self, input_ids, attention_mask, None, position_ids, inputs_embeds, labels, output_attentions,
            output_hidden_states, return_dict, output_member_hidden_states,
        )


# ------------------------------------------------------------------ image skeletons
class HydraVisionPreTrainedModel(HydraPreTrainedModel):
    """The base of a pre-LN image family's classes (ViT, DeiT, BEiT, DINOv2). The family's own subclass
    sets ``config_class``, ``base_config_class``, ``embeddings_class`` (one class or a tuple), the
    embeddings' tokens initialised truncated-normal (``trunc_normal_tokens``, in this order) or zero
    (``zero_tokens``), and ``init_own_weights`` for its own modules (layer scale, bias tables)."""

    main_input_name = "pixel_values"
    input_modalities = ("image",)
    embeddings_class: type | tuple[type, ...]
    trunc_normal_tokens: tuple[str, ...] = ("position_embeddings", "cls_token")
    zero_tokens: tuple[str, ...] = ()

    def init_own_weights(self, module: nn.Module) -> bool:
        """Initialise one of the family's own modules; False for any other module."""
        return False

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.base_config.get("initializer_range", 0.02)
        if init_hydra_weights(module, std) or self.init_own_weights(module):
            return
        if isinstance(module, self.embeddings_class):
            tokens = dict(module.named_parameters(recurse=False))  # a token the base does not use is absent
            for name in self.trunc_normal_tokens:
                if name in tokens:
                    init.trunc_normal_(tokens[name], mean=0.0, std=std)
            for name in self.zero_tokens:
                if name in tokens:
                    init.zeros_(tokens[name])
        elif isinstance(module, (nn.Linear, nn.Conv2d, nn.LayerNorm)):
            super()._init_weights(module)


class HydraVisionEncoder(HydraVisionPreTrainedModel):
    """The public side of every fused image encoder: ``forward``'s signature, the output flags, the check of
    ``pixel_values`` (any size with ``interpolate_pos_encoding``, or always with ``any_image_size``: BEiT,
    DINOv2, as in transformers) and the output. The family computes in ``encode``."""

    any_image_size = False

    # The family's class defines ``encode(pixel_values, interpolate_pos_encoding, output_attentions,
    # output_hidden_states)`` -> every member's final hidden states ``(B, M, T, d)``, pooled output ``(B, M, d)``
    # or None, and the ``LayerOutputs`` of its layer loop.

    def get_input_embeddings(self) -> nn.Module:
        return self.embeddings.patch_embeddings

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        interpolate_pos_encoding: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        output_member_hidden_states: bool = False,
        **kwargs,
    ) -> HydraModelOutput | tuple:
        """``output_member_hidden_states``: also return every member's per-layer streams,
        ``member_hidden_states`` (``output_hidden_states`` returns only the standard ``hidden_states``)."""
        output_attentions, output_hidden_states, return_dict = resolve_output_flags(
            self.config, output_attentions, output_hidden_states, return_dict
        )
        interpolate = bool(interpolate_pos_encoding)
        patch = self.embeddings.patch_embeddings
        check_pixel_values(pixel_values, patch.num_channels, patch.image_size, interpolate or self.any_image_size)
        pixel_values = pixel_values.to(patch.projection.weight.dtype)
        record = output_hidden_states or output_member_hidden_states  # the layers record the streams for either
        return encoder_output(
            *self.encode(pixel_values, interpolate, output_attentions, record), return_dict,
            output_hidden_states=output_hidden_states, output_member_hidden_states=output_member_hidden_states,
        )


class HydraPreLNVisionModel(HydraVisionEncoder):
    """The fused pre-LN image encoder: shared embeddings, M residual streams through the family's layers
    (``build_layers``; default ``HydraPreLNLayer``), per-member final LayerNorms (``layernorm``).

    Family hooks: ``build_embeddings``, ``build_layers``, ``embed`` (the embeddings call) and ``pool`` (the
    ``pooler_output`` from the normalised tokens; None by default).
    """

    def __init__(self, config) -> None:
        super().__init__(config)
        base = self.base_config(config)
        self.embeddings = self.build_embeddings(base)
        self.layers = nn.ModuleList(self.build_layers(config, base))
        self.layernorm = HydraLayerNorm(config.num_members, base.hidden_size, base.layer_norm_eps)
        self.post_init()

    def build_embeddings(self, base) -> nn.Module:
        return self.embeddings_class(base)

    def build_layers(self, config, base) -> list[nn.Module]:
        return [HydraPreLNLayer(config, spec) for spec in base_layer_specs(config, base)]

    def embed(self, pixel_values: torch.Tensor, interpolate_pos_encoding: bool) -> torch.Tensor:
        """``(B, C, H, W)`` -> the shared input of the first layer ``(B, T, d)``."""
        return self.embeddings(pixel_values, interpolate_pos_encoding=interpolate_pos_encoding)

    def pool(self, last: torch.Tensor) -> torch.Tensor | None:
        """``last (B, M, T, d)`` -> ``member_pooler_output (B, M, d)``, or None."""
        return None

    def encode(
        self, pixel_values, interpolate_pos_encoding, output_attentions, output_hidden_states
    ) -> tuple[torch.Tensor, torch.Tensor | None, LayerOutputs]:
        embeddings = self.embed(pixel_values, interpolate_pos_encoding)  # (B, T, d)
        hidden, outs = run_layers(
            self.layers, embeddings, self.config.num_members, None, output_hidden_states, output_attentions
        )  # (M, B, T, d)
        last = self.layernorm(hidden).transpose(0, 1)  # (B, M, T, d)
        return last, self.pool(last), outs


class HydraVisionForImageClassification(HydraVisionPreTrainedModel):
    """M pruned image classifiers in one model. ``logits`` = log of the mean of the members' softmaxes.

    ``encoder_class`` is the family's encoder; ``add_head`` registers the per-member head (default: a
    ``classifier (M, C, d)``) and ``member_logits`` computes ``(B, M, C)`` from the encoder's output
    (default: the classifier on every member's first token).
    """

    encoder_class: type

    def __init__(self, config) -> None:
        super().__init__(config)
        base = self.base_config(config)
        self.num_labels = config.num_labels
        self.hydra = self.encoder_class(config)
        self.add_head(config, base)
        self.post_init()

    def add_head(self, config, base) -> None:
        self.classifier = HydraMemberLinear(config.num_members, base.hidden_size, config.num_labels)

    def member_logits(self, outputs: HydraModelOutput) -> torch.Tensor:
        first = outputs.member_last_hidden_state[:, :, 0].transpose(
            0, 1
        )  # (M, B, d): every member's first ([CLS]) token
        return self.classifier(first).transpose(0, 1)  # (B, M, C)

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        interpolate_pos_encoding: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        output_member_hidden_states: bool = False,
        **kwargs,
    ) -> HydraClassifierOutput | tuple:
        return_dict = self.config.return_dict if return_dict is None else return_dict
        outputs = self.hydra(
            pixel_values, interpolate_pos_encoding=interpolate_pos_encoding, output_attentions=output_attentions,
            output_hidden_states=output_hidden_states, return_dict=True,
            output_member_hidden_states=output_member_hidden_states,
        )
        return classifier_output(self.member_logits(outputs), labels, self.config, outputs, return_dict)


# ------------------------------------------------------------------ two-tower skeletons (CLIP, SigLIP)
@dataclass
class HydraTwoTowerOutput(ModelOutput):
    """Output of a fused two-tower model (CLIP, SigLIP); the family's subclass says how its logits are made.

    Args:
        loss: mean over members of each member's contrastive loss, with ``return_loss=True``.
        logits_per_image: ``(B, N)`` the ensemble's logits of every (image, text) pair.
        logits_per_text: ``(N, B)`` the same, per text.
        member_logits_per_image: ``(B, M, N)`` every member's logits.
        member_logits_per_text: ``(N, M, B)`` the same, per text.
        text_embeds: ``(N, P)`` the ensemble's text embeddings, as the stock field: the members' mean of
            ``member_text_embeds``, L2-normalised (one member: its own).
        image_embeds: ``(B, P)`` the same for the images (from ``member_image_embeds``).
        text_model_output, vision_model_output: the towers' ``HydraModelOutput``.
        member_text_embeds: ``(N, M, P)`` L2-normalised text embeddings of every member.
        member_image_embeds: ``(B, M, P)`` L2-normalised image embeddings of every member.
    """

    loss: torch.Tensor | None = None
    logits_per_image: torch.Tensor | None = None
    logits_per_text: torch.Tensor | None = None
    member_logits_per_image: torch.Tensor | None = None
    member_logits_per_text: torch.Tensor | None = None
    text_embeds: torch.Tensor | None = None
    image_embeds: torch.Tensor | None = None
    text_model_output: HydraModelOutput | None = None
    vision_model_output: HydraModelOutput | None = None
    member_text_embeds: torch.Tensor | None = None
    member_image_embeds: torch.Tensor | None = None

    def to_tuple(self) -> tuple:
        return tuple(
            self[k] if k not in ("text_model_output", "vision_model_output") else getattr(self, k).to_tuple()
            for k in self.keys()
        )


def unit_mean(member_embeds: torch.Tensor) -> torch.Tensor:
    """The ensemble's embedding ``(N, P)`` from every member's unit embedding ``member_embeds (N, M, P)``: their
    mean, L2-normalised, so that a client's dot products are cosines, as with the stock field."""
    mean = member_embeds.mean(dim=1)  # (N, P)
    return mean / mean.norm(p=2, dim=-1, keepdim=True)


def tower_layers(config, tower: str, base, is_causal: bool = False) -> nn.ModuleList:
    """The fused pre-LN layers of one tower, ``config.kept_heads_of(tower)`` (no dropout on the branches, as
    in CLIP and SigLIP; ``is_causal``: CLIP's text tower)."""
    kept = config.kept_heads_of(tower)
    return nn.ModuleList(
        HydraPreLNLayer(
            config,
            layer_spec(
                kept, i, hidden_size=base.hidden_size, num_heads=base.num_attention_heads,
                intermediate_size=base.intermediate_size, hidden_act=base.hidden_act,
                layer_norm_eps=base.layer_norm_eps, attention_dropout=base.attention_dropout, hidden_dropout=0.0,
                mlp_fusion=config.mlp_fusion, kept_neurons=config.kept_neurons_of(tower),
            ),
            is_causal=is_causal,
        )
        for i in range(base.num_hidden_layers)
    )


class HydraTower(nn.Module):
    """One tower of a two-tower model for M members: shared ``embeddings``, fused ``layers``; the family's
    subclass registers them (and its norms and heads) and defines ``pool``."""

    # The family's tower defines ``pool(hidden, input_ids)``: ``hidden (M, B, T, d)`` after the layers -> the
    # returned hidden states ``(M, B, T, d)`` and the pooled output ``(M, B, P)``.

    def run(
        self, embeddings: torch.Tensor, mask: torch.Tensor | None, output_attentions: bool, output_hidden_states: bool,
        input_ids: torch.Tensor | None = None, output_member_hidden_states: bool = False,
    ) -> HydraModelOutput:
        """The layers on the shared ``embeddings (B, T, d)``, then the family's pooling."""
        record = output_hidden_states or output_member_hidden_states  # the layers record the streams for either
        hidden, outs = run_layers(
            self.layers, embeddings, self.config.num_members, mask, record, output_attentions
        )  # (M, B, T, d)
        hidden, pooled = self.pool(hidden, input_ids)
        return model_output(
            hidden.transpose(0, 1), pooled.transpose(0, 1), outs, output_hidden_states=output_hidden_states,
            output_member_hidden_states=output_member_hidden_states,
        )


class HydraVisionTower(HydraTower):
    """The vision tower: checks ``pixel_values``, embeds them (``embed``), runs the layers and pools."""

    def embed(self, pixel_values: torch.Tensor, interpolate_pos_encoding: bool) -> torch.Tensor:
        return self.embeddings(pixel_values, interpolate_pos_encoding=interpolate_pos_encoding)  # (B, T, d)

    def forward(
        self, pixel_values: torch.Tensor, interpolate_pos_encoding: bool = False, output_attentions: bool = False,
        output_hidden_states: bool = False, output_member_hidden_states: bool = False,
    ) -> HydraModelOutput:
        emb = self.embeddings
        size = (emb.image_size, emb.image_size)
        check_pixel_values(pixel_values, emb.patch_embedding.in_channels, size, bool(interpolate_pos_encoding))
        hidden = self.embed(pixel_values, bool(interpolate_pos_encoding))  # (B, T, d)
        return self.run(hidden, None, output_attentions, output_hidden_states, None, output_member_hidden_states)


class HydraTextTower(HydraTower):
    """The text tower: embeds ``input_ids (N, T)``, masks (``text_mask``), runs the layers and pools."""

    def text_mask(self, attention_mask: torch.Tensor | None, hidden: torch.Tensor) -> torch.Tensor | None:
        """The additive attention mask for ``hidden (N, T, d)`` from the ``(N, T)`` padding mask, or None."""
        return padding_mask_to_additive(attention_mask, hidden.dtype, hidden.shape[1])  # (N, 1, 1, T) or None

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None, output_attentions: bool = False, output_hidden_states: bool = False,
        output_member_hidden_states: bool = False,
    ) -> HydraModelOutput:
        if input_ids is None:
            raise ValueError("input_ids is required: the texts tokenized with the model's tokenizer")
        input_ids = input_ids.view(-1, input_ids.shape[-1])  # (N, T)
        hidden = self.embeddings(input_ids=input_ids, position_ids=position_ids)  # (N, T, d)
        return self.run(
            hidden, self.text_mask(attention_mask, hidden), output_attentions, output_hidden_states, input_ids,
            output_member_hidden_states,
        )


class HydraTwoTowerModel(HydraPreTrainedModel):
    """M pruned two-tower models in one (``vision_model``, ``text_model``: ``HydraTower``s). Member m scores
    image b against text n with its own towers; the family says how (``member_logits``), how the members'
    scores are combined (``ensemble_logits``), its loss (``member_loss``), its output class
    (``output_class``) and whether the pooled outputs are projected (``image_embeds`` / ``text_embeds``).
    """

    input_modalities = ("image", "text")
    output_class: type = HydraTwoTowerOutput

    def get_input_embeddings(self) -> nn.Module:
        return self.text_model.embeddings.token_embedding

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.text_model.embeddings.token_embedding = value

    def image_embeds(self, pooled: torch.Tensor) -> torch.Tensor:
        """The vision tower's ``member_pooler_output (B, M, d)`` -> every member's image embeddings ``(B, M, P)``."""
        return pooled

    def text_embeds(self, pooled: torch.Tensor) -> torch.Tensor:
        """The text tower's ``member_pooler_output (N, M, d)`` -> every member's text embeddings ``(N, M, P)``."""
        return pooled

    # The family's model defines ``member_logits(image_embeds, text_embeds)``: normalised ``(B, M, P)``,
    # ``(N, M, P)`` -> ``(B, M, N)`` (CLIP: scaled cosine; SigLIP: plus its bias), and
    # ``ensemble_logits(member_logits_per_image, member_logits_per_text)``: ``(B, M, N)``, ``(N, M, B)`` ->
    # ``logits_per_image (B, N)``, ``logits_per_text (N, B)`` (softmax or sigmoid ensemble), and
    # ``member_loss(member_logits_per_image, member_logits_per_text)``: the mean of the members' contrastive
    # (CLIP) or sigmoid (SigLIP) losses.

    def get_text_features(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None, **kwargs,
    ) -> torch.Tensor:
        """Every member's text embeddings ``(N, M, P)`` (not normalised)."""
        return self.text_embeds(self.text_model(input_ids, attention_mask, position_ids).member_pooler_output)

    def get_image_features(
        self, pixel_values: torch.Tensor, interpolate_pos_encoding: bool = False, **kwargs
    ) -> torch.Tensor:
        """Every member's image embeddings ``(B, M, P)`` (not normalised)."""
        return self.image_embeds(self.vision_model(pixel_values, interpolate_pos_encoding).member_pooler_output)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        pixel_values: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        return_loss: bool | None = None,
        interpolate_pos_encoding: bool = False,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        output_member_hidden_states: bool = False,
        **kwargs,
    ) -> HydraTwoTowerOutput | tuple:
        """``output_member_hidden_states``: the towers' outputs also hold every member's per-layer streams,
        ``member_hidden_states`` (``output_hidden_states`` returns only the standard ``hidden_states``)."""
        output_attentions, output_hidden_states, return_dict = resolve_output_flags(
            self.config, output_attentions, output_hidden_states, return_dict
        )
        flags = (output_attentions, output_hidden_states, output_member_hidden_states)
        vision = self.vision_model(pixel_values, interpolate_pos_encoding, *flags)
        text = self.text_model(input_ids, attention_mask, position_ids, *flags)
        image_embeds = self.image_embeds(vision.member_pooler_output)  # (B, M, P)
        text_embeds = self.text_embeds(text.member_pooler_output)  # (N, M, P)
        image_embeds = image_embeds / image_embeds.norm(p=2, dim=-1, keepdim=True)
        text_embeds = text_embeds / text_embeds.norm(p=2, dim=-1, keepdim=True)
        member_logits_per_image = self.member_logits(image_embeds, text_embeds)  # (B, M, N)
        member_logits_per_text = member_logits_per_image.permute(2, 1, 0)  # (N, M, B)
        logits_per_image, logits_per_text = self.ensemble_logits(member_logits_per_image, member_logits_per_text)
        loss = self.member_loss(member_logits_per_image, member_logits_per_text) if return_loss else None
        out = self.output_class(
            loss=loss,
            logits_per_image=logits_per_image,
            logits_per_text=logits_per_text,
            member_logits_per_image=member_logits_per_image,
            member_logits_per_text=member_logits_per_text,
            text_embeds=unit_mean(text_embeds),  # (N, P)
            image_embeds=unit_mean(image_embeds),  # (B, P)
            text_model_output=text,
            vision_model_output=vision,
            member_text_embeds=text_embeds,
            member_image_embeds=image_embeds,
        )
        return out if return_dict else out.to_tuple()
