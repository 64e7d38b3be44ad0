"""GPT-2: Hugging Face ``GPT2LMHeadModel``, ``GPT2ForSequenceClassification`` and bare ``GPT2Model``
checkpoints -> ``HydraEnsembleGPT2ForCausalLM`` / ``HydraEnsembleGPT2ForSequenceClassification``.

The reader is :mod:`hydra_hf.convert.hf_gpt2`; the shipped model is ``modeling_hydra_gpt2.py`` (GPT-2's pre-LN
blocks with causal attention over all members' kept heads and one shared key/value cache; learned position
embeddings; a ``gelu_new`` MLP averaged or per member; per-member LayerNorms, final ``ln_f`` and heads) with
its config in ``configuration_hydra_gpt2.py`` and the decoders' shared outputs and generation uncertainty in
``hydra_decoder.py``. A causal-LM checkpoint builds a causal LM (``generate()`` with per-token uncertainty);
a sequence classifier or a bare ``GPT2Model`` builds a sequence classifier (a bare model's ``score`` heads are
new, one per member, seeded).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformers import GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel

from ..convert.build import full_config
from ..convert.hf_gpt2 import READER
from ..errors import HydraInputError
from .adapters import gpt2_adapter
from .base import register_family
from .decoder import DecoderFamily


class GPT2Family(DecoderFamily):
    name = "gpt2"
    mlp_down_proj = {"text": r"h\.(\d+)\.mlp\.c_proj"}  # Conv1D: the neurons are its input rows
    model_types = ("gpt2",)
    base_model_type = "gpt2"
    config_class_name = "HydraEnsembleGPT2Config"
    config_file = "configuration_hydra_gpt2.py"
    modeling_file = "modeling_hydra_gpt2.py"
    model_class_names = {
        "AutoModel": "HydraEnsembleGPT2Model",
        "AutoModelForCausalLM": "HydraEnsembleGPT2ForCausalLM",
        "AutoModelForSequenceClassification": "HydraEnsembleGPT2ForSequenceClassification",
    }
    frozen_prefixes = ("hydra.wte.", "hydra.wpe.")
    reader = READER
    causal_lm_architectures = ("GPT2LMHeadModel",)
    # the architecture keys of a GPT-2 config (shared by all members)
    shape_keys = ("model_type", "vocab_size", "n_embd", "n_layer", "n_head", "n_inner", "n_positions")

    @property
    def supported_architectures(self) -> tuple[str, ...]:
        return ("GPT2Model", "GPT2LMHeadModel", "GPT2ForSequenceClassification")

    def full_config(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        if raw.get("model_type") != "gpt2":
            raise HydraInputError(f"model_type={raw.get('model_type')!r} is not GPT-2")
        return full_config(GPT2Config, dict(raw))

    def layer_shape(self, base: Mapping[str, Any]) -> tuple[int, int]:
        return base["n_layer"], base["n_head"]

    def adapter(self, model: Any, *, class_text_inputs: Any = None) -> Any:
        """Heads of ``h[i].attn`` (``Conv1D``: ``c_proj`` row blocks; Q / K / V column blocks of ``c_attn`` for
        Taylor); a causal LM's logits are next-token logits at every valid position."""
        return gpt2_adapter(model)

    def stock_class(self, base_config: Mapping[str, Any], num_labels: int | None) -> type:
        return GPT2ForSequenceClassification if num_labels is not None else GPT2LMHeadModel


GPT2 = register_family(GPT2Family())
