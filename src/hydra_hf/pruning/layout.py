"""Which heads a pruning search works over: one tower, or both towers of a CLIP model jointly.

The searches (Taylor, circuits, random) work on a *gate matrix* whose rows are attention layers and
whose columns are heads. For one tower that is the tower's ``(L, H)`` gates. For ``tower="joint"``
the layers of every tower are stacked into one ``(R, H_max)`` matrix, ``R = sum_t L_t`` (tower
order: the adapter's, ``vision`` then ``text``); a tower with fewer heads per layer than ``H_max``
(open_clip ViT-B/32: 12 vision heads, 8 text heads) has padding cells that do not exist: their gate
is 0 from the start, so they are never candidates and never counted as kept or removed.

:class:`HeadLayout` holds that mapping: ``row <-> (tower, layer)``, the stacked matrix ``<->`` one
``(L_t, H_t)`` gate tensor per tower, and how a :class:`~.budget.Budget` reads over all rows.
For a single tower the stacked matrix *is* the tower's matrix, so single-tower code paths are
unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ..families.adapters import ModelAdapter
from .budget import Budget

JOINT = "joint"


@dataclass(frozen=True)
class HeadLayout:
    """The towers a search covers, stacked layer by layer.

    Attributes:
        towers: ``((name, num_layers, num_heads), ...)`` in stacking order.
        joint: whether this is a ``tower="joint"`` layout (results are then keyed by tower).
    """

    towers: tuple[tuple[str, int, int], ...]
    joint: bool = False

    @classmethod
    def of(cls, adapter: ModelAdapter, tower: str | None) -> HeadLayout:
        """The layout of ``tower`` (a name, ``None`` for the only tower, or ``"joint"``).

        Raises:
            ValueError: ``"joint"`` on a one-tower model, or an unknown tower name.
        """
        if tower == JOINT:
            if len(adapter.towers) < 2:
                raise ValueError(
                    f"tower='joint' selects heads over several towers, but this {adapter.kind} model has only "
                    f"{adapter.tower_names}; drop tower= (--tower) or pass tower={adapter.tower_names[0]!r}"
                )
            return cls(tuple((t, *adapter.shape(t)) for t in adapter.tower_names), joint=True)
        name = adapter.resolve_tower(tower)
        return cls(((name, *adapter.shape(name)),))

    # ------------------------------------------------------------------------------- shape
    @property
    def names(self) -> list[str]:
        return [t for t, _, _ in self.towers]

    @property
    def num_rows(self) -> int:
        return sum(L for _, L, _ in self.towers)

    @property
    def max_heads(self) -> int:
        return max(H for _, _, H in self.towers)

    @property
    def total_heads(self) -> int:
        return sum(L * H for _, L, H in self.towers)

    @property
    def rows(self) -> list[tuple[str, int]]:
        """``rows[r] = (tower, layer)``."""
        return [(t, layer) for t, L, _ in self.towers for layer in range(L)]

    def heads_in_row(self) -> list[int]:
        """Heads of the layer in each row, ``(R,)``."""
        return [H for _, L, H in self.towers for _ in range(L)]

    def label(self, row: int, head: int) -> tuple[str, int, int] | tuple[int, int]:
        """How results name a head: ``(layer, head)`` for one tower, ``(tower, layer, head)`` when joint."""
        if not self.joint:
            return row, head
        tower, layer = self.rows[row]
        return tower, layer, head

    # ----------------------------------------------------------------------------- tensors
    def ones(self) -> torch.Tensor:
        """All existing heads on, padding cells 0. Shape ``(R, H_max)``."""
        gates = torch.zeros(self.num_rows, self.max_heads)
        for r, H in enumerate(self.heads_in_row()):
            gates[r, :H] = 1.0
        return gates

    def split(self, stacked: torch.Tensor) -> dict[str, torch.Tensor]:
        """``(R, H_max)`` -> ``{tower: (L_t, H_t)}`` (views of ``stacked``)."""
        out, start = {}, 0
        for t, L, H in self.towers:
            out[t] = stacked[start : start + L, :H]
            start += L
        return out

    def stack(self, per_tower: Mapping[str, torch.Tensor], fill: float = 0.0) -> torch.Tensor:
        """``{tower: (L_t, H_t)}`` -> ``(R, H_max)``, padding cells set to ``fill``."""
        first = next(iter(per_tower.values()))
        out = torch.full((self.num_rows, self.max_heads), fill, dtype=first.dtype)
        start = 0
        for t, L, H in self.towers:
            out[start : start + L, :H] = per_tower[t].to(out.dtype).cpu()
            start += L
        return out

    def unstack(self, stacked: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
        """What results hold: the ``(L, H)`` tensor for one tower, ``{tower: (L_t, H_t)}`` when joint."""
        parts = {t: v.clone() for t, v in self.split(stacked).items()}
        return parts if self.joint else parts[self.names[0]]

    def per_tower(self, result: torch.Tensor | Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A result of :meth:`unstack` (``(L, H)``, or ``{tower: (L_t, H_t)}`` when joint) keyed by tower."""
        return dict(result) if self.joint else {self.names[0]: result}  # type: ignore[arg-type]

    # ----------------------------------------------------------------------------- budget
    def check(self, budget: Budget) -> None:
        """Raise ``ValueError`` unless ``budget`` fits every tower (``heads_per_layer``) / all heads (``remove``)."""
        if not self.joint:
            _, L, H = self.towers[0]
            budget.check(L, H)
            return
        shapes = ", ".join(f"{t} {L} layers x {H}" for t, L, H in self.towers)
        min_heads = min(H for _, _, H in self.towers)
        if budget.heads_per_layer is not None and budget.heads_per_layer > min_heads:
            raise ValueError(
                f"--heads-per-layer {budget.heads_per_layer} is larger than the {min_heads} heads per layer of a "
                f"tower ({shapes}); with tower='joint' K applies to every layer of each tower: choose K <= {min_heads}"
            )
        if budget.remove is not None and budget.remove > self.total_heads:
            raise ValueError(
                f"--remove {budget.remove} is larger than the {self.total_heads} heads of both towers ({shapes}); "
                f"choose N <= {self.total_heads}"
            )

    def num_removed(self, budget: Budget) -> int:
        """Heads removed under ``budget`` over all rows."""
        self.check(budget)
        if budget.heads_per_layer is not None:
            return sum(L * (H - budget.heads_per_layer) for _, L, H in self.towers)
        return int(budget.remove)  # type: ignore[arg-type]
