# Shipped with every Hydra Ensemble model folder (remote code): imports only the standard library,
# torch, transformers and sibling files.
"""Hydra Ensemble of a RoBERTa-layout encoder (RoBERTa, XLM-RoBERTa, CamemBERT): M head-pruned
members run as one model in one pass.

Shared RoBERTa embeddings (position ids count from ``pad_token_id + 1`` and skip padding) feed M
residual streams through post-LN layers with fused self-attention, per-member LayerNorms and an MLP
averaged across members (or kept per member). Every member has its own classification head
(``dense`` -> tanh -> ``out_proj`` on its first token, as ``RobertaClassificationHead``); the
prediction is the mean of the members' softmaxes.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import RobertaConfig
from transformers import initialization as init
from transformers.models.roberta.modeling_roberta import RobertaEmbeddings

from .configuration_hydra import HydraEnsembleRobertaConfig
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


def roberta_base_config(config: HydraEnsembleRobertaConfig) -> RobertaConfig:
    """The base configuration stored in ``config.base_config`` (a RoBERTa, XLM-RoBERTa or CamemBERT dict)."""
    return RobertaConfig.from_dict(config.base_config)


class HydraEnsembleRobertaPreTrainedModel(HydraPreTrainedModel):
    config_class = HydraEnsembleRobertaConfig
    main_input_name = "input_ids"
    _no_split_modules = ["HydraPostLNLayer"]

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.base_config.get("initializer_range", 0.02)
        if init_hydra_weights(module, std):
            return
        if isinstance(module, RobertaEmbeddings):
            init.copy_(module.position_ids, torch.arange(module.position_ids.shape[-1]).expand((1, -1)))
            init.zeros_(module.token_type_ids)
        elif isinstance(module, (nn.Linear, nn.Embedding, nn.LayerNorm)):
            super()._init_weights(module)


class HydraEnsembleRobertaModel(HydraEnsembleRobertaPreTrainedModel):
    """The fused encoder: shared RoBERTa embeddings, M residual streams (no pooler: RoBERTa's
    sequence classifier reads the first token).

    ``AutoModel.from_pretrained(folder, trust_remote_code=True)`` returns this class.
    """

    def __init__(self, config: HydraEnsembleRobertaConfig) -> None:
        super().__init__(config)
        base = roberta_base_config(config)
        self.embeddings = RobertaEmbeddings(base)
        self.layers = nn.ModuleList(
            HydraPostLNLayer(
                config,
                layer_spec_for(
                    config.kept_heads, i, hidden_size=base.hidden_size, num_heads=base.num_attention_heads,
                    intermediate_size=base.intermediate_size, hidden_act=base.hidden_act,
                    layer_norm_eps=base.layer_norm_eps, attention_dropout=base.attention_probs_dropout_prob,
                    hidden_dropout=base.hidden_dropout_prob, mlp_fusion=config.mlp_fusion,
                ),
            )
            for i in range(base.num_hidden_layers)
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
        mask = padding_mask_to_additive(attention_mask, embeddings.dtype, embeddings.shape[1])  # (B, 1, 1, T) or None
        hidden, all_hidden, all_attentions = run_layers(
            self.layers, embeddings, self.config.num_members, mask, output_hidden_states, output_attentions
        )  # (M, B, T, d)
        last = hidden.transpose(0, 1)  # (B, M, T, d)
        if not return_dict:
            return tuple(v for v in (last, all_hidden, all_attentions) if v is not None)
        return HydraModelOutput(last_hidden_state=last, hidden_states=all_hidden, attentions=all_attentions)


class HydraEnsembleRobertaForSequenceClassification(HydraEnsembleRobertaPreTrainedModel):
    """M pruned RoBERTa classifiers in one model. ``logits`` = log of the mean of the members' softmaxes.

    ``AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True)`` and
    ``pipeline("text-classification", model=folder, trust_remote_code=True)`` use this class.
    """

    def __init__(self, config: HydraEnsembleRobertaConfig) -> None:
        super().__init__(config)
        base = roberta_base_config(config)
        self.num_labels = config.num_labels
        self.hydra = HydraEnsembleRobertaModel(config)
        dropout = base.classifier_dropout if base.classifier_dropout is not None else base.hidden_dropout_prob
        self.classifier = HydraClassificationHead(config.num_members, base.hidden_size, config.num_labels, "tanh", dropout)
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
    ):
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
        first = outputs.last_hidden_state[:, :, 0].transpose(0, 1)  # (M, B, d): every member's <s> token
        member_logits = self.classifier(first).transpose(0, 1)  # (B, M, C)
        return classifier_output(member_logits, labels, self.config, outputs, return_dict)
