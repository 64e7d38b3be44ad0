"""Figures for evaluation reports and model cards: reliability diagrams, OOD score histograms and
kept-head maps.

matplotlib is imported lazily inside each function, and only its object-oriented API is used
(``matplotlib.figure.Figure`` drawn by the Agg canvas): no ``pyplot`` state, no change of the
user's backend, no GUI. Every function validates its inputs before drawing and writes the PNG
atomically (a temporary file in the target folder, then ``os.replace``), so a failure never leaves
a missing-or-half-written file at ``path``.
"""

from __future__ import annotations

import logging
import math
import os
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch

from ..metrics import classification as metrics

logger = logging.getLogger(__name__)

__all__ = ["reliability_diagram", "ood_histogram", "heads_heatmap", "risk_coverage_diagram", "risk_coverage_figure"]

ArrayLike = torch.Tensor | np.ndarray


def _new_figure(width: float, height: float) -> Any:
    """A figure bound to the Agg canvas (no pyplot, no global backend switch)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # heavy: imported only to draw a figure
    from matplotlib.figure import Figure  # heavy: imported only to draw a figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save_atomic(fig: Any, path: str | os.PathLike[str]) -> str:
    """Save ``fig`` as PNG to ``path`` through a temporary file and ``os.replace``."""
    path = os.fspath(path)
    if not path.lower().endswith(".png"):
        raise ValueError(f"path must end with .png, got {path!r}")
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    # a fresh name opened with "xb" (not mkstemp) so the file gets the usual umask permissions
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "xb") as f:
            fig.savefig(f, format="png")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    logger.debug("wrote %s", path)  # often inside a temporary folder: callers name the output
    return path


def _check_mapping(x: Any, name: str, keyed_by: str = "model name") -> None:
    if not isinstance(x, Mapping):
        raise TypeError(f"{name} must be a dict keyed by {keyed_by}, got {type(x).__name__}")
    if not x:
        raise ValueError(f"{name} is empty; pass at least one entry keyed by {keyed_by}")


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float64).numpy()


def reliability_diagram(
    results: Mapping[str, tuple[ArrayLike, ArrayLike]],
    path: str | os.PathLike[str],
    n_bins: int = 15,
    title: str | None = None,
    layout: Literal["panels", "overlay"] = "panels",
) -> str:
    """Reliability diagram(s) of top-label confidence vs accuracy, written as a PNG.

    ``layout="panels"``: one panel per model with accuracy bars, the gap to the diagonal shaded
    (red hatched bars from accuracy up/down to the mean confidence) and the ECE in the legend.
    ``layout="overlay"``: one panel with a line per model through the non-empty bins, the gap to
    the diagonal shaded, and ``name (ECE = ...)`` in the legend.

    Args:
        results: ``{model_name: (probs, labels)}``.
        path: output ``.png`` path (parent folders are created).
        n_bins: equal-width confidence bins, as :func:`hydra_hf.metrics.ece`.
        title: figure title.
        layout: ``"panels"`` or ``"overlay"``.

    Shape:
        probs: (N, C); labels: (N,) per model (N may differ between models).

    Returns:
        ``path`` as a string.
    """
    _check_mapping(results, "results")
    if layout not in ("panels", "overlay"):
        raise ValueError(f"layout must be 'panels' or 'overlay', got {layout!r}")
    binned: dict[str, tuple[dict[str, torch.Tensor], float]] = {}
    for name, pair in results.items():
        if not isinstance(pair, Sequence) or len(pair) != 2:
            raise TypeError(f"results[{name!r}] must be a (probs, labels) pair, got {type(pair).__name__}")
        bins = metrics.calibration_bins(pair[0], pair[1], n_bins, "uniform")
        binned[str(name)] = (bins, metrics._ece_from_bins(bins))

    n = len(binned)
    if layout == "panels":
        cols = min(n, 4)
        rows = math.ceil(n / cols)
        fig = _new_figure(3.6 * cols, 3.6 * rows + (0.4 if title else 0))
        axes = fig.subplots(rows, cols, squeeze=False).flatten()
        for ax, (name, (bins, ece_value)) in zip(axes, binned.items()):
            lower, upper = _to_numpy(bins["lower"]), _to_numpy(bins["upper"])
            conf, acc = _to_numpy(bins["confidence"]), _to_numpy(bins["accuracy"])
            filled = bins["count"].numpy() > 0
            centers, width = (lower + upper) / 2, upper - lower
            acc_plot = np.where(filled, acc, 0.0)
            ax.bar(centers, acc_plot, width=width, color="tab:blue", edgecolor="black", linewidth=0.5,
                   label=f"accuracy (ECE = {ece_value:.4f})")
            gap_bottom = np.where(filled, np.minimum(acc, conf), 0.0)
            gap_height = np.where(filled, np.abs(conf - acc), 0.0)
            ax.bar(centers, gap_height, bottom=gap_bottom, width=width, color="tab:red", alpha=0.3,
                   edgecolor="tab:red", hatch="//", linewidth=0.5, label="gap to confidence")
            ax.plot([0, 1], [0, 1], linestyle="--", color="gray", linewidth=1)
            ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", ylabel="accuracy", title=name)
            ax.legend(loc="upper left", fontsize="small")
        for ax in axes[n:]:
            ax.set_visible(False)
    else:
        fig = _new_figure(5.0, 5.0)
        ax = fig.subplots()
        ax.plot([0, 1], [0, 1], linestyle="--", color="gray", linewidth=1, label="perfect calibration")
        for name, (bins, ece_value) in binned.items():
            filled = bins["count"].numpy() > 0
            conf, acc = _to_numpy(bins["confidence"])[filled], _to_numpy(bins["accuracy"])[filled]
            (line,) = ax.plot(conf, acc, marker="o", markersize=3, label=f"{name} (ECE = {ece_value:.4f})")
            ax.fill_between(conf, conf, acc, color=line.get_color(), alpha=0.15)
        ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", ylabel="accuracy")
        ax.legend(loc="upper left", fontsize="small")
    if title:
        fig.suptitle(title)
    return _save_atomic(fig, path)


def ood_histogram(
    scores_by_model: Mapping[str, tuple[ArrayLike, Mapping[str, ArrayLike]]],
    path: str | os.PathLike[str],
    score_name: str = "MSP",
    bins: int = 50,
    title: str | None = None,
) -> str:
    """Histograms of ID vs OOD scores, one panel per model, AUROCs in the panel titles.

    Args:
        scores_by_model: ``{model_name: (scores_id, {ood_set_name: scores_ood})}``; scores are
            "higher = more in-distribution" (see :func:`hydra_hf.metrics.ood_score`).
        path: output ``.png`` path (parent folders are created).
        score_name: x-axis label, e.g. ``"MSP"`` or ``"energy"``.
        bins: histogram bins, shared by all sets of a panel.
        title: figure title.

    Shape:
        scores_id: (N_id,); each scores_ood: (N_ood,).

    Returns:
        ``path`` as a string.
    """
    _check_mapping(scores_by_model, "scores_by_model")
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins must be a positive int, got {bins!r}")
    prepared: dict[str, tuple[np.ndarray, dict[str, tuple[np.ndarray, float]]]] = {}
    for name, pair in scores_by_model.items():
        if not isinstance(pair, Sequence) or len(pair) != 2:
            raise TypeError(
                f"scores_by_model[{name!r}] must be a (scores_id, {{ood_set: scores_ood}}) pair, "
                f"got {type(pair).__name__}"
            )
        scores_id, ood_sets = pair
        _check_mapping(ood_sets, f"scores_by_model[{name!r}][1]", keyed_by="OOD set name")
        s_id = metrics._scores(scores_id, "scores_id")
        per_set = {}
        for set_name, scores_ood in ood_sets.items():
            s_ood = metrics._scores(scores_ood, f"scores_ood[{set_name!r}]")
            per_set[str(set_name)] = (s_ood.numpy(), metrics.ood_auroc(s_id, s_ood))
        prepared[str(name)] = (s_id.numpy(), per_set)

    n = len(prepared)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig = _new_figure(4.5 * cols, 3.4 * rows + (0.4 if title else 0))
    axes = fig.subplots(rows, cols, squeeze=False).flatten()
    for ax, (name, (s_id, per_set)) in zip(axes, prepared.items()):
        all_scores = np.concatenate([s_id, *[s for s, _ in per_set.values()]])
        lo, hi = float(all_scores.min()), float(all_scores.max())
        if hi <= lo:  # all scores equal: give the histogram a visible width
            lo, hi = lo - 0.5, hi + 0.5
        edges = np.linspace(lo, hi, bins + 1)
        ax.hist(s_id, bins=edges, density=True, alpha=0.5, color="tab:blue", label="ID")
        for set_name, (s_ood, _) in per_set.items():
            ax.hist(s_ood, bins=edges, density=True, histtype="step", linewidth=1.5, label=f"OOD: {set_name}")
        aurocs = ", ".join(f"{s} {auroc:.3f}" for s, (_, auroc) in per_set.items())
        ax.set_title(f"{name}\nAUROC: {aurocs}", fontsize="medium")
        ax.set(xlabel=f"{score_name} (higher = more ID)", ylabel="density")
        ax.legend(fontsize="small")
    for ax in axes[n:]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    return _save_atomic(fig, path)


def risk_coverage_diagram(
    curves: Mapping[str, tuple[Sequence[float], Sequence[float], tuple[float, float] | None, float | None]],
    path: str | os.PathLike[str],
) -> str:
    """Selective risk (error among answered) against coverage (share answered), one line per model.

    Args:
        curves: ``{name: (coverage, risk, point, target)}``: the curve, the operating point of a threshold
            (a dot; None for none) and a target risk (a dotted line; None for none).
        path: the PNG to write.
    """
    _check_mapping(curves, "curves")
    fig = _new_figure(6.0, 4.2)
    ax = fig.add_subplot(1, 1, 1)
    for name, (coverage, risk, point, target) in curves.items():
        (line,) = ax.plot(list(coverage), list(risk), label=name)
        if point is not None:
            ax.plot([point[0]], [point[1]], "o", color=line.get_color())
        if target is not None:
            ax.axhline(target, color=line.get_color(), linestyle=":", linewidth=0.8)
    ax.set_xlabel("coverage (share answered)")
    ax.set_ylabel("risk (error among answered)")
    ax.set_title("Risk-coverage; dots: thresholds, dotted: target risk")
    ax.legend(fontsize=8)
    return _save_atomic(fig, path)


def _kept_heads_grid(kept_heads: Any, num_heads: int | None) -> np.ndarray:
    """Validate ``kept_heads[m][l]`` lists and return a 0/1 array of shape (M, L, H)."""
    if hasattr(kept_heads, "kept_heads"):  # a hydra_hf.masks.HeadMasks
        if num_heads is None:
            num_heads = getattr(kept_heads, "num_heads", None)
        kept_heads = kept_heads.kept_heads
    if not isinstance(kept_heads, Sequence) or isinstance(kept_heads, str) or not kept_heads:
        raise ValueError("kept_heads must be a non-empty list (members) of lists (layers) of head indices")
    num_layers: int | None = None
    for m, member in enumerate(kept_heads):
        if not isinstance(member, Sequence) or isinstance(member, str) or not member:
            raise ValueError(f"kept_heads[{m}] must be a non-empty list with one list of kept heads per layer")
        if num_layers is None:
            num_layers = len(member)
        elif len(member) != num_layers:
            raise ValueError(
                f"kept_heads[{m}] has {len(member)} layers but kept_heads[0] has {num_layers}; "
                f"every member needs one entry per layer"
            )
        for layer, heads in enumerate(member):
            if not isinstance(heads, Sequence) or isinstance(heads, str):
                raise TypeError(f"kept_heads[{m}][{layer}] must be a list of head indices, got {type(heads).__name__}")
            for h in heads:
                if isinstance(h, bool) or not isinstance(h, (int, np.integer)) or h < 0:
                    raise ValueError(f"kept_heads[{m}][{layer}] holds {h!r}; head indices are non-negative ints")
    max_index = max((int(h) for member in kept_heads for heads in member for h in heads), default=-1)
    if num_heads is None:
        num_heads = max_index + 1
        if num_heads == 0:
            raise ValueError("kept_heads keeps no head at all; pass num_heads to draw an empty map")
    elif max_index >= num_heads:
        raise ValueError(f"kept_heads holds head index {max_index} but num_heads={num_heads}")
    grid = np.zeros((len(kept_heads), len(kept_heads[0]), num_heads), dtype=np.int64)  # (M, L, H)
    for m, member in enumerate(kept_heads):
        for layer, heads in enumerate(member):
            grid[m, layer, [int(h) for h in heads]] = 1
    return grid


def heads_heatmap(
    kept_heads: Sequence[Sequence[Sequence[int]]] | Any,
    path: str | os.PathLike[str],
    num_heads: int | None = None,
    title: str | None = None,
    show_overlap: bool = True,
) -> str:
    """Map of the attention heads each member keeps: one ``L x H`` grid per member.

    Kept heads are filled, pruned heads empty; each panel title gives the number kept. With
    ``show_overlap`` a last panel counts, per head, how many members keep it (0..M), which shows
    at a glance how much the members' subnetworks overlap.

    Args:
        kept_heads: ``kept_heads[m][l]`` = head indices member ``m`` keeps in layer ``l``, or a
            :class:`hydra_hf.masks.HeadMasks`.
        path: output ``.png`` path (parent folders are created).
        num_heads: heads per layer ``H`` in the base model; inferred as the largest kept index + 1
            when not given (pass it when the last heads may be pruned everywhere).
        title: figure title.
        show_overlap: add the per-head member-count panel.

    Returns:
        ``path`` as a string.
    """
    grid = _kept_heads_grid(kept_heads, num_heads)  # (M, L, H)
    n_members, n_layers, n_heads = grid.shape
    n_panels = n_members + (1 if show_overlap else 0)
    cols = min(n_panels, 4)
    rows = math.ceil(n_panels / cols)
    cell = 0.28
    panel_w = max(2.2, cell * n_heads + 1.0)
    panel_h = max(2.0, cell * n_layers + 1.0)
    fig = _new_figure(panel_w * cols, panel_h * rows + (0.4 if title else 0))
    axes = fig.subplots(rows, cols, squeeze=False).flatten()

    def _style(ax: Any, label: str) -> None:
        ax.set_title(label, fontsize="medium")
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(n_heads))
        ax.set_yticks(range(n_layers))
        ax.tick_params(labelsize=6)
        ax.set_xticks(np.arange(-0.5, n_heads), minor=True)
        ax.set_yticks(np.arange(-0.5, n_layers), minor=True)
        ax.grid(which="minor", color="white", linewidth=0.5)
        ax.tick_params(which="minor", length=0)

    for m in range(n_members):
        ax = axes[m]
        ax.imshow(grid[m], cmap="Greens", vmin=0, vmax=1.25, aspect="equal", interpolation="nearest")
        _style(ax, f"member {m}: {int(grid[m].sum())}/{n_layers * n_heads} heads")
    if show_overlap:
        ax = axes[n_members]
        counts = grid.sum(axis=0)  # (L, H)
        image = ax.imshow(counts, cmap="viridis", vmin=0, vmax=n_members, aspect="equal", interpolation="nearest")
        _style(ax, "members keeping each head")
        fig.colorbar(image, ax=ax, ticks=range(n_members + 1), shrink=0.8)
    for ax in axes[n_panels:]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    return _save_atomic(fig, path)


def transfer_gains(
    rows: Sequence[Mapping[str, Any]],
    path: str | os.PathLike[str],
    *,
    kinds: Sequence[str],
    title: str | None = None,
) -> str:
    """The selection protocol's rows as horizontal bars (``hydra_hf.recipes.study``): per row the mean transfer
    gain in OOD AUROC over Single (± its seed std as an error bar, when there are several seeds) and a
    dot per OOD kind; rows that break the accuracy / ECE constraint are grey. Rows are ``collect()``'s,
    each with ``label``, ``gain``, ``gain_std``, ``gain_<kind>`` and ``eligible``.
    """
    if not rows:
        raise ValueError("no rows to plot")
    rows = sorted(rows, key=lambda r: r["gain"])
    fig = _new_figure(11.0, 1.4 + 0.28 * len(rows))
    ax = fig.add_subplot(1, 1, 1)
    y = np.arange(len(rows))
    colors = ["tab:blue" if r.get("eligible") else "0.7" for r in rows]
    ax.barh(y, [r["gain"] for r in rows], xerr=[r.get("gain_std", 0.0) for r in rows], color=colors, height=0.6)
    markers = "osD^v<>"
    for k, kind in enumerate(kinds):
        ax.scatter([r.get(f"gain_{kind}", np.nan) for r in rows], y, s=14, marker=markers[k % len(markers)],
                   color="black", zorder=3, label=kind)
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.set_yticks(y)
    ax.set_yticklabels([r["label"] for r in rows], fontsize=7)
    ax.set_xlabel("OOD AUROC minus Single's (MSP), on the OOD kinds a fold did not select on")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="per kind", title_fontsize=7)
    if title:
        ax.set_title(title)
    return _save_atomic(fig, path)


def risk_coverage_figure(decisions: Mapping[str, Sequence[Mapping[str, Any]]], path: str | os.PathLike) -> str:
    """The risk-coverage curves of :func:`hydra_hf.calibration.report.decision_metrics` rows (each model's
    first), thresholds as dots."""
    curves = {}
    for name, rows in decisions.items():
        row = rows[0]
        point = None
        if row["answered"] is not None and row["selective_accuracy"] is not None:
            point = (row["answered"], 1 - row["selective_accuracy"])
        curves[f"{name} ({row['score']})"] = (row["curve"]["coverage"], row["curve"]["risk"], point, row.get("risk"))
    return risk_coverage_diagram(curves, path)
