# Shipped with every Hydra Ensemble model folder (remote code): imports only the standard library,
# torch, transformers and sibling files.
"""Hydra Ensemble of DistilBERT: M head-pruned members run as one model in one pass.

Shared DistilBERT embeddings (word + position, no token types) feed M residual streams through
post-LN layers (``sa_layer_norm`` / ``output_layer_norm``; no dropout on the attention output, as in
DistilBERT) with fused self-attention, per-member LayerNorms and an MLP averaged across members (or
kept per member). Every member has its own ``pre_classifier`` -> ReLU -> ``classifier`` head on its
first token; the prediction is the mean of the members' softmaxes.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import DistilBertConfig
from transformers import initialization as init
from transformers.models.distilbert.modeling_distilbert import Embeddings as DistilBertEmbeddings

from .configuration_hydra import HydraEnsembleDistilBertConfig
from .hydra_layers import (
    HydraClassificationHead,
    HydraModelOutput,
    HydraPostLNLayer,
    HydraPreTrainedModel,
    classifier_output,
    init_hydra_weights,
    layer_spec_for,
    padding_mask_to_additive,
    run_layers,
)


# DistilBERT's LayerNorms use this epsilon whatever its config says (transformers' TransformerBlock).
DISTILBERT_LAYER_NORM_EPS = 1e-12


def distilbert_base_config(config: HydraEnsembleDistilBertConfig) -> DistilBertConfig:
    """The base DistilBERT configuration stored in ``config.base_config``."""
    return DistilBertConfig.from_dict(config.base_config)


class HydraEnsembleDistilBertPreTrainedModel(HydraPreTrainedModel):
    config_class = HydraEnsembleDistilBertConfig
    main_input_name = "input_ids"
    _no_split_modules = ["HydraPostLNLayer"]

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.base_config.get("initializer_range", 0.02)
        if init_hydra_weights(module, std):
            return
        if isinstance(module, DistilBertEmbeddings):
            init.copy_(module.position_ids, torch.arange(module.position_ids.shape[-1]).expand((1, -1)))
        elif isinstance(module, (nn.Linear, nn.Embedding, nn.LayerNorm)):
            super()._init_weights(module)


class HydraEnsembleDistilBertModel(HydraEnsembleDistilBertPreTrainedModel):
    """The fused encoder: shared DistilBERT embeddings, M residual streams.

    ``AutoModel.from_pretrained(folder, trust_remote_code=True)`` returns this class.
    """

    def __init__(self, config: HydraEnsembleDistilBertConfig) -> None:
        super().__init__(config)
        base = distilbert_base_config(config)
        self.embeddings = DistilBertEmbeddings(base)
        self.layers = nn.ModuleList(
            HydraPostLNLayer(
                config,
                layer_spec_for(
                    config.kept_heads, i, hidden_size=base.dim, num_heads=base.n_heads, intermediate_size=base.hidden_dim,
                    hidden_act=base.activation, layer_norm_eps=DISTILBERT_LAYER_NORM_EPS,
                    attention_dropout=base.attention_dropout, hidden_dropout=base.dropout, mlp_fusion=config.mlp_fusion,
                ),
                attention_output_dropout=False,
            )
            for i in range(base.n_layers)
        )
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.word_embeddings = value

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
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
        embeddings = self.embeddings(input_ids, inputs_embeds, position_ids)  # (B, T, d), shared by all members
        mask = padding_mask_to_additive(attention_mask, embeddings.dtype, embeddings.shape[1])  # (B, 1, 1, T) or None
        hidden, all_hidden, all_attentions = run_layers(
            self.layers, embeddings, self.config.num_members, mask, output_hidden_states, output_attentions
        )  # (M, B, T, d)
        last = hidden.transpose(0, 1)  # (B, M, T, d)
        if not return_dict:
            return tuple(v for v in (last, all_hidden, all_attentions) if v is not None)
        return HydraModelOutput(last_hidden_state=last, hidden_states=all_hidden, attentions=all_attentions)


class HydraEnsembleDistilBertForSequenceClassification(HydraEnsembleDistilBertPreTrainedModel):
    """M pruned DistilBERT classifiers in one model. ``logits`` = log of the mean of the members' softmaxes.

    ``AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True)`` and
    ``pipeline("text-classification", model=folder, trust_remote_code=True)`` use this class.
    """

    def __init__(self, config: HydraEnsembleDistilBertConfig) -> None:
        super().__init__(config)
        base = distilbert_base_config(config)
        self.num_labels = config.num_labels
        self.hydra = HydraEnsembleDistilBertModel(config)
        # every member's pre_classifier (classifier.dense) -> ReLU -> dropout -> classifier (classifier.out_proj)
        self.classifier = HydraClassificationHead(
            config.num_members, base.dim, config.num_labels, "relu", base.seq_classif_dropout, dropout_first=False
        )
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ):
        return_dict = self.config.return_dict if return_dict is None else return_dict
        outputs = self.hydra(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        first = outputs.last_hidden_state[:, :, 0].transpose(0, 1)  # (M, B, d): every member's [CLS] token
        member_logits = self.classifier(first).transpose(0, 1)  # (B, M, C)
        return classifier_output(member_logits, labels, self.config, outputs, return_dict)
