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
    supported_base_model_types: tuple[str, ...] = BASE_MODEL_TYPES

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

    def _pruned_towers(self) -> dict[str, tuple[Any, int, int]]:
        """``{field: (kept_heads, num_layers, num_heads)}`` for every pruned tower, after checking the
        tower's shape in ``base_config``. A hook: two-tower subclasses (CLIP) return one entry per tower."""
        num_layers, num_heads = self._tower_shape()
        if self.base_config["hidden_size"] % num_heads:
            raise ValueError(
                f"hidden_size={self.base_config['hidden_size']} is not a multiple of "
                f"num_attention_heads={num_heads} in base_config"
            )
        return {"kept_heads": (self.kept_heads, num_layers, num_heads)}

    def validate_hydra(self) -> None:
        if self.base_model_type not in self.supported_base_model_types:
            raise ValueError(
                f"base_model_type={self.base_model_type!r} is not supported by {type(self).__name__}; "
                f"expected one of {list(self.supported_base_model_types)}"
            )
        if self.mlp_fusion not in MLP_FUSIONS:
            raise ValueError(f"mlp_fusion={self.mlp_fusion!r} is unknown; use one of {list(MLP_FUSIONS)}")
        towers = self._pruned_towers()
        if isinstance(self.num_members, bool) or not isinstance(self.num_members, int) or self.num_members < 1:
            raise ValueError(f"num_members must be a positive integer, got {self.num_members!r}")
        for field, (kept, num_layers, num_heads) in towers.items():
            if len(kept) != self.num_members:
                raise ValueError(
                    f"num_members={self.num_members} but {field} lists {len(kept)} members; "
                    f"give one {field} entry per member (or leave num_members out)"
                )
            check_kept_heads(kept, num_layers, num_heads, where=field)
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


class HydraEnsembleViTConfig(HydraEnsembleConfig):
    r"""Configuration of a Hydra Ensemble built on a ViT image classifier.

    The same fields as ``HydraEnsembleConfig``; ``base_config`` is a ``ViTConfig.to_dict()`` (a timm
    ``vit_*`` checkpoint is converted to the equivalent ``ViTConfig``). A separate class (and
    ``model_type``) because transformers maps one config class to one model class per Auto class.
    """

    model_type = "hydra_ensemble_vit"
    supported_base_model_types = ("vit",)

    def __init__(self, base_model_type: str = "vit", **kwargs: Any) -> None:
        super().__init__(base_model_type=base_model_type, **kwargs)


CLIP_TOWERS = ("vision", "text")


class HydraEnsembleCLIPConfig(HydraEnsembleConfig):
    r"""Configuration of a Hydra Ensemble built on a CLIP model (zero-shot image classification).

    Member m is the pair (vision tower m, text tower m); each tower is pruned separately.

    Args:
        base_config (`dict`): ``CLIPConfig.to_dict()`` of the base (with nested ``vision_config`` and
            ``text_config``); an open_clip model is converted to the equivalent ``CLIPConfig``.
        vision_kept_heads (`list[list[list[int]]]`, *optional*): ``vision_kept_heads[m][l]`` = sorted
            heads member m keeps in layer l of the vision tower.
        text_kept_heads (`list[list[list[int]]]`, *optional*): the same for the text tower.
        num_members (`int`, *optional*): M; read from the kept-heads lists when left out.

    A tower given no kept heads is not pruned: every member keeps all its heads (its weights are still
    per member, so members fine-tuned separately stay distinct). The other arguments are those of
    ``HydraEnsembleConfig``; ``kept_heads`` is not used (the heads are per tower).
    """

    model_type = "hydra_ensemble_clip"
    supported_base_model_types = ("clip",)

    def __init__(
        self,
        base_model_type: str = "clip",
        base_config: dict[str, Any] | None = None,
        num_members: int | None = None,
        vision_kept_heads: list[list[list[int]]] | None = None,
        text_kept_heads: list[list[list[int]]] | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.pop("kept_heads", None)  # single-tower field of the parent: heads are per tower here
        self.vision_kept_heads = [[list(h) for h in member] for member in (vision_kept_heads or [])]
        self.text_kept_heads = [[list(h) for h in member] for member in (text_kept_heads or [])]
        if num_members is None:
            given = [len(k) for k in (self.vision_kept_heads, self.text_kept_heads) if k]
            num_members = given[0] if given else None
        if base_config and isinstance(num_members, int) and not isinstance(num_members, bool):
            for tower in CLIP_TOWERS:  # an unpruned tower: every member keeps every head
                if not getattr(self, f"{tower}_kept_heads"):
                    sub = base_config.get(f"{tower}_config") or {}
                    if "num_hidden_layers" in sub and "num_attention_heads" in sub:
                        everything = [list(range(int(sub["num_attention_heads"])))] * int(sub["num_hidden_layers"])
                        setattr(self, f"{tower}_kept_heads", [[list(h) for h in everything] for _ in range(num_members)])
        super().__init__(base_model_type=base_model_type, base_config=base_config, num_members=num_members, **kwargs)

    def _tower_config(self, tower: str) -> dict[str, Any]:
        """``base_config[f"{tower}_config"]``, checked for the keys the model needs."""
        sub = self.base_config.get(f"{tower}_config")
        if not isinstance(sub, dict):
            raise ValueError(
                f"base_config has no {tower}_config; pass the base model's full CLIPConfig "
                "(CLIPConfig.from_pretrained(base).to_dict())"
            )
        missing = [k for k in ("num_hidden_layers", "num_attention_heads", "hidden_size") if k not in sub]
        if missing:
            raise ValueError(f"base_config['{tower}_config'] is missing {missing}; pass the full CLIPConfig")
        return sub

    def _tower_shape(self, tower: str = "vision") -> tuple[int, int]:
        sub = self._tower_config(tower)
        return int(sub["num_hidden_layers"]), int(sub["num_attention_heads"])

    def _pruned_towers(self) -> dict[str, tuple[Any, int, int]]:
        out = {}
        for tower in CLIP_TOWERS:
            sub = self._tower_config(tower)
            num_layers, num_heads = self._tower_shape(tower)
            if sub["hidden_size"] % num_heads:
                raise ValueError(
                    f"hidden_size={sub['hidden_size']} is not a multiple of num_attention_heads={num_heads} "
                    f"in base_config['{tower}_config']"
                )
            out[f"{tower}_kept_heads"] = (getattr(self, f"{tower}_kept_heads"), num_layers, num_heads)
        return out

    @property
    def hidden_size(self) -> int:
        """Width of the vision tower (the text tower's is ``base_config['text_config']['hidden_size']``)."""
        return int(self._tower_config("vision")["hidden_size"])

    def kept_heads_of(self, tower: str) -> list[list[list[int]]]:
        """``out[m][l]`` = heads member m keeps in layer l of ``tower`` (``"vision"`` or ``"text"``)."""
        if tower not in CLIP_TOWERS:
            raise ValueError(f"unknown tower {tower!r}; a CLIP Hydra Ensemble has towers {list(CLIP_TOWERS)}")
        return getattr(self, f"{tower}_kept_heads")

    def heads_per_layer(self, tower: str = "vision") -> list[list[int]]:
        """``out[m][l]`` = number of heads member ``m`` keeps in layer ``l`` of ``tower``."""
        return [[len(h) for h in member] for member in self.kept_heads_of(tower)]

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out.pop("kept_heads", None)  # the parent's single-tower field, always empty here
        return out
