# Shipped with every Hydra Ensemble model folder (remote code): imports only the standard library,
# torch, transformers and sibling files.
"""Hydra Ensemble of a BERT-family encoder: M head-pruned members run as one model in one pass.

Shared embeddings feed M residual streams. Every layer is BERT's post-LN layer with fused
self-attention over all members' kept heads, per-member LayerNorms, and an MLP averaged across
members (or kept per member). Every member has its own pooler and classifier; the prediction is the
mean of the members' softmaxes.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import BertConfig
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.models.bert.modeling_bert import BertEmbeddings

from .configuration_hydra import HydraEnsembleConfig
from .hydra_layers import (
    HydraClassifierOutput,
    HydraLayerNorm,
    HydraLayerSpec,
    HydraMemberLinear,
    HydraMLP,
    HydraModelOutput,
    HydraPreTrainedModel,
    HydraSelfAttention,
    ensemble_outputs,
    init_hydra_weights,
    padding_mask_to_additive,
    run_layers,
)


def bert_base_config(config: HydraEnsembleConfig) -> BertConfig:
    """The base BERT configuration stored in ``config.base_config``."""
    return BertConfig.from_dict(config.base_config)


def bert_layer_spec(config: HydraEnsembleConfig, base: BertConfig, layer_idx: int) -> HydraLayerSpec:
    return HydraLayerSpec(
        hidden_size=base.hidden_size,
        num_heads=base.num_attention_heads,
        kept_heads=tuple(tuple(member[layer_idx]) for member in config.kept_heads),
        intermediate_size=base.intermediate_size,
        hidden_act=base.hidden_act,
        layer_norm_eps=base.layer_norm_eps,
        attention_dropout=base.attention_probs_dropout_prob,
        hidden_dropout=base.hidden_dropout_prob,
        mlp_fusion=config.mlp_fusion,
    )


class HydraBertLayer(GradientCheckpointingLayer):
    """BERT's post-LN layer for M members: ``h = LN1_m(h + Attn(h)); h = LN2_m(h + MLP(h))``."""

    def __init__(self, config: HydraEnsembleConfig, spec: HydraLayerSpec) -> None:
        super().__init__()
        self.attention = HydraSelfAttention(config, spec)
        self.norm1 = HydraLayerNorm(spec.num_members, spec.hidden_size, spec.layer_norm_eps)
        self.mlp = HydraMLP(spec)
        self.norm2 = HydraLayerNorm(spec.num_members, spec.hidden_size, spec.layer_norm_eps)
        self.dropout = nn.Dropout(spec.hidden_dropout)

    def forward(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None, output_attentions: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``hidden (M, B, T, d)`` or shared ``(B, T, d)`` -> ``(M, B, T, d)``. Checkpointed (recomputed in the
        backward pass) after ``model.gradient_checkpointing_enable()``."""
        attn, weights = self.attention(hidden, attention_mask, output_attentions)  # (M, B, T, d)
        hidden = self.norm1(self.dropout(attn) + hidden)  # broadcasts a shared input over M
        hidden = self.norm2(self.dropout(self.mlp(hidden)) + hidden)
        return hidden, weights


class HydraEnsemblePreTrainedModel(HydraPreTrainedModel):
    config_class = HydraEnsembleConfig
    main_input_name = "input_ids"
    _no_split_modules = ["HydraBertLayer"]

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.base_config.get("initializer_range", 0.02)
        if init_hydra_weights(module, std):
            return
        if isinstance(module, BertEmbeddings):
            init.copy_(module.position_ids, torch.arange(module.position_ids.shape[-1]).expand((1, -1)))
            init.zeros_(module.token_type_ids)
        elif isinstance(module, (nn.Linear, nn.Embedding, nn.LayerNorm)):
            super()._init_weights(module)


class HydraEnsembleModel(HydraEnsemblePreTrainedModel):
    """The fused encoder: shared BERT embeddings, M residual streams, per-member poolers.

    ``AutoModel.from_pretrained(folder, trust_remote_code=True)`` returns this class.
    """

    def __init__(self, config: HydraEnsembleConfig, add_pooling_layer: bool = True) -> None:
        super().__init__(config)
        base = bert_base_config(config)
        self.embeddings = BertEmbeddings(base)
        self.layers = nn.ModuleList(
            HydraBertLayer(config, bert_layer_spec(config, base, i)) for i in range(base.num_hidden_layers)
        )
        self.pooler = HydraMemberLinear(config.num_members, base.hidden_size, base.hidden_size) if add_pooling_layer else None
        self.post_init()

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
        **kwargs,
    ) -> HydraModelOutput | tuple:
        output_attentions = self.config.output_attentions if output_attentions is None else output_attentions
        output_hidden_states = self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        return_dict = self.config.return_dict if return_dict is None else return_dict
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        embeddings = self.embeddings(
            input_ids=input_ids, token_type_ids=token_type_ids, position_ids=position_ids, inputs_embeds=inputs_embeds
        )  # (B, T, d), shared by all members
        B, T, _ = embeddings.shape
        mask = padding_mask_to_additive(attention_mask, embeddings.dtype, T)  # (B, 1, 1, T) or None
        M = self.config.num_members

        hidden, all_hidden, all_attentions = run_layers(
            self.layers, embeddings, M, mask, output_hidden_states, output_attentions
        )  # (M, B, T, d)
        pooled = torch.tanh(self.pooler(hidden[:, :, 0])).transpose(0, 1) if self.pooler is not None else None  # (B, M, d)
        last = hidden.transpose(0, 1)  # (B, M, T, d)
        if not return_dict:
            return tuple(v for v in (last, pooled, all_hidden, all_attentions) if v is not None)
        return HydraModelOutput(
            last_hidden_state=last, pooler_output=pooled, hidden_states=all_hidden, attentions=all_attentions
        )


class HydraEnsembleForSequenceClassification(HydraEnsemblePreTrainedModel):
    """M pruned BERT classifiers in one model. ``logits`` = log of the mean of the members' softmaxes.

    ``AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True)`` and
    ``pipeline("text-classification", model=folder, trust_remote_code=True)`` use this class.
    """

    def __init__(self, config: HydraEnsembleConfig) -> None:
        super().__init__(config)
        base = bert_base_config(config)
        self.num_labels = config.num_labels
        self.hydra = HydraEnsembleModel(config)
        dropout = base.classifier_dropout if base.classifier_dropout is not None else base.hidden_dropout_prob
        self.dropout = nn.Dropout(dropout)
        self.classifier = HydraMemberLinear(config.num_members, base.hidden_size, config.num_labels)
        self.post_init()

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
        **kwargs,
    ) -> HydraClassifierOutput | tuple:
        return_dict = self.config.return_dict if return_dict is None else return_dict
        outputs = self.hydra(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        pooled = outputs.pooler_output.transpose(0, 1)  # (M, B, d)
        member_logits = self.classifier(self.dropout(pooled)).transpose(0, 1)  # (B, M, C)
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
