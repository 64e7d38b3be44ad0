"""Tests for hydra_hf.evaluation.plots (PNG files, atomic writes) and hydra_hf.evaluation.report (tables, report
files)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hydra_hf import metrics as M
from hydra_hf.evaluation import plots, report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 5_000, f"{path} is only {len(data)} bytes"
    leftovers = [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


@pytest.fixture(scope="module")
def preds() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(300, 5, generator=g) * 2, -1)
    labels = torch.randint(0, 5, (300,), generator=g)
    return probs, labels


# ------------------------------------------------------------------------------------------------
# plots
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["panels", "overlay"])
def test_reliability_diagram_writes_png(preds, tmp_path, layout) -> None:  # noqa: ANN001
    probs, labels = preds
    path = tmp_path / "sub" / "reliability.png"
    out = plots.reliability_diagram(
        {"hydra": (probs, labels), "single": (probs.numpy(), labels.numpy())}, path, title="t", layout=layout
    )
    assert out == str(path)
    _assert_png(path)


def test_ood_histogram_writes_png(tmp_path) -> None:  # noqa: ANN001
    rng = np.random.default_rng(0)
    scores = {
        "hydra": (rng.random(200), {"svhn": rng.random(150) * 0.8, "cifar100": rng.random(100)}),
        "single": (torch.rand(200), {"svhn": torch.full((50,), 0.5)}),  # constant scores are fine
    }
    path = tmp_path / "ood.png"
    plots.ood_histogram(scores, path, score_name="energy")
    _assert_png(path)


def test_heads_heatmap_writes_png(tmp_path) -> None:  # noqa: ANN001
    kept = [[[0, 1, 5], [2, 3]], [[1], [0, 1, 2, 3, 4, 5]], [[0, 2], []]]  # M=3, L=2
    path = tmp_path / "heads.png"
    plots.heads_heatmap(kept, path, num_heads=8, title="kept heads")
    _assert_png(path)

    class _Masks:  # duck-typed hydra_hf.masks.HeadMasks
        kept_heads = kept
        num_heads = 6

    plots.heads_heatmap(_Masks(), tmp_path / "heads2.png", show_overlap=False)
    _assert_png(tmp_path / "heads2.png")


def test_invalid_input_leaves_no_file_and_keeps_old_one(preds, tmp_path) -> None:  # noqa: ANN001
    probs, labels = preds
    bad = probs.clone()
    bad[0, 0] = float("nan")
    path = tmp_path / "reliability.png"
    with pytest.raises(ValueError, match="probs contains 1 NaN"):
        plots.reliability_diagram({"m": (bad, labels)}, path)
    assert not path.exists()
    path.write_bytes(b"old")
    with pytest.raises(ValueError, match="scores_ood\\['svhn'\\] is empty"):
        plots.ood_histogram({"m": (np.ones(3), {"svhn": np.array([])})}, path)
    with pytest.raises(ValueError, match="head index 9 but num_heads=8"):
        plots.heads_heatmap([[[0, 9]]], path, num_heads=8)
    with pytest.raises(ValueError, match="kept_heads\\[1\\] has 1 layers but kept_heads\\[0\\] has 2"):
        plots.heads_heatmap([[[0], [1]], [[0]]], path)
    with pytest.raises(TypeError, match="results must be a dict"):
        plots.reliability_diagram([(probs, labels)], path)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="path must end with .png"):
        plots.heads_heatmap([[[0]]], tmp_path / "heads.jpg")
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reliability.png"]


def test_failure_while_saving_leaves_no_file(preds, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    from matplotlib.figure import Figure

    def _broken_savefig(self, fname, **kwargs) -> None:  # noqa: ANN001
        fname.write(b"\x89PNG half")
        raise OSError("disk full")

    monkeypatch.setattr(Figure, "savefig", _broken_savefig)
    probs, labels = preds
    with pytest.raises(OSError, match="disk full"):
        plots.reliability_diagram({"m": (probs, labels)}, tmp_path / "r.png")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------------
# report
# ------------------------------------------------------------------------------------------------


def _rows(preds) -> list[dict]:  # noqa: ANN001
    probs, labels = preds
    g = torch.Generator().manual_seed(1)
    s_id, s_ood = torch.rand(100, generator=g) + 0.3, torch.rand(80, generator=g)
    return [
        {
            "method": "Hydra (M=4)",
            **M.calibration_report(probs, labels),
            "svhn": M.ood_report(s_id, s_ood),
            "compute_x": 2.5,
            "latency_ms": 3.14159,
            "params_m": 86.57,
        },
        {"method": "Single | base", "accuracy": 0.5, "ece": float("nan"), "svhn/auroc": 0.99, "params_m": None},
    ]


def test_markdown_table_layout(preds) -> None:  # noqa: ANN001
    table = report.render_markdown_table(_rows(preds))
    lines = table.splitlines()
    assert lines[0] == (
        "| Method | Acc ↑ | Brier ↓ | NLL ↓ | ECE ↓ | aECE ↓ | svhn AUROC ↑ | svhn FPR95 ↓ | svhn AUPR-In ↑ "
        "| svhn AUPR-Out ↑ | compute (x Single) | latency (ms) | params (M) |"
    )
    assert lines[1] == "|:---|" + "---:|" * 12
    assert "| 2.50 | 3.14 |" in lines[2]
    assert len(lines) == 4
    first = lines[2].split(" | ")
    assert first[0] == "| Hydra (M=4)" and first[-2] == "3.14" and first[-1] == "86.6 |"
    # missing, None and NaN all render as the en dash; "|" in a name is escaped
    second = lines[3].split(" | ")
    assert second[0] == "| Single \\| base"
    assert second[1] == "0.5000" and second[2] == report.MISSING and second[4] == report.MISSING
    assert second[6] == "0.9900" and second[-1] == report.MISSING + " |"


def test_markdown_table_bold_best_and_custom_columns(preds) -> None:  # noqa: ANN001
    rows = [{"method": "a", "ece": 0.1, "auroc": 0.8}, {"method": "b", "ece": 0.05, "auroc": 0.8}]
    columns = [("method", "Method", ""), ("ece", "ECE ↓"), ("auroc", "AUROC ↑", ".2f")]
    table = report.render_markdown_table(rows, columns, bold_best=True)
    assert table.splitlines()[2] == "| a | 0.1000 | **0.80** |"
    assert table.splitlines()[3] == "| b | **0.0500** | **0.80** |"
    with pytest.raises(ValueError, match="rows is empty"):
        report.render_markdown_table([])
    with pytest.raises(TypeError, match=r"rows\[0\]\['ece'\] is a list"):
        report.render_markdown_table([{"ece": [0.1]}])
    with pytest.raises(TypeError, match="columns\\[0\\] must be a \\(key, header\\)"):
        report.render_markdown_table(rows, ["ece"])


def test_write_report(preds, tmp_path) -> None:  # noqa: ANN001
    probs, labels = preds
    plots.reliability_diagram({"hydra": (probs, labels)}, tmp_path / "reliability.png")
    rows = _rows(preds)
    paths = report.write_report(
        {
            "title": "CIFAR-10 test",
            "settings": {"model": "vit-tiny", "members": 4, "seed": 0},
            "rows": rows,
            "figures": {"Reliability": "reliability.png", "Missing": "nope.png"},
            "extra": {"tensor": torch.tensor([1.0, 2.0]), "np": np.float32(0.5)},
        },
        tmp_path,
    )
    data = json.loads(Path(paths["json"]).read_text(encoding="utf-8"))
    assert data["rows"][0]["svhn"]["auroc"] == rows[0]["svhn"]["auroc"]
    assert data["rows"][1]["ece"] is None  # NaN -> null: strict JSON
    assert data["extra"] == {"tensor": [1.0, 2.0], "np": 0.5}
    md = Path(paths["markdown"]).read_text(encoding="utf-8")
    assert md.startswith("# CIFAR-10 test\n")
    assert "**model**: vit-tiny; **members**: 4; **seed**: 0." in md
    assert report.render_markdown_table(rows, bold_best=True) in md
    assert "![Reliability](reliability.png)" in md and "nope.png" not in md
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reliability.png", "report.json", "report.md"]


def test_write_report_invalid_writes_nothing(tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="report has no 'rows'"):
        report.write_report({"title": "x"}, out)
    with pytest.raises(TypeError, match=r"report\['extra'\] has type object"):
        report.write_report({"rows": [{"method": "a"}], "extra": object()}, out)
    assert not out.exists()


def test_params_of_a_tiny_model_are_not_zero() -> None:
    """``params (M)`` keeps 3 significant digits: a 12k-parameter test model is 0.0123, not 0.0 (issue 24 item 9)."""
    table = report.render_markdown_table(
        [{"method": "tiny", "params_m": 0.0123}, {"method": "base", "params_m": 109.48}]
    )
    assert table.splitlines()[2].endswith("| 0.0123 |") and table.splitlines()[3].endswith("| 109 |")
