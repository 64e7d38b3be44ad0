"""DeBERTa-v2 / DeBERTa-v3: Hugging Face ``deberta-v2`` checkpoints ->
``HydraEnsembleDebertaV2ForSequenceClassification``.

The reader is :mod:`hydra_hf.convert.hf_deberta_v2`; the shipped model is ``modeling_hydra_deberta_v2.py``
(post-LN layers with disentangled attention: each kept head brings its rows of the position
projections; a per-member ``ContextPooler`` and classifier) with its config in
``configuration_hydra_deberta_v2.py``.
"""

from __future__ import annotations

from typing import Any

from ..convert.hf_deberta_v2 import READER
from .adapters import AttentionLayer, ModelAdapter
from .base import register_family
from .custom_text import CustomTextFamily, classifier_logits


class DebertaV2Family(CustomTextFamily):
    name = "deberta_v2"
    aliases = ("deberta-v3", "deberta_v3")
    model_types = ("deberta-v2",)  # DeBERTa-v3 checkpoints have this model_type too
    hf_class_prefix = "DebertaV2"
    base_model_type = "deberta-v2"
    config_class_name = "HydraEnsembleDebertaV2Config"
    config_file = "configuration_hydra_deberta_v2.py"
    modeling_file = "modeling_hydra_deberta_v2.py"
    model_class_names = {
        "AutoModel": "HydraEnsembleDebertaV2Model",
        "AutoModelForSequenceClassification": "HydraEnsembleDebertaV2ForSequenceClassification",
    }
    reader = READER
    hf_config_class = "DebertaV2Config"
    hf_task_class = "DebertaV2ForSequenceClassification"
    head_keys = ("pooler.weight", "pooler.bias", "classifier.weight", "classifier.bias")
    # word (+ position, token-type) embeddings and their LayerNorm, the relative-position table
    frozen_prefixes = ("hydra.embeddings.", "hydra.rel_embeddings.")

    def adapter(self, model: Any, *, class_text_inputs: Any = None) -> Any:
        """Heads of ``encoder.layer[i].attention``: ``self.{query,key,value}_proj`` rows and
        ``output.dense`` columns (the position projections follow the same heads but are not gated:
        a gated-off head's output is zero whatever its scores)."""
        encoder = getattr(model, "deberta", model).encoder
        layers = []
        for layer in encoder.layer:
            att = layer.attention.self
            layers.append(AttentionLayer(
                out_proj=layer.attention.output.dense,
                qkv=[(att.query_proj.weight, 0), (att.key_proj.weight, 0), (att.value_proj.weight, 0)],
                num_heads=att.num_attention_heads,
                head_dim=att.attention_head_size,
            ))
        return ModelAdapter("hf_deberta_v2", model, {"text": layers}, classifier_logits, self.input_keys)


DEBERTA_V2 = register_family(DebertaV2Family())
