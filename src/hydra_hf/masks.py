"""The head-masks file: which attention heads every member of a Hydra Ensemble keeps.

Format (JSON, ``version`` 1)::

    {
      "format": "hydra-head-masks",
      "version": 1,
      "num_layers": L,
      "num_heads": H,
      "members": [
        {"kept_heads": [[0, 3, 5], [1, 2], ...one sorted list per layer...], ...optional metadata...},
        ...one object per member...
      ],
      ...optional top-level metadata (method, base model, seed, budget, ...)...
    }

A member may keep any number of heads in a layer, 0 included. ``HeadMasks`` reads, writes and
validates this file; every error names the bad value and how to fix it.

Two-tower models (CLIP) use a variant with ``"towers"`` instead of ``num_layers``/``num_heads`` and
kept heads per tower (``TowerHeadMasks``); ``load_masks(path)`` returns the right class for a file.
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .errors import HydraTypeError
from .modeling.configuration_hydra import check_kept_heads
from .outputs import write_output_file

FORMAT_NAME = "hydra-head-masks"
FORMAT_VERSION = 1


# One validator for the masks file and the shipped config (the config cannot import hydra_hf).
validate_kept_heads = check_kept_heads


def _count(value: Any, key: str, source: str) -> int:
    """A positive integer read from a masks file (``"4"`` or ``4.0`` is a type error naming the fix)."""
    if isinstance(value, bool) or not isinstance(value, int):
        hint = f"; write {value} without quotes" if isinstance(value, str) and value.strip().isdigit() else ""
        raise HydraTypeError(f"{source}: {key!r} must be an integer, got {type(value).__name__} {value!r}{hint}")
    if value < 1:
        raise ValueError(f"{source}: {key!r} must be at least 1, got {value}")
    return value


@dataclass
class HeadMasks:
    """Kept heads of M members over L layers of H heads each.

    Attributes:
        kept_heads: ``kept_heads[m][l]`` = sorted head indices member ``m`` keeps in layer ``l``.
        num_heads: heads per layer in the base model (H).
        member_metadata: one dict per member (method, seed, scores, ranking, ...), saved beside
            ``kept_heads``.
        metadata: top-level metadata (base model, method, budget, ...).
    """

    kept_heads: list[list[list[int]]]
    num_heads: int
    member_metadata: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.num_heads, bool) or not isinstance(self.num_heads, int) or self.num_heads < 1:
            raise ValueError(f"num_heads must be a positive integer, got {self.num_heads!r}")
        self.kept_heads = [[list(heads) for heads in member] for member in self.kept_heads]
        num_layers = len(self.kept_heads[0]) if self.kept_heads and isinstance(self.kept_heads[0], list) else 0
        validate_kept_heads(self.kept_heads, num_layers, self.num_heads)
        if num_layers == 0:
            raise ValueError("kept_heads[0] has no layers; give one list of kept heads per layer")
        if not self.member_metadata:
            self.member_metadata = [{} for _ in self.kept_heads]
        if len(self.member_metadata) != len(self.kept_heads):
            raise ValueError(
                f"member_metadata has {len(self.member_metadata)} entries for {len(self.kept_heads)} members; "
                "give one dict per member (or none)"
            )

    # ------------------------------------------------------------------ shape
    @property
    def num_members(self) -> int:
        return len(self.kept_heads)

    @property
    def num_layers(self) -> int:
        return len(self.kept_heads[0])

    def num_kept(self, member: int) -> int:
        """Total heads member ``member`` keeps over all layers."""
        return sum(len(h) for h in self.kept_heads[member])

    def removed_heads(self, member: int) -> list[list[int]]:
        """``removed[l]`` = heads member ``member`` removes in layer ``l``."""
        return [[h for h in range(self.num_heads) if h not in set(kept)] for kept in self.kept_heads[member]]

    def gates(self, member: int | None = None) -> torch.Tensor:
        """0/1 gates: ``(L, H)`` for one member, ``(M, L, H)`` for all."""
        members = range(self.num_members) if member is None else [member]
        out = torch.zeros(len(members), self.num_layers, self.num_heads)
        for i, m in enumerate(members):
            for layer, heads in enumerate(self.kept_heads[m]):
                out[i, layer, heads] = 1.0
        return out if member is None else out[0]

    @classmethod
    def from_gates(cls, gates: torch.Tensor, **kwargs: Any) -> HeadMasks:
        """Build from 0/1 gates of shape ``(M, L, H)`` (or ``(L, H)`` for one member)."""
        if gates.dim() == 2:
            gates = gates.unsqueeze(0)
        if gates.dim() != 3:
            raise ValueError(f"gates must have shape (M, L, H) or (L, H), got {tuple(gates.shape)}")
        kept = [[torch.nonzero(g > 0.5).flatten().tolist() for g in member] for member in gates]
        return cls(kept_heads=kept, num_heads=gates.shape[-1], **kwargs)

    # -------------------------------------------------------------- diversity
    def jaccard(self) -> torch.Tensor:
        """Pairwise Jaccard overlap of the members' kept (layer, head) sets, shape ``(M, M)``."""
        sets = [{(layer, h) for layer, heads in enumerate(member) for h in heads} for member in self.kept_heads]
        out = torch.ones(self.num_members, self.num_members)
        for i, j in itertools.combinations(range(self.num_members), 2):
            union = len(sets[i] | sets[j])
            out[i, j] = out[j, i] = len(sets[i] & sets[j]) / union if union else 1.0
        return out

    def summary(self) -> str:
        """A few human-readable lines: heads kept per member and the pairwise Jaccard overlap."""
        total = self.num_layers * self.num_heads
        lines = [f"{self.num_members} members, {self.num_layers} layers x {self.num_heads} heads"]
        for m in range(self.num_members):
            per_layer = ",".join(str(len(h)) for h in self.kept_heads[m])
            lines.append(f"  member {m}: keeps {self.num_kept(m)}/{total} heads (per layer: {per_layer})")
        jac = self.jaccard()
        pairs = [f"{i}-{j}: {jac[i, j]:.2f}" for i, j in itertools.combinations(range(self.num_members), 2)]
        if pairs:
            lines.append("  pairwise Jaccard overlap of kept heads: " + ", ".join(pairs))
        return "\n".join(lines)

    # ------------------------------------------------------------------- I/O
    def to_dict(self) -> dict[str, Any]:
        reserved = {"format", "version", "num_layers", "num_heads", "members"}
        clash = reserved & set(self.metadata)
        if clash:
            raise ValueError(f"metadata keys {sorted(clash)} are reserved by the masks format; rename them")
        members = []
        for kept, meta in zip(self.kept_heads, self.member_metadata):
            if "kept_heads" in meta:
                raise ValueError("member metadata may not contain 'kept_heads'; it is the mask itself")
            members.append({"kept_heads": kept, **meta})
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "members": members,
            **self.metadata,
        }

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "masks") -> HeadMasks:
        if not isinstance(data, dict):
            raise ValueError(f"{source}: expected a JSON object, got {type(data).__name__}")
        if data.get("format") != FORMAT_NAME:
            raise ValueError(f"{source}: 'format' is {data.get('format')!r}; a masks file has \"format\": \"{FORMAT_NAME}\"")
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(
                f"{source}: 'version' is {data.get('version')!r}; this hydra_hf reads version {FORMAT_VERSION}"
            )
        if "towers" in data:
            raise ValueError(f"{source}: has 'towers' (a two-tower CLIP masks file); load it with load_masks()")
        for key in ("num_layers", "num_heads", "members"):
            if key not in data:
                raise ValueError(f"{source}: missing key {key!r}; see the masks format in the README")
        members = data["members"]
        if not isinstance(members, list) or not members or not all(isinstance(m, dict) for m in members):
            raise ValueError(f"{source}: 'members' must be a non-empty list of objects with 'kept_heads'")
        for i, m in enumerate(members):
            if "kept_heads" not in m:
                raise ValueError(f"{source}: members[{i}] has no 'kept_heads'")
        kept = [m["kept_heads"] for m in members]
        num_layers = _count(data["num_layers"], "num_layers", source)
        num_heads = _count(data["num_heads"], "num_heads", source)
        validate_kept_heads(kept, num_layers, num_heads, where=f"{source}: members[*].kept_heads")
        meta = {k: v for k, v in data.items() if k not in {"format", "version", "num_layers", "num_heads", "members"}}
        return cls(
            kept_heads=kept,
            num_heads=num_heads,
            member_metadata=[{k: v for k, v in m.items() if k != "kept_heads"} for m in members],
            metadata=meta,
        )

    @classmethod
    def load(cls, path: str | os.PathLike) -> HeadMasks:
        """Read a masks file; a missing file or bad JSON raises ``ValueError`` naming the path."""
        path = Path(path)
        return cls.from_dict(_read_masks_json(path), source=f"masks file {str(path)!r}")

    def save(self, path: str | os.PathLike) -> None:
        """Write atomically (a temporary file renamed into place): never a half-written masks file."""
        path = Path(path)
        text = json.dumps(self.to_dict(), indent=2, default=_json_default)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_output_file(path, text + "\n")

    def check_compatible(self, num_layers: int, num_heads: int, *, model: str = "the model") -> None:
        """Raise ``ValueError`` unless these masks fit a model of ``num_layers`` x ``num_heads``."""
        if (self.num_layers, self.num_heads) != (num_layers, num_heads):
            raise ValueError(
                f"the masks are for {self.num_layers} layers x {self.num_heads} heads but {model} has "
                f"{num_layers} layers x {num_heads} heads; use masks made for this model (hydra-hf prune --model ...)"
            )


def _json_default(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if hasattr(obj, "tolist"):  # numpy
        return obj.tolist()
    raise TypeError(f"cannot write {type(obj).__name__} into a masks file")


# ---------------------------------------------------------------------------------- two towers
TOWER_NAMES = ("vision", "text")


@dataclass
class TowerHeadMasks:
    """Kept heads of M members in each tower of a two-tower model (CLIP: ``"vision"`` and ``"text"``).

    Format (JSON, ``version`` 1)::

        {
          "format": "hydra-head-masks",
          "version": 1,
          "towers": {"vision": {"num_layers": 12, "num_heads": 12}, "text": {"num_layers": 12, "num_heads": 8}},
          "members": [
            {"kept_heads": {"vision": [[...one sorted list per layer...]], "text": [[...]]}, ...metadata...},
            ...one object per member...
          ],
          ...optional top-level metadata...
        }

    Every member names the tower of each of its layer lists. A tower left out of ``towers`` is not
    pruned (its members keep all heads); asking to prune it (``require``) raises ``ValueError``.

    Attributes:
        towers: tower name -> ``HeadMasks`` of that tower (all with the same M).
        member_metadata: one dict per member.
        metadata: top-level metadata.
    """

    towers: dict[str, HeadMasks]
    member_metadata: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.towers, dict) or not self.towers:
            raise ValueError(f"towers must name at least one tower of {list(TOWER_NAMES)}, got {self.towers!r}")
        unknown = [t for t in self.towers if t not in TOWER_NAMES]
        if unknown:
            raise ValueError(f"unknown tower {unknown[0]!r} in the masks; towers are named {list(TOWER_NAMES)}")
        counts = {t: m.num_members for t, m in self.towers.items()}
        if len(set(counts.values())) != 1:
            raise ValueError(f"the towers have different numbers of members {counts}; give every member both towers")
        if not self.member_metadata:
            self.member_metadata = [{} for _ in range(self.num_members)]
        if len(self.member_metadata) != self.num_members:
            raise ValueError(
                f"member_metadata has {len(self.member_metadata)} entries for {self.num_members} members; "
                "give one dict per member (or none)"
            )

    @property
    def num_members(self) -> int:
        return next(iter(self.towers.values())).num_members

    def tower(self, name: str) -> HeadMasks:
        """The masks of one tower; ``ValueError`` naming the tower when the file has none for it."""
        if name not in TOWER_NAMES:
            raise ValueError(f"unknown tower {name!r}; towers are named {list(TOWER_NAMES)}")
        if name not in self.towers:
            raise ValueError(
                f"the masks have no {name!r} tower (they prune {sorted(self.towers)}); add "
                f"\"towers\": {{\"{name}\": ...}} and every member's kept_heads[{name!r}], or do not ask to prune it"
            )
        return self.towers[name]

    def require(self, names: list[str] | tuple[str, ...]) -> None:
        """Raise ``ValueError`` unless every tower in ``names`` is in the masks."""
        for name in names:
            self.tower(name)

    def kept_heads(self, name: str) -> list[list[list[int]]]:
        return self.tower(name).kept_heads

    def jaccard(self) -> torch.Tensor:
        """Pairwise Jaccard overlap of the members' kept ``(tower, layer, head)`` sets (the union over
        the towers), shape ``(M, M)``."""
        sets = [
            {(t, layer, h) for t, masks in self.towers.items() for layer, heads in enumerate(masks.kept_heads[m]) for h in heads}
            for m in range(self.num_members)
        ]
        out = torch.ones(self.num_members, self.num_members)
        for i, j in itertools.combinations(range(self.num_members), 2):
            union = len(sets[i] | sets[j])
            out[i, j] = out[j, i] = len(sets[i] & sets[j]) / union if union else 1.0
        return out

    def summary(self) -> str:
        """Per tower: heads kept per member (and that tower's overlap); then the overlap over both towers."""
        lines = [f"[{name}] " + masks.summary() for name, masks in self.towers.items()]
        if len(self.towers) > 1:
            jac = self.jaccard()
            pairs = [f"{i}-{j}: {jac[i, j]:.2f}" for i, j in itertools.combinations(range(self.num_members), 2)]
            if pairs:
                lines.append("pairwise Jaccard overlap of kept heads, all towers: " + ", ".join(pairs))
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        reserved = {"format", "version", "towers", "members", "num_layers", "num_heads"}
        clash = reserved & set(self.metadata)
        if clash:
            raise ValueError(f"metadata keys {sorted(clash)} are reserved by the masks format; rename them")
        members = []
        for m, meta in enumerate(self.member_metadata):
            if "kept_heads" in meta:
                raise ValueError("member metadata may not contain 'kept_heads'; it is the mask itself")
            members.append({"kept_heads": {t: masks.kept_heads[m] for t, masks in self.towers.items()}, **meta})
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "towers": {t: {"num_layers": masks.num_layers, "num_heads": masks.num_heads} for t, masks in self.towers.items()},
            "members": members,
            **self.metadata,
        }

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "masks") -> TowerHeadMasks:
        if not isinstance(data, dict):
            raise ValueError(f"{source}: expected a JSON object, got {type(data).__name__}")
        if data.get("format") != FORMAT_NAME:
            raise ValueError(f"{source}: 'format' is {data.get('format')!r}; a masks file has \"format\": \"{FORMAT_NAME}\"")
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(f"{source}: 'version' is {data.get('version')!r}; this hydra_hf reads version {FORMAT_VERSION}")
        towers, members = data.get("towers"), data.get("members")
        if not isinstance(towers, dict) or not towers:
            raise ValueError(f"{source}: 'towers' must map tower names {list(TOWER_NAMES)} to {{num_layers, num_heads}}")
        unknown = [t for t in towers if t not in TOWER_NAMES]
        if unknown:
            raise ValueError(f"{source}: unknown tower {unknown[0]!r}; towers are named {list(TOWER_NAMES)}")
        if not isinstance(members, list) or not members or not all(isinstance(m, dict) for m in members):
            raise ValueError(f"{source}: 'members' must be a non-empty list of objects with 'kept_heads'")
        per_tower: dict[str, HeadMasks] = {}
        for name, shape in towers.items():
            if not isinstance(shape, dict) or "num_layers" not in shape or "num_heads" not in shape:
                raise ValueError(f"{source}: towers[{name!r}] must be {{\"num_layers\": L, \"num_heads\": H}}")
            shape = {k: _count(shape[k], f"towers[{name!r}].{k}", source) for k in ("num_layers", "num_heads")}
            kept = []
            for i, m in enumerate(members):
                heads = m.get("kept_heads")
                if not isinstance(heads, dict):
                    raise ValueError(
                        f"{source}: members[{i}].kept_heads must map each tower to its layer lists "
                        f"(e.g. {{\"vision\": [[...]], \"text\": [[...]]}}), got {type(heads).__name__}"
                    )
                extra = [t for t in heads if t not in towers]
                if extra:
                    raise ValueError(
                        f"{source}: members[{i}].kept_heads names tower {extra[0]!r} that 'towers' does not list "
                        f"(towers: {sorted(towers)}); add it to 'towers' or remove it"
                    )
                if name not in heads:
                    raise ValueError(f"{source}: members[{i}].kept_heads misses the {name!r} tower; give its layer lists")
                kept.append(heads[name])
            validate_kept_heads(kept, shape["num_layers"], shape["num_heads"], where=f"{source}: members[*].kept_heads[{name!r}]")
            per_tower[name] = HeadMasks(kept_heads=kept, num_heads=shape["num_heads"])
        meta = {k: v for k, v in data.items() if k not in {"format", "version", "towers", "members"}}
        return cls(
            towers=per_tower,
            member_metadata=[{k: v for k, v in m.items() if k != "kept_heads"} for m in members],
            metadata=meta,
        )

    @classmethod
    def load(cls, path: str | os.PathLike) -> TowerHeadMasks:
        loaded = load_masks(path)
        if not isinstance(loaded, TowerHeadMasks):
            raise ValueError(
                f"masks file {str(path)!r} has no 'towers': it is a single-tower masks file; a CLIP model needs "
                f"kept heads per tower ({list(TOWER_NAMES)})"
            )
        return loaded

    def save(self, path: str | os.PathLike) -> None:
        """Write atomically (a temporary file renamed into place)."""
        path = Path(path)
        text = json.dumps(self.to_dict(), indent=2, default=_json_default)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_output_file(path, text + "\n")

    def check_compatible(self, shapes: dict[str, tuple[int, int]], *, model: str = "the model") -> None:
        """Raise ``ValueError`` unless every tower in the masks fits ``shapes[tower] = (L, H)``."""
        for name, masks in self.towers.items():
            if name not in shapes:
                raise ValueError(f"the masks prune a {name!r} tower but {model} has towers {sorted(shapes)}")
            masks.check_compatible(*shapes[name], model=f"the {name} tower of {model}")


def load_masks(path: str | os.PathLike) -> HeadMasks | TowerHeadMasks:
    """Read a masks file: ``TowerHeadMasks`` when it has ``towers`` (CLIP), else ``HeadMasks``."""
    path = Path(path)
    data = _read_masks_json(path)
    source = f"masks file {str(path)!r}"
    if isinstance(data, dict) and "towers" in data:
        return TowerHeadMasks.from_dict(data, source=source)
    return HeadMasks.from_dict(data, source=source)


def _read_masks_json(path: Path) -> Any:
    """The JSON content of a masks file; every problem is a ``ValueError`` naming the path."""
    if path.is_dir():
        raise ValueError(f"masks file {str(path)!r} is a folder; pass the masks JSON file (e.g. masks.json)")
    if not path.is_file():
        raise ValueError(f"masks file {str(path)!r} does not exist; create one with `hydra-hf prune` or by hand")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"masks file {str(path)!r} is not valid JSON ({exc}); fix or regenerate it") from None
