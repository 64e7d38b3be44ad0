"""The head-masks file: which attention heads every member of a Hydra Ensemble keeps, per tower.

One type, :class:`HeadMasks`, holds the kept heads of M members in one or more *towers* (the
encoder stacks of a model: BERT and ViT have one, CLIP / SigLIP / open_clip have ``"vision"`` and
``"text"``). The file has two shapes, both ``version`` 1, and a model's number of towers says which
one it reads:

One-tower models (the tower is not named: the masks apply to the model's only tower)::

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

Several towers (named; a tower the file leaves out is not pruned: its members keep all heads)::

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

A member may keep any number of heads in a layer, 0 included.

**Slim members** (an extension beyond the paper; ``"version": 2``): a member may also keep a subset of each
layer's MLP intermediate neurons, ``"kept_neurons"`` beside its ``"kept_heads"`` (one sorted list per layer,
0 neurons allowed; a member without the key keeps every neuron), and the file records the MLP's width,
``"intermediate_size"`` (top level, or in each pruned tower's entry of ``"towers"``)::

    {"format": "hydra-head-masks", "version": 2, "num_layers": L, "num_heads": H, "intermediate_size": I,
     "members": [{"kept_heads": [[0, 3], ...], "kept_neurons": [[5, 17, ...], ...]}, ...]}

A version-1 reader refuses such a file (its version), so that no reader silently fuses whole MLPs; this
reader refuses ``kept_neurons`` in a version-1 file. Files without slim members are written as version 1,
byte for byte as before. :meth:`HeadMasks.load` reads both
shapes (``load_masks`` is the same), :meth:`HeadMasks.save` writes the shape it was read from (or
built as), byte for byte as before; every error names the bad value and how to fix it. Code that
fuses or prunes a model asks the masks for the model's towers (:meth:`HeadMasks.check_towers`,
:meth:`HeadMasks.kept_heads_by_tower`) instead of asking which shape they have.
"""

from __future__ import annotations

import difflib
import itertools
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .errors import HydraInputError, HydraTypeError
from .modeling import hydra_formulas as formulas
from .modeling.configuration_hydra import check_kept_heads, check_kept_neurons
from .outputs import read_json, write_output_file

FORMAT_NAME = "hydra-head-masks"
FORMAT_VERSION = 1
SLIM_FORMAT_VERSION = 2  # a file whose members keep subsets of the MLP neurons ("kept_neurons")
READ_VERSIONS = (FORMAT_VERSION, SLIM_FORMAT_VERSION)
NEURONS_KEY = "kept_neurons"
INNER_KEY = "intermediate_size"
# bounds checked before any work: an ensemble has a handful of members, and its masks file a few kB
MAX_MEMBERS = 256
MAX_FILE_BYTES = 8 * 2**20
TOWER_NAMES = ("vision", "text")  # the names a masks file may give its towers
ANY_TOWER = "*"  # the key of the unnamed tower of a one-tower masks file: the model's only tower

# One validator for the masks file and the shipped config (the config cannot import hydra_hf).
validate_kept_heads = check_kept_heads

_RESERVED = frozenset({"format", "version", "num_layers", "num_heads", "towers", "members", INNER_KEY})
_MEMBER_RESERVED = frozenset({"kept_heads", NEURONS_KEY})
# grouped-query attention (decoders): the model's key/value heads per layer, and each member's kept ones
KV_HEADS_KEY = "num_key_value_heads"
MEMBER_KV_KEY = "kept_kv_heads"


def _count(value: Any, key: str, source: str) -> int:
    """A positive integer read from a masks file (``"4"`` or ``4.0`` is a type error naming the fix)."""
    if isinstance(value, bool) or not isinstance(value, int):
        hint = f"; write {value} without quotes" if isinstance(value, str) and value.strip().isdigit() else ""
        raise HydraTypeError(f"{source}: {key!r} must be an integer, got {type(value).__name__} {value!r}{hint}")
    if value < 1:
        raise ValueError(f"{source}: {key!r} must be at least 1, got {value}")
    return value


def _inner_size(holder: Mapping[str, Any], key: str, source: str) -> int:
    """The MLP width a slim masks file records (one line naming the fix when it records none)."""
    if holder.get(INNER_KEY) is None:
        raise HydraInputError(
            f"{source}: members list {NEURONS_KEY!r} but the file gives no {key!r} (the MLP's number of neurons); "
            "add it (hydra-hf prune --mlp-keep writes it)"
        )
    return _count(holder[INNER_KEY], key, source)


def _checked_neurons(
    kept_neurons: Any, intermediate_size: Any, num_members: int, num_layers: int, where: str = "kept_neurons"
) -> list[list[list[int]] | None]:
    """One tower's ``kept_neurons[m]`` (``[l]`` lists, or None: member m keeps every neuron) as fresh lists,
    validated against the MLP width ``intermediate_size``."""
    if isinstance(intermediate_size, bool) or not isinstance(intermediate_size, int) or intermediate_size < 1:
        raise HydraInputError(
            f"{where}: the masks need the MLP width {INNER_KEY!r} (a positive integer) beside "
            f"kept_neurons, got {intermediate_size!r}"
        )
    if not isinstance(kept_neurons, (list, tuple)) or len(kept_neurons) != num_members:
        raise HydraInputError(
            f"{where}: give one entry per member ({num_members}), or None for a member keeping every neuron"
        )
    # a member that keeps every neuron (None) stands in as one keeping none: the check's messages index members
    check_kept_neurons([[[] for _ in range(num_layers)] if n is None else n for n in kept_neurons], num_members,
                       num_layers, where=where)
    out: list[list[list[int]] | None] = []
    for m, member in enumerate(kept_neurons):
        if member is None:
            out.append(None)
            continue
        for layer, neurons in enumerate(member):
            if neurons and neurons[-1] >= intermediate_size:
                bad = [n for n in neurons if n >= intermediate_size][:5]
                raise HydraInputError(
                    f"{where}[{m}][{layer}] has neuron indices {bad} outside [0, {intermediate_size}); the MLP has "
                    f"{intermediate_size} intermediate neurons"
                )
        out.append([list(n) for n in member])
    return out


def _checked_tower(kept_heads: Any, num_heads: Any) -> list[list[list[int]]]:
    """One tower's ``kept_heads[m][l]`` as fresh lists, validated against ``num_heads``."""
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"num_heads must be a positive integer, got {num_heads!r}")
    kept = [[list(heads) for heads in member] for member in kept_heads]
    num_layers = len(kept[0]) if kept and isinstance(kept[0], list) else 0
    validate_kept_heads(kept, num_layers, num_heads)
    if num_layers == 0:
        raise ValueError("kept_heads[0] has no layers; give one list of kept heads per layer")
    return kept


class HeadMasks:
    """Kept heads of M members in each of one or more towers.

    Build one tower with ``HeadMasks(kept_heads=..., num_heads=H)`` (the one-tower file) or named
    towers with ``HeadMasks(towers={"vision": HeadMasks(...), "text": HeadMasks(...)})`` (the file
    with ``"towers"``; each value gives that tower's kept heads and ``H``, its metadata is not used).

    Attributes:
        member_metadata: one dict per member (method, seed, scores, ranking, ...), saved beside
            ``kept_heads``.
        metadata: top-level metadata (base model, method, budget, ...).
        named: whether the towers are named (the ``"towers"`` file shape); unnamed masks have one
            tower, stored under :data:`ANY_TOWER`, which fits any one-tower model.
        source: the file :meth:`load` read them from (None when built in memory, copies included): an
            input of every command that writes an output from them, never held or deleted by it.

    The one-tower accessors (``kept_heads``, ``num_heads``, ``num_layers``, ``gates``, ...) work
    whenever the masks hold exactly one tower, named or not; :meth:`tower` picks one of several.
    """

    def __init__(
        self,
        kept_heads: list[list[list[int]]] | None = None,
        num_heads: int | None = None,
        member_metadata: list[dict[str, Any]] | None = None,
        metadata: dict[str, Any] | None = None,
        *,
        towers: Mapping[str, HeadMasks] | None = None,
        kept_neurons: list[list[list[int]] | None] | None = None,
        intermediate_size: int | None = None,
    ) -> None:
        self.source: Path | None = None
        self._neurons: dict[str, list[list[list[int]] | None]] = {}  # slim towers only
        self._inner: dict[str, int] = {}
        if towers is None:
            if kept_heads is None or num_heads is None:
                raise ValueError("give kept_heads and num_heads (one tower), or towers={name: HeadMasks} (several)")
            self._kept = {ANY_TOWER: _checked_tower(kept_heads, num_heads)}
            self._heads = {ANY_TOWER: num_heads}
            if kept_neurons is not None and any(n is not None for n in kept_neurons):
                self._neurons[ANY_TOWER] = _checked_neurons(
                    kept_neurons, intermediate_size, len(self._kept[ANY_TOWER]), len(self._kept[ANY_TOWER][0])
                )
                self._inner[ANY_TOWER] = intermediate_size
        else:
            if kept_heads is not None or num_heads is not None or kept_neurons is not None:
                raise ValueError("give either kept_heads and num_heads (one tower) or towers=..., not both")
            if not isinstance(towers, Mapping) or not towers:
                raise ValueError(f"towers must name at least one tower of {list(TOWER_NAMES)}, got {towers!r}")
            unknown = [t for t in towers if t not in TOWER_NAMES]
            if unknown:
                raise ValueError(f"unknown tower {unknown[0]!r} in the masks; towers are named {list(TOWER_NAMES)}")
            self._kept = {t: _checked_tower(m.kept_heads, m.num_heads) for t, m in towers.items()}
            self._heads = {t: m.num_heads for t, m in towers.items()}
            for t, m in towers.items():
                if m.slim:
                    self._neurons[t], self._inner[t] = m._neurons[ANY_TOWER], m._inner[ANY_TOWER]
            counts = {t: len(k) for t, k in self._kept.items()}
            if len(set(counts.values())) != 1:
                raise ValueError(
                    f"the towers have different numbers of members {counts}; give every member both towers"
                )
        self.member_metadata = list(member_metadata) if member_metadata else [{} for _ in range(self.num_members)]
        self.metadata = dict(metadata) if metadata else {}
        if len(self.member_metadata) != self.num_members:
            raise ValueError(
                f"member_metadata has {len(self.member_metadata)} entries for {self.num_members} members; "
                "give one dict per member (or none)"
            )

    @classmethod
    def for_model(
        cls,
        model_towers: Sequence[str],
        kept_heads: Mapping[str, list[list[list[int]]]],
        num_heads: Mapping[str, int],
        member_metadata: list[dict[str, Any]] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> HeadMasks:
        """Masks of a model with ``model_towers`` from per-tower kept heads (a subset of its towers):
        unnamed for a one-tower model, named for several (the file shape each model reads)."""
        if len(model_towers) == 1:
            (tower,) = kept_heads
            return cls(kept_heads[tower], num_heads[tower], member_metadata, metadata)
        towers = {t: cls(kept_heads[t], num_heads[t]) for t in kept_heads}
        return cls(towers=towers, member_metadata=member_metadata, metadata=metadata)

    # ------------------------------------------------------------------ towers
    @property
    def named(self) -> bool:
        return ANY_TOWER not in self._kept

    @property
    def tower_names(self) -> list[str]:
        """The towers these masks prune (``[ANY_TOWER]`` for unnamed masks)."""
        return list(self._kept)

    @property
    def towers(self) -> dict[str, HeadMasks]:
        """Tower name -> that tower's masks (one tower each, unnamed, no metadata; slim neurons kept)."""
        return {t: self._one_tower(t, range(self.num_members)) for t in self._kept}

    def _one_tower(self, tower: str, members: Sequence[int]) -> HeadMasks:
        """``tower``'s masks for ``members``, unnamed, no metadata."""
        neurons = self._neurons.get(tower)
        return HeadMasks(
            kept_heads=[self._kept[tower][m] for m in members], num_heads=self._heads[tower],
            kept_neurons=None if neurons is None else [neurons[m] for m in members],
            intermediate_size=self._inner.get(tower),
        )

    def tower(self, name: str) -> HeadMasks:
        """The masks of one tower; ``ValueError`` naming the tower when the masks have none for it.

        Unnamed masks answer for any name: their tower is the model's only one.
        """
        if not self.named:
            return self.towers[ANY_TOWER]
        if name not in TOWER_NAMES:
            raise ValueError(f"unknown tower {name!r}; towers are named {list(TOWER_NAMES)}")
        if name not in self._kept:
            raise ValueError(
                f"the masks have no {name!r} tower (they prune {sorted(self._kept)}); add "
                f"\"towers\": {{\"{name}\": ...}} and every member's kept_heads[{name!r}], or do not ask to prune it"
            )
        return self.towers[name]

    def require(self, names: Sequence[str]) -> None:
        """Raise ``ValueError`` unless every tower in ``names`` is in the masks."""
        for name in names:
            self.tower(name)

    def check_towers(
        self, model_towers: Sequence[str], prune: Sequence[str] | None = None, *, model: str = "the model"
    ) -> None:
        """Raise ``HydraInputError`` (a ``ValueError``) unless these masks can prune a model with ``model_towers``.

        A one-tower model reads the unnamed file and takes no ``prune`` list; a model with several
        towers reads the named file, and every tower in ``prune`` must be one of its towers and in
        the masks. ``model`` names the model in errors (``"a clip checkpoint"``).
        """
        if len(model_towers) == 1:
            if prune is not None:
                raise HydraInputError(f"towers={list(prune)} applies to two-tower models only; {model} has one tower")
            if self.named:
                raise HydraInputError(
                    f"{model} needs a single-tower masks file (num_layers, num_heads, members[].kept_heads "
                    "as layer lists); this one has 'towers' (a two-tower masks file)"
                )
            return
        if not self.named:
            towers = ", ".join(f'"{t}": {{num_layers, num_heads}}' for t in model_towers)
            raise HydraInputError(
                f"{model} needs a two-tower masks file: \"towers\": {{{towers}}} and every member's "
                "kept_heads per tower; see hydra_hf.masks.HeadMasks"
            )
        if prune is not None:
            unknown = [t for t in prune if t not in model_towers]
            if unknown:
                raise HydraInputError(f"unknown tower {unknown[0]!r}; {model} has towers {list(model_towers)}")
            self.require(list(prune))

    def kept_heads_by_tower(
        self, shapes: Mapping[str, tuple[int, int]], *, model: str = "the model"
    ) -> dict[str, list[list[list[int]]]]:
        """``kept[tower][m][l]`` for every tower of a model with ``shapes[tower] = (L, H)``; a tower the
        masks leave out keeps all its heads. Checks the shapes (``ValueError`` naming the mismatch)."""
        self.check_compatible(shapes, model=model)
        if not self.named:
            (tower,) = shapes
            return {tower: self._kept[ANY_TOWER]}
        return {
            t: self._kept[t] if t in self._kept else [[list(range(H))] * L for _ in range(self.num_members)]
            for t, (L, H) in shapes.items()
        }

    def _only(self) -> str:
        if len(self._kept) != 1:
            raise HydraInputError(f"the masks have towers {sorted(self._kept)}; pick one with masks.tower(name)")
        return next(iter(self._kept))

    # ------------------------------------------------------------------ shape
    @property
    def num_members(self) -> int:
        return len(next(iter(self._kept.values())))

    @property
    def kept_heads(self) -> list[list[list[int]]]:
        """``kept_heads[m][l]`` = sorted head indices member ``m`` keeps in layer ``l`` (one tower)."""
        return self._kept[self._only()]

    @property
    def num_heads(self) -> int:
        """Heads per layer in the base model (H; one tower)."""
        return self._heads[self._only()]

    @property
    def num_layers(self) -> int:
        return len(self.kept_heads[0])

    def num_kept(self, member: int) -> int:
        """Total heads member ``member`` keeps over all layers (of every tower)."""
        return sum(len(h) for kept in self._kept.values() for h in kept[member])

    def removed_heads(self, member: int) -> list[list[int]]:
        """``removed[l]`` = heads member ``member`` removes in layer ``l`` (one tower)."""
        return [[h for h in range(self.num_heads) if h not in set(kept)] for kept in self.kept_heads[member]]

    def gates(self, member: int | None = None) -> torch.Tensor:
        """0/1 gates of one tower: ``(L, H)`` for one member, ``(M, L, H)`` for all."""
        members = range(self.num_members) if member is None else [member]
        out = torch.zeros(len(members), self.num_layers, self.num_heads)
        for i, m in enumerate(members):
            for layer, heads in enumerate(self.kept_heads[m]):
                out[i, layer, heads] = 1.0
        return out if member is None else out[0]

    @classmethod
    def from_gates(cls, gates: torch.Tensor, **kwargs: Any) -> HeadMasks:
        """Build one tower from 0/1 gates of shape ``(M, L, H)`` (or ``(L, H)`` for one member)."""
        if gates.dim() == 2:
            gates = gates.unsqueeze(0)
        if gates.dim() != 3:
            raise ValueError(f"gates must have shape (M, L, H) or (L, H), got {tuple(gates.shape)}")
        kept = [[torch.nonzero(g > 0.5).flatten().tolist() for g in member] for member in gates]
        return cls(kept_heads=kept, num_heads=gates.shape[-1], **kwargs)

    def select_members(self, members: Sequence[int]) -> HeadMasks:
        """The masks of ``members`` alone, in that order, same towers and file shape (e.g. ``[m]``:
        the single pruned model of member ``m``)."""
        meta = [dict(self.member_metadata[m]) for m in members]
        towers = {t: self._one_tower(t, members) for t in self._kept}
        if not self.named:
            one = towers[ANY_TOWER]
            return HeadMasks(
                one.kept_heads, self._heads[ANY_TOWER], meta, dict(self.metadata),
                kept_neurons=one._neurons.get(ANY_TOWER), intermediate_size=one._inner.get(ANY_TOWER),
            )
        return HeadMasks(towers=towers, member_metadata=meta, metadata=dict(self.metadata))

    # ------------------------------------------------------------ slim members
    @property
    def slim(self) -> bool:
        """Whether some member keeps a subset of the MLP neurons (in some tower): a version-2 file."""
        return bool(self._neurons)

    def intermediate_size(self, tower: str | None = None) -> int | None:
        """The MLP width the slim masks of ``tower`` were made for (None: that tower keeps whole MLPs)."""
        return self._inner.get(self._tower_key(tower))

    def kept_neurons(self, tower: str | None = None) -> list[list[list[int]]] | None:
        """``out[m][l]`` = sorted MLP neurons member m keeps in layer l of ``tower`` (a member the file gives no
        ``kept_neurons`` keeps every neuron: ``range(I)``), or None when no member of the tower is slim."""
        key = self._tower_key(tower)
        neurons = self._neurons.get(key)
        if neurons is None:
            return None
        everything = list(range(self._inner[key]))
        layers = len(self._kept[key][0])
        return [[list(everything) for _ in range(layers)] if n is None else [list(x) for x in n] for n in neurons]

    def member_neurons(self, tower: str | None = None) -> list[list[list[int]] | None] | None:
        """The neurons as stored, nothing of the MLP's width built: ``out[m]`` = member m's per-layer lists, or
        None where member m keeps every neuron; None when no member of ``tower`` is slim."""
        neurons = self._neurons.get(self._tower_key(tower))
        return None if neurons is None else [None if n is None else [list(x) for x in n] for n in neurons]

    def _tower_key(self, tower: str | None) -> str:
        if not self.named:
            return ANY_TOWER
        return self._only() if tower is None else tower

    def _layer_counts(self, tower: str, member: int) -> list[int]:
        """Neurons member ``member`` keeps per layer of the slim ``tower`` (counted, never listed)."""
        neurons = self._neurons[tower][member]
        if neurons is None:
            return [self._inner[tower]] * len(self._kept[tower][member])
        return [len(n) for n in neurons]

    def num_kept_neurons(self, member: int) -> int | None:
        """Total MLP neurons member ``member`` keeps over all layers of the slim towers (None: not slim)."""
        if not self.slim:
            return None
        return sum(sum(self._layer_counts(t, member)) for t in self._neurons)

    def check_mlp_width(self, tower: str | None, width: int, *, model: str = "the model") -> None:
        """Raise ``HydraInputError`` (one line naming both sizes and the fix) unless the slim members of
        ``tower`` were made for an MLP of ``width`` neurons per layer, the model's: a file's
        ``intermediate_size`` says what "keeps every neuron" means, so a wrong one would keep other neurons
        (smaller) or build lists of its size (larger). Call it before anything of the masks' width is built."""
        key = self._tower_key(tower)
        inner = self._inner.get(key)
        if inner is None or inner == width:
            return
        where = INNER_KEY if not self.named else f"towers[{key!r}].{INNER_KEY}"
        source = f"masks file {str(self.source)!r}" if self.source is not None else "the masks"
        fix = f'"{INNER_KEY}": {width}' + (f" in towers[{key!r}]" if self.named else "")
        raise HydraInputError(
            f"{source}: {where} {inner} but {model} has {width} MLP neurons per layer"
            f"{f' in its {key} tower' if self.named else ''}; use masks made for this model (hydra-hf prune "
            f"--mlp-keep F) or write {fix}"
        )

    def with_neurons(
        self, kept_neurons: Mapping[str | None, Sequence[list[list[int]] | None]],
        intermediate_size: Mapping[str | None, int],
    ) -> HeadMasks:
        """A copy whose members keep ``kept_neurons[tower][m]`` (None: every neuron) of the
        ``intermediate_size[tower]`` MLP neurons per layer, for every tower named (``None``: the one tower of
        one-tower masks); the other towers, the heads and the metadata as they are. A tower whose members all
        keep every neuron keeps whole MLPs."""
        towers = {}
        for name, one in self.towers.items():
            key = None if not self.named else name
            neurons = kept_neurons[key] if key in kept_neurons else self._neurons.get(name)
            inner = intermediate_size[key] if key in intermediate_size else self._inner.get(name)
            slim = neurons is not None and any(n is not None for n in neurons)
            towers[name] = HeadMasks(one.kept_heads, one.num_heads, kept_neurons=list(neurons) if slim else None,
                                     intermediate_size=inner if slim else None)
        meta = [dict(m) for m in self.member_metadata]
        if not self.named:
            one = towers[ANY_TOWER]
            return HeadMasks(one.kept_heads, one.num_heads, meta, dict(self.metadata),
                             kept_neurons=one._neurons.get(ANY_TOWER), intermediate_size=one._inner.get(ANY_TOWER))
        return HeadMasks(towers=towers, member_metadata=meta, metadata=dict(self.metadata))

    # -------------------------------------------------------------- diversity
    def jaccard(self) -> torch.Tensor:
        """Pairwise Jaccard overlap of the members' kept ``(tower, layer, head)`` sets (the union over
        the towers), shape ``(M, M)``."""
        sets = [
            {(t, layer, h) for t, kept in self._kept.items() for layer, heads in enumerate(kept[m]) for h in heads}
            for m in range(self.num_members)
        ]
        out = torch.ones(self.num_members, self.num_members)
        for i, j in itertools.combinations(range(self.num_members), 2):
            union = len(sets[i] | sets[j])
            out[i, j] = out[j, i] = len(sets[i] & sets[j]) / union if union else 1.0
        return out

    def identical_members(self) -> list[tuple[int, int]]:
        """The pairs ``(i, j)``, ``i < j``, of members that keep exactly the same heads and, slim members, the same
        MLP neurons (a member keeping every neuron, listed or not, is one whole MLP): built from one base
        checkpoint they are one model counted twice. Members with the same heads and other neurons differ."""
        keys = [self._member_key(m) for m in range(self.num_members)]
        return [(i, j) for i, j in itertools.combinations(range(self.num_members), 2) if keys[i] == keys[j]]

    def _member_key(self, member: int) -> tuple:
        """What member ``member`` keeps, comparable: its heads per tower, its neurons per slim tower (None: all)."""
        heads = tuple((t, tuple(map(tuple, kept[member]))) for t, kept in self._kept.items())
        neurons = []
        for t, per_member in self._neurons.items():
            layers, inner = per_member[member], self._inner[t]
            whole = layers is None or all(len(n) == inner for n in layers)  # sorted unique: all of range(I)
            neurons.append((t, None if whole else tuple(map(tuple, layers))))
        return heads, tuple(neurons)

    def summary(self) -> str:
        """Human-readable lines: heads kept per member and the pairwise Jaccard overlap, per tower
        (named towers: ``[name]`` before each) and, with several towers, over all of them."""
        if not self.named:
            return self._tower_summary(ANY_TOWER)
        lines = [f"[{t}] " + self._tower_summary(t) for t in self._kept]
        if len(self._kept) > 1:
            jac = self.jaccard()
            pairs = [f"{i}-{j}: {jac[i, j]:.2f}" for i, j in itertools.combinations(range(self.num_members), 2)]
            if pairs:
                lines.append("pairwise Jaccard overlap of kept heads, all towers: " + ", ".join(pairs))
        return "\n".join(lines)

    def _tower_summary(self, tower: str) -> str:
        one = self.towers[tower]
        total = one.num_layers * one.num_heads
        lines = [f"{one.num_members} members, {one.num_layers} layers x {one.num_heads} heads"]
        for m in range(one.num_members):
            per_layer = ",".join(str(len(h)) for h in one.kept_heads[m])
            lines.append(f"  member {m}: keeps {one.num_kept(m)}/{total} heads (per layer: {per_layer})")
            if one.slim:
                counts = one._layer_counts(ANY_TOWER, m)  # counted: the MLP's width is never listed
                lines.append(
                    f"            and {sum(counts)}/{one.num_layers * one.intermediate_size()} MLP "
                    f"neurons (per layer: {','.join(map(str, counts))})"
                )
        jac = one.jaccard()
        pairs = [f"{i}-{j}: {jac[i, j]:.2f}" for i, j in itertools.combinations(range(one.num_members), 2)]
        if pairs:
            lines.append("  pairwise Jaccard overlap of kept heads: " + ", ".join(pairs))
        return "\n".join(lines)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HeadMasks):
            return NotImplemented
        return (self._kept, self._heads, self._neurons, self._inner, self.member_metadata, self.metadata) == (
            other._kept, other._heads, other._neurons, other._inner, other.member_metadata, other.metadata
        )

    def __repr__(self) -> str:
        shape = {t: (len(k[0]), self._heads[t]) for t, k in self._kept.items()}
        return f"HeadMasks(members={self.num_members}, towers={shape}, metadata={sorted(self.metadata)})"

    # ------------------------------------------------------------------- I/O
    def to_dict(self) -> dict[str, Any]:
        """The JSON object of the masks file, in the shape the masks were read or built with."""
        clash = _RESERVED & set(self.metadata)
        if clash:
            raise ValueError(f"metadata keys {sorted(clash)} are reserved by the masks format; rename them")
        for meta in self.member_metadata:
            clash = _MEMBER_RESERVED & set(meta)
            if clash:
                raise ValueError(f"member metadata may not contain {sorted(clash)}; they are the mask itself")
        if not self.named:
            shape: dict[str, Any] = {"num_layers": self.num_layers, "num_heads": self.num_heads}
            if self.slim:
                shape[INNER_KEY] = self._inner[ANY_TOWER]
            kept: list[Any] = self._kept[ANY_TOWER]
            neurons: list[Any] = self._neurons.get(ANY_TOWER, [None] * self.num_members)
        else:
            shape = {
                "towers": {
                    t: {
                        "num_layers": len(k[0]),
                        "num_heads": self._heads[t],
                        **({INNER_KEY: self._inner[t]} if t in self._inner else {}),
                    }
                    for t, k in self._kept.items()
                }
            }
            kept = [{t: k[m] for t, k in self._kept.items()} for m in range(self.num_members)]
            neurons = [
                {t: n[m] for t, n in self._neurons.items() if n[m] is not None} or None
                for m in range(self.num_members)
            ]
        members = [
            {"kept_heads": heads, **({NEURONS_KEY: n} if n is not None else {}), **meta}
            for heads, n, meta in zip(kept, neurons, self.member_metadata)
        ]
        version = SLIM_FORMAT_VERSION if self.slim else FORMAT_VERSION
        return {"format": FORMAT_NAME, "version": version, **shape, "members": members, **self.metadata}

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "masks") -> HeadMasks:
        """Masks from the JSON object of either file shape (``"towers"`` or ``num_layers``/``num_heads``)."""
        if not isinstance(data, dict):
            raise ValueError(f"{source}: expected a JSON object, got {type(data).__name__}")
        if data.get("format") != FORMAT_NAME:
            raise ValueError(
                f"{source}: 'format' is {data.get('format')!r}; a masks file has \"format\": \"{FORMAT_NAME}\""
            )
        version = data.get("version")
        if isinstance(version, bool) or version not in READ_VERSIONS:
            raise ValueError(
                f"{source}: 'version' is {version!r}; this hydra_hf reads versions {list(READ_VERSIONS)} "
                "(2: members that keep MLP neurons too)"
            )
        members = data.get("members")
        if version == FORMAT_VERSION and isinstance(members, list) and any(
            isinstance(m, dict) and NEURONS_KEY in m for m in members
        ):
            raise HydraInputError(
                f"{source}: members list {NEURONS_KEY!r} (slim members) but the file is version 1, which a reader "
                f"fuses with whole MLPs; write \"version\": {SLIM_FORMAT_VERSION} with {INNER_KEY!r} (hydra-hf prune "
                "--mlp-keep writes it)"
            )
        if isinstance(members, list) and all(isinstance(m, dict) for m in members):
            _check_member_keys(members, source)
            if version == SLIM_FORMAT_VERSION and not any(NEURONS_KEY in m for m in members):
                raise HydraInputError(
                    f"{source}: 'version' is {SLIM_FORMAT_VERSION} (slim members) but no member has {NEURONS_KEY!r}; "
                    f"give the slim members their {NEURONS_KEY}, or write \"version\": {FORMAT_VERSION} for members "
                    "that keep whole MLPs"
                )
        if "towers" in data:
            return cls._from_towers_dict(data, source)
        for key in ("num_layers", "num_heads", "members"):
            if key not in data:
                raise ValueError(f"{source}: missing key {key!r}; see the masks format in the README")
        members = data["members"]
        if not isinstance(members, list) or not members or not all(isinstance(m, dict) for m in members):
            raise ValueError(f"{source}: 'members' must be a non-empty list of objects with 'kept_heads'")
        _check_member_count(members, source)
        for i, m in enumerate(members):
            if "kept_heads" not in m:
                raise ValueError(f"{source}: members[{i}] has no 'kept_heads'")
        kept = [m["kept_heads"] for m in members]
        num_layers = _count(data["num_layers"], "num_layers", source)
        num_heads = _count(data["num_heads"], "num_heads", source)
        validate_kept_heads(kept, num_layers, num_heads, where=f"{source}: members[*].kept_heads")
        neurons, inner = None, None
        if any(NEURONS_KEY in m for m in members):
            inner = _inner_size(data, INNER_KEY, source)
            neurons = _checked_neurons(
                [m.get(NEURONS_KEY) for m in members], inner, len(members), num_layers,
                where=f"{source}: members[*].{NEURONS_KEY}",
            )
        meta = {k: v for k, v in data.items() if k not in _RESERVED}
        masks = cls(
            kept_heads=kept,
            num_heads=num_heads,
            member_metadata=[{k: v for k, v in m.items() if k not in _MEMBER_RESERVED} for m in members],
            metadata=meta,
            kept_neurons=neurons,
            intermediate_size=inner,
        )
        if KV_HEADS_KEY in meta or any(MEMBER_KV_KEY in m for m in members):
            masks.check_key_value_heads(meta.get(KV_HEADS_KEY), source=source)
        return masks

    @classmethod
    def _from_towers_dict(cls, data: dict[str, Any], source: str) -> HeadMasks:
        towers, members = data.get("towers"), data.get("members")
        if not isinstance(towers, dict) or not towers:
            raise ValueError(
                f"{source}: 'towers' must map tower names {list(TOWER_NAMES)} to {{num_layers, num_heads}}"
            )
        unknown = [t for t in towers if t not in TOWER_NAMES]
        if unknown:
            raise ValueError(f"{source}: unknown tower {unknown[0]!r}; towers are named {list(TOWER_NAMES)}")
        if not isinstance(members, list) or not members or not all(isinstance(m, dict) for m in members):
            raise ValueError(f"{source}: 'members' must be a non-empty list of objects with 'kept_heads'")
        _check_member_count(members, source)
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
                    raise ValueError(
                        f"{source}: members[{i}].kept_heads misses the {name!r} tower; give its layer lists"
                    )
                kept.append(heads[name])
            validate_kept_heads(
                kept, shape["num_layers"], shape["num_heads"], where=f"{source}: members[*].kept_heads[{name!r}]"
            )
            neurons, inner = None, None
            given = [m.get(NEURONS_KEY) for m in members]
            for i, n in enumerate(given):
                if n is not None and not isinstance(n, dict):
                    raise HydraInputError(
                        f"{source}: members[{i}].{NEURONS_KEY} must map towers to their "
                        f"layer lists, got {type(n).__name__}"
                    )
                extra = [t for t in (n or {}) if t not in towers]
                if extra:
                    raise HydraInputError(
                        f"{source}: members[{i}].{NEURONS_KEY} names tower {extra[0]!r} that 'towers' does not list"
                    )
            if any(n is not None and name in n for n in given):
                inner = _inner_size(towers[name], f"towers[{name!r}].{INNER_KEY}", source)
                neurons = _checked_neurons(
                    [None if n is None else n.get(name) for n in given], inner, len(members), shape["num_layers"],
                    where=f"{source}: members[*].{NEURONS_KEY}[{name!r}]",
                )
            per_tower[name] = cls(
                kept_heads=kept, num_heads=shape["num_heads"], kept_neurons=neurons, intermediate_size=inner
            )
        meta = {k: v for k, v in data.items() if k not in {"format", "version", "towers", "members"}}
        return cls(
            towers=per_tower,
            member_metadata=[{k: v for k, v in m.items() if k not in _MEMBER_RESERVED} for m in members],
            metadata=meta,
        )

    @classmethod
    def load(cls, path: str | os.PathLike) -> HeadMasks:
        """Read a masks file of either shape; a missing file or bad JSON raises ``ValueError`` naming the path."""
        path = Path(path)
        masks = cls.from_dict(_read_masks_json(path), source=f"masks file {str(path)!r}")
        masks.source = path
        return masks

    def save(self, path: str | os.PathLike) -> None:
        """Write atomically (a temporary file renamed into place): never a half-written masks file."""
        path = Path(path)
        text = json.dumps(self.to_dict(), indent=2, default=_json_default)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_output_file(path, text + "\n")

    # ------------------------------------------------------- grouped-query attention (decoders)
    def with_key_value_heads(self, num_key_value_heads: int) -> HeadMasks:
        """A copy that records grouped-query attention for a one-tower decoder: ``"num_key_value_heads"`` at
        the top of the file and every member's ``"kept_kv_heads"`` (per layer, the key/value heads its kept
        query heads read: a key/value head stays while any of its query heads is kept). Readers may use them
        to size caches; the query heads in ``kept_heads`` stay the mask."""
        kept = self.kept_heads
        kv = members_kept_kv_heads(kept, self.num_heads, num_key_value_heads)
        meta = [{**m, MEMBER_KV_KEY: member_kv} for m, member_kv in zip(self.member_metadata, kv)]
        return HeadMasks(
            kept, self.num_heads, meta, {**self.metadata, KV_HEADS_KEY: num_key_value_heads},
            kept_neurons=self._neurons.get(ANY_TOWER), intermediate_size=self._inner.get(ANY_TOWER),
        )

    def check_key_value_heads(
        self, num_key_value_heads: int | None, *, source: str = "masks", model: str | None = None
    ) -> None:
        """Raise ``HydraInputError`` (one line) unless the grouped-query fields of the masks are consistent:
        the file's ``"num_key_value_heads"`` equals ``num_key_value_heads`` (the model's, when ``model`` names
        it), and every member's ``"kept_kv_heads"``, where given, lists exactly the key/value heads its kept
        query heads read."""
        recorded = self.metadata.get(KV_HEADS_KEY)
        if model is not None and recorded is not None and recorded != num_key_value_heads:
            raise HydraInputError(
                f"the masks record num_key_value_heads={recorded!r} but {model} has {num_key_value_heads} key/value "
                "heads; use masks made for this model (hydra-hf prune --model ...)"
            )
        kv = recorded if num_key_value_heads is None else num_key_value_heads
        if any(MEMBER_KV_KEY in m for m in self.member_metadata) and kv is None:
            raise HydraInputError(
                f"{source}: members list 'kept_kv_heads' but the file has no 'num_key_value_heads'; add it or drop "
                "kept_kv_heads (it is derived from the query heads)"
            )
        if isinstance(kv, bool) or not isinstance(kv, int) or kv < 1 or self.num_heads % kv:
            raise HydraInputError(
                f"{source}: num_key_value_heads={kv!r} must be a positive divisor of num_heads={self.num_heads}"
            )
        for m, (meta, member) in enumerate(zip(self.member_metadata, self.kept_heads)):
            given = meta.get(MEMBER_KV_KEY)
            if given is None:
                continue
            if not isinstance(given, list) or len(given) != len(member):
                raise HydraInputError(
                    f"{source}: members[{m}].kept_kv_heads must list {len(member)} layers of key/value heads"
                )
            for layer, (heads, query) in enumerate(zip(given, member)):
                want = kept_kv_heads(query, self.num_heads, kv)
                if not isinstance(heads, list) or sorted(heads) != want:
                    raise HydraInputError(
                        f"{source}: members[{m}].kept_kv_heads[{layer}]={heads!r} but its query heads {query} read "
                        f"key/value heads {want}: a key/value head stays exactly while one of its query heads is "
                        "kept; drop kept_kv_heads (it is derived) or fix kept_heads"
                    )

    def check_compatible(
        self,
        num_layers: int | Mapping[str, tuple[int, int]],
        num_heads: int | None = None,
        *,
        model: str = "the model",
    ) -> None:
        """Raise ``ValueError`` unless these masks fit the model: ``check_compatible(L, H)`` for a
        one-tower model, ``check_compatible({tower: (L, H)})`` for a model with named towers (every
        tower of the masks must be one of the model's)."""
        if not isinstance(num_layers, Mapping):
            self._check_shape(self._only(), num_layers, num_heads, model)
            return
        shapes = dict(num_layers)
        if not self.named:
            if len(shapes) != 1:
                raise ValueError(
                    f"single-tower masks fit a one-tower model but {model} has towers {sorted(shapes)}; "
                    "give a masks file with 'towers'"
                )
            ((L, H),) = shapes.values()
            self._check_shape(ANY_TOWER, L, H, model)
            return
        for name in self._kept:
            if name not in shapes:
                raise ValueError(f"the masks prune a {name!r} tower but {model} has towers {sorted(shapes)}")
            self._check_shape(name, *shapes[name], f"the {name} tower of {model}")

    def _check_shape(self, tower: str, num_layers: int | None, num_heads: int | None, model: str) -> None:
        L, H = len(self._kept[tower][0]), self._heads[tower]
        if (L, H) != (num_layers, num_heads):
            raise ValueError(
                f"the masks are for {L} layers x {H} heads but {model} has "
                f"{num_layers} layers x {num_heads} heads; use masks made for this model (hydra-hf prune --model ...)"
            )


def _json_default(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if hasattr(obj, "tolist"):  # numpy
        return obj.tolist()
    raise TypeError(f"cannot write {type(obj).__name__} into a masks file")


def load_masks(path: str | os.PathLike) -> HeadMasks:
    """Read a masks file of either shape (the same as :meth:`HeadMasks.load`)."""
    return HeadMasks.load(path)


def _check_member_keys(members: list[dict], source: str) -> None:
    """Refuse a member key one letter or so off a key hydra_hf reads (``kept_neuron``): kept as metadata, it would
    leave the member keeping every neuron (or no heads' list at all) without a word."""
    known = ("kept_heads", NEURONS_KEY, MEMBER_KV_KEY)
    for i, member in enumerate(members):
        for key in member:
            close = [] if key in known else difflib.get_close_matches(str(key), known, n=1, cutoff=0.85)
            if close:
                raise HydraInputError(
                    f"{source}: members[{i}] has the key {key!r}, which no reader uses; did you mean {close[0]!r}? "
                    "Rename it"
                )


def _check_member_count(members: list, source: str) -> None:
    if len(members) > MAX_MEMBERS:
        raise HydraInputError(
            f"{source}: {len(members)} members, more than the {MAX_MEMBERS} an ensemble file may hold; "
            "keep the members you mean to fuse"
        )


def _read_masks_json(path: Path) -> Any:
    """The JSON content of a masks file, read with bounds (:func:`hydra_hf.outputs.read_json`: a regular
    file of at most 8 MB, no deeper than 64 levels); every problem is one line naming the path."""
    return read_json(path, what="masks file", fix="fix it, or write a new one with `hydra-hf prune`",
                     max_bytes=MAX_FILE_BYTES)


def kept_kv_heads(kept_query_heads: Sequence[int], num_heads: int, num_key_value_heads: int) -> list[int]:
    """The key/value heads a member keeps under grouped-query attention.

    Masks name *query* heads. Query head ``h`` reads key/value head ``h // (num_heads / num_key_value_heads)``
    (transformers' ``repeat_kv``); a key/value head stays while any of its query heads is kept, and goes
    when all of them are removed. With ``num_key_value_heads == num_heads`` this is ``sorted(kept_query_heads)``.
    The rule is :func:`hydra_hf.modeling.hydra_formulas.kept_kv_heads`; this checks the arguments first.

    Example: ``kept_kv_heads([0, 5], 8, 2) == [0, 1]``; ``kept_kv_heads([0, 1], 8, 2) == [0]``.

    Raises:
        HydraInputError: ``num_heads`` not a positive multiple of ``num_key_value_heads``, or a query
            head outside ``[0, num_heads)``.
    """
    if num_key_value_heads < 1 or num_heads < 1 or num_heads % num_key_value_heads:
        raise HydraInputError(
            f"num_heads {num_heads} must be a positive multiple of num_key_value_heads {num_key_value_heads}"
        )
    bad = [h for h in kept_query_heads if not 0 <= int(h) < num_heads]
    if bad:
        raise HydraInputError(f"query heads {bad} are outside [0, {num_heads}); a layer has {num_heads} query heads")
    return formulas.kept_kv_heads(kept_query_heads, num_heads, num_key_value_heads)


def members_kept_kv_heads(
    kept_heads: Sequence[Sequence[Sequence[int]]], num_heads: int, num_key_value_heads: int
) -> list[list[list[int]]]:
    """:func:`kept_kv_heads` of every member and layer: ``out[m][l]`` = the key/value heads member m keeps in
    layer l (the rule is the shipped ``hydra_formulas.kept_kv_heads``, which the loaded models apply too)."""
    return [[kept_kv_heads(layer, num_heads, num_key_value_heads) for layer in member] for member in kept_heads]
