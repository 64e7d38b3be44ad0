"""BERT: Hugging Face ``bert`` checkpoints -> ``HydraEnsembleForSequenceClassification``.

The reader is :mod:`hydra_hf.convert.hf_bert`; the shipped model is ``modeling_hydra_bert.py``
(post-LN layers, per-member pooler and classifier).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from transformers import BertConfig, BertForSequenceClassification

from ..convert.hf_bert import bert_member_from_state_dict, build_bert, unfuse_bert
from .adapters import bert_like_adapter
from .base import Built, Family, register_family


class BertFamily(Family):
    name = "bert"
    modality = "text"
    model_types = ("bert",)
    hf_class_prefix = "Bert"
    base_model_type = "bert"
    task = "text-classification"
    config_class_name = "HydraEnsembleConfig"
    modeling_file = "modeling_hydra_bert.py"
    model_class_names = {
        "AutoModel": "HydraEnsembleModel",
        "AutoModelForSequenceClassification": "HydraEnsembleForSequenceClassification",
    }
    towers = ("text",)
    mlp_down_proj = {"text": r"encoder\.layer\.(\d+)\.output\.dense"}
    # word, position and token-type embeddings + their LayerNorm
    frozen_prefixes = ("hydra.embeddings.",)

    def build(self, folders: list[Path], masks: Any, *, mlp_fusion: str, shared: str, num_labels: int | None,
              id2label: dict[int, str] | None, seed: int, towers: Sequence[str] | None) -> Built:
        model = build_bert(
            folders, masks, mlp_fusion=mlp_fusion, shared=shared, num_labels=num_labels, id2label=id2label, seed=seed
        )
        return Built(model, folders[0])

    def read_member(self, state: dict, config: dict[str, Any], source: str = "checkpoint") -> Any:
        return bert_member_from_state_dict(state, config, source=source)

    def unfuse_whole_mlps(self, state: dict, hydra_config: Any) -> list[dict]:
        return unfuse_bert(state, hydra_config)

    def adapter(self, model: Any, *, class_text_inputs: Any = None) -> Any:
        return bert_like_adapter(model, "hf_bert")

    def stock_model(self, base_config: Mapping[str, Any], num_labels: int | None = None) -> Any:
        extra = {"num_labels": num_labels} if num_labels is not None else {}
        return BertForSequenceClassification(BertConfig.from_dict({**base_config, **extra}))


BERT = register_family(BertFamily())
