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

import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel

from ..convert.build import check_same_architecture, full_config, label_arguments, load_fused
from ..convert.hf_gpt2 import fuse_gpt2, gpt2_member_from_state_dict, unfuse_gpt2
from ..convert.io import read_config, read_state_dict
from ..errors import HydraInputError
from .adapters import gpt2_adapter
from .base import Built, Family, register_family

ARCHITECTURES = ("GPT2Model", "GPT2LMHeadModel", "GPT2ForSequenceClassification")
# the architecture keys of a GPT-2 config (shared by all members)
GPT2_SHAPE_KEYS = ("model_type", "vocab_size", "n_embd", "n_layer", "n_head", "n_inner", "n_positions")


def gpt2_task(config: Mapping[str, Any]) -> str:
    """``"causal_lm"`` for a ``GPT2LMHeadModel`` checkpoint, else ``"sequence_classification"``."""
    names = config.get("architectures") or []
    return "causal_lm" if "GPT2LMHeadModel" in names else "sequence_classification"


class GPT2Family(Family):
    name = "gpt2"
    modality = "text"
    model_types = ("gpt2",)
    base_model_type = "gpt2"
    task = "text-classification"
    config_class_name = "HydraEnsembleGPT2Config"
    config_file = "configuration_hydra_gpt2.py"
    modeling_file = "modeling_hydra_gpt2.py"
    model_class_names = {
        "AutoModel": "HydraEnsembleGPT2Model",
        "AutoModelForCausalLM": "HydraEnsembleGPT2ForCausalLM",
        "AutoModelForSequenceClassification": "HydraEnsembleGPT2ForSequenceClassification",
    }
    towers = ("text",)
    frozen_prefixes = ("hydra.wte.", "hydra.wpe.")
    classifier_keys = ("score.weight",)

    @property
    def supported_architectures(self) -> tuple[str, ...]:
        return ARCHITECTURES

    @property
    def shipped_files(self) -> tuple[str, ...]:
        """The common files but the encoder skeletons (a decoder does not use them), its config file and the
        decoders' shared file."""
        common = (f for f in super().shipped_files if f != "hydra_skeletons.py")
        return (*common, self.config_file, "hydra_decoder.py")

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
        if raw.get("model_type") != "gpt2":
            raise HydraInputError(f"model_type={raw.get('model_type')!r} is not GPT-2")
        return full_config(GPT2Config, dict(raw))

    def read_member(self, state: dict, config: dict[str, Any], source: str = "checkpoint") -> Any:
        return gpt2_member_from_state_dict(state, config, source=source)

    def unfuse(self, state: dict, hydra_config: Any) -> list[dict]:
        task = "sequence_classification" if "score.weight" in state else "causal_lm"
        return unfuse_gpt2(state, hydra_config, task=task)

    def build(self, folders: list[Path], masks: Any, *, mlp_fusion: str, shared: str, num_labels: int | None,
              id2label: dict[int, str] | None, seed: int, towers: Sequence[str] | None) -> Built:
        masks.check_towers(self.towers, towers, model=f"a {self.name} checkpoint")
        raw = [read_config(f) for f in folders]
        configs = [self.full_config(c) for c in raw]
        check_same_architecture(folders, configs, GPT2_SHAPE_KEYS)
        base = configs[0]
        masks.check_compatible(base["n_layer"], base["n_head"], model=repr(str(folders[0])))
        task = gpt2_task(raw[0])
        if any(gpt2_task(c) != task for c in raw[1:]):
            raise HydraInputError("the member checkpoints mix causal LMs and sequence classifiers; convert one kind")
        loaded = [self.read_member(read_state_dict(f), c, source=repr(str(f))) for f, c in zip(folders, configs)]
        members = loaded * masks.num_members if len(loaded) == 1 else loaded
        if task == "causal_lm" and any(m.lm_head is None for m in members):
            raise HydraInputError(f"{str(folders[0])!r} is a causal LM without an lm_head tensor; save it with its head")
        heads = [m.lm_head for m in members if m.lm_head is not None]
        per_member = len(heads) > 1 and any(not torch.equal(heads[0], h) for h in heads[1:])
        lm_head_fusion = "per_member" if per_member else "shared"
        state = fuse_gpt2(members, masks.kept_heads, mlp_fusion, shared, task=task, lm_head_fusion=lm_head_fusion)
        labels = label_arguments(state, "score.weight", raw[0], num_labels, id2label) if task != "causal_lm" else {}
        config = self.config_class()(
            base_config=base, kept_heads=masks.kept_heads, mlp_fusion=mlp_fusion,
            member_metadata=masks.member_metadata, lm_head_fusion=lm_head_fusion, **labels,
        )  # fmt: skip
        auto = "AutoModelForCausalLM" if task == "causal_lm" else "AutoModelForSequenceClassification"
        torch.manual_seed(seed)  # a bare GPT2Model's per-member score heads are initialised from this seed
        model = self.model_class(auto)(config)
        # tied (GPT-2's default): lm_head.weight is the token embeddings' tensor (the same values loaded twice)
        return Built(load_fused(model, state, {"score.weight"}, folders[0], seed), folders[0])

    # -------------------------------------------------------------------------------- pruning
    def adapter(self, model: Any, *, class_text_inputs: Any = None) -> Any:
        """Heads of ``h[i].attn`` (``Conv1D``: ``c_proj`` row blocks; Q / K / V column blocks of ``c_attn`` for
        Taylor); a causal LM's logits are next-token logits at every valid position."""
        return gpt2_adapter(model)

    def stock_model(self, base_config: Mapping[str, Any], num_labels: int | None = None) -> Any:
        config = GPT2Config.from_dict({**base_config, **({"num_labels": num_labels} if num_labels else {})})
        return GPT2ForSequenceClassification(config) if num_labels is not None else GPT2LMHeadModel(config)


GPT2 = register_family(GPT2Family())
