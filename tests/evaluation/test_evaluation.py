"""Evaluation: baselines' predictors, temperature scaling, `hydra-hf evaluate` end to end on a tiny model."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import BertForSequenceClassification

from hydra_hf import evaluation as ev
from hydra_hf.assemble import convert_checkpoint
from hydra_hf.cli import main as cli_main
from hydra_hf.masks import HeadMasks

KEPT = [[[0, 1], [2, 3], [1]], [[1, 2, 3], [0], []], [[0], [0, 1, 2, 3], [0, 2]]]
WORDS = "the a movie film good bad great awful plot actor fun boring i it was is and not very".split()


def _texts(n: int, seed: int) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    return [
        " ".join(
            WORDS[i] for i in torch.randint(0, len(WORDS), (int(torch.randint(3, 9, (1,), generator=g)),), generator=g)
        )
        for _ in range(n)
    ]


@pytest.fixture
def tiny_data(tmp_path):
    import pandas as pd

    texts = _texts(40, 0)
    pd.DataFrame({"text": texts, "label": [i % 3 for i in range(40)]}).to_csv(tmp_path / "id.csv", index=False)
    ood = ["zzz qqq xxx" * (1 + i % 3) for i in range(20)]
    pd.DataFrame({"text": ood}).to_csv(tmp_path / "ood.csv", index=False)
    return tmp_path / "id.csv", tmp_path / "ood.csv"


def test_temperature_scaling_recovers_the_temperature():
    """Labels drawn from softmax(z); the model reports 3 z: the fitted T must be close to 3."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(4000, 4, generator=g) * 2
    labels = torch.multinomial(torch.softmax(z, -1), 1, generator=g).squeeze(1)
    t = ev.fit_temperature(ev.Predictions(member_logits=(3 * z).unsqueeze(1), labels=labels))
    assert abs(t - 3) < 0.25, t
    scaled = ev.Predictions(member_logits=(3 * z / t).unsqueeze(1), labels=labels)
    from hydra_hf import metrics

    before = metrics.nll(torch.softmax(3 * z, -1), labels)
    assert metrics.nll(scaled.probs, labels) < before


def test_mc_dropout_samples_differ_and_are_reproducible(tiny_bert_dir):
    model = BertForSequenceClassification.from_pretrained(tiny_bert_dir, hidden_dropout_prob=0.3)
    batch = {"input_ids": torch.randint(5, 99, (2, 7))}
    a = ev.MCDropoutPredictor(model, samples=4, seed=1).member_logits(batch)
    b = ev.MCDropoutPredictor(model, samples=4, seed=1).member_logits(batch)
    assert a.shape == (2, 4, 3)
    torch.testing.assert_close(a, b)
    assert (a[:, 0] - a[:, 1]).abs().max() > 1e-4
    assert not any(m.training for m in model.modules())  # dropout switched off again
    with torch.no_grad():
        plain = ev.ModelPredictor(model).member_logits(batch)
    assert plain.shape == (2, 1, 3)


def test_deep_ensemble_heads_are_distinct_and_hydra_predictor_uses_members(tiny_bert_dir, tiny_data):
    from transformers import AutoTokenizer

    from hydra_hf.data import resolve_dataset

    model = BertForSequenceClassification.from_pretrained(tiny_bert_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_bert_dir)
    loader = ev.make_loader(resolve_dataset(str(tiny_data[0])), tok, "text", batch_size=8)
    heads = ev.train_ensemble_heads(model, loader, num_heads=3, epochs=2)
    pred = ev.predict(ev.HeadsEnsemblePredictor(model, heads), loader)
    assert pred.member_logits.shape == (40, 3, 3)
    assert (pred.member_logits[:, 0] - pred.member_logits[:, 1]).abs().max() > 1e-4
    hydra = convert_checkpoint(HeadMasks(kept_heads=KEPT, num_heads=4), base=tiny_bert_dir)
    hp = ev.predict(ev.ModelPredictor(hydra), loader)
    assert hp.member_logits.shape == (40, 3, 3)
    # the ensemble's probabilities are the mean of the members' softmaxes
    torch.testing.assert_close(hp.probs, torch.softmax(hp.member_logits.double(), -1).mean(1))


def test_evaluate_cli_writes_complete_report(tiny_bert_dir, tiny_data, tmp_path, capsys):
    id_csv, ood_csv = tiny_data
    hydra_dir = tmp_path / "hydra"
    convert_checkpoint(HeadMasks(kept_heads=KEPT, num_heads=4), base=tiny_bert_dir, output_dir=hydra_dir)
    report = tmp_path / "report"
    code = cli_main([
        "evaluate", "--model", str(hydra_dir), "--baseline", f"Single={tiny_bert_dir}", "--mc-dropout", "Single",
        "--mc-samples", "3", "--deep-ensemble", "Single", "--train-data", str(id_csv),
        "--temperature-scaling", "--val-data", str(id_csv),
        "--id-data", str(id_csv), "--ood-data", f"noise={ood_csv}", "--report", str(report), "--batch-size", "16",
    ])
    assert code == 0
    data = json.loads((report / "report.json").read_text())
    methods = [r["method"] for r in data["rows"]]
    assert methods[:4] == ["Hydra", "Single", "Single + MC Dropout", "Deep Ensembles (D)"]
    assert "Hydra + TS" in methods and "Single + TS" in methods
    for row in data["rows"]:
        for key in ("accuracy", "brier", "nll", "ece", "aece", "latency_ms", "params_m"):
            assert isinstance(row[key], float) and math.isfinite(row[key]), (row["method"], key)
        assert 0 <= row["noise"]["auroc"] <= 1
    hydra_row = data["rows"][0]
    assert hydra_row["members"] == 3 and hydra_row["mutual_information"] > 0
    md = (report / "report.md").read_text()
    assert "| Hydra |" in md and "noise AUROC" in md
    for png in ("reliability.png", "ood_scores.png"):
        assert (report / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Hydra" in capsys.readouterr().out


def test_evaluate_cli_bad_inputs(tiny_bert_dir, tiny_data, tmp_path, capsys):
    id_csv, ood_csv = tiny_data
    base = ["evaluate", "--model", str(tiny_bert_dir), "--id-data", str(id_csv), "--ood-data", str(ood_csv),
            "--report", str(tmp_path / "r")]
    assert cli_main([*base, "--temperature-scaling"]) == 2
    assert "--val-data" in capsys.readouterr().err
    assert cli_main([*base, "--mc-dropout", "Nope"]) == 2
    assert "'Nope' is not a model" in capsys.readouterr().err
    assert cli_main([*base[:4], str(ood_csv), *base[5:]]) == 2  # OOD file as ID data: no labels
    assert "label" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_a_row_can_use_its_own_ood_score(tmp_path):
    """scores={name: ...}: that row's AUROC, its comparison and its histogram use the named score."""
    from hydra_hf import evaluation as ev
    from hydra_hf import metrics

    class Fixed(ev.Predictor):
        def __init__(self, logits):
            super().__init__()
            self.logits = logits

        def member_logits(self, batch):
            return self.logits[batch["index"]]

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(40, 3, 4, generator=g) * 2, torch.randn(40, 1, 4, generator=g) * 2
    id_batches = [{"index": torch.arange(0, 20), "labels": torch.randint(0, 4, (20,), generator=g)}]
    ood_batches = {"o": [{"index": torch.arange(20, 40)}]}
    result = ev.evaluate_predictors({"Hydra": Fixed(a), "Single": Fixed(b)}, id_batches, ood_batches,
                                    scores={"Hydra": "mutual_information"})
    rows = {r["method"]: r for r in result.rows}
    assert rows["Hydra"]["ood_score"] == "mutual_information" and rows["Single"]["ood_score"] == "msp"
    pa = torch.softmax(a.double(), -1)
    expected = metrics.ood_report(metrics.ood_score("mutual_information", member_probs=pa[:20]),
                                  metrics.ood_score("mutual_information", member_probs=pa[20:]))["auroc"]
    assert rows["Hydra"]["o"]["auroc"] == pytest.approx(expected)
    pb = torch.softmax(b.double(), -1).mean(1)
    assert rows["Single"]["o"]["auroc"] == pytest.approx(
        metrics.ood_report(metrics.msp(pb[:20]), metrics.msp(pb[20:]))["auroc"]
    )
    diff = ev.compare_predictions(result, "Hydra", "Single", n_boot=50)["o.auroc"]["difference"]
    assert diff == pytest.approx(rows["Hydra"]["o"]["auroc"] - rows["Single"]["o"]["auroc"])
    ev.write_evaluation_report(result, tmp_path / "r")
    assert "except **Hydra**: `mutual_information`" in (tmp_path / "r" / "report.md").read_text()
    with pytest.raises(ValueError, match="not one of the predictors"):
        ev.evaluate_predictors({"Hydra": Fixed(a)}, id_batches, ood_batches, scores={"Nope": "msp"})


def test_rows_sharing_a_model_run_it_once_with_identical_numbers(tiny_bert_dir, tiny_data):
    """Single, Single + TS and a Deep Ensemble whose member 0 is the Single: the Single runs once per
    batch during the metric passes (not again per row), the rows equal rows evaluated one at a time,
    and latency still runs every predictor."""
    from transformers import AutoTokenizer

    from hydra_hf.data import resolve_dataset

    single = BertForSequenceClassification.from_pretrained(tiny_bert_dir).eval()
    torch.manual_seed(1)
    other = BertForSequenceClassification(single.config).eval()
    tok = AutoTokenizer.from_pretrained(tiny_bert_dir)
    id_loader = ev.make_loader(resolve_dataset(str(tiny_data[0])), tok, "text", batch_size=8)
    ood = {"o": ev.make_loader(resolve_dataset(str(tiny_data[1]), label_column=None), tok, "text", batch_size=8)}
    calls = []
    single.register_forward_hook(lambda *a: calls.append(1))
    base = ev.ModelPredictor(single)

    def predictors():
        return {"Single": base, "Single + TS": ev.TemperatureScaledPredictor(base, 1.7),
                "DE": ev.EnsemblePredictor([single, other])}

    batches = len(id_loader) + len(ood["o"])
    result = ev.evaluate_predictors(predictors(), id_loader, ood)
    assert len(calls) == batches  # three rows, one pass of the Single
    separate = {}
    for name, predictor in predictors().items():
        separate.update({r["method"]: r for r in ev.evaluate_predictors({name: predictor}, id_loader, ood).rows})
    for row in result.rows:
        for key in ("accuracy", "nll", "ece"):
            assert row[key] == separate[row["method"]][key]
        assert row["o"]["auroc"] == separate[row["method"]]["o"]["auroc"]
    assert result.rows[1]["nll"] != result.rows[0]["nll"]  # the temperature does act
    calls.clear()
    latency_batch = {k: v for k, v in next(iter(id_loader)).items() if k != "labels"}
    ev.evaluate_predictors(predictors(), id_loader, ood, latency_batch=latency_batch)
    assert len(calls) == batches + 3 * (1 + 5)  # latency: warm-up + 5 rounds for each of the 3 rows, never reused
    single.train()  # a model in training mode (dropout) is never reused
    calls.clear()
    with ev.reuse_forwards():
        batch = next(iter(id_loader))
        base.member_logits(batch), base.member_logits(batch)
    assert len(calls) == 2
