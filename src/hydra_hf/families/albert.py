"""ALBERT: embeddings of width ``embedding_size`` and the shared ``embedding_hidden_mapping_in``
projection; one set of layer weights per layer *group* (``num_hidden_groups``, usually 1) used by all
its layers. The fused model holds one copy per layer, so that members prune every layer separately;
the pruning adapter unties a stock model the same way (an exactly equivalent ALBERT with one group
per layer). Head: per-member ``pooler`` (tanh) and ``classifier``. Shipped model:
``modeling_hydra_albert.py``.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from typing import Any

import torch

from ..convert.hf_text import TextLayout
from ..errors import HydraInputError
from .adapters import layer_list_adapter
from .base import register_family
from .text import HFTextFamily

_EMBEDDINGS = ("word_embeddings.weight", "position_embeddings.weight", "token_type_embeddings.weight",
               "LayerNorm.weight", "LayerNorm.bias")


def layer_group(i: int, config: Mapping[str, Any]) -> int:
    """The layer group whose weights ALBERT's layer ``i`` uses (transformers' AlbertTransformer)."""
    return int(i / (config["num_hidden_layers"] / config.get("num_hidden_groups", 1)))


@functools.cache
def layout() -> TextLayout:
    """The checkpoint layout (built once, on first use)."""
    return TextLayout(
        family="ALBERT",
        prefix="albert.",
        layer=lambda i, config: f"albert.encoder.albert_layer_groups.{layer_group(i, config)}.albert_layers.0.",
        layer_map={
            "q": "attention.query",
            "k": "attention.key",
            "v": "attention.value",
            "o": "attention.dense",
            "norm1": "attention.LayerNorm",
            "fc1": "ffn",
            "fc2": "ffn_output",
            "norm2": "full_layer_layer_norm",
        },
        shared={
            **{f"hydra.embeddings.{k}": f"albert.embeddings.{k}" for k in _EMBEDDINGS},
            "hydra.embedding_hidden_mapping_in.weight": "albert.encoder.embedding_hidden_mapping_in.weight",
            "hydra.embedding_hidden_mapping_in.bias": "albert.encoder.embedding_hidden_mapping_in.bias",
        },
        heads={
            "pooler": {"hydra.pooler.weight": "albert.pooler.weight", "hydra.pooler.bias": "albert.pooler.bias"},
            "classifier": {"classifier.weight": "classifier.weight", "classifier.bias": "classifier.bias"},
        },
        num_labels_key="classifier.weight",
        ignored=(
            "predictions.",
            "sop_classifier.",
            "albert.embeddings.position_ids",
            "albert.embeddings.token_type_ids",
        ),
    )


def untied_config(base_config: Mapping[str, Any]) -> dict[str, Any]:
    """``base_config`` with one layer group per layer (what a member of the fused model is)."""
    return {**base_config, "num_hidden_groups": int(base_config["num_hidden_layers"])}


def untie_albert_(model: Any) -> Any:
    """Give every layer of a stock ALBERT its own copy of its group's weights, in place (the model
    computes exactly the same function; ``config.num_hidden_groups`` becomes ``num_hidden_layers``)."""
    body = getattr(model, "albert", model)
    config = body.config
    L, G = config.num_hidden_layers, config.num_hidden_groups
    if G != L:
        groups = body.encoder.albert_layer_groups
        body.encoder.albert_layer_groups = torch.nn.ModuleList(
            copy.deepcopy(groups[layer_group(i, {"num_hidden_layers": L, "num_hidden_groups": G})]) for i in range(L)
        )
        config.num_hidden_groups = L
    return model


class AlbertFamily(HFTextFamily):
    name = "albert"
    # after untie_albert_ (the adapter unties first): one layer group per layer
    mlp_down_proj = {"text": r"albert_layer_groups\.(\d+)\.albert_layers\.0\.ffn_output"}
    model_types = ("albert",)
    hf_class_prefix = "Albert"
    hf_config_class = "AlbertConfig"
    hf_task_class = "AlbertForSequenceClassification"
    base_model_type = "albert"
    config_class_name = "HydraEnsembleAlbertConfig"
    config_file = "configuration_hydra_albert.py"
    modeling_file = "modeling_hydra_albert.py"
    model_class_names = {
        "AutoModel": "HydraEnsembleAlbertModel",
        "AutoModelForSequenceClassification": "HydraEnsembleAlbertForSequenceClassification",
    }

    def layout(self) -> TextLayout:
        return layout()

    def check_config(self, config: Mapping[str, Any], source: str) -> None:
        super().check_config(config, source)
        if int(config.get("inner_group_num", 1)) != 1:
            raise HydraInputError(
                f"{source} has inner_group_num={config['inner_group_num']}; the ALBERT Hydra model supports "
                "one layer per group (inner_group_num=1, as in every released ALBERT)"
            )

    def unfuse_whole_mlps(self, state: dict, hydra_config: Any) -> list[dict]:
        """Per member: an untied ALBERT state dict (one layer group per layer; see :meth:`stock_model`)."""
        return self.reader.unfuse(state, hydra_config, member_config=untied_config(hydra_config.base_config))

    def adapter(self, model: Any, *, class_text_inputs: Any = None) -> Any:
        """Unties ``model`` in place first (:func:`untie_albert_`): members prune every layer separately."""
        untie_albert_(model)
        body = getattr(model, "albert", model)
        attention = [group.albert_layers[0].attention for group in body.encoder.albert_layer_groups]
        names = ("query", "key", "value", "dense")
        return layer_list_adapter(
            model, "hf_albert", attention, names, model.config.num_attention_heads, self.input_keys
        )

    def stock_model(self, base_config: Mapping[str, Any], num_labels: int | None = None) -> Any:
        """An untied stock ALBERT (one layer group per layer): a member of the fused model."""
        return super().stock_model(untied_config(base_config), num_labels)


ALBERT = register_family(AlbertFamily())
