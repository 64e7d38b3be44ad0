"""How many heads to prune: keep ``K`` heads in every layer, or remove ``N`` heads in total."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Budget:
    """A pruning budget; give exactly one of the two fields.

    Attributes:
        heads_per_layer: keep this many heads in every layer (per-layer pruning; ``--heads-per-layer``).
        remove: remove this many heads in total, anywhere (global pruning; ``--remove``).
    """

    heads_per_layer: int | None = None
    remove: int | None = None

    def __post_init__(self) -> None:
        if (self.heads_per_layer is None) == (self.remove is None):
            raise ValueError(
                "give exactly one budget: heads_per_layer=K (--heads-per-layer) or remove=N (--remove), "
                f"got heads_per_layer={self.heads_per_layer!r}, remove={self.remove!r}"
            )
        for name in ("heads_per_layer", "remove"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"budget {name} must be a non-negative integer, got {value!r}")

    def check(self, num_layers: int, num_heads: int) -> None:
        """Raise ``ValueError`` if the budget does not fit a model of ``num_layers`` x ``num_heads``."""
        total = num_layers * num_heads
        if self.heads_per_layer is not None and self.heads_per_layer > num_heads:
            raise ValueError(
                f"--heads-per-layer {self.heads_per_layer} is larger than the {num_heads} heads per layer "
                f"of the model; choose K <= {num_heads}"
            )
        if self.remove is not None and self.remove > total:
            raise ValueError(
                f"--remove {self.remove} is larger than the model's {total} heads "
                f"({num_layers} layers x {num_heads}); choose N <= {total}"
            )

    def num_removed(self, num_layers: int, num_heads: int) -> int:
        """Total heads removed under this budget."""
        self.check(num_layers, num_heads)
        if self.heads_per_layer is not None:
            return num_layers * (num_heads - self.heads_per_layer)
        return int(self.remove)  # type: ignore[arg-type]

    def min_kept_per_layer(self) -> int:
        """Fewest heads a layer may keep (``K`` for per-layer budgets, 0 for global ones)."""
        return self.heads_per_layer if self.heads_per_layer is not None else 0

    def to_dict(self) -> dict[str, int | None]:
        return {"heads_per_layer": self.heads_per_layer, "remove": self.remove}

    def describe(self) -> str:
        """``"6 heads kept in every layer"`` / ``"36 heads removed"`` (report titles and logs)."""
        if self.heads_per_layer is not None:
            return f"{self.heads_per_layer} heads kept in every layer"
        return f"{self.remove} heads removed"

    @classmethod
    def of(cls, owner: object) -> Budget:
        """The budget of a recipe object with ``heads_per_layer`` and ``remove`` fields (exactly one set)."""
        try:
            return cls(heads_per_layer=getattr(owner, "heads_per_layer", None), remove=getattr(owner, "remove", None))
        except ValueError as exc:
            raise ValueError(f"{type(owner).__name__}: {exc}; set the other one to None") from None
