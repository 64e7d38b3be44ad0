"""Tests for hydra_hf.metrics: hand-computed examples, sklearn cross-checks, identities, errors."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, log_loss, roc_auc_score, roc_curve

from hydra_hf import metrics as M

# ------------------------------------------------------------------------------------------------
# a 4-sample, 2-class example used by several hand-computed tests
#   sample  probs          label  conf  correct
#   0       [0.90, 0.10]   0      0.90  yes
#   1       [0.70, 0.30]   1      0.70  no
#   2       [0.25, 0.75]   1      0.75  yes
#   3       [0.55, 0.45]   0      0.55  yes
# ------------------------------------------------------------------------------------------------
PROBS4 = torch.tensor([[0.90, 0.10], [0.70, 0.30], [0.25, 0.75], [0.55, 0.45]], dtype=torch.float64)
LABELS4 = torch.tensor([0, 1, 1, 0])


def _random_probs(n: int, c: int, seed: int, scale: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(n, c, generator=g, dtype=torch.float64) * scale, dim=-1)


def _reference_ece(probs: np.ndarray, labels: np.ndarray, n_bins: int) -> float:
    """Loop version of Guo et al.'s ECE (bins (lo, hi]), written independently of the library."""
    conf, pred = probs.max(1), probs.argmax(1)
    edges = np.linspace(0, 1, n_bins + 1)
    total = 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        in_bin = (conf > lo) & (conf <= hi)
        if in_bin.any():
            total += in_bin.mean() * abs((pred[in_bin] == labels[in_bin]).mean() - conf[in_bin].mean())
    return total


# ------------------------------------------------------------------------------------------------
# hand-computed values
# ------------------------------------------------------------------------------------------------


def test_accuracy_brier_nll_by_hand() -> None:
    assert M.accuracy(PROBS4, LABELS4) == pytest.approx(0.75)
    # per-sample Brier: 0.01+0.01, 0.49+0.49, 0.0625+0.0625, 0.2025+0.2025 -> mean 1.53 / 4
    assert M.brier_score(PROBS4, LABELS4) == pytest.approx(1.53 / 4, abs=1e-12)
    expected_nll = -(math.log(0.9) + math.log(0.3) + math.log(0.75) + math.log(0.55)) / 4
    assert M.nll(PROBS4, LABELS4) == pytest.approx(expected_nll, abs=1e-12)


def test_nll_matches_sklearn_and_clamps() -> None:
    probs = _random_probs(200, 5, seed=0)
    labels = torch.randint(0, 5, (200,), generator=torch.Generator().manual_seed(1))
    assert M.nll(probs, labels) == pytest.approx(log_loss(labels.numpy(), probs.numpy(), labels=range(5)), abs=1e-10)
    # a certain wrong prediction costs -log(eps), not inf
    assert M.nll(torch.tensor([[1.0, 0.0]]), torch.tensor([1]), eps=1e-6) == pytest.approx(-math.log(1e-6))


def test_ece_by_hand() -> None:
    # 5 bins (0,.2] (.2,.4] (.4,.6] (.6,.8] (.8,1]:
    #   (.8,1]: {0.90 ok}          acc 1.0  conf 0.900  gap 0.100  weight 1/4
    #   (.6,.8]: {0.70 no, 0.75 ok} acc 0.5  conf 0.725  gap 0.225  weight 2/4
    #   (.4,.6]: {0.55 ok}          acc 1.0  conf 0.550  gap 0.450  weight 1/4
    # ECE = 0.025 + 0.1125 + 0.1125 = 0.25
    assert M.ece(PROBS4, LABELS4, n_bins=5) == pytest.approx(0.25, abs=1e-12)


def test_adaptive_ece_by_hand() -> None:
    # 2 equal-mass bins over sorted confidences 0.55(ok) 0.70(no) | 0.75(ok) 0.90(ok):
    #   bin 1: acc 0.5, conf 0.625, gap 0.125; bin 2: acc 1.0, conf 0.825, gap 0.175
    # aECE = 0.5 * 0.125 + 0.5 * 0.175 = 0.15
    assert M.adaptive_ece(PROBS4, LABELS4, n_bins=2) == pytest.approx(0.15, abs=1e-12)
    # one bin: |acc - mean conf| = |0.75 - 0.725| = 0.025
    assert M.adaptive_ece(PROBS4, LABELS4, n_bins=1) == pytest.approx(0.025, abs=1e-12)


def test_ece_matches_loop_reference() -> None:
    probs = _random_probs(1000, 10, seed=3)
    labels = torch.randint(0, 10, (1000,), generator=torch.Generator().manual_seed(4))
    for n_bins in (1, 10, 15):
        expected = _reference_ece(probs.numpy(), labels.numpy(), n_bins)
        assert M.ece(probs, labels, n_bins) == pytest.approx(expected, abs=1e-12)


def test_perfect_calibration_gives_zero_ece() -> None:
    # confidence 0.9 on 10 samples (9 right), 0.6 on 5 (3 right), 0.75 on 4 (3 right):
    # every bin's accuracy equals its confidence, and overall accuracy 15/19 = mean confidence.
    rows, labels = [], []
    for conf, n, n_right in ((0.9, 10, 9), (0.6, 5, 3), (0.75, 4, 3)):
        for i in range(n):
            rows.append([conf, 1 - conf])
            labels.append(0 if i < n_right else 1)
    probs, labels_t = torch.tensor(rows, dtype=torch.float64), torch.tensor(labels)
    assert M.ece(probs, labels_t) == pytest.approx(0.0, abs=1e-12)
    assert M.adaptive_ece(probs, labels_t, n_bins=1) == pytest.approx(0.0, abs=1e-12)
    # the same confidences with every label flipped is badly calibrated
    assert M.ece(probs, 1 - labels_t) > 0.3


def test_calibration_bins_contents() -> None:
    bins = M.calibration_bins(PROBS4, LABELS4, n_bins=5)
    assert bins["count"].tolist() == [0, 0, 1, 2, 1]
    assert torch.isnan(bins["accuracy"][:2]).all() and torch.isnan(bins["confidence"][:2]).all()
    torch.testing.assert_close(bins["accuracy"][2:], torch.tensor([1.0, 0.5, 1.0], dtype=torch.float64))
    torch.testing.assert_close(bins["confidence"][2:], torch.tensor([0.55, 0.725, 0.9], dtype=torch.float64))
    torch.testing.assert_close(bins["upper"], torch.tensor([0.2, 0.4, 0.6, 0.8, 1.0], dtype=torch.float64))
    q = M.calibration_bins(PROBS4, LABELS4, n_bins=3, strategy="quantile")  # sizes 2, 1, 1
    assert q["count"].tolist() == [2, 1, 1]
    torch.testing.assert_close(q["lower"], torch.tensor([0.55, 0.75, 0.9], dtype=torch.float64))
    # more bins than samples: the extra bins are empty, and the ECE ignores them
    assert M.calibration_bins(PROBS4, LABELS4, n_bins=6, strategy="quantile")["count"].tolist() == [1, 1, 1, 1, 0, 0]


def test_aurc_by_hand() -> None:
    # ranked by confidence: 0.90 ok, 0.75 ok, 0.70 wrong, 0.55 ok
    # risk at k = 1..4: 0, 0, 1/3, 1/4 -> AURC = (1/3 + 1/4) / 4 = 7/48
    # oracle (error last): 0, 0, 0, 1/4 -> 1/16 = 3/48; e-AURC = 4/48
    assert M.aurc(PROBS4, LABELS4) == pytest.approx(7 / 48, abs=1e-12)
    assert M.eaurc(PROBS4, LABELS4) == pytest.approx(4 / 48, abs=1e-12)
    # a custom confidence that ranks the error last is optimal
    assert M.eaurc(PROBS4, LABELS4, confidence=torch.tensor([4.0, 1.0, 3.0, 2.0])) == pytest.approx(0.0, abs=1e-12)


def test_aurc_ties_are_order_independent() -> None:
    # two samples with equal confidence, one wrong: each ranked slot carries 0.5 expected error,
    # risk(1) = 0.5, risk(2) = 0.5 -> AURC 0.5 whichever comes first
    probs = torch.tensor([[0.8, 0.2], [0.8, 0.2]], dtype=torch.float64)
    assert M.aurc(probs, torch.tensor([0, 1])) == pytest.approx(0.5)
    assert M.aurc(probs, torch.tensor([1, 0])) == pytest.approx(0.5)
    probs = _random_probs(300, 3, seed=5).round(decimals=1)
    probs = probs / probs.sum(1, keepdim=True)
    labels = torch.randint(0, 3, (300,), generator=torch.Generator().manual_seed(6))
    perm = torch.randperm(300, generator=torch.Generator().manual_seed(7))
    assert M.aurc(probs[perm], labels[perm]) == pytest.approx(M.aurc(probs, labels), abs=1e-12)


# ------------------------------------------------------------------------------------------------
# OOD detection
# ------------------------------------------------------------------------------------------------


def test_ood_metrics_by_hand() -> None:
    # pairs (id, ood): (.9,.6)=1 (.9,.3)=1 (.6,.6)=0.5 (.6,.3)=1 -> AUROC 3.5/4
    assert M.ood_auroc(np.array([0.9, 0.6]), np.array([0.6, 0.3])) == pytest.approx(0.875)
    # 4 ID scores: keeping >= 95 % means keeping all 4 -> threshold 0.6; OOD >= 0.6: {0.65, 0.95}
    assert M.fpr_at_95_tpr(np.array([0.9, 0.8, 0.7, 0.6]), np.array([0.65, 0.5, 0.95])) == pytest.approx(2 / 3)
    # 20 ID scores 1..20: 19 of them (95 %) are >= 2; OOD >= 2: {2, 3, 10} of 5
    assert M.fpr_at_95_tpr(np.arange(1.0, 21.0), np.array([0.0, 1.5, 2.0, 3.0, 10.0])) == pytest.approx(0.6)
    # perfect separation
    report = M.ood_report(torch.tensor([5.0, 6.0]), torch.tensor([1.0, 2.0, 3.0]))
    assert report == {"auroc": 1.0, "fpr95": 0.0, "aupr_in": 1.0, "aupr_out": 1.0}


@pytest.mark.parametrize("seed", range(6))
def test_ood_metrics_match_sklearn_with_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(15):
        n_id, n_ood = rng.integers(1, 60, size=2)
        # few distinct values -> many ties, within and across the two sides
        s_id = rng.integers(0, 6, size=n_id).astype(np.float64)
        s_ood = rng.integers(0, 6, size=n_ood).astype(np.float64) - rng.integers(0, 2)
        y = np.r_[np.ones(n_id), np.zeros(n_ood)]
        s = np.r_[s_id, s_ood]
        assert M.ood_auroc(s_id, s_ood) == pytest.approx(roc_auc_score(y, s), abs=1e-12)
        assert M.aupr_in(s_id, s_ood) == pytest.approx(average_precision_score(y, s), abs=1e-12)
        assert M.aupr_out(s_id, s_ood) == pytest.approx(average_precision_score(1 - y, -s), abs=1e-12)
        fpr, tpr, _ = roc_curve(y, s, drop_intermediate=False)
        assert M.fpr_at_95_tpr(s_id, s_ood) == pytest.approx(fpr[np.argmax(tpr >= 0.95)], abs=1e-12)


def test_ood_metrics_match_sklearn_continuous() -> None:
    g = torch.Generator().manual_seed(0)
    s_id, s_ood = torch.randn(500, generator=g) + 1, torch.randn(300, generator=g)
    y = np.r_[np.ones(500), np.zeros(300)]
    s = np.r_[s_id.numpy(), s_ood.numpy()]
    assert M.ood_auroc(s_id, s_ood) == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    assert M.aupr_in(s_id, s_ood) == pytest.approx(average_precision_score(y, s), abs=1e-12)
    assert M.aupr_out(s_id, s_ood) == pytest.approx(average_precision_score(1 - y, -s), abs=1e-12)


def test_ood_one_class_only_raises() -> None:
    for fn in (M.ood_auroc, M.fpr_at_95_tpr, M.aupr_in, M.aupr_out, M.ood_report):
        with pytest.raises(ValueError, match="scores_ood is empty.*one class only"):
            fn(np.array([0.1, 0.2]), np.array([]))
        with pytest.raises(ValueError, match="scores_id is empty.*one class only"):
            fn(torch.tensor([]), torch.tensor([0.3]))


# ------------------------------------------------------------------------------------------------
# ensemble uncertainty and OOD scores
# ------------------------------------------------------------------------------------------------


def test_mutual_information_zero_when_members_agree() -> None:
    probs = _random_probs(50, 4, seed=8)
    member_probs = probs[:, None, :].expand(50, 3, 4)  # (N, M, C), identical members
    zeros = torch.zeros(50, dtype=torch.float64)
    torch.testing.assert_close(M.mutual_information(member_probs), zeros, atol=1e-12, rtol=0)
    torch.testing.assert_close(M.predictive_entropy(member_probs), M.expected_entropy(member_probs))
    assert float(M.disagreement(member_probs).max()) == 0.0


def test_mutual_information_positive_when_members_disagree() -> None:
    member_probs = _random_probs(40 * 4, 5, seed=9, scale=3.0).reshape(40, 4, 5)  # (N, M, C)
    mi = M.mutual_information(member_probs)
    assert mi.shape == (40,) and bool((mi > 0).all())
    # predictive = expected + MI, and MI <= log M
    torch.testing.assert_close(M.predictive_entropy(member_probs), M.expected_entropy(member_probs) + mi)
    assert float(mi.max()) <= math.log(4) + 1e-12
    torch.testing.assert_close(M.negative_mutual_information(member_probs), -mi)


def test_disagreement_by_hand() -> None:
    # sample 0: two one-hot members on different classes -> mean [.5, .5, 0], ensemble argmax 0
    #   MI = log 2 (max for 2 members); member 1 differs from the ensemble -> 1/2; the pair differs -> 1
    # sample 1: members agree on class 2 -> 0, 0, 0
    member_probs = torch.tensor(
        [[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], [[0.1, 0.1, 0.8], [0.0, 0.3, 0.7]]], dtype=torch.float64
    )
    assert M.mutual_information(member_probs)[0].item() == pytest.approx(math.log(2))
    torch.testing.assert_close(M.disagreement(member_probs), torch.tensor([0.5, 0.0], dtype=torch.float64))
    torch.testing.assert_close(M.pairwise_disagreement(member_probs), torch.tensor([1.0, 0.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="at least 2 members, got M=1"):
        M.pairwise_disagreement(member_probs[:, :1])


def test_ood_scores() -> None:
    probs = torch.tensor([[0.5, 0.5], [0.9, 0.1]])
    torch.testing.assert_close(M.msp(probs), torch.tensor([0.5, 0.9]))
    torch.testing.assert_close(M.negative_entropy(probs)[0], torch.tensor(-math.log(2)))
    assert M.msp(probs).dtype == torch.float32 and M.msp(probs.double()).dtype == torch.float64
    logits = torch.tensor([[0.0, 0.0], [10.0, 0.0]])
    torch.testing.assert_close(M.energy_score(logits), torch.logsumexp(logits, 1))
    assert M.energy_score(logits)[0].item() == pytest.approx(math.log(2), rel=1e-6)
    assert M.energy_score(logits, temperature=2.0)[0].item() == pytest.approx(2 * math.log(2), rel=1e-6)
    member_probs = torch.stack([probs, probs.flip(1)], dim=1)  # (N=2, M=2, C=2)
    torch.testing.assert_close(M.ood_score("msp", probs=probs), M.msp(probs))
    torch.testing.assert_close(M.ood_score("msp", member_probs=member_probs), M.msp(member_probs.mean(1)))
    torch.testing.assert_close(M.ood_score("entropy", probs=probs), M.negative_entropy(probs))
    torch.testing.assert_close(
        M.ood_score("mutual_information", member_probs=member_probs), -M.mutual_information(member_probs)
    )
    torch.testing.assert_close(M.ood_score("energy", logits=logits, temperature=2.0), M.energy_score(logits, 2.0))
    with pytest.raises(ValueError, match=r"unknown OOD score 'odin'.*'msp', 'entropy'"):
        M.ood_score("odin", probs=probs)
    with pytest.raises(ValueError, match="needs member_probs"):
        M.ood_score("mutual_information", probs=probs)
    with pytest.raises(ValueError, match="needs logits"):
        M.ood_score("energy", probs=probs)


# ------------------------------------------------------------------------------------------------
# reports
# ------------------------------------------------------------------------------------------------


def test_calibration_report() -> None:
    member_probs = _random_probs(60 * 3, 4, seed=10).reshape(60, 3, 4)
    probs = member_probs.mean(1)
    labels = torch.randint(0, 4, (60,), generator=torch.Generator().manual_seed(11))
    report = M.calibration_report(probs, labels, member_probs=member_probs)
    assert set(report) == {
        "accuracy", "brier", "nll", "ece", "aece", "aurc", "eaurc", "predictive_entropy",
        "expected_entropy", "mutual_information", "disagreement", "pairwise_disagreement",
    }
    assert all(type(v) is float for v in report.values())
    assert report["ece"] == M.ece(probs, labels) and report["aurc"] == M.aurc(probs, labels)
    assert report["predictive_entropy"] == pytest.approx(report["expected_entropy"] + report["mutual_information"])
    without_members = M.calibration_report(probs.numpy(), labels.numpy())
    assert set(without_members) == {"accuracy", "brier", "nll", "ece", "aece", "aurc", "eaurc"}
    with pytest.raises(ValueError, match=r"member_probs has shape \(60, 3, 4\) but probs has shape \(59, 4\)"):
        M.calibration_report(probs[:59], labels[:59], member_probs=member_probs)


def test_numpy_and_torch_and_float32_agree() -> None:
    probs = _random_probs(100, 3, seed=12)
    labels = torch.randint(0, 3, (100,), generator=torch.Generator().manual_seed(13))
    assert M.ece(probs.numpy(), labels.numpy()) == M.ece(probs, labels)
    assert M.brier_score(probs.float(), labels) == pytest.approx(M.brier_score(probs, labels), abs=1e-6)


# ------------------------------------------------------------------------------------------------
# validation
# ------------------------------------------------------------------------------------------------


def test_nan_and_inf_raise_naming_the_argument() -> None:
    bad = PROBS4.clone()
    bad[1, 0] = float("nan")
    with pytest.raises(ValueError, match="probs contains 1 NaN/inf"):
        M.ece(bad, LABELS4)
    with pytest.raises(ValueError, match="scores_ood contains 1 NaN/inf"):
        M.ood_auroc(np.array([0.1]), np.array([0.2, np.inf]))
    with pytest.raises(ValueError, match="logits contains"):
        M.energy_score(torch.tensor([[0.0, float("-inf")]]))


def test_wrong_shapes_raise() -> None:
    with pytest.raises(ValueError, match=r"probs must have shape \(N, C\), got shape \(4,\)"):
        M.accuracy(PROBS4[:, 0], LABELS4)
    with pytest.raises(ValueError, match=r"member_probs must have shape \(N, M, C\), got shape \(4, 2\)"):
        M.mutual_information(PROBS4)
    with pytest.raises(ValueError, match="labels has 3 entries but the predictions have N=4 rows"):
        M.nll(PROBS4, LABELS4[:3])
    with pytest.raises(ValueError, match=r"labels must have shape \(N,\), got shape \(4, 1\)"):
        M.nll(PROBS4, LABELS4[:, None])
    with pytest.raises(ValueError, match=r"scores_id must have shape \(N,\)"):
        M.ood_auroc(np.ones((2, 2)), np.ones(3))
    with pytest.raises(ValueError, match="confidence has 3 entries but probs has N=4"):
        M.aurc(PROBS4, LABELS4, confidence=torch.ones(3))


def test_not_probabilities_raise() -> None:
    with pytest.raises(ValueError, match="rows must sum to 1.*sums to 1.1.*apply softmax"):
        M.brier_score(torch.tensor([[0.6, 0.5], [0.5, 0.5]]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"probabilities in \[0, 1\].*apply softmax"):
        M.ece(torch.tensor([[2.0, -1.0]]), torch.tensor([0]))


def test_wrong_types_raise_type_error() -> None:
    with pytest.raises(TypeError, match="probs must be a torch.Tensor or numpy.ndarray, got list"):
        M.accuracy([[0.5, 0.5]], torch.tensor([0]))
    with pytest.raises(TypeError, match="labels must be an integer.*float"):
        M.accuracy(PROBS4, LABELS4.double())
    with pytest.raises(TypeError, match="scores_id must be a torch.Tensor"):
        M.ood_auroc((0.1, 0.2), np.array([0.3]))
    with pytest.raises(TypeError, match="n_bins must be an int"):
        M.ece(PROBS4, LABELS4, n_bins=2.5)  # type: ignore[arg-type]


def test_empty_and_out_of_range_raise() -> None:
    with pytest.raises(ValueError, match="probs is empty"):
        M.accuracy(torch.empty(0, 3), torch.empty(0, dtype=torch.long))
    with pytest.raises(ValueError, match=r"labels must be class indices in \[0, 2\).*got values in \[0, 2\]"):
        M.accuracy(PROBS4, torch.tensor([0, 1, 2, 0]))
    with pytest.raises(ValueError, match=r"got values in \[-1, 1\]"):
        M.accuracy(PROBS4, torch.tensor([0, 1, -1, 0]))
    with pytest.raises(ValueError, match="n_bins must be >= 1, got 0"):
        M.ece(PROBS4, LABELS4, n_bins=0)
    with pytest.raises(ValueError, match="strategy must be 'uniform' or 'quantile', got 'kmeans'"):
        M.calibration_bins(PROBS4, LABELS4, strategy="kmeans")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"tpr must be in \(0, 1\], got 0"):
        M.fpr_at_95_tpr(np.ones(2), np.ones(2), tpr=0)


def test_importing_metrics_does_not_import_matplotlib() -> None:
    code = "import sys, hydra_hf.metrics; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_ood_scores_are_a_registry_the_cli_and_study_read():
    """Issue 27 item 4: an OOD score is an object registered by name; adding one is a function and a
    registration, and ood_score, Predictions, the study and `evaluate --score` pick it up."""
    import argparse

    from hydra_hf import metrics
    from hydra_hf.cli import evaluate as cli_evaluate
    from hydra_hf.evaluation import Predictions
    from hydra_hf.recipes import study

    assert (
        list(metrics.OOD_SCORES) == list(metrics.OOD_SCORE_NAMES) == ["msp", "entropy", "mutual_information", "energy"]
    )
    assert study.SINGLE_SCORES == ("msp", "entropy", "energy") and set(study.STUDY_SCORES) == set(metrics.OOD_SCORES)
    member_logits = torch.tensor([[[2.0, 0.0], [1.0, 0.5]], [[0.1, 0.0], [0.0, 3.0]]])  # (N=2, M=2, C=2)
    preds = Predictions(member_logits, None)
    torch.testing.assert_close(preds.ood_scores("energy"), torch.logsumexp(member_logits.double().mean(1), -1))
    score = metrics.OODScore(
        "max_logit", "logits", lambda logits, t: torch.as_tensor(logits).amax(-1), True, "largest logit"
    )
    try:
        metrics.register_ood_score(score)
        torch.testing.assert_close(preds.ood_scores("max_logit"), member_logits.double().mean(1).amax(-1))
        parser = argparse.ArgumentParser()
        cli_evaluate.add_parser(parser.add_subparsers())
        assert parser.parse_args(["evaluate", "--model", "m", "--id-data", "i", "--ood-data", "o", "--report", "r",
                                  "--score", "max_logit"]).score == "max_logit"
        with pytest.raises(ValueError, match="already registered"):
            metrics.register_ood_score(score)
    finally:
        metrics.OOD_SCORES.pop("max_logit", None)
    with pytest.raises(ValueError, match="reads must be"):
        metrics.register_ood_score(metrics.OODScore("x", "images", lambda x, t: x, True, ""))


def test_one_score_registry_by_level() -> None:
    """Issue 37: the classifiers' scores, a causal LM's token and sequence scores: one registry, a level each;
    a sequence score is the mean of the token score of its name."""
    from hydra_hf.metrics import causal_lm

    assert list(M.SCORES) == ["example", "sequence", "token"] and M.SCORES["example"] is M.OOD_SCORES
    assert list(M.SEQUENCE_SCORES) == list(M.TOKEN_SCORES) == ["msp", "entropy", "mutual_information", "likelihood"]
    assert {s.level for s in M.SEQUENCE_SCORES.values()} == {"sequence"} and M.level_scores("token") is M.TOKEN_SCORES
    g = torch.Generator().manual_seed(0)
    member_logits = torch.randn(3, 2, 5, 7, generator=g) * 3  # (B, M, T, V)
    targets = torch.randint(0, 7, (3, 5), generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    tokens = causal_lm.next_token_uncertainty(member_logits, targets, mask)
    per_token = causal_lm.token_scores(tokens, num_members=2)
    torch.testing.assert_close(per_token["likelihood"], -tokens["nll"])
    sequences = causal_lm.sequence_scores(tokens, num_members=2)
    for name, (quantity, sign) in {
        "msp": ("msp", 1),
        "entropy": ("predictive_entropy", -1),
        "mutual_information": ("mutual_information", -1),
        "likelihood": ("nll", -1),
    }.items():
        expected = torch.stack([sign * tokens[quantity][b][mask[b]].double().mean() for b in range(3)])
        torch.testing.assert_close(sequences[name], expected)
    assert "mutual_information" not in causal_lm.sequence_scores(tokens, num_members=1)
    with pytest.raises(ValueError, match="a sequence score reads one of"):
        M.register_ood_score(M.OODScore("x", "probs", None, True, "", level="sequence"))
    with pytest.raises(ValueError, match="level must be one of"):
        M.register_ood_score(M.OODScore("x", "probs", None, True, "", level="batch"))


def test_paired_t_over_seeds_is_scipys_paired_test_with_the_degenerate_cases_decided():
    from scipy import stats

    from hydra_hf.metrics import paired_t_over_seeds

    a, b = [0.71, 0.69, 0.74], [0.70, 0.64, 0.70]
    test = paired_t_over_seeds([x - y for x, y in zip(a, b)])
    assert test["p"] == pytest.approx(stats.ttest_rel(a, b).pvalue)
    assert test["decided"] is (test["p"] < 0.05)
    assert paired_t_over_seeds([0.02]) == {"p": 1.0, "decided": False}  # one seed decides nothing
    assert paired_t_over_seeds([0.01, 0.01, 0.01]) == {"p": 0.0, "decided": True}
    assert paired_t_over_seeds([0.0, 0.0]) == {"p": 1.0, "decided": False}
    assert paired_t_over_seeds([0.02, 0.024, 0.018], level=0.001)["decided"] is False
