"""The shipped `evaluate` metric modules load offline and give exactly hydra_hf.metrics' numbers."""

from __future__ import annotations

import os

# evaluate / huggingface_hub read these when first imported: no network in these tests
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_EVALUATE_OFFLINE", "1")

from pathlib import Path

import numpy as np
import pytest
import torch

evaluate = pytest.importorskip("evaluate")

from hydra_hf import metrics as M  # noqa: E402

N, C, MEMBERS = 64, 4, 3


@pytest.fixture(scope="module")
def data() -> dict[str, np.ndarray]:
    g = torch.Generator().manual_seed(0)
    member_probs = torch.softmax(torch.randn(N, MEMBERS, C, generator=g, dtype=torch.float64) * 2, -1)
    probs = member_probs.mean(1)
    labels = torch.randint(0, C, (N,), generator=g)
    scores = torch.randint(0, 8, (N,), generator=g).double() / 8  # ties on purpose
    is_id = (torch.arange(N) % 3 != 0).long()  # 1 = ID, 0 = OOD
    return {
        "member_probs": member_probs.numpy(),
        "probs": probs.numpy(),
        "labels": labels.numpy(),
        "scores": scores.numpy(),
        "is_id": is_id.numpy(),
    }


def _load(name: str, tmp_path: Path):  # noqa: ANN202 - evaluate.EvaluationModule
    return evaluate.load(M.module_path(name), cache_dir=str(tmp_path))


def test_module_path_lists_every_shipped_module() -> None:
    root = Path(M.__file__).parent / "metric_modules"
    shipped = sorted(p.name for p in root.iterdir() if (p / f"{p.name}.py").is_file())
    assert shipped == sorted(M.METRIC_MODULE_NAMES)
    for name in M.METRIC_MODULE_NAMES:
        assert Path(M.module_path(name), f"{name}.py").is_file()
    with pytest.raises(ValueError, match=r"unknown metric module 'accuracy'; available: \['adaptive_ece'"):
        M.module_path("accuracy")


@pytest.mark.parametrize(
    ("name", "kwargs", "expected"),
    [
        ("ece", {}, lambda p, y: {"ece": M.ece(p, y)}),
        ("ece", {"n_bins": 7}, lambda p, y: {"ece": M.ece(p, y, n_bins=7)}),
        ("adaptive_ece", {"n_bins": 5}, lambda p, y: {"adaptive_ece": M.adaptive_ece(p, y, n_bins=5)}),
        ("brier_score", {}, lambda p, y: {"brier_score": M.brier_score(p, y)}),
        ("nll", {}, lambda p, y: {"nll": M.nll(p, y)}),
        ("aurc", {}, lambda p, y: {"aurc": M.aurc(p, y), "eaurc": M.eaurc(p, y)}),
    ],
)
def test_classification_modules_match_plain_functions(name, kwargs, expected, data, tmp_path) -> None:  # noqa: ANN001
    metric = _load(name, tmp_path)
    result = metric.compute(predictions=data["probs"].tolist(), references=data["labels"].tolist(), **kwargs)
    assert result == expected(data["probs"], data["labels"])  # exact, not approximate


def test_batched_compute_matches(data, tmp_path) -> None:  # noqa: ANN001
    metric = _load("ece", tmp_path)
    for start in range(0, N, 16):
        batch = slice(start, start + 16)
        metric.add_batch(predictions=data["probs"][batch].tolist(), references=data["labels"][batch].tolist())
    assert metric.compute() == {"ece": M.ece(data["probs"], data["labels"])}


def test_ood_modules_match_plain_functions(data, tmp_path) -> None:  # noqa: ANN001
    scores, is_id = data["scores"], data["is_id"]
    s_id, s_ood = scores[is_id == 1], scores[is_id == 0]
    kwargs = {"predictions": scores.tolist(), "references": is_id.tolist()}
    assert _load("ood_auroc", tmp_path).compute(**kwargs) == {"auroc": M.ood_auroc(s_id, s_ood)}
    assert _load("fpr95", tmp_path).compute(**kwargs) == {"fpr95": M.fpr_at_95_tpr(s_id, s_ood)}
    assert _load("fpr95", tmp_path).compute(**kwargs, tpr=0.8) == {"fpr95": M.fpr_at_95_tpr(s_id, s_ood, tpr=0.8)}
    assert _load("aupr", tmp_path).compute(**kwargs) == {
        "aupr_in": M.aupr_in(s_id, s_ood),
        "aupr_out": M.aupr_out(s_id, s_ood),
    }


def test_mutual_information_module(data, tmp_path) -> None:  # noqa: ANN001
    mp = data["member_probs"]
    result = _load("mutual_information", tmp_path).compute(predictions=mp.tolist())
    assert result == {
        "mutual_information": float(M.mutual_information(mp).mean()),
        "predictive_entropy": float(M.predictive_entropy(mp).mean()),
        "expected_entropy": float(M.expected_entropy(mp).mean()),
    }
    assert result["mutual_information"] > 0


def test_modules_raise_the_library_errors(tmp_path) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="one class only"):
        _load("ood_auroc", tmp_path).compute(predictions=[0.1, 0.2], references=[1, 1])
    with pytest.raises(ValueError, match=r"references must be 1 \(in-distribution\) or 0 \(OOD\), got values \[2\]"):
        _load("aupr", tmp_path).compute(predictions=[0.1, 0.2], references=[1, 2])
    with pytest.raises(ValueError, match="rows must sum to 1"):
        _load("ece", tmp_path).compute(predictions=[[0.9, 0.9]], references=[0])
    with pytest.raises(ValueError, match=r"labels must be class indices in \[0, 2\)"):
        _load("nll", tmp_path).compute(predictions=[[0.9, 0.1]], references=[3])
