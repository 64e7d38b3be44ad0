"""Llama-style decoders (Llama, Mistral, Qwen2, Qwen3): Hugging Face ``*ForCausalLM``,
``*ForSequenceClassification`` and bare ``*Model`` checkpoints -> ``HydraEnsembleLlamaForCausalLM`` /
``HydraEnsembleLlamaForSequenceClassification``.

The reader is :mod:`hydra_hf.convert.hf_llama`; the shipped model is ``modeling_hydra_llama.py`` (pre-norm
decoder layers with rotary, grouped-query, causal attention over all members' kept query heads and one
shared key/value cache; a SwiGLU MLP averaged or per member; per-member RMSNorms and heads) with its config
in ``configuration_hydra_llama.py``. A causal-LM checkpoint builds a causal LM (``generate()`` with
per-token uncertainty); a sequence classifier or a bare decoder builds a sequence classifier (a bare
decoder's ``score`` heads are new, one per member, seeded).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import CONFIG_MAPPING

from ..convert.build import check_same_architecture, full_config, label_arguments, load_fused
from ..convert.hf_llama import decoder_member_from_state_dict, fuse_decoder, unfuse_decoder
from ..convert.io import read_config, read_state_dict
from ..errors import HydraInputError
from ..modeling.configuration_hydra_llama import DECODER_BASE_MODEL_TYPES
from .adapters import llama_like_adapter
from .base import Built, Family, register_family

PREFIXES = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3"}
HEADS = ("Model", "ForCausalLM", "ForSequenceClassification")
# the architecture keys of a decoder config (shared by all members)
DECODER_SHAPE_KEYS = (
    "model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "intermediate_size", "head_dim",
)  # fmt: skip


def decoder_task(config: Mapping[str, Any]) -> str:
    """``"causal_lm"`` for a ``*ForCausalLM`` checkpoint, else ``"sequence_classification"``."""
    names = config.get("architectures") or []
    return "causal_lm" if any(str(a).endswith("ForCausalLM") for a in names) else "sequence_classification"


class LlamaFamily(Family):
    name = "llama"
    aliases = ("mistral", "qwen2", "qwen3")
    modality = "text"
    model_types = DECODER_BASE_MODEL_TYPES
    base_model_type = "llama"
    task = "text-classification"
    config_class_name = "HydraEnsembleLlamaConfig"
    config_file = "configuration_hydra_llama.py"
    modeling_file = "modeling_hydra_llama.py"
    model_class_names = {
        "AutoModel": "HydraEnsembleLlamaModel",
        "AutoModelForCausalLM": "HydraEnsembleLlamaForCausalLM",
        "AutoModelForSequenceClassification": "HydraEnsembleLlamaForSequenceClassification",
    }
    towers = ("text",)
    frozen_prefixes = ("hydra.embed_tokens.",)
    classifier_keys = ("score.weight",)

    @property
    def supported_architectures(self) -> tuple[str, ...]:
        return tuple(f"{prefix}{head}" for prefix in PREFIXES.values() for head in HEADS)

    @property
    def shipped_files(self) -> tuple[str, ...]:
        """The common files but the encoder skeletons (a decoder does not use them), its config and modeling files
        and the decoders' shared file (outputs, generation uncertainty)."""
        return (*(f for f in super().shipped_files if f != "hydra_skeletons.py"), self.config_file, "hydra_decoder.py")

    @property
    def auto_map(self) -> dict[str, str]:
        out = super().auto_map
        out["AutoConfig"] = f"{self.config_file.removesuffix('.py')}.{self.config_class_name}"
        return out

    def config_class(self) -> type:
        module = importlib.import_module(f"hydra_hf.modeling.{self.config_file.removesuffix('.py')}")
        return getattr(module, self.config_class_name)

    # ----------------------------------------------------------------------------- converting
    def full_config(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        model_type = raw.get("model_type")
        if model_type not in PREFIXES:
            raise HydraInputError(f"model_type={model_type!r} is not a Llama-style decoder; expected one of {list(PREFIXES)}")
        return full_config(CONFIG_MAPPING[model_type], dict(raw))

    def read_member(self, state: dict, config: dict[str, Any], source: str = "checkpoint") -> Any:
        return decoder_member_from_state_dict(state, config, source=source)

    def unfuse(self, state: dict, hydra_config: Any) -> list[dict]:
        task = "sequence_classification" if "score.weight" in state else "causal_lm"
        return unfuse_decoder(state, hydra_config, task=task)

    def build(self, folders: list[Path], masks: Any, *, mlp_fusion: str, shared: str, num_labels: int | None,
              id2label: dict[int, str] | None, seed: int, towers: Sequence[str] | None) -> Built:
        masks.check_towers(self.towers, towers, model=f"a {self.name} checkpoint")
        raw = [read_config(f) for f in folders]
        configs = [self.full_config(c) for c in raw]
        check_same_architecture(folders, configs, DECODER_SHAPE_KEYS)
        base = configs[0]
        masks.check_compatible(base["num_hidden_layers"], base["num_attention_heads"], model=repr(str(folders[0])))
        task = decoder_task(raw[0])
        if any(decoder_task(c) != task for c in raw[1:]):
            raise HydraInputError("the member checkpoints mix causal LMs and sequence classifiers; convert one kind")
        loaded = [self.read_member(read_state_dict(f), c, source=repr(str(f))) for f, c in zip(folders, configs)]
        members = loaded * masks.num_members if len(loaded) == 1 else loaded
        if task == "causal_lm" and any(m.lm_head is None for m in members):
            raise HydraInputError(f"{str(folders[0])!r} is a causal LM without an lm_head tensor; save it with its head")
        heads = [m.lm_head for m in members if m.lm_head is not None]
        per_member = len(heads) > 1 and any(not torch.equal(heads[0], h) for h in heads[1:])
        lm_head_fusion = "per_member" if per_member else "shared"
        state = fuse_decoder(members, masks.kept_heads, mlp_fusion, shared, task=task, lm_head_fusion=lm_head_fusion)
        labels = label_arguments(state, "score.weight", raw[0], num_labels, id2label) if task != "causal_lm" else {}
        config = self.config_class()(
            base_model_type=base["model_type"], base_config=base, kept_heads=masks.kept_heads, mlp_fusion=mlp_fusion,
            member_metadata=masks.member_metadata, lm_head_fusion=lm_head_fusion, **labels,
        )  # fmt: skip
        auto = "AutoModelForCausalLM" if task == "causal_lm" else "AutoModelForSequenceClassification"
        torch.manual_seed(seed)  # a bare decoder's per-member score heads are initialised from this seed
        model = self.model_class(auto)(config)
        # a tied base: lm_head.weight is the embeddings' tensor (the same values are loaded into it twice)
        return Built(load_fused(model, state, {"score.weight"}, folders[0], seed), folders[0])

    # -------------------------------------------------------------------------------- pruning
    def adapter(self, model: Any, *, class_text_inputs: Any = None) -> Any:
        """Query heads of ``layers[i].self_attn`` (``o_proj`` column blocks; Q rows and the K/V rows of their
        key/value group for Taylor); a causal LM's logits are next-token logits at every valid position."""
        return llama_like_adapter(model)

    def stock_model(self, base_config: Mapping[str, Any], num_labels: int | None = None) -> Any:
        model_type = base_config["model_type"]
        config = CONFIG_MAPPING[model_type].from_dict({**base_config, **({"num_labels": num_labels} if num_labels else {})})
        head = "ForSequenceClassification" if num_labels is not None else "ForCausalLM"
        return getattr(transformers, f"{PREFIXES[model_type]}{head}")(config)


LLAMA = register_family(LlamaFamily())
