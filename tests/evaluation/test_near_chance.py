"""A comparison with a model that learned next to nothing is marked, not read as a win (issue 49: a Single trained
at the paper's 1e-5 for 180 steps reached 57.2 % on reviews whose majority rate is 57.2 %, and the Hydra built on
it was reported +12.2 points better)."""

from __future__ import annotations

import math

import pytest

from hydra_hf.evaluation.report import near_chance_rows, render_comparisons
from hydra_hf.metrics import chance_levels, near_chance

LABELS = [0] * 572 + [1] * 428  # the test split's majority rate


def test_chance_levels_are_the_majority_rate_and_the_class_frequency_entropy():
    levels = chance_levels(LABELS)
    assert levels["majority_rate"] == pytest.approx(0.572) and levels["classes"] == 2
    assert levels["chance_nll"] == pytest.approx(-(0.572 * math.log(0.572) + 0.428 * math.log(0.428)))
    assert levels["uniform_nll"] == pytest.approx(math.log(2))
    assert chance_levels([0, 0, 1], num_classes=3)["uniform_nll"] == pytest.approx(math.log(3))


@pytest.mark.parametrize("accuracy, nll, near", [
    (0.572, 0.45, True),   # the majority rate, however confident
    (0.60, 0.675, True),   # above the majority rate by 3 points: within the margin
    (0.70, 0.675, True),   # accurate enough, but the NLL of predicting the class frequencies
    (0.806, 0.42, False),  # the README's Single
])
def test_near_chance(accuracy, nll, near):
    assert (near_chance(chance_levels(LABELS), accuracy=accuracy, nll=nll) is not None) is near


def test_a_comparison_with_a_row_near_chance_is_marked_and_its_verdicts_are_not_wins():
    rows = [{"method": "Hydra", "accuracy": 0.8025, "nll": 0.419},
            {"method": "Single", "accuracy": 0.572, "nll": 0.68}]
    near = near_chance_rows(rows, LABELS)["rows"]
    assert list(near) == ["Single"] and "majority rate 0.572" in near["Single"]
    interval = {"difference": 0.2305, "ci_low": 0.20, "ci_high": 0.26, "level": 0.95, "n_boot": 1000,
                "verdict": "better"}
    tie = {**interval, "difference": 0.001, "ci_low": -0.01, "ci_high": 0.01, "verdict": "tie"}
    text = render_comparisons({"Hydra − Single": {"accuracy": interval, "ece": tie}}, near)
    assert "> **Single** is near chance (" in text and "no win or loss of the method" in text
    assert "| accuracy | +0.2305 | [+0.2000, +0.2600] | not comparable (better than a model near chance) |" in text
    assert "| ece | +0.0010 | [-0.0100, +0.0100] | tie |" in text
    # the same comparison against a trained baseline keeps its verdict
    assert "| better |" in render_comparisons({"Hydra − Single": {"accuracy": interval}}, {})
