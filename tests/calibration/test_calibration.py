"""Calibrated decisions: split conformal sets (finite-sample quantile, equal to torch-uncertainty's),
Learn-then-Test abstention, `hydra-hf calibrate`, and the shipped pipeline returning the stored decisions."""

from __future__ import annotations

import hashlib
import json
import math
import shutil

import pandas as pd
import pytest
import torch
from conftest import run_fresh_python

from hydra_hf import evaluation as ev
from hydra_hf.assemble import convert_checkpoint
from hydra_hf.calibration import (
    binomial_p_value,
    conformal_quantile,
    fit_calibration,
    fit_conformal,
    fit_selective,
    min_calibration_size,
    prediction_sets,
)
from hydra_hf.cli import main as cli_main
from hydra_hf.errors import HydraInputError
from hydra_hf.masks import HeadMasks
from hydra_hf.modeling.pipeline_hydra import calibrated_decisions, conformal_noise, conformal_scores

KEPT = [[[0, 1], [2, 3], [1]], [[1, 2, 3], [0], []], [[0], [0, 1, 2, 3], [0, 2]]]
WORDS = "the a movie film good bad great awful plot actor fun boring i it was is and not very".split()


def synthetic(n: int, seed: int, members: int = 3, classes: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """Member logits ``(n, M, C)`` and labels drawn from the ensemble's own probabilities (so calibration
    and test draws are exchangeable and the model is calibrated)."""
    g = torch.Generator().manual_seed(seed)
    shared = torch.randn(n, 1, classes, generator=g) * 3
    member_logits = shared + torch.randn(n, members, classes, generator=g) * torch.rand(n, 1, 1, generator=g) * 3
    probs = torch.softmax(member_logits.double(), dim=-1).mean(dim=1)
    labels = torch.multinomial(probs.float(), 1, generator=g).squeeze(1)
    return member_logits, labels


# ------------------------------------------------------------------------------------ conformal
def test_quantile_is_the_finite_sample_order_statistic():
    scores = torch.tensor([0.7, 0.1, 0.9, 0.3, 0.5, 0.2, 1.0, 0.4, 0.6, 0.8])  # n = 10
    assert conformal_quantile(scores, 0.1) == pytest.approx(1.0)  # ceil(11 * 0.9) = 10th smallest
    assert conformal_quantile(scores, 0.2) == pytest.approx(0.9)  # ceil(11 * 0.8) = 9th (a plain 0.8-quantile: 0.82)
    assert conformal_quantile(scores, 0.5) == pytest.approx(0.6)  # ceil(5.5) = 6th
    assert min_calibration_size(0.1) == 9 and min_calibration_size(0.05) == 19 and min_calibration_size(0.3) == 3
    with pytest.raises(HydraInputError, match="needs at least 9 labelled calibration examples.*got 8"):
        conformal_quantile(scores[:8], 0.1)
    conformal_quantile(scores[:9], 0.1)  # n = 9 is enough
    for alpha in (0.0, 1.0, -0.1, float("nan")):
        with pytest.raises(HydraInputError, match="outside \\(0, 1\\)"):
            conformal_quantile(scores, alpha)


def test_scores_of_every_method_on_a_known_distribution():
    probs = torch.tensor([[0.1, 0.6, 0.3]], dtype=torch.float64)
    torch.testing.assert_close(conformal_scores(probs, "lac"), torch.tensor([[0.9, 0.4, 0.7]], dtype=torch.float64))
    torch.testing.assert_close(conformal_scores(probs, "aps"), torch.tensor([[1.0, 0.6, 0.9]], dtype=torch.float64))
    raps = conformal_scores(probs, "raps", penalty=0.5, regularization_rank=1)  # ranks 3, 1, 2 -> +1.0, +0, +0.5
    torch.testing.assert_close(raps, torch.tensor([[2.0, 0.6, 1.4]], dtype=torch.float64))


@pytest.mark.parametrize("method", ["lac", "aps", "raps"])
def test_coverage_of_90_percent_sets_on_exchangeable_data(method):
    member_logits, labels = synthetic(6000, seed=1)
    probs = torch.softmax(member_logits.double(), -1).mean(1)
    fit = fit_conformal(probs[:1000], labels[:1000], alpha=0.1, method=method)
    sets = prediction_sets(probs[1000:], fit)  # (5000, C)
    coverage = float(sets[torch.arange(5000), labels[1000:]].double().mean())
    # P(covered | calibration) ~ Beta(k, n + 1 - k), k = 901, n = 1000 (sd 0.0095), then 5000 test draws (sd 0.004):
    # a 3.5-sigma band; APS / RAPS without random tie-breaking may cover more
    assert 0.86 <= coverage <= (0.94 if method == "lac" else 0.97), coverage
    assert 1.0 < float(sets.sum(1).double().mean()) < 5.0  # not the trivial sets
    bad = fit_conformal(probs[:1000], labels[:1000], alpha=0.5, method=method)
    assert float(prediction_sets(probs[1000:], bad)[torch.arange(5000), labels[1000:]].double().mean()) < 0.8


# ------------------------------------------------------------------- the reference: torch-uncertainty
class _LogOf(torch.nn.Module):
    """A 'model' whose softmax gives back the probabilities it is fed: log p."""

    def forward(self, probs):
        return probs.log()


@pytest.mark.parametrize("method", ["lac", "aps", "raps"])
def test_q_hat_and_sets_equal_torch_uncertainty(method):
    conformal = pytest.importorskip("torch_uncertainty.post_processing.conformal")  # the dev extra installs it
    member_logits, labels = synthetic(700, seed=2, classes=6)
    probs = torch.softmax(member_logits.double(), -1).mean(1)  # (700, 6)
    cal, test = probs[:500], probs[500:]
    n, alpha = 500, 0.1
    ours = fit_conformal(cal, labels[:500], alpha, method, penalty=0.05, regularization_rank=2)
    # torch-uncertainty takes the plain (linear) quantile at 1 - alpha; at level (k - 1) / (n - 1), k the
    # finite-sample rank ceil((n + 1)(1 - alpha)), it lands on the same order statistic
    k = math.ceil((n + 1) * (1 - alpha))
    level = 1 - (k - 1) / (n - 1)
    if method == "lac":
        ref = conformal.ConformalClsTHR(level, model=_LogOf(), enable_ts=False)
    elif method == "aps":
        ref = conformal.ConformalClsAPS(level, model=_LogOf(), randomized=False, enable_ts=False)
    else:
        ref = conformal.ConformalClsRAPS(level, model=_LogOf(), randomized=False, penalty=0.05, regularization_rank=2,
                                         enable_ts=False)
    ref.fit([(cal, labels[:500])])
    assert float(ref.quantile) == pytest.approx(ours.q_hat, abs=1e-12)
    sets = prediction_sets(test, ours)  # (200, 6)
    if method == "lac":
        reference_support = ref.conformal(test) > 0  # torch-uncertainty always adds the top class
        top = torch.nn.functional.one_hot(test.argmax(-1), 6).bool()
        assert torch.equal(sets | top, reference_support)
        torch.testing.assert_close(conformal_scores(test, "lac"), 1 - test)
    else:
        torch.testing.assert_close(conformal_scores(test, method, 0.05, 2), ref._calculate_all_labels(test))
        reference_support = ref.conformal(test) > 0  # an empty set gets the lowest-score class
        fallback = torch.nn.functional.one_hot(conformal_scores(test, method, 0.05, 2).argmin(-1), 6).bool()
        assert torch.equal(sets | (fallback & ~sets.any(-1, keepdim=True)), reference_support)
    assert 1.5 < float(sets.sum(1).double().mean()) < 6  # sets of several labels: the comparison tests something


@pytest.mark.parametrize("method", ["aps", "raps"])
def test_randomized_q_hat_and_sets_equal_torch_uncertainty_fed_the_same_u(method, monkeypatch):
    conformal = pytest.importorskip("torch_uncertainty.post_processing.conformal")
    member_logits, labels = synthetic(700, seed=6, classes=6)
    probs = torch.softmax(member_logits.double(), -1).mean(1)  # (700, 6)
    cal, test = probs[:500], probs[500:]
    n, alpha = 500, 0.1
    ours = fit_conformal(
        cal, labels[:500], alpha, method, penalty=0.05, regularization_rank=2, randomized=True, seed=3
    )
    assert ours.to_dict()["randomized"] is True and ours.to_dict()["seed"] == 3
    # torch-uncertainty draws its U with torch.rand: (n,) at fit time, (N, C) for the sets (one U per class);
    # fed our U, one per input, repeated over the classes
    u = {"now": conformal_noise(cal, 3)}

    def same_u(*shape, **kwargs):
        size = tuple(shape[0]) if len(shape) == 1 and not isinstance(shape[0], int) else shape
        noise = u["now"]
        return noise if len(size) == 1 else noise[:, None].expand(size).clone()

    monkeypatch.setattr(torch, "rand", same_u)
    k = math.ceil((n + 1) * (1 - alpha))
    level = 1 - (k - 1) / (n - 1)  # the finite-sample order statistic through torch.quantile (see above)
    if method == "aps":
        ref = conformal.ConformalClsAPS(level, model=_LogOf(), randomized=True, enable_ts=False)
    else:
        ref = conformal.ConformalClsRAPS(level, model=_LogOf(), randomized=True, penalty=0.05, regularization_rank=2,
                                         enable_ts=False)
    ref.fit([(cal, labels[:500])])
    assert float(ref.quantile) == pytest.approx(ours.q_hat, abs=1e-12)
    deterministic = fit_conformal(cal, labels[:500], alpha, method, penalty=0.05, regularization_rank=2)
    assert ours.q_hat < deterministic.q_hat - 0.01  # U lowers the scores: the comparison sees the randomisation
    u["now"] = conformal_noise(test, 3)
    sets = prediction_sets(test, ours)  # (200, 6)
    scores = conformal_scores(test, method, 0.05, 2, conformal_noise(test, 3))
    torch.testing.assert_close(scores, ref._calculate_all_labels(test))
    reference_support = ref.conformal(test) > 0  # an empty set gets the lowest-score class
    fallback = torch.nn.functional.one_hot(scores.argmin(-1), 6).bool()
    assert torch.equal(sets | (fallback & ~sets.any(-1, keepdim=True)), reference_support)
    assert not torch.equal(sets, prediction_sets(test, deterministic))  # the randomised sets differ
    assert 1.5 < float(sets.sum(1).double().mean()) < 6


def test_randomization_noise_is_uniform_and_a_function_of_the_input():
    probs = torch.softmax(torch.randn(4000, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64), -1)
    u = conformal_noise(probs, 0)  # (4000,)
    assert u.shape == (4000,) and float(u.min()) >= 0 and float(u.max()) < 1
    counts = torch.histc(u, bins=10, min=0, max=1)  # uniform: 400 per tenth (sd 19)
    assert float((counts - 400).abs().max()) < 80, counts
    assert torch.equal(conformal_noise(probs[17:18], 0), u[17:18])  # alone or in a batch: the same U
    assert torch.equal(conformal_noise(probs + 1e-9, 0), u)  # below the rounding: the same U
    assert not torch.equal(conformal_noise(probs, 1), u)  # the seed keys it
    # float32 outputs: the same U but where the rounding at 4 decimals flips (about 1e-3 of inputs here)
    assert float((conformal_noise(probs.float(), 0) == u).double().mean()) > 0.99


def test_randomized_aps_fixes_the_over_coverage_of_deterministic_aps_on_two_classes():
    member_logits, labels = synthetic(10000, seed=7, classes=2)
    probs = torch.softmax(member_logits.double(), -1).mean(1)
    assert float((probs.argmax(-1) != labels).double().mean()) > 0.1  # more errors than alpha: ties at score 1
    coverage = {}
    for randomized in (False, True):
        fit = fit_conformal(probs[:2000], labels[:2000], 0.1, "aps", randomized=randomized)
        sets = prediction_sets(probs[2000:], fit)  # (8000, 2)
        coverage[randomized] = float(sets[torch.arange(8000), labels[2000:]].double().mean())
    # deterministic APS: q_hat is 1 (the true label ranked second scores exactly 1): every set holds both labels
    assert coverage[False] > 0.99
    assert 0.88 <= coverage[True] <= 0.92, coverage  # n = 2000: sd 0.007 (calibration) + 0.003 (test)
    with pytest.raises(HydraInputError, match="--randomized applies to aps and raps, not lac"):
        fit_conformal(probs[:2000], labels[:2000], 0.1, "lac", randomized=True)


# ------------------------------------------------------------------------------------- selective
def test_binomial_p_value_equals_scipy():
    stats = pytest.importorskip("scipy.stats")
    for errors, answered, risk in ((0, 45, 0.05), (3, 100, 0.1), (40, 200, 0.2), (7, 7, 0.5), (12, 500, 0.05)):
        assert binomial_p_value(errors, answered, risk) == pytest.approx(
            stats.binom.cdf(errors, answered, risk), rel=1e-9
        )
    assert binomial_p_value(0, 0, 0.1) == 1.0


@pytest.mark.parametrize("score", ["msp", "entropy", "mi"])
def test_learn_then_test_error_at_or_below_target_on_held_out_data(score):
    risk = 0.2 if score != "mi" else 0.3
    for seed in range(4):
        member_logits, labels = synthetic(12000, seed=10 + seed)
        member_probs = torch.softmax(member_logits.double(), -1)
        fit = fit_selective(member_probs[:2000], labels[:2000], score, risk=risk, delta=0.1)
        record = {"method": "lac", "q_hat": 0.5, "score": score, "threshold": fit.threshold}
        answered = ~calibrated_decisions(member_logits[2000:], record)["abstain"]
        # the labels are drawn from the ensemble's probabilities: an input's chance of an error is 1 - max p,
        # so the held-out error among answered inputs is known without the noise of drawing labels
        chance_wrong = 1 - member_probs[2000:].mean(1).max(-1).values  # (10000,)
        held_out_error = float(chance_wrong[answered].mean())
        assert held_out_error <= risk, (seed, held_out_error)
        # it answers some, and not all, inputs (mi ranks by disagreement only: here it answers few)
        assert (0.01 if score == "mi" else 0.2) < float(answered.double().mean()) < 1.0
        assert fit.calibration_error <= risk and 0 < fit.answered_fraction < 1
    assert float(chance_wrong.mean()) > risk  # answering everything would miss the target: the threshold does the work


def test_selective_fit_that_cannot_certify_is_one_line():
    member_logits, labels = synthetic(300, seed=3)
    labels = (labels + 1) % 5  # mostly wrong
    with pytest.raises(HydraInputError) as info:
        fit_selective(torch.softmax(member_logits.double(), -1), labels, "msp", risk=0.05)
    assert "raise --risk" in str(info.value) and "\n" not in str(info.value)


def test_fit_calibration_with_a_fitted_temperature_names_its_part():
    member_logits, labels = synthetic(800, seed=4)
    record = fit_calibration(member_logits * 3, labels, risk=None, temperature="fit")  # overconfident logits
    assert record["temperature"] > 1.5 and record["temperature_part"]["n"] == 400 and record["n"] == 400
    plain = fit_calibration(member_logits * 3, labels, risk=None)
    assert plain["temperature"] == 1.0 and "temperature_part" not in plain


# ------------------------------------------------------------------------------- the folder, CLI
@pytest.fixture
def hydra_folder(tiny_bert_dir, tmp_path):
    masks = HeadMasks(kept_heads=KEPT, num_heads=4)
    out = tmp_path / "hydra"
    convert_checkpoint(masks, base=tiny_bert_dir, output_dir=out)
    return out


def _texts(n: int, seed: int) -> list[str]:
    """``n`` distinct short texts of the tiny vocabulary (the data readers drop duplicates)."""
    g = torch.Generator().manual_seed(seed)
    texts: dict[str, None] = {}
    while len(texts) < n:
        length = int(torch.randint(3, 9, (1,), generator=g))
        texts[" ".join(WORDS[int(i)] for i in torch.randint(len(WORDS), (length,), generator=g))] = None
    return list(texts)


def _calibration_csv(folder, path, n: int = 300, seed: int = 0):
    """Labels = the model's own top class, except for the least sure quarter of the texts (highest
    entropy), labelled with another class: errors that abstention can avoid."""
    model, tokenizer, _ = ev.load_classifier(folder)
    texts = _texts(n, seed)
    with torch.no_grad():
        probs = torch.softmax(model(**tokenizer(texts, padding=True, return_tensors="pt")).logits.double(), -1)
    entropy = -(probs * probs.log()).sum(-1)
    unsure = entropy >= entropy.quantile(0.75)
    labels = torch.where(unsure, (probs.argmax(-1) + 1) % 3, probs.argmax(-1))
    pd.DataFrame({"text": texts, "label": labels.tolist()}).to_csv(path, index=False)
    return path


def _digest(folder) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def _one_line_error(args, capsys) -> str:
    capsys.readouterr()  # what earlier steps printed
    code = cli_main(args)
    lines = [
        line
        for line in capsys.readouterr().err.splitlines()
        if line.strip() and "it/s]" not in line and "examples/s]" not in line
    ]
    # progress bars aside
    assert code == 2 and len(lines) == 1 and lines[0].startswith("hydra-hf calibrate: error: "), lines
    return lines[0]


def test_calibrate_cli_writes_a_calibrated_copy(hydra_folder, tmp_path, capsys):
    data = _calibration_csv(hydra_folder, tmp_path / "cal.csv")
    before = _digest(hydra_folder)
    out = tmp_path / "calibrated"
    assert cli_main(["calibrate", str(hydra_folder), "--data", str(data), "--output", str(out), "--alpha", "0.1",
                     "--method", "aps", "--score", "entropy", "--risk", "0.1", "--delta", "0.1"]) == 0
    assert "at least 90%" in capsys.readouterr().out
    assert _digest(hydra_folder) == before  # the input folder is never changed
    stored = json.loads((out / "config.json").read_text())["calibration"]
    assert stored["method"] == "aps" and stored["alpha"] == 0.1 and stored["n"] == 300 and stored["score"] == "entropy"
    assert stored["risk"] == 0.1 and stored["delta"] == 0.1 and stored["threshold"] > 0
    assert len(stored["data_sha256"]) == 64 and stored["hydra_hf_version"]
    # the library's own fit on the same outputs
    model, tokenizer, _ = ev.load_classifier(hydra_folder)
    frame = pd.read_csv(data)
    with torch.no_grad():
        member_logits = model(**tokenizer(list(frame.text), padding=True, return_tensors="pt")).member_logits
    again = fit_calibration(member_logits, torch.tensor(frame.label.values), method="aps", score="entropy", risk=0.1)
    assert again["q_hat"] == pytest.approx(stored["q_hat"], abs=1e-6)
    assert again["threshold"] == pytest.approx(stored["threshold"], rel=1e-6)
    others = {k: v for k, v in _digest(out).items() if k not in ("config.json", ".hydra_hf_output.json")}
    assert others == {k: v for k, v in before.items() if k not in ("config.json", ".hydra_hf_output.json")}
    assert json.loads((out / ".hydra_hf_output.json").read_text())["command"] == "calibrate"
    # a calibrated folder is calibrated again only with --overwrite
    err = _one_line_error(["calibrate", str(out), "--data", str(data), "--output", str(tmp_path / "twice")], capsys)
    assert "already calibrated" in err and "--overwrite" in err and not (tmp_path / "twice").exists()
    assert cli_main(["calibrate", str(out), "--data", str(data), "--output", str(tmp_path / "twice"), "--risk", "none",
                     "--overwrite"]) == 0
    assert json.loads((tmp_path / "twice" / "config.json").read_text())["calibration"]["threshold"] is None


def test_calibrate_cli_bad_input_is_one_line_and_writes_nothing(hydra_folder, tmp_path, capsys):
    data = _calibration_csv(hydra_folder, tmp_path / "cal.csv", n=40)
    frame = pd.read_csv(data)
    frame[["text"]].to_csv(tmp_path / "unlabelled.csv", index=False)
    frame.assign(label=frame.label + 5).to_csv(tmp_path / "other_labels.csv", index=False)
    out = tmp_path / "out"
    base = ["calibrate", str(hydra_folder), "--output", str(out)]
    assert "label" in _one_line_error([*base, "--data", str(tmp_path / "unlabelled.csv")], capsys)
    assert "outside (0, 1)" in _one_line_error([*base, "--data", str(data), "--alpha", "1.5"], capsys)
    assert "outside (0, 1)" in _one_line_error([*base, "--data", str(data), "--alpha", "0"], capsys)
    err = _one_line_error([*base, "--data", str(tmp_path / "other_labels.csv")], capsys)
    assert "label" in err
    err = _one_line_error([*base, "--data", str(data), "--alpha", "0.01", "--risk", "none"], capsys)
    assert "needs at least 99 labelled calibration examples" in err and "got 40" in err
    for alpha in ("-0.1", "1"):
        assert "alpha" in _one_line_error([*base, "--data", str(data), f"--alpha={alpha}"], capsys)
    names = {0: "good", 1: "bad", 2: "meh"}  # label names of another label set
    frame.assign(label=frame.label.map(names)).to_csv(tmp_path / "other_names.csv", index=False)
    err = _one_line_error([*base, "--data", str(tmp_path / "other_names.csv")], capsys)
    assert "label" in err and ("good" in err or "bad" in err or "meh" in err)
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]  # no temporary folder left


def test_randomized_calibration_is_stored_and_the_pipeline_draws_the_same_u_alone_or_batched(
    hydra_folder, tmp_path, capsys
):
    from transformers import pipeline

    from hydra_hf.calibration import guarantee_text

    data = _calibration_csv(hydra_folder, tmp_path / "cal.csv", n=200)
    out = tmp_path / "calibrated"
    assert cli_main(["calibrate", str(hydra_folder), "--data", str(data), "--output", str(out), "--alpha", "0.2",
                     "--method", "aps", "--randomized", "--seed", "5", "--risk", "none"]) == 0
    stored = json.loads((out / "config.json").read_text())["calibration"]
    assert stored["method"] == "aps" and stored["randomized"] is True and stored["seed"] == 5
    model, tokenizer, _ = ev.load_classifier(hydra_folder)
    frame = pd.read_csv(data)
    with torch.no_grad():
        cal_logits = model(**tokenizer(list(frame.text), padding=True, return_tensors="pt")).member_logits
    again = fit_calibration(cal_logits, torch.tensor(frame.label.values), alpha=0.2, method="aps", risk=None,
                            randomized=True, seed=5)
    assert again["q_hat"] == pytest.approx(stored["q_hat"], abs=1e-6)
    plain = fit_calibration(cal_logits, torch.tensor(frame.label.values), alpha=0.2, method="aps", risk=None)
    assert plain["q_hat"] != pytest.approx(stored["q_hat"], abs=1e-3)  # the randomisation changed the fit
    assert "randomised" in guarantee_text(stored) and "seed 5" in guarantee_text(stored)
    texts = _texts(12, seed=11)
    pipe = pipeline("hydra-text-classification", model=str(out), trust_remote_code=True)
    batched = pipe(texts, batch_size=4)
    alone = [pipe(t) for t in texts]
    assert [r["prediction_set"] for r in batched] == [r["prediction_set"] for r in alone]
    with torch.no_grad():
        member_logits = torch.cat([model(**tokenizer([t], return_tensors="pt")).member_logits for t in texts])
    # the sets of the library's own fit (hydra_hf.calibration.prediction_sets, not the pipeline's function)
    fit = fit_conformal(torch.softmax(cal_logits.double(), -1).mean(1), torch.tensor(frame.label.values), 0.2, "aps",
                        randomized=True, seed=5)
    expected = prediction_sets(torch.softmax(member_logits.double(), -1).mean(1), fit)  # (12, 3)
    names = [model.config.id2label[c] for c in range(3)]
    for i, result in enumerate(alone):
        assert set(result["prediction_set"]) == {names[c] for c in range(3) if expected[i, c]}
    assert len({len(r["prediction_set"]) for r in alone}) > 1  # sets of different sizes: not trivial
    err = _one_line_error(["calibrate", str(hydra_folder), "--data", str(data), "--output", str(tmp_path / "lac"),
                           "--randomized"], capsys)
    assert "--randomized applies to aps and raps, not lac" in err and not (tmp_path / "lac").exists()
    err = _one_line_error(["calibrate", str(hydra_folder), "--data", str(data), "--output", str(tmp_path / "lac"),
                           "--method", "aps", "--seed", "3"], capsys)
    assert "add --randomized" in err and not (tmp_path / "lac").exists()


def test_fresh_process_pipeline_returns_the_stored_decisions(hydra_folder, tmp_path):
    data = _calibration_csv(hydra_folder, tmp_path / "cal.csv", n=300)
    out = tmp_path / "calibrated"
    assert cli_main(["calibrate", str(hydra_folder), "--data", str(data), "--output", str(out), "--alpha", "0.2",
                     "--risk", "0.1", "--score", "msp"]) == 0
    stored = json.loads((out / "config.json").read_text())["calibration"]
    texts = _texts(24, seed=99)
    code = f"""
        import json
        from transformers import pipeline
        pipe = pipeline("hydra-text-classification", model={str(out)!r}, trust_remote_code=True)
        results = pipe({texts!r})
        print(json.dumps([{{k: r[k] for k in ("prediction_set", "abstain", "abstain_score")}} for r in results]))
    """
    got = json.loads(
        run_fresh_python(code, env={"HF_MODULES_CACHE": str(tmp_path / "modules")}).strip().splitlines()[-1]
    )
    model, tokenizer, _ = ev.load_classifier(out)
    labels = [model.config.id2label[c] for c in range(3)]
    with torch.no_grad():
        member_logits = torch.cat([model(**tokenizer([t], return_tensors="pt")).member_logits for t in texts])
    decided = calibrated_decisions(member_logits, stored)
    probs = torch.softmax(member_logits.double(), -1).mean(1)
    for i, result in enumerate(got):
        expected = sorted((c for c in range(3) if decided["prediction_set"][i, c]), key=lambda c: -float(probs[i, c]))
        assert result["prediction_set"] == [labels[c] for c in expected]
        assert result["abstain"] == bool(decided["abstain"][i])
        assert (
            result["abstain_score"]["threshold"] == stored["threshold"] and result["abstain_score"]["score"] == "msp"
        )
        assert result["abstain_score"]["value"] == pytest.approx(float(decided["abstain_value"][i]), abs=1e-6)
    assert {len(r["prediction_set"]) for r in got} != {1}  # the sets vary: the decisions are not trivial
    assert any(r["abstain"] for r in got) and not all(r["abstain"] for r in got)
    plain = run_fresh_python(code.replace(str(out), str(hydra_folder)).replace(
        '{k: r[k] for k in ("prediction_set", "abstain", "abstain_score")}', 'sorted(r)'),
        env={"HF_MODULES_CACHE": str(tmp_path / "modules2")})
    assert "prediction_set" not in plain  # an uncalibrated folder's results are unchanged


def test_onnx_export_of_a_calibrated_folder_gives_the_same_decisions(hydra_folder, tmp_path):
    pytest.importorskip("onnxruntime")
    from hydra_hf.onnx.export import export_onnx
    from hydra_hf.onnx.runtime import pipeline as onnx_pipeline

    data = _calibration_csv(hydra_folder, tmp_path / "cal.csv", n=300)
    out = tmp_path / "calibrated"
    assert cli_main(["calibrate", str(hydra_folder), "--data", str(data), "--output", str(out), "--alpha", "0.2",
                     "--risk", "0.1", "--method", "aps", "--randomized"]) == 0
    export_onnx(out, tmp_path / "onnx")
    stored = json.loads((out / "config.json").read_text())["calibration"]
    assert json.loads((tmp_path / "onnx" / "config.json").read_text())["calibration"] == stored
    texts = _texts(16, seed=7)
    got = onnx_pipeline(tmp_path / "onnx")(texts)
    model, tokenizer, _ = ev.load_classifier(out)
    with torch.no_grad():
        member_logits = torch.cat([model(**tokenizer([t], return_tensors="pt")).member_logits for t in texts])
    decided = calibrated_decisions(member_logits, stored)
    labels = [model.config.id2label[c] for c in range(3)]
    for i, result in enumerate(got):
        assert set(result["prediction_set"]) == {labels[c] for c in range(3) if decided["prediction_set"][i, c]}
        assert result["abstain"] == bool(decided["abstain"][i])
    assert {len(r["prediction_set"]) for r in got} != {1}


def test_model_card_states_the_guarantee_in_words(hydra_folder, tmp_path):
    from hydra_hf.hub import build_model_card

    assert "Calibrated decisions" not in build_model_card(hydra_folder, None, repo_id="org/hydra-tiny").text
    member_logits, labels = synthetic(500, seed=5, classes=3)
    record = fit_calibration(member_logits, labels, alpha=0.1, method="raps", score="entropy", risk=0.3)
    folder = tmp_path / "with-calibration"
    shutil.copytree(hydra_folder, folder)
    config = json.loads((folder / "config.json").read_text())
    config["calibration"] = record
    (folder / "config.json").write_text(json.dumps(config))
    text = " ".join(build_model_card(folder, None, repo_id="org/hydra-tiny").text.split())
    assert "Calibrated decisions" in text and "`prediction_set`" in text
    assert "at least 90% (alpha = 0.1)" in text and "n = 500 labelled examples" in text
    assert "marginal" in text and "exchangeable with the calibration data" in text
    assert "error rate among answered inputs like the calibration data is at most 0.3" in text
    config["calibration"] = {"method": "lac", "alpha": "ten", "n": 5, "q_hat": 0.3}  # no card claims it (push refuses)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(HydraInputError, match="config.calibration alpha 'ten' must be a finite number in"):
        build_model_card(folder, None, repo_id="org/hydra-tiny")


def test_evaluate_reports_the_decisions_of_a_calibrated_folder_and_its_baseline(hydra_folder, tiny_bert_dir, tmp_path):
    cal = _calibration_csv(hydra_folder, tmp_path / "cal.csv", n=300, seed=0)
    test = _calibration_csv(hydra_folder, tmp_path / "test.csv", n=200, seed=1)
    pd.DataFrame({"text": [f"zzz {i} qqq" for i in range(40)]}).to_csv(tmp_path / "ood.csv", index=False)
    out = tmp_path / "calibrated"
    assert cli_main(["calibrate", str(hydra_folder), "--data", str(cal), "--output", str(out), "--alpha", "0.2",
                     "--risk", "0.1"]) == 0
    report = tmp_path / "report"
    assert cli_main(["evaluate", "--model", str(out), "--baseline", f"Single={tiny_bert_dir}", "--val-data", str(cal),
                     "--conformal-alpha", "0.1", "--id-data", str(test), "--ood-data", f"noise={tmp_path / 'ood.csv'}",
                     "--report", str(report), "--bootstrap", "50"]) == 0
    data = json.loads((report / "report.json").read_text())
    decisions = data["decisions"]
    assert [r["source"] for r in decisions["Hydra"]] == ["stored", "val"] and [
        r["source"] for r in decisions["Single"]
    ] == ["val"]
    assert [r["alpha"] for r in decisions["Hydra"]] == [0.2, 0.1]
    stored = json.loads((out / "config.json").read_text())["calibration"]
    model, tokenizer, _ = ev.load_classifier(out)
    frame = pd.read_csv(test)
    with torch.no_grad():
        member_logits = model(**tokenizer(list(frame.text), padding=True, return_tensors="pt")).member_logits
    decided = calibrated_decisions(member_logits, stored)
    labels = torch.tensor(frame.label.values)
    row = decisions["Hydra"][0]
    assert row["coverage"] == pytest.approx(
        float(decided["prediction_set"][torch.arange(200), labels].double().mean()), abs=1e-9
    )
    assert row["set_size"] == pytest.approx(float(decided["prediction_set"].sum(1).double().mean()), abs=1e-9)
    assert row["answered"] == pytest.approx(float((~decided["abstain"]).double().mean()), abs=1e-9)
    assert row["coverage_ci"]["ci_low"] <= row["coverage"] <= row["coverage_ci"]["ci_high"]
    assert set(row["ood"]["noise"]) == {"refused", "set_gt1", "refused_or_set_gt1"}
    assert 0 < row["curve"]["coverage"][-1] <= 1 and row["aurc"] > 0
    assert decisions["Single"][0]["set_size"] != row["set_size"]  # each model's own sets
    assert (report / "risk_coverage.png").stat().st_size > 1000
    text = (report / "report.md").read_text()
    assert "Hydra (stored)" in text and "Single (val)" in text and "risk_coverage.png" in text


def test_decoder_classifier_folder_is_calibrated_and_its_pipeline_decides(tmp_path, capsys):
    from _tiny_decoders import save_llama
    from _tiny_decoders import write_masks as write_decoder_masks
    from transformers import pipeline

    base = save_llama(tmp_path / "llama", pad=True)
    assert cli_main(["convert", "--base", str(base), "--masks", str(write_decoder_masks(tmp_path / "masks.json")),
                     "--output", str(tmp_path / "hydra")]) == 0
    texts = _texts(120, seed=3)
    model, tokenizer, _ = ev.load_classifier(tmp_path / "hydra")
    with torch.no_grad():
        top = torch.cat([model(**tokenizer([t], return_tensors="pt")).logits.argmax(-1) for t in texts])
    labels = torch.where(torch.arange(120) % 4 == 0, (top + 1) % 3, top)  # a quarter wrong
    pd.DataFrame({"text": texts, "label": labels.tolist()}).to_csv(tmp_path / "cal.csv", index=False)
    out = tmp_path / "calibrated"
    assert cli_main(["calibrate", str(tmp_path / "hydra"), "--data", str(tmp_path / "cal.csv"), "--output", str(out),
                     "--alpha", "0.3", "--risk", "none", "--batch-size", "1"]) == 0
    stored = json.loads((out / "config.json").read_text())["calibration"]
    assert stored["n"] == 120 and stored["threshold"] is None
    pipe = pipeline("hydra-text-classification", model=str(out), trust_remote_code=True)
    results = pipe(texts[:20])
    with torch.no_grad():
        member_logits = torch.cat([model(**tokenizer([t], return_tensors="pt")).member_logits for t in texts[:20]])
    decided = calibrated_decisions(member_logits, stored)
    names = [model.config.id2label[c] for c in range(3)]
    for i, result in enumerate(results):
        assert set(result["prediction_set"]) == {names[c] for c in range(3) if decided["prediction_set"][i, c]}
        assert result["abstain"] is None
    assert len({len(r["prediction_set"]) for r in results}) > 1  # sets of different sizes: not trivial


def test_calibrate_refuses_an_occupied_output_before_any_work(hydra_folder, tmp_path, capsys, monkeypatch):
    data = _calibration_csv(hydra_folder, tmp_path / "cal.csv", n=40)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded before the output was checked")

    monkeypatch.setattr(ev, "load_classifier", no_loading)
    err = _one_line_error(["calibrate", str(hydra_folder), "--data", str(data), "--output", str(tmp_path / "taken"),
                           "--risk", "none"], capsys)
    assert "not empty" in err and (tmp_path / "taken" / "notes.txt").read_text() == "mine"
    err = _one_line_error(
        [
            "calibrate",
            str(hydra_folder),
            "--data",
            str(data),
            "--output",
            str(hydra_folder / "inside"),
            "--risk",
            "none",
        ],
        capsys,
    )
    assert "inside the input folder" in err


def test_causal_lm_abstention_thresholds_are_stored_and_used_by_generate_with_uncertainty(tmp_path, capsys):
    from _tiny_decoders import WORDS as LM_WORDS
    from _tiny_decoders import save_llama
    from _tiny_decoders import write_masks as write_decoder_masks
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hydra_hf.calibration.generation import text_token_scores

    base = save_llama(tmp_path / "llama", head="ForCausalLM", pad=True)
    assert cli_main(["convert", "--base", str(base), "--masks", str(write_decoder_masks(tmp_path / "masks.json")),
                     "--output", str(tmp_path / "hydra")]) == 0
    rng = torch.Generator().manual_seed(0)
    texts = list(
        dict.fromkeys(
            " ".join(LM_WORDS[int(i)] for i in torch.randint(len(LM_WORDS), (int(n),), generator=rng))
            for n in torch.randint(3, 9, (400,), generator=rng)
        )
    )
    pd.DataFrame({"text": texts[:150]}).to_csv(tmp_path / "texts.csv", index=False)
    out = tmp_path / "calibrated"
    assert cli_main(["calibrate", str(tmp_path / "hydra"), "--data", str(tmp_path / "texts.csv"), "--output", str(out),
                     "--alpha", "0.2"]) == 0
    stored = json.loads((out / "config.json").read_text())["calibration"]
    assert stored["task"] == "causal_lm" and stored["score"] == "mi" and stored["n"] == 150
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    sequence, tokens = text_token_scores(model, tokenizer, texts[:150], "mi")
    assert stored["sequence_threshold"] == pytest.approx(conformal_quantile(sequence, 0.2), rel=1e-9)
    assert stored["token_threshold"] == pytest.approx(conformal_quantile(torch.cat(tokens), 0.2), rel=1e-9)
    held_out, _ = text_token_scores(model, tokenizer, texts[150:], "mi")  # exchangeable texts: about 20 % refused
    refused = float((held_out > stored["sequence_threshold"]).double().mean())
    assert 0.05 < refused < 0.35, refused
    prompts = tokenizer(["the movie", "a plot was"], return_tensors="pt", padding=True)
    generated = model.generate_with_uncertainty(prompts["input_ids"], prompts["attention_mask"], max_new_tokens=6,
                                                do_sample=False)
    mask = generated.generated_mask.bool()
    expected_tokens = (generated.token_mutual_information > stored["token_threshold"]) & mask
    assert torch.equal(generated["token_abstain"], expected_tokens)
    mean = (generated.token_mutual_information * mask).sum(-1) / mask.sum(-1).clamp_min(1)
    assert torch.equal(generated["sequence_abstain"], mean > stored["sequence_threshold"])
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "hydra").eval()
    assert "token_abstain" not in plain.generate_with_uncertainty(prompts["input_ids"], prompts["attention_mask"],
                                                                  max_new_tokens=3, do_sample=False)
    err = _one_line_error(["calibrate", str(tmp_path / "hydra"), "--data", str(tmp_path / "texts.csv"), "--output",
                           str(tmp_path / "x"), "--score", "msp"], capsys)
    assert "does not apply to a causal LM" in err and "entropy, mutual_information" in err
    assert not (tmp_path / "x").exists()


def test_text_generation_card_states_the_abstention_thresholds(tmp_path):
    from _tiny_decoders import save_llama
    from _tiny_decoders import write_masks as write_decoder_masks

    from hydra_hf.hub import build_model_card

    base = save_llama(tmp_path / "llama", head="ForCausalLM", pad=True)
    assert cli_main(["convert", "--base", str(base), "--masks", str(write_decoder_masks(tmp_path / "masks.json")),
                     "--output", str(tmp_path / "hydra")]) == 0
    config = json.loads((tmp_path / "hydra" / "config.json").read_text())
    config["calibration"] = {"task": "causal_lm", "score": "mi", "alpha": 0.1, "n": 200, "sequence_threshold": 0.012,
                             "token_threshold": 0.03}
    (tmp_path / "hydra" / "config.json").write_text(json.dumps(config))
    text = " ".join(build_model_card(tmp_path / "hydra", None, repo_id="org/hydra-lm").text.split())
    assert "`sequence_abstain`" in text and "exceeds 0.012" in text and "n = 200 in-distribution texts" in text
    assert "at most 10% of texts like them" in text


def test_image_folder_is_calibrated_on_an_image_folder_and_its_pipeline_decides(tmp_path):
    from PIL import Image
    from test_modeling_vit import UNEQUAL, tiny_vit_config
    from transformers import ViTForImageClassification, ViTImageProcessor, pipeline

    torch.manual_seed(0)
    base = tmp_path / "vit"
    ViTForImageClassification(tiny_vit_config(id2label={0: "cat", 1: "dog", 2: "bird"})).eval().save_pretrained(base)
    ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(base)
    out = tmp_path / "hydra"
    convert_checkpoint(HeadMasks(kept_heads=UNEQUAL, num_heads=4), base=base, output_dir=out)
    g = torch.Generator().manual_seed(0)
    images = tmp_path / "images"
    for name in ("cat", "dog", "bird"):
        (images / name).mkdir(parents=True)
        for i in range(20):
            array = (torch.rand(16, 16, 3, generator=g) * 255).to(torch.uint8).numpy()
            Image.fromarray(array).save(images / name / f"{i}.png")
    assert cli_main(["calibrate", str(out), "--data", str(images), "--output", str(tmp_path / "calibrated"),
                     "--alpha", "0.3", "--risk", "none"]) == 0
    stored = json.loads((tmp_path / "calibrated" / "config.json").read_text())["calibration"]
    assert stored["n"] == 60 and len(stored["data_sha256"]) == 64
    pipe = pipeline("hydra-image-classification", model=str(tmp_path / "calibrated"), trust_remote_code=True)
    files = [str(images / "cat" / f"{i}.png") for i in range(8)]
    results = pipe(files)
    model, processor, _ = ev.load_classifier(tmp_path / "calibrated")
    with torch.no_grad():
        member_logits = model(**processor([Image.open(f) for f in files], return_tensors="pt")).member_logits
    decided = calibrated_decisions(member_logits, stored)
    for i, result in enumerate(results):
        assert set(result["prediction_set"]) == {
            model.config.id2label[c] for c in range(3) if decided["prediction_set"][i, c]
        }


def test_zero_shot_folder_is_calibrated_for_its_classes_and_template(tmp_path):
    from PIL import Image
    from test_modeling_clip import OPEN_CLIP_CFG, save_open_clip, tiny_open_clip, two_tower_masks
    from transformers import pipeline

    from hydra_hf.evaluation.zero_shot import load_zero_shot_model

    cfg = {**OPEN_CLIP_CFG, "text_cfg": {**OPEN_CLIP_CFG["text_cfg"], "vocab_size": 49408, "context_length": 16}}
    out = tmp_path / "clip-hydra"
    convert_checkpoint(
        two_tower_masks(), base=save_open_clip(tiny_open_clip(cfg=cfg), tmp_path / "oc", cfg), output_dir=out
    )
    classes = ("cat", "dog", "diagram")
    g = torch.Generator().manual_seed(0)
    images = tmp_path / "images"
    for name in classes:
        (images / name).mkdir(parents=True)
        for i in range(15):
            Image.fromarray((torch.rand(20, 24, 3, generator=g) * 255).to(torch.uint8).numpy()).save(
                images / name / f"{i}.png"
            )
    calibrated = tmp_path / "calibrated"
    assert cli_main(["calibrate", str(out), "--data", str(images), "--output", str(calibrated), "--alpha", "0.3",
                     "--risk", "none"]) == 0
    stored = json.loads((calibrated / "config.json").read_text())["calibration"]
    assert stored["class_names"] == ["cat", "diagram", "dog"] and stored["templates"] == ["This is a photo of {}."]
    files = [str(images / "dog" / f"{i}.png") for i in range(6)]
    pipe = pipeline("hydra-zero-shot-image-classification", model=str(calibrated), trust_remote_code=True)
    results = [pipe(f, candidate_labels=stored["class_names"]) for f in files]
    zero_shot = load_zero_shot_model(calibrated)
    predictor = zero_shot.predictor(stored["class_names"], stored["templates"])
    with torch.no_grad():
        member_logits = predictor.member_logits(
            {"pixel_values": torch.stack([zero_shot.transform(Image.open(f)) for f in files])}
        )
    decided = calibrated_decisions(member_logits, stored)
    for i, result in enumerate(results):
        assert set(result["prediction_set"]) == {
            stored["class_names"][c] for c in range(3) if decided["prediction_set"][i, c]
        }
    # another order: no claim
    assert "prediction_set" not in pipe(files[0], candidate_labels=["cat", "dog", "diagram"])
    assert "prediction_set" not in pipe(files[0], candidate_labels=stored["class_names"], hypothesis_template="a {}")
    (tmp_path / "ood" / "noise").mkdir(parents=True)
    for i in range(4):
        Image.fromarray((torch.rand(20, 24, 3, generator=g) * 64).to(torch.uint8).numpy()).save(
            tmp_path / "ood" / "noise" / f"{i}.png"
        )
    base = [
        "evaluate",
        "--model",
        str(calibrated),
        "--id-data",
        str(images),
        "--ood-data",
        f"noise={tmp_path / 'ood'}",
        "--bootstrap",
        "0",
    ]
    assert cli_main([*base, "--templates", "This is a photo of {}.", "--report", str(tmp_path / "same")]) == 0
    decisions = json.loads((tmp_path / "same" / "report.json").read_text())["decisions"]["Hydra"]
    assert [row["source"] for row in decisions] == ["stored"] and decisions[0]["n_calibration"] == 45
    # another template: the guarantee does not apply
    assert cli_main([*base, "--report", str(tmp_path / "other")]) == 0
    assert "decisions" not in json.loads((tmp_path / "other" / "report.json").read_text())


def test_calibration_study_calibrates_on_the_held_out_reviews_and_scores_the_test_split():
    """examples/calibration_study.py on synthetic cached logits: every row is fitted on the calibration part
    and scored on the whole test part, the Deep Ensemble is the three Singles, and a re-split partitions the
    two parts together into parts of their sizes."""
    import importlib.util

    from conftest import REPO

    spec = importlib.util.spec_from_file_location("calibration_study", REPO / "examples" / "calibration_study.py")
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    logits, labels = {}, {}
    for k, name in enumerate(("hydra", "single_0", "single_1", "single_2")):
        members = 3 if name == "hydra" else 1
        test, labels["test"] = synthetic(400, seed=20, members=members, classes=2)
        val, labels["validation"] = synthetic(100, seed=21, members=members, classes=2)
        cal, labels["calibration"] = synthetic(300, seed=22, members=members, classes=2)
        noise = torch.randn(800, 1, 2, generator=torch.Generator().manual_seed(k)) * 0.3  # the models differ
        logits[name] = {
            "test": test + noise[:400],
            "validation": val + noise[400:500],
            "calibration": cal + noise[500:],
            "ood/noise": torch.randn(50, test.shape[1], 2),
        }
    cached = {"logits": logits, "labels": labels}
    out = study.study(cached, [1], [0.2], 0.1)
    assert {r["model"] for r in out["sets"]} == {"Hydra", "Single", "Single + TS", "Deep Ensemble (M=3)"}
    assert {(r["n_calibration"], r["n_scored"]) for r in out["sets"]} == {(300, 400)}
    row = next(r for r in out["sets"] if r["model"] == "Deep Ensemble (M=3)" and r["method"] == "APS randomised")
    parts = ("test", "calibration")
    ensemble = {part: torch.cat([logits[f"single_{s}"][part] for s in range(3)], dim=1) for part in parts}
    probs = {part: torch.softmax(x.double(), -1).mean(1) for part, x in ensemble.items()}
    fit = fit_conformal(probs["calibration"], labels["calibration"], 0.1, "aps", randomized=True, seed=1)
    sets = prediction_sets(probs["test"], fit)
    assert row["coverage"] == pytest.approx(float(sets[torch.arange(400), labels["test"]].double().mean()), abs=1e-12)
    single = next(r for r in out["sets"] if r["model"] == "Single" and r["method"] == "LAC")
    assert single["coverage"] != row["coverage"] or single["set_size"] != row["set_size"]  # the Single of seed 1 alone
    assert len(out["abstention"]) == 4 and all(r["risk"] == 0.2 for r in out["abstention"])
    assert out["must"][0].startswith("90 % LAC coverage in [0.88, 0.92]")
    cal, scored = study.resplit(300, 400, 7)
    assert sorted(torch.cat([cal, scored]).tolist()) == list(range(700)) and len(cal) == 300
    assert not torch.equal(cal, study.resplit(300, 400, 8)[0])
    splits = study.coverage_over_splits(cached, 5)
    assert {(r["model"], r["splits"]) for r in splits} >= {("Hydra", 5)} and all(0 <= r["mean"] <= 1 for r in splits)


# ------------------------------------------------------------------------- a stored calibration is input
STORED = {"method": "raps", "alpha": 0.1, "q_hat": 0.8, "n": 200, "randomized": True, "seed": 3, "penalty": 0.1,
          "regularization_rank": 1, "temperature": 1.3, "score": "msp", "risk": 0.1, "delta": 0.1, "threshold": 0.3,
          "answered_fraction": 0.7, "calibration_selective_error": 0.05, "p_value": 0.01}
STORED_LM = {"task": "causal_lm", "score": "mi", "alpha": 0.2, "n": 150, "sequence_threshold": 0.3,
             "token_threshold": 0.4, "n_tokens": 900}
NAN, INF = float("nan"), float("inf")
BAD_CALIBRATIONS = {
    # name: (the stored calibration, words in the message)
    "a list": ([STORED], "config.calibration must be an object"),
    "q_hat -1": ({**STORED, "q_hat": -1}, "config.calibration q_hat -1"),
    "q_hat 5 (lac)": ({**STORED, "method": "lac", "randomized": False, "q_hat": 5}, "config.calibration q_hat 5"),
    "q_hat a string": ({**STORED, "q_hat": "0.8"}, "config.calibration q_hat '0.8'"),
    "q_hat NaN": ({**STORED, "q_hat": NAN}, "config.calibration q_hat nan"),
    "q_hat missing": ({k: v for k, v in STORED.items() if k != "q_hat"}, "config.calibration q_hat None"),
    "threshold inf": ({**STORED, "threshold": INF}, "config.calibration threshold inf"),
    "threshold negative": ({**STORED, "threshold": -0.2}, "config.calibration threshold -0.2"),
    "threshold 1.5 on msp": ({**STORED, "threshold": 1.5}, "config.calibration threshold 1.5"),
    "threshold a string": ({**STORED, "threshold": "0.3"}, "config.calibration threshold '0.3'"),
    "temperature 0": ({**STORED, "temperature": 0}, "config.calibration temperature 0"),
    "temperature negative": ({**STORED, "temperature": -2.0}, "config.calibration temperature -2.0"),
    "temperature NaN": ({**STORED, "temperature": NAN}, "config.calibration temperature nan"),
    "alpha 1": ({**STORED, "alpha": 1.0}, "config.calibration alpha 1.0"),
    "risk 2": ({**STORED, "risk": 2.0}, "config.calibration risk 2.0"),
    "delta a string": ({**STORED, "delta": "x"}, "config.calibration delta 'x'"),
    "n zero": ({**STORED, "n": 0}, "config.calibration n 0"),
    "method unknown": ({**STORED, "method": "magic"}, "config.calibration method 'magic'"),
    "score unknown": ({**STORED, "score": "energy"}, "config.calibration score 'energy'"),
    "seed a string": ({**STORED, "seed": "3"}, "config.calibration seed '3'"),
    "randomized lac": ({**STORED, "method": "lac"}, "config.calibration randomized True"),
    "penalty negative": ({**STORED, "penalty": -1.0}, "config.calibration penalty -1.0"),
    "regularization_rank a float": ({**STORED, "regularization_rank": 1.5},
                                    "config.calibration regularization_rank 1.5"),
    "answered_fraction 2": ({**STORED, "answered_fraction": 2.0}, "config.calibration answered_fraction 2.0"),
    "task unknown": ({**STORED, "task": "regression"}, "config.calibration task 'regression'"),
    "causal LM token_threshold NaN": ({**STORED_LM, "token_threshold": NAN}, "config.calibration token_threshold nan"),
    "causal LM sequence_threshold negative": ({**STORED_LM, "sequence_threshold": -1.0},
                                              "config.calibration sequence_threshold -1.0"),
    "causal LM score msp": ({**STORED_LM, "score": "msp"}, "config.calibration score 'msp'"),
}


@pytest.mark.parametrize("case", sorted(BAD_CALIBRATIONS))
def test_every_reader_of_a_stored_calibration_checks_it(case):
    """Round 5: a stored config.calibration was used unchecked: NaN / inf / negative thresholds or
    temperatures, q_hat -1 or 5, strings where numbers belong silently changed every set and abstention
    (or were tracebacks). One validator in the shipped code (check_calibration) refuses each in one line
    naming the field and the fix, and every reader calls it: the shipped pipelines (resolve_calibration),
    generate_with_uncertainty (add_generation_abstention), the card's guarantee and evaluate."""
    from types import SimpleNamespace

    from hydra_hf.calibration import guarantee_text
    from hydra_hf.modeling.configuration_hydra import check_calibration
    from hydra_hf.modeling.hydra_decoder import HydraGenerateOutput, add_generation_abstention
    from hydra_hf.modeling.pipeline_hydra import resolve_calibration

    assert check_calibration(STORED) == STORED and check_calibration(STORED_LM) == STORED_LM
    assert check_calibration(None) is None and guarantee_text(STORED) and guarantee_text(STORED_LM)
    calibration, words = BAD_CALIBRATIONS[case]
    out = HydraGenerateOutput(token_mutual_information=torch.zeros(1, 2), token_entropy=torch.zeros(1, 2),
                              generated_mask=torch.ones(1, 2))
    readers = [lambda: check_calibration(calibration), lambda: guarantee_text(calibration),
               lambda: resolve_calibration(SimpleNamespace(calibration=calibration))
               if not isinstance(calibration, dict) or calibration.get("task") != "causal_lm"
               else add_generation_abstention(out, calibration)]
    for read in readers:
        with pytest.raises(ValueError) as info:
            read()
        message = str(info.value)
        assert words in message and "calibrate" in message and "\n" not in message, message


def test_the_shipped_pipeline_refuses_a_stored_calibration_it_cannot_apply(hydra_folder):
    """q_hat -1 made every prediction set empty and the pipeline said nothing."""
    from hydra_hf.modeling.pipeline_hydra import HydraTextClassificationPipeline

    config = json.loads((hydra_folder / "config.json").read_text())
    (hydra_folder / "config.json").write_text(json.dumps({**config, "calibration": {**STORED, "q_hat": -1}}))
    model, tokenizer, _ = ev.load_classifier(hydra_folder)
    pipe = HydraTextClassificationPipeline(model=model, tokenizer=tokenizer)
    with pytest.raises(ValueError, match="config.calibration q_hat -1 "):
        pipe("a good movie")
