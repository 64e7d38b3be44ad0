# Shipped with every Hydra Ensemble model folder built on GPT-2 (remote code): imports only the standard
# library, transformers and sibling files.
"""Configuration of a Hydra Ensemble built on GPT-2."""

from __future__ import annotations

from typing import Any, ClassVar

from .configuration_hydra import HydraEnsembleConfig

LM_HEAD_FUSIONS = ("shared", "per_member")
# GPT2Config's own names (its ``attribute_map`` aliases them as hidden_size, num_hidden_layers,
# num_attention_heads; ``to_dict()`` writes only these)
GPT2_SHAPE_KEYS = {"num_hidden_layers": "n_layer", "num_attention_heads": "n_head", "hidden_size": "n_embd"}


class HydraEnsembleGPT2Config(HydraEnsembleConfig):
    r"""Configuration of a Hydra Ensemble built on GPT-2: a causal language model or a sequence classifier
    (last non-padding token).

    The same fields as ``HydraEnsembleConfig``; ``base_config`` is the base's ``GPT2Config.to_dict()`` (GPT-2's
    names: ``n_layer``, ``n_head``, ``n_embd``, ``n_inner``, ``n_positions``) and ``base_model_type`` is
    ``"gpt2"``. ``kept_heads[m][l]`` lists the heads member m keeps in layer l (GPT-2 has no grouped-query
    attention: a kept head keeps its own query, key and value).

    Args:
        lm_head_fusion (`str`): causal LMs: ``"shared"`` (one output embedding for all members: the base's,
            or the members' average; tied to the input embeddings when the base ties them, as GPT-2 does) or
            ``"per_member"`` (every member keeps its own ``lm_head``).
        use_cache (`bool`): whether the causal LM returns (and extends) the key/value cache by default.
    """

    model_type = "hydra_ensemble_gpt2"
    supported_base_model_types = ("gpt2",)
    hydra_auto_map: ClassVar[dict[str, str]] = {
        "AutoModel": "modeling_hydra_gpt2.HydraEnsembleGPT2Model",
        "AutoModelForSequenceClassification": "modeling_hydra_gpt2.HydraEnsembleGPT2ForSequenceClassification",
        "AutoModelForCausalLM": "modeling_hydra_gpt2.HydraEnsembleGPT2ForCausalLM",
    }

    def __init__(self, lm_head_fusion: str = "shared", use_cache: bool = True, **kwargs: Any) -> None:
        self.lm_head_fusion = lm_head_fusion
        # a config field, as GPT2Config's: from_pretrained(folder, use_cache=False) sets it
        self.use_cache = use_cache
        super().__init__(**kwargs)

    def _shape_value(self, name: str) -> int:
        """``base_config``'s value of ``name`` (``num_hidden_layers``, ``num_attention_heads``,
        ``hidden_size``) under GPT-2's own key (``n_layer``, ``n_head``, ``n_embd``) or the alias."""
        base = self.base_settings()
        for key in (GPT2_SHAPE_KEYS[name], name):
            if key in base:
                return int(base[key])
        raise ValueError(
            f"base_config has no {GPT2_SHAPE_KEYS[name]} ({name}); pass the base model's full config "
            "(GPT2Config.from_pretrained(base).to_dict())"
        )

    def _tower_shape(self) -> tuple[int, int]:
        return self._shape_value("num_hidden_layers"), self._shape_value("num_attention_heads")

    def _pruned_towers(self) -> dict[str, tuple[Any, int, int]]:
        num_layers, num_heads = self._tower_shape()
        hidden_size = self._shape_value("hidden_size")  # ValueError naming the key when it is missing
        if hidden_size % num_heads:
            raise ValueError(f"n_embd={hidden_size} is not a multiple of n_head={num_heads} in base_config")
        return {"kept_heads": (self.kept_heads, num_layers, num_heads)}

    def validate_hydra(self) -> None:
        super().validate_hydra()
        if self.lm_head_fusion not in LM_HEAD_FUSIONS:
            raise ValueError(f"lm_head_fusion={self.lm_head_fusion!r} is unknown; use one of {list(LM_HEAD_FUSIONS)}")
        if self.base_config.get("add_cross_attention"):
            raise ValueError(
                "base_config has add_cross_attention=True: a Hydra Ensemble of GPT-2 fuses decoder-only "
                "models; pass a GPT-2 checkpoint without cross-attention"
            )

    @property
    def hidden_size(self) -> int:
        try:
            return self._shape_value("hidden_size")
        except ValueError as err:  # a property's missing value is an AttributeError (hasattr answers False)
            raise AttributeError(str(err)) from None

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads
