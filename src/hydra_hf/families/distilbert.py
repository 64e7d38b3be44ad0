"""DistilBERT: ``distilbert.transformer.layer.N.attention.{q_lin,k_lin,v_lin,out_lin}``,
``sa_layer_norm``, ``ffn.lin1/lin2``, ``output_layer_norm``; no token types; head ``pre_classifier`` ->
ReLU -> ``classifier``. Its config names sizes ``dim`` / ``n_layers`` / ``n_heads`` / ``hidden_dim``;
the converter adds the usual names as aliases. Shipped model: ``modeling_hydra_distilbert.py``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from ..convert.hf_text import TextLayout
from .adapters import layer_list_adapter
from .base import register_family
from .text import HFTextFamily

_EMBEDDINGS = ("word_embeddings.weight", "position_embeddings.weight", "LayerNorm.weight", "LayerNorm.bias")

@functools.cache
def layout() -> TextLayout:
    """The checkpoint layout (built once, on first use)."""
    return TextLayout(
        family="DistilBERT",
        prefix="distilbert.",
        layer=lambda i, config: f"distilbert.transformer.layer.{i}.",
        layer_map={
            "q": "attention.q_lin", "k": "attention.k_lin", "v": "attention.v_lin", "o": "attention.out_lin",
            "norm1": "sa_layer_norm", "fc1": "ffn.lin1", "fc2": "ffn.lin2", "norm2": "output_layer_norm",
        },
        shared={f"hydra.embeddings.{k}": f"distilbert.embeddings.{k}" for k in _EMBEDDINGS},
        heads={"classifier": {
            "classifier.dense.weight": "pre_classifier.weight", "classifier.dense.bias": "pre_classifier.bias",
            "classifier.out_proj.weight": "classifier.weight", "classifier.out_proj.bias": "classifier.bias",
        }},
        num_labels_key="classifier.out_proj.weight",
        ignored=("vocab_transform.", "vocab_layer_norm.", "vocab_projector.", "distilbert.embeddings.position_ids"),
    )


class DistilBertFamily(HFTextFamily):
    name = "distilbert"
    mlp_down_proj = {"text": r"transformer\.layer\.(\d+)\.ffn\.lin2"}
    model_types = ("distilbert",)
    hf_class_prefix = "DistilBert"
    hf_config_class = "DistilBertConfig"
    hf_task_class = "DistilBertForSequenceClassification"
    base_model_type = "distilbert"
    config_class_name = "HydraEnsembleDistilBertConfig"
    config_file = "configuration_hydra_distilbert.py"
    modeling_file = "modeling_hydra_distilbert.py"
    model_class_names = {
        "AutoModel": "HydraEnsembleDistilBertModel",
        "AutoModelForSequenceClassification": "HydraEnsembleDistilBertForSequenceClassification",
    }
    input_keys = ("input_ids", "attention_mask")

    def layout(self) -> TextLayout:
        return layout()

    def full_config(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        config = super().full_config(raw)
        # the names every other reader uses (DistilBertConfig maps the first three back onto its own)
        config.update(hidden_size=config["dim"], num_hidden_layers=config["n_layers"],
                      num_attention_heads=config["n_heads"], intermediate_size=config["hidden_dim"])
        return config

    def adapter(self, model: Any, *, class_text_inputs: Any = None) -> Any:
        body = getattr(model, "distilbert", model)
        attention = [layer.attention for layer in body.transformer.layer]
        names = ("q_lin", "k_lin", "v_lin", "out_lin")
        return layer_list_adapter(model, "hf_distilbert", attention, names, model.config.n_heads, self.input_keys)


DISTILBERT = register_family(DistilBertFamily())
