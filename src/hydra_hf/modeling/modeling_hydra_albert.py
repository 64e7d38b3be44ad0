# Shipped with every Hydra Ensemble model folder (remote code): imports only the standard library,
# torch, transformers and sibling files.
"""Hydra Ensemble of ALBERT: M head-pruned members run as one model in one pass.

Shared ALBERT embeddings (width ``embedding_size``) and the shared ``embedding_hidden_mapping_in``
projection feed M residual streams through post-LN layers. ALBERT shares one layer's weights across
its layers (``num_hidden_groups`` groups); here every layer is its own fused layer holding a copy of
its group's weights, so that every member prunes every layer separately. As in ALBERT, no dropout is
applied to the MLP output. Every member has its own pooler (tanh) and classifier; the prediction is
the mean of the members' softmaxes.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AlbertConfig
from transformers import initialization as init
from transformers.models.albert.modeling_albert import AlbertEmbeddings

from .configuration_hydra import HydraEnsembleAlbertConfig
from .hydra_layers import (
    HydraMemberLinear,
    HydraModelOutput,
    HydraPostLNLayer,
    HydraPreTrainedModel,
    classifier_output,
    init_hydra_weights,
    layer_spec_for,
    padding_mask_to_additive,
    run_layers,
)


def albert_base_config(config: HydraEnsembleAlbertConfig) -> AlbertConfig:
    """The base ALBERT configuration stored in ``config.base_config``."""
    return AlbertConfig.from_dict(config.base_config)


class HydraEnsembleAlbertPreTrainedModel(HydraPreTrainedModel):
    config_class = HydraEnsembleAlbertConfig
    main_input_name = "input_ids"
    _no_split_modules = ["HydraPostLNLayer"]

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.base_config.get("initializer_range", 0.02)
        if init_hydra_weights(module, std):
            return
        if isinstance(module, AlbertEmbeddings):
            init.copy_(module.position_ids, torch.arange(module.position_ids.shape[-1]).expand((1, -1)))
            init.zeros_(module.token_type_ids)
        elif isinstance(module, (nn.Linear, nn.Embedding, nn.LayerNorm)):
            super()._init_weights(module)


class HydraEnsembleAlbertModel(HydraEnsembleAlbertPreTrainedModel):
    """The fused encoder: shared ALBERT embeddings and input projection, one fused layer per layer,
    per-member poolers.

    ``AutoModel.from_pretrained(folder, trust_remote_code=True)`` returns this class.
    """

    def __init__(self, config: HydraEnsembleAlbertConfig, add_pooling_layer: bool = True) -> None:
        super().__init__(config)
        base = albert_base_config(config)
        self.embeddings = AlbertEmbeddings(base)
        self.embedding_hidden_mapping_in = nn.Linear(base.embedding_size, base.hidden_size)  # shared
        self.layers = nn.ModuleList(
            HydraPostLNLayer(
                config,
                layer_spec_for(
                    config.kept_heads, i, hidden_size=base.hidden_size, num_heads=base.num_attention_heads,
                    intermediate_size=base.intermediate_size, hidden_act=base.hidden_act,
                    layer_norm_eps=base.layer_norm_eps, attention_dropout=base.attention_probs_dropout_prob,
                    hidden_dropout=base.hidden_dropout_prob, mlp_fusion=config.mlp_fusion,
                ),
                mlp_output_dropout=False,
            )
            for i in range(base.num_hidden_layers)
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
        )  # (B, T, E), shared by all members
        embeddings = self.embedding_hidden_mapping_in(embeddings)  # (B, T, d)
        mask = padding_mask_to_additive(attention_mask, embeddings.dtype, embeddings.shape[1])  # (B, 1, 1, T) or None
        hidden, all_hidden, all_attentions = run_layers(
            self.layers, embeddings, self.config.num_members, mask, output_hidden_states, output_attentions
        )  # (M, B, T, d)
        pooled = torch.tanh(self.pooler(hidden[:, :, 0])).transpose(0, 1) if self.pooler is not None else None  # (B, M, d)
        last = hidden.transpose(0, 1)  # (B, M, T, d)
        if not return_dict:
            return tuple(v for v in (last, pooled, all_hidden, all_attentions) if v is not None)
        return HydraModelOutput(
            last_hidden_state=last, pooler_output=pooled, hidden_states=all_hidden, attentions=all_attentions
        )


class HydraEnsembleAlbertForSequenceClassification(HydraEnsembleAlbertPreTrainedModel):
    """M pruned ALBERT classifiers in one model. ``logits`` = log of the mean of the members' softmaxes.

    ``AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True)`` and
    ``pipeline("text-classification", model=folder, trust_remote_code=True)`` use this class.
    """

    def __init__(self, config: HydraEnsembleAlbertConfig) -> None:
        super().__init__(config)
        base = albert_base_config(config)
        self.num_labels = config.num_labels
        self.hydra = HydraEnsembleAlbertModel(config)
        self.dropout = nn.Dropout(base.classifier_dropout_prob)
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
        pooled = outputs.pooler_output.transpose(0, 1)  # (M, B, d)
        member_logits = self.classifier(self.dropout(pooled)).transpose(0, 1)  # (B, M, C)
        return classifier_output(member_logits, labels, self.config, outputs, return_dict)
