"""Hugging Face BERT checkpoints (``BertModel``, ``BertForSequenceClassification``, ``BertForMaskedLM``,
``BertForPreTraining``), described by a :class:`~hydra_hf.convert.hf_text.TextLayout`.

The fused model (``HydraEnsembleForSequenceClassification``) keeps the embeddings shared, one fused layer per
layer and a pooler and classifier per member; a bare or pre-training encoder's (absent) classifier is newly
initialised. Old TF-converted checkpoints (``LayerNorm.gamma`` / ``beta``) read as the current names.
"""

from __future__ import annotations

from .hf_text import TextLayout, bert_layer_map, text_reader

EMBEDDING_KEYS = (
    "word_embeddings.weight",
    "position_embeddings.weight",
    "token_type_embeddings.weight",
    "LayerNorm.weight",
    "LayerNorm.bias",
)

BERT_LAYOUT = TextLayout(
    family="BERT",
    prefix="bert.",
    layer=lambda i, config: f"bert.encoder.layer.{i}.",
    layer_map=bert_layer_map(),
    shared={f"hydra.embeddings.{k}": f"bert.embeddings.{k}" for k in EMBEDDING_KEYS},
    heads={
        "pooler": {"hydra.pooler.weight": "bert.pooler.dense.weight", "hydra.pooler.bias": "bert.pooler.dense.bias"},
        "classifier": {"classifier.weight": "classifier.weight", "classifier.bias": "classifier.bias"},
    },
    num_labels_key="classifier.weight",
    # the masked-LM and next-sentence heads of pre-training checkpoints; buffers older versions saved
    ignored=("cls.", "bert.embeddings.position_ids", "bert.embeddings.token_type_ids"),
)

READER = text_reader(BERT_LAYOUT)
# checkpoint state dict -> member; members -> fused state dict (full names); fused -> stock state dicts
bert_member_from_state_dict, fuse_bert, unfuse_bert = READER
