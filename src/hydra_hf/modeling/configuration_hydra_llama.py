# Shipped with every Hydra Ensemble model folder built on a Llama-style decoder (remote code): imports only
# the standard library, torch, transformers and sibling files.
"""Configuration of a Hydra Ensemble built on a Llama-style decoder (Llama, Mistral, Qwen2, Qwen3)."""

from __future__ import annotations

from typing import Any, ClassVar

from .configuration_hydra import HydraEnsembleConfig
from .hydra_formulas import members_kept_kv_heads

LM_HEAD_FUSIONS = ("shared", "per_member")
DECODER_BASE_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


class HydraEnsembleLlamaConfig(HydraEnsembleConfig):
    r"""Configuration of a Hydra Ensemble built on a Llama-style decoder: a sequence classifier (last
    non-padding token) or a causal language model.

    The same fields as ``HydraEnsembleConfig``; ``base_config`` is the base's ``LlamaConfig`` /
    ``MistralConfig`` / ``Qwen2Config`` / ``Qwen3Config`` ``to_dict()`` and ``base_model_type`` its
    ``model_type``. ``kept_heads[m][l]`` lists the **query** heads member m keeps; with grouped-query
    attention (``num_key_value_heads < num_attention_heads``) a key/value head stays while any query head
    of its group is kept (``hydra_formulas.kept_kv_heads``), so a member's key/value cache holds only those.

    Args:
        lm_head_fusion (`str`): causal LMs: ``"shared"`` (one output embedding for all members: the base's,
            or the members' average; tied to the input embeddings when the base ties them) or
            ``"per_member"`` (every member keeps its own ``lm_head``: fine-tuned members whose heads differ).
        use_cache (`bool`): whether a causal LM returns (and extends) the key/value cache by default.
    """

    model_type = "hydra_ensemble_llama"
    supported_base_model_types = DECODER_BASE_MODEL_TYPES
    hydra_auto_map: ClassVar[dict[str, str]] = {
        "AutoModel": "modeling_hydra_llama.HydraEnsembleLlamaModel",
        "AutoModelForSequenceClassification": "modeling_hydra_llama.HydraEnsembleLlamaForSequenceClassification",
        "AutoModelForCausalLM": "modeling_hydra_llama.HydraEnsembleLlamaForCausalLM",
    }

    def __init__(
        self, lm_head_fusion: str = "shared", kept_kv_heads: list[list[list[int]]] | None = None,
        use_cache: bool = True, **kwargs: Any,
    ) -> None:
        self.lm_head_fusion = lm_head_fusion
        # the decoders' cache switch, as transformers' decoder configs have it: a config field, so that
        # from_pretrained(folder, use_cache=False) sets it (else transformers hands it to the model's __init__)
        self.use_cache = use_cache
        self._given_kv_heads = kept_kv_heads  # checked against the query heads, written back derived
        super().__init__(**kwargs)

    def _pruned_towers(self) -> dict[str, tuple[Any, int, int]]:
        # a decoder's heads may be narrower or wider than hidden_size / num_heads (``head_dim``)
        num_layers, num_heads = self._tower_shape()
        if "head_dim" not in self.base_config and self.base_config["hidden_size"] % num_heads:
            raise ValueError(
                f"hidden_size={self.base_config['hidden_size']} is not a multiple of num_attention_heads={num_heads} "
                "in base_config and it sets no head_dim"
            )
        return {"kept_heads": (self.kept_heads, num_layers, num_heads)}

    def validate_hydra(self) -> None:
        super().validate_hydra()
        if self.lm_head_fusion not in LM_HEAD_FUSIONS:
            raise ValueError(f"lm_head_fusion={self.lm_head_fusion!r} is unknown; use one of {list(LM_HEAD_FUSIONS)}")
        heads, kv = self.num_attention_heads, self.num_key_value_heads
        if not isinstance(kv, int) or kv < 1 or heads % kv:
            raise ValueError(
                f"base_config has num_key_value_heads={kv!r} for num_attention_heads={heads}; it must divide the "
                "number of query heads (grouped-query attention)"
            )
        given = getattr(self, "_given_kv_heads", None)
        if given is not None:
            derived = self.kept_kv_heads
            for m, (mine, want) in enumerate(zip(given, derived)):
                for layer, (g, w) in enumerate(zip(mine, want)):
                    if sorted(g) != w:
                        raise ValueError(
                            f"kept_kv_heads[{m}][{layer}]={list(g)} but member {m}'s query heads "
                            f"{self.kept_heads[m][layer]} read key/value heads {w}: a key/value head stays exactly "
                            "while one of its query heads is kept; drop kept_kv_heads (it is derived) or fix "
                            "kept_heads"
                        )

    def to_dict(self) -> dict[str, Any]:
        """The config as saved, with the derived ``kept_kv_heads`` (what each member's cache holds)."""
        out = super().to_dict()
        out.pop("_given_kv_heads", None)
        if self.kept_heads and self.base_config:
            out["kept_kv_heads"] = self.kept_kv_heads
        return out

    @property
    def num_key_value_heads(self) -> int:
        kv = self.base_settings().get("num_key_value_heads")
        return self.num_attention_heads if kv is None else kv

    @property
    def head_dim(self) -> int:
        return self.base_settings().get("head_dim") or self.hidden_size // self.num_attention_heads

    @property
    def kept_kv_heads(self) -> list[list[list[int]]]:
        """``kept_kv_heads[m][l]``: the key/value heads member m keeps in layer l (the grouped-query rule,
        ``hydra_formulas.kept_kv_heads``)."""
        return members_kept_kv_heads(self.kept_heads, self.num_attention_heads, self.num_key_value_heads)
