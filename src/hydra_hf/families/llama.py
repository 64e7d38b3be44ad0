"""Llama-style decoders (Llama, Mistral, Qwen2, Qwen3): Hugging Face ``*ForCausalLM``,
``*ForSequenceClassification`` and bare ``*Model`` checkpoints -> ``HydraEnsembleLlamaForCausalLM`` /
``HydraEnsembleLlamaForSequenceClassification``.

The reader is :mod:`hydra_hf.convert.hf_llama`; the shipped model is ``modeling_hydra_llama.py`` (pre-norm
decoder layers with rotary, grouped-query, causal attention over all members' kept query heads and one
shared key/value cache; a SwiGLU MLP averaged or per member; per-member RMSNorms and heads) with its config
in ``configuration_hydra_llama.py``. What every decoder family does with a checkpoint is
:class:`~hydra_hf.families.decoder.DecoderFamily`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import transformers
from transformers import CONFIG_MAPPING

from ..convert.build import full_config
from ..convert.hf_llama import READER
from ..errors import HydraInputError
from ..modeling.configuration_hydra_llama import DECODER_BASE_MODEL_TYPES
from .adapters import llama_like_adapter
from .base import register_family
from .decoder import DecoderFamily

PREFIXES = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3"}
HEADS = ("Model", "ForCausalLM", "ForSequenceClassification")


class LlamaFamily(DecoderFamily):
    name = "llama"
    aliases = ("mistral", "qwen2", "qwen3")
    model_types = DECODER_BASE_MODEL_TYPES
    base_model_type = "llama"
    config_class_name = "HydraEnsembleLlamaConfig"
    config_file = "configuration_hydra_llama.py"
    modeling_file = "modeling_hydra_llama.py"
    model_class_names = {
        "AutoModel": "HydraEnsembleLlamaModel",
        "AutoModelForCausalLM": "HydraEnsembleLlamaForCausalLM",
        "AutoModelForSequenceClassification": "HydraEnsembleLlamaForSequenceClassification",
    }
    frozen_prefixes = ("hydra.embed_tokens.",)
    reader = READER
    causal_lm_architectures = tuple(f"{prefix}ForCausalLM" for prefix in PREFIXES.values())
    # the architecture keys of a decoder config (shared by all members)
    shape_keys = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "intermediate_size", "head_dim")

    @property
    def supported_architectures(self) -> tuple[str, ...]:
        return tuple(f"{prefix}{head}" for prefix in PREFIXES.values() for head in HEADS)

    def full_config(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        model_type = raw.get("model_type")
        if model_type not in PREFIXES:
            raise HydraInputError(
                f"model_type={model_type!r} is not a Llama-style decoder; expected one of {list(PREFIXES)}"
            )
        return full_config(CONFIG_MAPPING[model_type], dict(raw))

    def layer_shape(self, base: Mapping[str, Any]) -> tuple[int, int]:
        return base["num_hidden_layers"], base["num_attention_heads"]

    def key_value_heads(self, base: Mapping[str, Any]) -> int:
        return base.get("num_key_value_heads") or base["num_attention_heads"]

    def adapter(self, model: Any, *, class_text_inputs: Any = None) -> Any:
        """Query heads of ``layers[i].self_attn`` (``o_proj`` column blocks; Q rows and the K/V rows of their
        key/value group for Taylor); a causal LM's logits are next-token logits at every valid position."""
        return llama_like_adapter(model)

    def stock_class(self, base_config: Mapping[str, Any], num_labels: int | None) -> type:
        head = "ForSequenceClassification" if num_labels is not None else "ForCausalLM"
        return getattr(transformers, f"{PREFIXES[base_config['model_type']]}{head}")


LLAMA = register_family(LlamaFamily())
