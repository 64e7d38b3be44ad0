"""RoBERTa, XLM-RoBERTa and CamemBERT: one layout (``roberta.`` prefix, BERT's layers, position ids
counted from ``pad_token_id + 1``, head ``classifier.dense`` -> tanh -> ``classifier.out_proj``) and one
shipped model, ``modeling_hydra_roberta.py``; three families so that each keeps its own name,
``model_type`` and stock classes.
"""

from __future__ import annotations

import functools

from ..convert.hf_text import TextLayout, bert_layer_map
from .base import register_family
from .text import HFTextFamily

_EMBEDDINGS = ("word_embeddings.weight", "position_embeddings.weight", "token_type_embeddings.weight",
               "LayerNorm.weight", "LayerNorm.bias")
_HEAD = ("dense.weight", "dense.bias", "out_proj.weight", "out_proj.bias")

@functools.cache
def layout() -> TextLayout:
    """The checkpoint layout (built once, on first use)."""
    return TextLayout(
        family="RoBERTa",
        prefix="roberta.",
        layer=lambda i, config: f"roberta.encoder.layer.{i}.",
        layer_map=bert_layer_map(),
        shared={f"hydra.embeddings.{k}": f"roberta.embeddings.{k}" for k in _EMBEDDINGS},
        heads={"classifier": {f"classifier.{k}": f"classifier.{k}" for k in _HEAD}},
        num_labels_key="classifier.out_proj.weight",
        # a bare RobertaModel's pooler is not part of the sequence classifier; LM heads; buffers
        ignored=(
            "roberta.pooler.",
            "lm_head.",
            "roberta.embeddings.position_ids",
            "roberta.embeddings.token_type_ids",
        ),
    )


class RobertaFamily(HFTextFamily):
    name = "roberta"
    model_types = ("roberta",)
    hf_class_prefix = "Roberta"
    hf_config_class = "RobertaConfig"
    hf_task_class = "RobertaForSequenceClassification"
    base_model_type = "roberta"
    config_class_name = "HydraEnsembleRobertaConfig"
    config_file = "configuration_hydra_roberta.py"
    modeling_file = "modeling_hydra_roberta.py"
    model_class_names = {
        "AutoModel": "HydraEnsembleRobertaModel",
        "AutoModelForSequenceClassification": "HydraEnsembleRobertaForSequenceClassification",
    }

    def layout(self) -> TextLayout:
        return layout()


class XLMRobertaFamily(RobertaFamily):
    name = "xlm_roberta"
    model_types = ("xlm-roberta",)
    hf_class_prefix = "XLMRoberta"
    hf_config_class = "XLMRobertaConfig"
    hf_task_class = "XLMRobertaForSequenceClassification"
    base_model_type = "xlm-roberta"


class CamembertFamily(RobertaFamily):
    name = "camembert"
    model_types = ("camembert",)
    hf_class_prefix = "Camembert"
    hf_config_class = "CamembertConfig"
    hf_task_class = "CamembertForSequenceClassification"
    base_model_type = "camembert"


ROBERTA = register_family(RobertaFamily())
XLM_ROBERTA = register_family(XLMRobertaFamily())
CAMEMBERT = register_family(CamembertFamily())
