"""ELECTRA discriminators: ``electra.`` prefix, BERT's layers, embeddings of width ``embedding_size``
projected by ``embeddings_project`` when it differs from ``hidden_size``, head ``classifier.dense`` ->
GELU -> ``classifier.out_proj``. Shipped model: ``modeling_hydra_electra.py``.
"""

from __future__ import annotations

import functools

from ..convert.hf_text import TextLayout, bert_layer_map
from .base import register_family
from .text import HFTextFamily

_EMBEDDINGS = ("word_embeddings.weight", "position_embeddings.weight", "token_type_embeddings.weight",
               "LayerNorm.weight", "LayerNorm.bias")
_PROJECT = ("embeddings_project.weight", "embeddings_project.bias")
_HEAD = ("dense.weight", "dense.bias", "out_proj.weight", "out_proj.bias")

@functools.cache
def layout() -> TextLayout:
    """The checkpoint layout (built once, on first use)."""
    return TextLayout(
        family="ELECTRA",
        prefix="electra.",
        layer=lambda i, config: f"electra.encoder.layer.{i}.",
        layer_map=bert_layer_map(),
        shared={
            **{f"hydra.embeddings.{k}": f"electra.embeddings.{k}" for k in _EMBEDDINGS},
            **{f"hydra.{k}": f"electra.{k}" for k in _PROJECT},
        },
        optional_shared=tuple(f"hydra.{k}" for k in _PROJECT),  # only when embedding_size != hidden_size
        heads={"classifier": {f"classifier.{k}": f"classifier.{k}" for k in _HEAD}},
        num_labels_key="classifier.out_proj.weight",
        # pre-training heads (discriminator / generator); buffers
        ignored=("discriminator_predictions.", "generator_predictions.", "generator_lm_head.",
                 "electra.embeddings.position_ids", "electra.embeddings.token_type_ids"),
    )


class ElectraFamily(HFTextFamily):
    name = "electra"
    model_types = ("electra",)
    hf_class_prefix = "Electra"
    hf_config_class = "ElectraConfig"
    hf_task_class = "ElectraForSequenceClassification"
    base_model_type = "electra"
    config_class_name = "HydraEnsembleElectraConfig"
    config_file = "configuration_hydra_electra.py"
    modeling_file = "modeling_hydra_electra.py"
    model_class_names = {
        "AutoModel": "HydraEnsembleElectraModel",
        "AutoModelForSequenceClassification": "HydraEnsembleElectraForSequenceClassification",
    }

    def layout(self) -> TextLayout:
        return layout()


ELECTRA = register_family(ElectraFamily())
