"""The image ceiling testbed (examples/ceiling_image.py): its data are disjoint and as documented, its
paired intervals and leave-one-kind-out scoring compute what they say."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from hydra_hf.evaluation import Predictions

pytest.importorskip("mlxtend")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ceiling_image.py"


@pytest.fixture(scope="module")
def ci():
    spec = importlib.util.spec_from_file_location("ceiling_image", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pixels(ds) -> set[bytes]:
    return {np.asarray(img).tobytes() for img in ds["image"]}


def test_testbed_splits_are_disjoint_and_sized(ci, tmp_path):
    info = ci.build_testbed(tmp_path, n_select=20, n_score=30)
    assert info["id"] == {"train": 1700, "validation": 300, "score": 500}
    assert info["ood"] == {k: [20, 30] for k in ci.KINDS}
    splits = {name: ci._load(tmp_path, f"id_{name}") for name in ("train", "validation", "score")}
    for ds in splits.values():
        assert set(ds["label"]) <= set(range(5)) and len(set(ds["label"])) == 5
        assert np.asarray(ds[0]["image"]).shape == (28, 28, 3)
    pix = {name: _pixels(ds) for name, ds in splits.items()}
    assert (
        not pix["train"] & pix["validation"]
        and not pix["train"] & pix["score"]
        and not pix["validation"] & pix["score"]
    )
    near = ci._load(tmp_path, "ood_digits_5-9_score")
    assert not _pixels(near) & (pix["train"] | pix["score"])
    for kind in ci.KINDS:  # the selection pool never holds a scored image
        safe = kind.replace(" ", "_")
        assert not _pixels(ci._load(tmp_path, f"ood_{safe}_select")) & _pixels(ci._load(tmp_path, f"ood_{safe}_score"))
    # leave-one-kind-out: the pool for a fold holds every other kind's selection images, none of its own
    pool = ci._ood_pool(tmp_path, "letters")
    assert len(pool) == 20 * (len(ci.KINDS) - 1)
    assert not _pixels(pool) & _pixels(ci._load(tmp_path, "ood_letters_select"))
    # built once: a second call reads the record instead of rebuilding
    assert ci.build_testbed(tmp_path, n_select=99, n_score=99) == info


def _preds(msp_id: torch.Tensor, msp_ood: torch.Tensor) -> dict[str, Predictions]:
    """Two-class predictions whose MSP is the given value (logit gap log(p / (1 - p)))."""
    def logits(p):
        gap = torch.log(p / (1 - p))
        return torch.stack([gap, torch.zeros_like(gap)], dim=-1)[:, None, :]

    return {"id": Predictions(logits(msp_id), torch.zeros(len(msp_id), dtype=torch.long)),
            "noise": Predictions(logits(msp_ood), None)}


def test_paired_auroc_of_a_model_with_itself_is_zero_and_a_separating_model_wins(ci):
    g = torch.Generator().manual_seed(0)
    mixed = _preds(0.5 + 0.49 * torch.rand(200, generator=g), 0.5 + 0.49 * torch.rand(150, generator=g))
    same = ci.paired_auroc(mixed, mixed, "noise")
    assert same["difference"] == 0 and same["ci_low"] == 0 and same["ci_high"] == 0
    perfect = _preds(0.9 + 0.09 * torch.rand(200, generator=g), 0.55 + 0.3 * torch.rand(150, generator=g))
    better = ci.paired_auroc(perfect, mixed, "noise")
    assert better["difference"] == pytest.approx(1.0 - 0.5, abs=0.08)
    assert better["ci_low"] > 0.3


def test_each_kind_is_scored_against_the_id_predictions_of_its_own_fold(ci):
    kinds = ci.KINDS
    g = torch.Generator().manual_seed(1)
    base = _preds(0.6 + 0.3 * torch.rand(100, generator=g), 0.55 + 0.1 * torch.rand(80, generator=g))
    merged = {"id": base["id"], **{k: base["noise"] for k in kinds}}
    # the fold of the first kind scored ID images with an MSP of 0.51: that kind's AUROC must fall to ~0
    merged[f"id@{kinds[0]}"] = Predictions(_preds(torch.full((100,), 0.51), torch.full((1,), 0.6))["id"].member_logits,
                                           torch.zeros(100, dtype=torch.long))
    numbers = ci._numbers_per_fold(merged)
    plain = ci.numbers_of(merged)
    assert numbers["ood"][kinds[0]]["msp"] == pytest.approx(0.0, abs=1e-9)
    assert plain["ood"][kinds[0]]["msp"] > 0.8
    for kind in kinds[1:]:
        assert numbers["ood"][kind]["msp"] == plain["ood"][kind]["msp"]
