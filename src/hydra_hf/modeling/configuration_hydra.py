# Shipped with every Hydra Ensemble model folder (remote code): imports only the standard library,
# torch, transformers and sibling files.
"""Configuration of a Hydra Ensemble: one base transformer, M members that each keep their own
subset of attention heads, fused into one model."""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

MLP_FUSIONS = ("average", "per_member")
BASE_MODEL_TYPES = ("bert",)


def check_kept_heads(kept_heads: Any, num_layers: int, num_heads: int, where: str = "kept_heads") -> None:
    """Raise ``ValueError`` unless ``kept_heads[m][l]`` is a sorted list of unique heads in ``[0, H)``
    for every member ``m`` and each of the ``num_layers`` layers."""
    if not isinstance(kept_heads, (list, tuple)) or len(kept_heads) == 0:
        raise ValueError(f"{where} must be a non-empty list with one entry per member, got {kept_heads!r}")
    for m, member in enumerate(kept_heads):
        if not isinstance(member, (list, tuple)) or len(member) != num_layers:
            got = len(member) if isinstance(member, (list, tuple)) else type(member).__name__
            raise ValueError(
                f"{where}[{m}] must hold one list of heads per layer ({num_layers} layers), got {got}; "
                "give every member exactly one list per layer of the base model"
            )
        for layer, heads in enumerate(member):
            if not isinstance(heads, (list, tuple)) or any(isinstance(h, bool) or not isinstance(h, int) for h in heads):
                raise ValueError(f"{where}[{m}][{layer}] must be a list of integer head indices, got {heads!r}")
            bad = [h for h in heads if not 0 <= h < num_heads]
            if bad:
                raise ValueError(
                    f"{where}[{m}][{layer}] has head indices {bad} outside [0, {num_heads}); "
                    f"the base model has {num_heads} heads per layer"
                )
            if len(set(heads)) != len(heads):
                raise ValueError(f"{where}[{m}][{layer}] lists a head twice: {list(heads)}; list each kept head once")
            if list(heads) != sorted(heads):
                raise ValueError(f"{where}[{m}][{layer}] must be sorted, got {list(heads)}; use {sorted(heads)}")


class HydraEnsembleConfig(PretrainedConfig):
    r"""Configuration of a Hydra Ensemble built on a BERT-family encoder.

    Args:
        base_model_type (`str`): architecture of the base model (``"bert"``).
        base_config (`dict`): the base model's own configuration (``BertConfig.to_dict()``), nested.
        num_members (`int`): M, the number of members. Must equal ``len(kept_heads)``.
        kept_heads (`list[list[list[int]]]`): ``kept_heads[m][l]`` = sorted indices of the heads that
            member ``m`` keeps in layer ``l``. Members and layers may keep different numbers of heads,
            including 0.
        mlp_fusion (`str`): ``"average"`` (the paper's merged MLP: one MLP per layer whose weights are
            the members' average, shared by all members) or ``"per_member"`` (every member keeps its own
            MLP: the exact, larger variant).
        member_metadata (`list[dict]`, *optional*): how each member was built (method, seed, ...).

    Labels (``id2label``, ``label2id``, ``num_labels``, ``problem_type``) are the usual
    ``PretrainedConfig`` arguments. The configuration validates itself when it is built: every error
    names the bad value and how to fix it.
    """

    model_type = "hydra_ensemble"

    def __init__(
        self,
        base_model_type: str = "bert",
        base_config: dict[str, Any] | None = None,
        num_members: int | None = None,
        kept_heads: list[list[list[int]]] | None = None,
        mlp_fusion: str = "average",
        member_metadata: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        self.base_model_type = base_model_type
        self.base_config = dict(base_config or {})
        self.kept_heads = [[list(h) for h in member] for member in (kept_heads or [])]
        self.num_members = len(self.kept_heads) if num_members is None else num_members
        self.mlp_fusion = mlp_fusion
        self.member_metadata = list(member_metadata or [])
        super().__init__(**kwargs)
        # PretrainedConfig.__init__ may be called with nothing (e.g. to build a default instance for
        # diffing when saving); only a config that names its members is validated.
        if self.kept_heads or self.base_config:
            self.validate_hydra()

    # ----------------------------------------------------------------------------------- checks
    def _tower_shape(self) -> tuple[int, int]:
        """(num_layers, num_heads) of the base model, read from ``base_config``."""
        missing = [k for k in ("num_hidden_layers", "num_attention_heads", "hidden_size") if k not in self.base_config]
        if missing:
            raise ValueError(
                f"base_config is missing {missing}; pass the base model's full config "
                "(e.g. BertConfig.from_pretrained(base).to_dict())"
            )
        return int(self.base_config["num_hidden_layers"]), int(self.base_config["num_attention_heads"])

    def validate_hydra(self) -> None:
        if self.base_model_type not in BASE_MODEL_TYPES:
            raise ValueError(
                f"base_model_type={self.base_model_type!r} is not supported by {type(self).__name__}; "
                f"expected one of {list(BASE_MODEL_TYPES)}"
            )
        if self.mlp_fusion not in MLP_FUSIONS:
            raise ValueError(f"mlp_fusion={self.mlp_fusion!r} is unknown; use one of {list(MLP_FUSIONS)}")
        num_layers, num_heads = self._tower_shape()
        if self.base_config["hidden_size"] % num_heads:
            raise ValueError(
                f"hidden_size={self.base_config['hidden_size']} is not a multiple of "
                f"num_attention_heads={num_heads} in base_config"
            )
        if isinstance(self.num_members, bool) or not isinstance(self.num_members, int) or self.num_members < 1:
            raise ValueError(f"num_members must be a positive integer, got {self.num_members!r}")
        if len(self.kept_heads) != self.num_members:
            raise ValueError(
                f"num_members={self.num_members} but kept_heads lists {len(self.kept_heads)} members; "
                "give one kept_heads entry per member (or leave num_members out)"
            )
        check_kept_heads(self.kept_heads, num_layers, num_heads)
        if self.member_metadata and len(self.member_metadata) != self.num_members:
            raise ValueError(
                f"member_metadata has {len(self.member_metadata)} entries for {self.num_members} members; "
                "give one dict per member or none"
            )

    # ------------------------------------------------------------------------------ accessors
    @property
    def num_hidden_layers(self) -> int:
        return self._tower_shape()[0]

    @property
    def num_attention_heads(self) -> int:
        return self._tower_shape()[1]

    @property
    def hidden_size(self) -> int:
        return int(self.base_config["hidden_size"])

    def heads_per_layer(self) -> list[list[int]]:
        """``out[m][l]`` = number of heads member ``m`` keeps in layer ``l``."""
        return [[len(h) for h in member] for member in self.kept_heads]
