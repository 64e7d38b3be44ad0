"""BERT: Hugging Face ``bert`` checkpoints -> ``HydraEnsembleForSequenceClassification``.

The layout is :data:`hydra_hf.convert.hf_bert.BERT_LAYOUT`; the shipped model is ``modeling_hydra_bert.py``
(post-LN layers, per-member pooler and classifier) with its config, the shared ``HydraEnsembleConfig``, in
``configuration_hydra.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..convert.build import base_config_dict
from ..convert.hf_bert import BERT_LAYOUT
from ..convert.hf_text import TextLayout
from .base import register_family
from .text import HFTextFamily


class BertFamily(HFTextFamily):
    name = "bert"
    model_types = ("bert",)
    hf_class_prefix = "Bert"
    hf_config_class = "BertConfig"
    hf_task_class = "BertForSequenceClassification"
    base_model_type = "bert"
    config_class_name = "HydraEnsembleConfig"
    modeling_file = "modeling_hydra_bert.py"
    model_class_names = {
        "AutoModel": "HydraEnsembleModel",
        "AutoModelForSequenceClassification": "HydraEnsembleForSequenceClassification",
    }

    def layout(self) -> TextLayout:
        return BERT_LAYOUT

    def full_config(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """The architecture part of the checkpoint's ``config.json`` as it is written (no transformers defaults
        filled in): the ``base_config`` BERT folders have always held."""
        return base_config_dict(dict(raw))


BERT = register_family(BertFamily())
