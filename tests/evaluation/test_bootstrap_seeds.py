"""Paired bootstrap intervals of Hydra − Single, verdicts, and mean ± std over seeds in reports."""

from __future__ import annotations

import json

import pytest
import torch

from hydra_hf import metrics
from hydra_hf.evaluation import EvaluationResult, Predictions, compare_predictions, report, write_evaluation_report
from hydra_hf.evaluation.report import aggregate_seed_reports, write_report


def _predictions(logit_scale: float, n: int, seed: int, labels=None) -> Predictions:
    g = torch.Generator().manual_seed(seed)
    y = labels if labels is not None else torch.randint(0, 3, (n,), generator=g)
    logits = torch.randn(n, 2, 3, generator=g)
    if labels is not None:
        logits[torch.arange(n), :, y] += logit_scale  # the true class gets a push
    return Predictions(logits, labels)


def _result(push_a: float, push_b: float, n: int = 400) -> EvaluationResult:
    labels = torch.randint(0, 3, (n,), generator=torch.Generator().manual_seed(0))
    ida, idb = _predictions(push_a, n, 1, labels), _predictions(push_b, n, 2, labels)
    ood = {"news": _predictions(0.0, 300, 3)}
    ood_b = {"news": _predictions(0.0, 300, 4)}
    return EvaluationResult(rows=[], id_predictions={"Hydra": ida, "Single": idb},
                            ood_predictions={"Hydra": ood, "Single": ood_b}, score="msp")


def test_interval_brackets_the_difference_and_verdicts_follow_it():
    clear = compare_predictions(_result(3.0, 0.0), "Hydra", "Single", n_boot=200)
    assert clear["accuracy"]["verdict"] == "better" and clear["nll"]["verdict"] == "better"
    for row in clear.values():
        assert row["ci_low"] <= row["difference"] <= row["ci_high"]
    # the same model against itself: every difference is 0, every verdict a tie
    r = _result(1.0, 1.0)
    r.id_predictions["Single"] = r.id_predictions["Hydra"]
    r.ood_predictions["Single"] = r.ood_predictions["Hydra"]
    same = compare_predictions(r, "Hydra", "Single", n_boot=50)
    assert all(row["verdict"] == "tie" and row["difference"] == 0 for row in same.values())
    assert set(same) == {"accuracy", "nll", "ece", "brier", "news.auroc", "news.fpr95"}


def test_paired_bootstrap_matches_a_hand_computed_percentile_interval():
    a = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    b = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0])
    got = metrics.paired_bootstrap(lambda i: float(a[i].mean() - b[i].mean()), (8,), n_boot=500, seed=7)
    g = torch.Generator().manual_seed(7)
    draws = torch.tensor(
        [float(a[i].mean() - b[i].mean()) for i in (torch.randint(0, 8, (8,), generator=g) for _ in range(500))],
        dtype=torch.float64,
    )
    low, high = torch.quantile(draws, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    assert (
        got["difference"] == pytest.approx(0.375)
        and got["ci_low"] == pytest.approx(low)
        and got["ci_high"] == pytest.approx(high)
    )
    assert (
        metrics.bootstrap_verdict({"difference": -0.1, "ci_low": -0.2, "ci_high": -0.01}, higher_is_better=False)
        == "better"
    )
    with pytest.raises(ValueError, match="n_boot"):
        metrics.paired_bootstrap(lambda i: 0.0, (8,), n_boot=3)


def test_report_shows_the_comparison_table(tmp_path):
    result = _result(3.0, 0.0)
    result.rows = [{"method": "Hydra", "accuracy": 0.9}, {"method": "Single", "accuracy": 0.5}]
    comparisons = {"Hydra − Single": compare_predictions(result, "Hydra", "Single", n_boot=50)}
    write_evaluation_report(result, tmp_path, comparisons=comparisons)
    md = (tmp_path / "report.md").read_text()
    assert "## Paired differences" in md and "| accuracy | +" in md and "better" in md
    assert (
        json.loads((tmp_path / "report.json").read_text())["comparisons"]["Hydra − Single"]["nll"]["verdict"]
        == "better"
    )


def test_seed_aggregate_means_stds_and_rendering(tmp_path):
    reports = [{"title": "t", "rows": [{"method": "Hydra", "accuracy": acc, "news": {"auroc": auc}},
                                       {"method": "Single", "accuracy": 0.5, "news": {"auroc": 0.6}}]}
               for acc, auc in ((0.8, 0.7), (0.9, 0.8), (0.7, 0.9))]
    agg = aggregate_seed_reports(reports)
    assert agg["seeds"] == 3 and agg["rows"][0]["accuracy"] == pytest.approx(0.8)
    assert agg["rows_std"][0]["accuracy"] == pytest.approx(0.1) and agg["rows_std"][1]["news"]["auroc"] == 0.0
    write_report(agg, tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "0.8000 ± 0.1000" in md and "over 3 seeds" in md
    with pytest.raises(ValueError, match="different methods"):
        aggregate_seed_reports([reports[0], {"rows": [{"method": "Other"}]}])


def test_aggregate_command_writes_mean_std_and_each_seeds_intervals(tmp_path, capsys):
    """`hydra-hf aggregate`: the mean ± std report of several seeds' reports, their intervals kept per
    seed; bad input is one line and writes nothing."""
    import json

    from hydra_hf.cli import main

    rows = lambda acc: [{"method": "Hydra", "accuracy": acc, "ece": 0.02, "o": {"auroc": acc - 0.1}},  # noqa: E731
                        {"method": "Single", "accuracy": 0.80, "ece": 0.03, "o": {"auroc": 0.7}}]
    for seed, acc in ((0, 0.82), (1, 0.84)):
        interval = {
            "difference": acc - 0.8,
            "ci_low": -0.01,
            "ci_high": 0.05,
            "level": 0.95,
            "n_boot": 100,
            "verdict": "tie",
        }
        report.write_report({"rows": rows(acc), "settings": {"seed": seed},
                             "comparisons": {"Hydra − Single": {"accuracy": interval}}}, tmp_path / f"r{seed}")
    assert (
        main(
            [
                "aggregate",
                str(tmp_path / "r0"),
                str(tmp_path / "r1" / "report.json"),
                "--output",
                str(tmp_path / "agg"),
            ]
        )
        == 0
    )
    data = json.loads((tmp_path / "agg" / "report.json").read_text())
    assert data["seeds"] == 2 and data["rows"][0]["accuracy"] == pytest.approx(0.83)
    assert data["rows_std"][0]["accuracy"] == pytest.approx(0.0141421, abs=1e-6)
    assert set(data["comparisons"]) == {"Hydra − Single (seed 0)", "Hydra − Single (seed 1)"}
    md = (tmp_path / "agg" / "report.md").read_text()
    assert "0.8300 ± 0.0141" in md and "Hydra − Single (seed 1)" in md
    summary = data["comparison_summary"]["Hydra − Single"]["accuracy"]  # differences 0.02 and 0.04, both ties
    assert summary["mean"] == pytest.approx(0.03) and summary["std"] == pytest.approx(0.0141421, abs=1e-6)
    assert (summary["seeds"], summary["better"], summary["tie"], summary["worse"]) == (2, 0, 2, 0)
    assert "| accuracy | +0.0300 ± 0.0141 | 0 | 2 | 0 |" in md
    capsys.readouterr()
    # different methods, one report, a missing folder: one line, exit 2, no output
    report.write_report({"rows": rows(0.9)[:1]}, tmp_path / "other")
    capsys.readouterr()
    bad = json.loads((tmp_path / "r1" / "report.json").read_text())
    bad["comparisons"]["Hydra − Single"]["accuracy"]["difference"] = "n/a"  # an edited report
    (tmp_path / "edited").mkdir()
    (tmp_path / "edited" / "report.json").write_text(json.dumps(bad))
    for args in (
        [str(tmp_path / "r0"), str(tmp_path / "edited")],
        [str(tmp_path / "r0"), str(tmp_path / "other")],
        [str(tmp_path / "r0")],
        [str(tmp_path / "r0"), str(tmp_path / "nope")],
    ):
        assert main(["aggregate", *args, "--output", str(tmp_path / "bad")]) == 2
        err = "\n".join(line for line in capsys.readouterr().err.splitlines() if " INFO " not in line).strip()
        assert err and "\n" not in err
        assert not (tmp_path / "bad").exists()
