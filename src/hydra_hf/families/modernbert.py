"""ModernBERT: Hugging Face ``modernbert`` checkpoints -> ``HydraEnsembleModernBertForSequenceClassification``.

The reader is :mod:`hydra_hf.convert.hf_modernbert`; the shipped model is ``modeling_hydra_modernbert.py``
(pre-LN layers with rotary attention, global or in a sliding window, a gated MLP, no biases; a
per-member final LayerNorm, prediction head and classifier) with its config in
``configuration_hydra_modernbert.py``.
"""

from __future__ import annotations

from typing import Any

from ..convert.hf_modernbert import READER
from .adapters import AttentionLayer, ModelAdapter
from .base import register_family
from .custom_text import CustomTextFamily, classifier_logits


class ModernBertFamily(CustomTextFamily):
    name = "modernbert"
    mlp_down_proj = {"text": r"layers\.(\d+)\.mlp\.Wo"}
    model_types = ("modernbert",)
    hf_class_prefix = "ModernBert"
    base_model_type = "modernbert"
    config_class_name = "HydraEnsembleModernBertConfig"
    config_file = "configuration_hydra_modernbert.py"
    modeling_file = "modeling_hydra_modernbert.py"
    model_class_names = {
        "AutoModel": "HydraEnsembleModernBertModel",
        "AutoModelForSequenceClassification": "HydraEnsembleModernBertForSequenceClassification",
    }
    reader = READER
    hf_config_class = "ModernBertConfig"
    hf_task_class = "ModernBertForSequenceClassification"
    # the prediction head (dense + LayerNorm) and the classifier: the pre-trained masked-LM head of a
    # base checkpoint is reused as the prediction head, as transformers does
    head_keys = ("head.dense.weight", "head.dense.bias", "head.norm.weight", "head.norm.bias",
                 "classifier.weight", "classifier.bias")
    input_keys = ("input_ids", "attention_mask")  # ModernBERT has no token types
    frozen_prefixes = ("hydra.embeddings.",)  # token embeddings and their LayerNorm

    def adapter(self, model: Any, *, class_text_inputs: Any = None) -> Any:
        """Heads of ``layers[i].attn``: the Q, K and V row blocks of the fused ``Wqkv (3*H*dk, d)`` and
        the column blocks of ``Wo`` (no bias)."""
        encoder = getattr(model, "model", model)
        H = model.config.num_attention_heads
        layers = []
        for layer in encoder.layers:
            w, d = layer.attn.Wqkv.weight, layer.attn.Wo.in_features
            layers.append(AttentionLayer(out_proj=layer.attn.Wo, qkv=[(w, 0), (w, d), (w, 2 * d)], num_heads=H,
                                         head_dim=d // H))
        return ModelAdapter("hf_modernbert", model, {"text": layers}, classifier_logits, self.input_keys)


MODERNBERT = register_family(ModernBertFamily())
