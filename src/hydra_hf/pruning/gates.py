"""Head gates on stock models: switch attention heads on and off, and differentiate through them.

transformers 5 has neither ``head_mask`` nor ``prune_heads``. A *gate* ``g[l, h]`` multiplies head
``h``'s output in layer ``l`` before the output projection. Since the projection is linear, this is
the same as scaling the column block ``W_O[:, h*dk:(h+1)*dk]`` by ``g[l, h]``, which is how it is
implemented: a ``torch.nn.utils.parametrize`` parametrization on every output-projection weight.
Unlike a module hook it also acts where the weight is read directly (``nn.MultiheadAttention`` in
open_clip passes ``out_proj.weight`` to ``F.multi_head_attention_forward``). A gate of 0 removes the
head exactly (the projection bias is kept, as in the fused Hydra model); all heads of a layer may be
switched off. For weights stored ``(in, out)`` (transformers ``Conv1D``, GPT-2; ``AttentionLayer.transposed``)
the head blocks of ``W_O``'s input are *rows* of the stored weight, and those are scaled. Under
grouped-query attention the gates act on the query heads.

Example::

    with HeadGates(model) as hg:
        hg.set(masks.gates(member=0))      # (L, H) 0/1
        logits = model(**batch).logits     # the pruned member
    # the model is restored exactly here
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType

import torch
from torch import nn
from torch.nn.utils import parametrize

from ..families import get_adapter
from ..families.adapters import ModelAdapter


class _ColumnBlockGate(nn.Module):
    """Parametrization ``W -> W * repeat_interleave(gates[layer], head_dim)`` (scales W_O's head blocks).

    The gate tensor is shared with :class:`HeadGates` (held as a plain attribute, not a buffer, so
    that writing into ``HeadGates.gates`` changes every layer at once). ``transposed``: the weight is
    stored ``(H*dk, d_out)`` (``Conv1D``) and its rows are scaled instead of its columns.
    """

    def __init__(self, gates: torch.Tensor, layer: int, head_dim: int, transposed: bool = False) -> None:
        super().__init__()
        self.gates = gates  # (L, H), shared
        self.layer = layer
        self.head_dim = head_dim
        self.transposed = transposed

    def forward(self, weight: torch.Tensor) -> torch.Tensor:  # weight: (d_out, H*dk), or (H*dk, d_out) transposed
        col_scale = self.gates[self.layer].to(weight.dtype).repeat_interleave(self.head_dim)  # (H*dk,)
        if self.transposed:
            return weight * col_scale.unsqueeze(1)
        return weight * col_scale


class HeadGates:
    """Per-head gates on every attention layer of a stock model (all towers).

    Args:
        model: a model :func:`~hydra_hf.families.get_adapter` supports (or pass ``adapter``).
        adapter: a prebuilt adapter of ``model``.
        requires_grad: make the gates leaf tensors with ``requires_grad=True`` so that
            ``loss.backward()`` fills ``gates.grad`` with ``dL/dgate`` (Michel et al., 2019).

    Attributes:
        tower_gates: tower name -> gates ``(L, H)`` (float32, on the model's device), all ones at start.

    The parametrizations are removed by :meth:`remove` (or on leaving a ``with`` block), which
    restores the original weight tensors and state-dict keys exactly.
    """

    def __init__(self, model: nn.Module, *, adapter: ModelAdapter | None = None, requires_grad: bool = False) -> None:
        self.adapter = adapter if adapter is not None else get_adapter(model)
        self.model = model
        device = next(model.parameters()).device
        self.tower_gates: dict[str, torch.Tensor] = {}
        self._modules: list[nn.Linear] = []
        self._param_order: list[list[str]] = []  # each module's parameter names, to restore their order
        for tower, layers in self.adapter.towers.items():
            for layer in layers:
                if parametrize.is_parametrized(layer.out_proj, "weight"):
                    self._undo()
                    raise ValueError(
                        "this model already has head gates (or another parametrization) on its attention "
                        "output projections; call .remove() on the existing HeadGates first"
                    )
            L, H = len(layers), layers[0].num_heads
            gates = torch.ones(L, H, device=device, requires_grad=requires_grad)
            self.tower_gates[tower] = gates
            for index, layer in enumerate(layers):
                self._param_order.append(list(layer.out_proj._parameters))
                parametrize.register_parametrization(
                    layer.out_proj,
                    "weight",
                    _ColumnBlockGate(gates, index, layer.head_dim, layer.transposed),
                    unsafe=True,
                )
                self._modules.append(layer.out_proj)
        self._active = True

    # -------------------------------------------------------------------------------- access
    @property
    def gates(self) -> torch.Tensor:
        """The ``(L, H)`` gates of a single-tower model (use :attr:`tower_gates` for CLIP)."""
        if len(self.tower_gates) != 1:
            raise ValueError(f"this model has towers {list(self.tower_gates)}; use tower_gates[name]")
        return next(iter(self.tower_gates.values()))

    def set(self, mask: torch.Tensor | Mapping[str, torch.Tensor], tower: str | None = None) -> None:
        """Copy gate values in: a ``(L, H)`` tensor (for ``tower``, or the only tower) or a dict per tower.

        Values may be fractional (soft gates); 0 removes a head, 1 keeps it.
        """
        items = dict(mask) if isinstance(mask, Mapping) else {self.adapter.resolve_tower(tower): mask}
        for name, value in items.items():
            if name not in self.tower_gates:
                raise ValueError(f"unknown tower {name!r}; this model has {list(self.tower_gates)}")
            target = self.tower_gates[name]
            value = torch.as_tensor(value, dtype=target.dtype)
            if tuple(value.shape) != tuple(target.shape):
                raise ValueError(
                    f"gates for tower {name!r} must have shape {tuple(target.shape)} "
                    f"(layers, heads), got {tuple(value.shape)}"
                )
            with torch.no_grad():
                target.copy_(value.to(target.device))

    def reset(self) -> None:
        """All gates back to 1 (every head on) and gradients cleared."""
        for gates in self.tower_gates.values():
            with torch.no_grad():
                gates.fill_(1.0)
            gates.grad = None

    # ------------------------------------------------------------------------------- cleanup
    def _undo(self) -> None:
        for module, order in zip(self._modules, self._param_order):
            if parametrize.is_parametrized(module, "weight"):
                parametrize.remove_parametrizations(module, "weight", leave_parametrized=False)
                # removal re-registers "weight" last; restore the original order (state-dict key order)
                params = module._parameters
                module._parameters = type(params)((name, params[name]) for name in order if name in params)
        self._modules = []
        self._param_order = []

    def remove(self) -> None:
        """Remove the gates; the model's weights and state-dict keys are exactly the original ones."""
        if self._active:
            self._undo()
            self._active = False

    def __enter__(self) -> HeadGates:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.remove()


def zero_head_columns_(
    model: nn.Module, gates: torch.Tensor | Mapping[str, torch.Tensor], *, adapter: ModelAdapter | None = None
) -> nn.Module:
    """Zero, in place, the ``W_O`` column blocks of the heads whose gate is 0 (the reference pruning).

    Args:
        model: the model to modify.
        gates: ``(L, H)`` 0/1 (single tower) or a dict tower -> ``(L, H)``.

    Returns:
        ``model`` (modified in place).
    """
    adapter = adapter if adapter is not None else get_adapter(model)
    items = dict(gates) if isinstance(gates, Mapping) else {adapter.resolve_tower(None): gates}
    with torch.no_grad():
        for tower, g in items.items():
            for index, layer in enumerate(adapter.towers[tower]):
                for h in range(layer.num_heads):
                    if float(g[index, h]) == 0.0:
                        block = slice(h * layer.head_dim, (h + 1) * layer.head_dim)
                        if layer.transposed:  # (H*dk, d_out): the head's input block is rows
                            layer.out_proj.weight[block] = 0.0
                        else:
                            layer.out_proj.weight[:, block] = 0.0
    return model
