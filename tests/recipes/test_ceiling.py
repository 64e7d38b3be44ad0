"""The ceiling table (issue 23): Singles over seeds, their real Deep Ensemble, and a Hydra recipe, per
OOD kind on validation splits; gains by hand; a tiny run end to end (trains the Singles, resumes)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from hydra_hf.recipes import ceiling
from hydra_hf.recipes import study as st


def _numbers(acc, ece, aurocs, mi=None):
    return {"accuracy": acc, "ece": ece, "mutual_information": mi,
            "ood": {k: {**v, "disagreement_mean": 0.1 if mi else None} for k, v in aurocs.items()}}


def test_ceiling_table_by_hand():
    s0 = _numbers(
        0.80,
        0.05,
        {"a": {"msp": 0.60, "entropy": 0.62, "energy": 0.58}, "b": {"msp": 0.70, "entropy": 0.69, "energy": 0.75}},
    )
    s1 = _numbers(
        0.82,
        0.07,
        {"a": {"msp": 0.64, "entropy": 0.61, "energy": 0.60}, "b": {"msp": 0.72, "entropy": 0.70, "energy": 0.71}},
    )
    de = _numbers(0.83, 0.04, {k: {"msp": v, "entropy": v, "energy": v, "mutual_information": v - 0.1}
                               for k, v in {"a": 0.66, "b": 0.74}.items()}, mi=0.02)
    table = ceiling.ceiling_table(
        {"kinds": ["a", "b"], "seeds": [0, 1], "single": {"0": s0, "1": s1}, "deep_ensemble": de}
    )
    rows = {(r["model"], r["score"]): r for r in table["rows"]}
    single = rows[("Single", "msp")]
    assert single["auroc"]["a"] == pytest.approx(0.62) and single["auroc_std"]["a"] == pytest.approx(0.04 / 2**0.5)
    assert single["accuracy"] == pytest.approx(0.81) and single["ece"] == pytest.approx(0.06)
    assert ("Single", "mutual_information") not in rows  # one model has no disagreement to score with
    d = rows[("Deep Ensemble", "msp")]
    assert d["gain_msp"]["a"] == pytest.approx(0.66 - 0.62) and d["gain_msp"]["b"] == pytest.approx(0.74 - 0.71)
    # against each Single's best own score per kind: a: max(0.60, 0.62, 0.58) = 0.62, max(.64, .61, .60) = .64
    assert d["gain_best"]["a"] == pytest.approx(0.66 - 0.63) and d["gain_best"]["b"] == pytest.approx(0.74 - 0.735)
    assert rows[("Deep Ensemble", "mutual_information")]["gain_msp"]["a"] == pytest.approx(0.56 - 0.62)
    text = ceiling.render_ceiling(table)
    assert "| Deep Ensemble | msp | 1 | 0.6600 | 0.7400 | 0.8300 | 0.0400 |" in text
    assert "| Deep Ensemble | msp | +4.0 / +3.0 | +3.0 / +0.5 | +3.5 / +1.8 |" in text
    # a Hydra recipe screened on one seed only: its rows average the seeds it ran on, against the mean Single
    hydra = _numbers(0.81, 0.03, {k: {"msp": v, "entropy": v, "energy": v, "mutual_information": v}
                                  for k, v in {"a": 0.70, "b": 0.70}.items()}, mi=0.05)
    table = ceiling.ceiling_table({"kinds": ["a", "b"], "seeds": [0, 1], "single": {"0": s0, "1": s1},
                                   "deep_ensemble": de, "hydra": {"1": hydra}})
    h = {r["score"]: r for r in table["rows"] if r["model"] == "Hydra"}["msp"]
    assert h["seeds"] == 1 and h["auroc_std"]["a"] == 0
    assert h["gain_msp"]["a"] == pytest.approx(0.70 - 0.62) and h["gain_msp"]["b"] == pytest.approx(0.70 - 0.71)


def test_ceiling_end_to_end_tiny(tmp_path):
    """Two seeds of a tiny model: Singles trained into the study's folders, the Deep Ensemble's AUROC
    recomputed from the two Singles, a Taylor Hydra row per seed; a re-run resumes from the cache."""
    from conftest import tiny_bert_config, write_tiny_tokenizer
    from test_demo_smoke import _reviews
    from transformers import BertForSequenceClassification

    from hydra_hf import metrics
    from hydra_hf.evaluation import EnsemblePredictor, load_classifier, make_loader, predict

    base = tmp_path / "base"
    torch.manual_seed(0)
    BertForSequenceClassification(tiny_bert_config(num_labels=2)).save_pretrained(base)
    write_tiny_tokenizer(base)
    _reviews(96, 0).to_csv(tmp_path / "train.csv", index=False)
    _reviews(72, 1).to_csv(tmp_path / "validation.csv", index=False)
    for kind, words in (("a", "x y z"), ("b", "q r s")):
        pd.DataFrame({"text": [f"{words} {i % 7}" for i in range(20)]}).to_csv(tmp_path / f"{kind}.csv", index=False)
    s = st.TextStudy(
        base_model=str(base),
        train_data=str(tmp_path / "train.csv"),
        heldout_data=str(tmp_path / "train.csv"),
        id_validation=str(tmp_path / "validation.csv"),
        ood_validation={k: str(tmp_path / f"{k}.csv") for k in "ab"},
        finetune_eval=8,
        max_score_samples=40,
        max_length=16,
        batch_size=8,
        max_train_samples=64,
        single_steps=2,
    )
    hydra = st.Candidate("taylor k2", method="taylor", remove=None, heads_per_layer=2, samples=16, members=2,
                         member_steps=0, selection="heldout")
    out = tmp_path / "study"
    numbers = ceiling.ceiling_numbers(s, out, [0, 1], hydra=hydra)
    assert (out / "single_seed1" / "work" / "member_0" / "model" / "config.json").is_file()  # the study's Singles
    assert set(numbers["single"]) == {"0", "1"} and set(numbers["hydra"]) == {"0", "1"}
    models = [load_classifier(out / f"single_seed{seed}" / "work" / "member_0" / "model")[0] for seed in (0, 1)]
    tok = load_classifier(out / "single_seed0" / "work" / "member_0" / "model")[1]
    from hydra_hf.data import resolve_dataset

    ident = resolve_dataset(str(tmp_path / "validation.csv"), require_labels=True, num_labels=2).select(range(8, 48))
    ood = resolve_dataset(str(tmp_path / "b.csv"), label_column=None)
    p_id = predict(EnsemblePredictor(models), make_loader(ident, tok, "text", 64, 16))
    p_ood = predict(EnsemblePredictor(models), make_loader(ood, tok, "text", 64, 16))
    expected = metrics.ood_report(p_id.ood_scores("mutual_information"), p_ood.ood_scores("mutual_information"))[
        "auroc"
    ]
    assert numbers["deep_ensemble"]["ood"]["b"]["mutual_information"] == pytest.approx(expected, abs=1e-9)
    masks = json.loads(next((out / "masks" / "seed1").glob("taylor-K2-*heldout*.json")).read_text())
    assert all(len(h) == 2 for m in masks["members"] for h in m["kept_heads"])
    table = ceiling.ceiling_table(numbers)
    assert {r["model"] for r in table["rows"]} == {"Single", "Deep Ensemble", "Hydra"}
    stamp = {p: p.stat().st_mtime_ns for p in (out / "ceiling").glob("*.json")}
    ceiling.ceiling_numbers(s, out, [0, 1], hydra=hydra)  # resumes: nothing recomputed
    assert stamp == {p: p.stat().st_mtime_ns for p in (out / "ceiling").glob("*.json")}
    with pytest.raises(ValueError, match="must select without OOD data"):
        ceiling.ceiling_numbers(s, out, [0, 1], hydra=st.Candidate("circ"))
    with pytest.raises(ValueError, match="at least 2 seeds"):
        ceiling.ceiling_numbers(s, out, [0])
