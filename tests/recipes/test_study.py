"""The selection protocol (`hydra_hf.recipes.study`): leave-one-OOD-kind-out arithmetic, the decision rule,
and a tiny end-to-end study that reads no test split and whose numbers a direct recomputation gives."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from hydra_hf.recipes import study as st


def _write_cell(out, seed, cand, fold, aurocs, acc=0.80, ece=0.05, fusion="average"):
    f = st._cell_file(out, seed, cand, fold)
    f.parent.mkdir(parents=True, exist_ok=True)
    ood = {k: {s: v for s in st.STUDY_SCORES} | {"mutual_information_mean": 0.01, "disagreement_mean": 0.1}
           for k, v in aurocs.items()}
    f.write_text(json.dumps({"fusions": {fusion: {"accuracy": acc, "ece": ece, "nll": 0.4, "mutual_information": 0.005,
                                                  "disagreement": 0.05, "ood": ood}}}))


def _write_single(out, seed, aurocs, acc=0.80, ece=0.05):
    f = out / "cells" / f"seed{seed}" / "single.json"
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(
        json.dumps(
            {"seed": seed, "numbers": {"accuracy": acc, "ece": ece, "ood": {k: {"msp": v} for k, v in aurocs.items()}}}
        )
    )


def test_leave_one_kind_out_gain_and_decision(tmp_path):
    s = st.TextStudy(ood_validation={"a": "x", "b": "y", "c": "z"})
    single = {"a": 0.70, "b": 0.60, "c": 0.50}
    _write_single(tmp_path, 0, single)
    circ = st.Candidate("circ", method="circuit-avg")
    taylor = st.Candidate("taylor", method="taylor")
    worse = st.Candidate("accurate-less", method="circuit-ood")
    # fold a selected on a: scored on b, c. Gains: fold a (0.05 + 0.10) / 2; fold b (0.0 + 0.10) / 2;
    # fold c (0.0 + 0.05) / 2
    _write_cell(tmp_path, 0, circ, "a", {"a": 0.99, "b": 0.65, "c": 0.60})
    _write_cell(tmp_path, 0, circ, "b", {"a": 0.70, "b": 0.99, "c": 0.60})
    _write_cell(tmp_path, 0, circ, "c", {"a": 0.70, "b": 0.65, "c": 0.99})
    # one selection without OOD data: the same cell for every fold
    _write_cell(tmp_path, 0, taylor, st.ANY_FOLD, {"a": 0.72, "b": 0.62, "c": 0.52})
    # a larger gain but 2 accuracy points lost: not eligible
    for fold in "abc":
        _write_cell(tmp_path, 0, worse, fold, {"a": 0.9, "b": 0.9, "c": 0.9}, acc=0.78)
    summary = st.collect(tmp_path, s, [circ, taylor, worse])
    rows = {(r["candidate"], r["score"]): r for r in summary["rows"]}
    r = rows[("circ", "msp")]
    assert r["gain"] == pytest.approx(((0.05 + 0.10) / 2 + (0.0 + 0.10) / 2 + (0.0 + 0.05) / 2) / 3)
    assert r["worst_fold_gain"] == pytest.approx(0.025)
    # each fold's gain on the kind it selected on: a 0.99, b 0.99, c 0.99 against 0.70, 0.60, 0.50
    assert r["selected_kind_gain"] == pytest.approx((0.29 + 0.39 + 0.49) / 3)
    # a selection without OOD data has no selected kind: its "own-kind" gain is its mean over all kinds
    assert rows[("taylor", "msp")]["selected_kind_gain"] == pytest.approx(0.02)
    assert (
        r["gain_a"] == pytest.approx(0.0) and r["gain_b"] == pytest.approx(0.05) and r["gain_c"] == pytest.approx(0.10)
    )
    assert rows[("taylor", "msp")]["gain"] == pytest.approx(0.02)
    assert rows[("accurate-less", "msp")]["accuracy_diff"] == pytest.approx(-0.02)
    assert r["disagreement_id"] == pytest.approx(0.05) and r["disagreement_ood"] == pytest.approx(0.1)
    choice = st.decide(summary, s)
    assert choice["candidate"] == "circ"
    table = st.render_decision_table(summary, s)
    assert "**chosen**" in table and "accurate-less" in table  # losers stay in the table
    assert table.count("| no |") == len(st.STUDY_SCORES)
    short = st.render_decision_table(summary, s, best_per_candidate=True, preamble=False)
    names = [line.split(" | ")[0][2:] for line in short.splitlines()[2:]]
    assert names == ["accurate-less", "circ", "taylor"]  # one row each, by gain; the ineligible one stays
    assert "| **chosen** |" in short and short.count("| no |") == 1 and not short.startswith("- Single")
    from PIL import Image

    png = st.plot_decision(summary, s, tmp_path / "decision.png")
    assert Image.open(png).size[1] > 100
    short_png = st.plot_decision(summary, s, tmp_path / "short.png", best_per_candidate=True)
    assert Image.open(short_png).size[1] < Image.open(png).size[1]  # 3 bars instead of 12


def test_unfinished_candidates_and_seeds(tmp_path):
    s = st.TextStudy(ood_validation={"a": "x", "b": "y"})
    c = st.Candidate("circ")
    for seed, gain in ((0, 0.1), (1, 0.3)):
        _write_single(tmp_path, seed, {"a": 0.5, "b": 0.5})
        for fold in "ab":
            _write_cell(tmp_path, seed, c, fold, {"a": 0.5 + gain, "b": 0.5 + gain})
    partial = st.Candidate("partial")
    _write_cell(tmp_path, 0, partial, "a", {"a": 0.9, "b": 0.9})  # fold b missing: no row
    summary = st.collect(tmp_path, s, [c, partial])
    rows = [r for r in summary["rows"] if r["score"] == "msp"]
    assert [r["candidate"] for r in rows] == ["circ"]
    assert rows[0]["seeds"] == 2 and rows[0]["gain"] == pytest.approx(0.2)
    assert rows[0]["gain_std"] == pytest.approx(torch.tensor([0.1, 0.3]).std().item())
    assert "± " in st.render_decision_table(summary, s)


def test_rows_on_fewer_seeds_are_provisional(tmp_path):
    """A larger gain on one seed does not beat a candidate replicated on two: it is marked provisional
    until it has as many seeds (or ``min_seeds`` lowers the bar)."""
    s = st.TextStudy(ood_validation={"a": "x", "b": "y"})
    replicated, lucky = st.Candidate("replicated"), st.Candidate("lucky", method="taylor")
    for seed in (0, 1):
        _write_single(tmp_path, seed, {"a": 0.5, "b": 0.5})
        for fold in "ab":
            _write_cell(tmp_path, seed, replicated, fold, {"a": 0.52, "b": 0.52})
    _write_cell(tmp_path, 0, lucky, st.ANY_FOLD, {"a": 0.6, "b": 0.6})
    weak = st.Candidate("weak", method="random")  # one seed, far below the choice: screened out, not provisional
    _write_cell(tmp_path, 0, weak, st.ANY_FOLD, {"a": 0.49, "b": 0.49})
    # two fusions: the ineligible one gains more; the short table shows the eligible one
    mixed = st.Candidate("mixed", method="circuit-ood")
    for seed in (0, 1):
        for fold in "ab":
            _write_cell(tmp_path, seed, mixed, fold, {"a": 0.9, "b": 0.9}, acc=0.70, fusion="average")
            cell = st._cell_file(tmp_path, seed, mixed, fold)
            data = json.loads(cell.read_text())
            data["fusions"]["per_member"] = {
                **data["fusions"]["average"],
                "accuracy": 0.80,
                "ood": {k: {sc: 0.51 for sc in v} for k, v in data["fusions"]["average"]["ood"].items()},
            }
            cell.write_text(json.dumps(data))
    summary = st.collect(tmp_path, s, [replicated, lucky, weak, mixed])
    short = st.render_decision_table(summary, s, best_per_candidate=True, preamble=False)
    assert [line for line in short.splitlines() if line.startswith("| mixed")][0].startswith("| mixed | per_member |")
    assert all(line.endswith("| 1 | screened out |") for line in short.splitlines() if line.startswith("| weak"))
    summary = st.collect(tmp_path, s, [replicated, lucky])
    assert st.seeds_to_choose(summary, s) == 2
    assert st.decide(summary, s)["candidate"] == "replicated"
    table = st.render_decision_table(summary, s)
    lucky_rows = [line for line in table.splitlines() if line.startswith("| lucky")]
    assert lucky_rows and all(line.endswith("| 1 | provisional |") for line in lucky_rows)
    assert "at least 2 seeds" in table
    one = dataclasses.replace(s, min_seeds=1)
    assert st.decide(summary, one)["candidate"] == "lucky"
    assert "| provisional |" not in st.render_decision_table(summary, one)


def test_screening_replicates_only_candidates_close_to_the_best(tmp_path):
    """Two-stage protocol: on the screening seed, candidates within ``replicate_margin`` of the best
    eligible row are replicated on the other seeds, unless they already are; ineligible and distant ones are not."""
    s = st.TextStudy(ood_validation={"a": "x", "b": "y"}, replicate_margin=0.01)
    for seed in (0, 1):
        _write_single(tmp_path, seed, {"a": 0.5, "b": 0.5})
    best, close, done, far, inaccurate = (
        st.Candidate(n, method="taylor") for n in ("best", "close", "done", "far", "inaccurate")
    )
    for c, gain in ((best, 0.05), (close, 0.045), (done, 0.042), (far, 0.035), (inaccurate, 0.09)):
        _write_cell(tmp_path, 0, c, st.ANY_FOLD, {"a": 0.5 + gain, "b": 0.5 + gain},
                    acc=0.70 if c is inaccurate else 0.80)
    _write_cell(tmp_path, 1, done, st.ANY_FOLD, {"a": 0.5, "b": 0.5})
    unscreened = st.Candidate("unscreened", method="random")
    _write_cell(tmp_path, 1, unscreened, st.ANY_FOLD, {"a": 0.9, "b": 0.9})
    cands = [best, close, done, far, inaccurate, unscreened]
    got = st.candidates_to_replicate(tmp_path, s, cands, [0, 1])
    assert [c.name for c in got] == ["best", "close"]
    assert st.candidates_to_replicate(tmp_path, s, cands, [0]) == []
    wide = dataclasses.replace(s, replicate_margin=0.02)
    assert [c.name for c in st.candidates_to_replicate(tmp_path, wide, cands, [0, 1])] == ["best", "close", "far"]
    # collect(seeds=...) keeps the screening seed apart: "done" has 2 seeds overall, 1 on seed 0
    rows = {r["candidate"]: r for r in st.collect(tmp_path, s, cands, seeds=[0])["rows"] if r["score"] == "msp"}
    assert rows["done"]["seeds"] == 1 and rows["done"]["gain"] == pytest.approx(0.042) and "unscreened" not in rows


def test_study_reads_validation_splits_only_and_the_script_builds_it(tmp_path):
    """A test split named anywhere in the study's data is refused (it would leak into the choice); the
    script's data arguments build the TextStudy; bad ones are one-line errors."""
    for bad in (
        {"id_validation": "rotten_tomatoes:test"},
        {"ood_validation": {"a": "x:validation", "b": "agnews:test"}},
        {"ood_validation": {"a": "x", "b": str(tmp_path / "ood_test.csv")}},
    ):
        with pytest.raises(ValueError, match="names a test split"):
            st.TextStudy(**bad)
    # not a test split
    st.TextStudy(ood_validation={"contest": "contest_data:validation", "b": "latest_news:validation"})
    with pytest.raises(Exception, match="needs at least 2"):
        st.run_study(st.TextStudy(ood_validation={"a": "x"}), tmp_path / "study")
    assert not (tmp_path / "study").exists()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "study.json").write_text("{not json")
    with pytest.raises(Exception, match="is not a study record"):
        st.run_study(st.TextStudy(), tmp_path / "broken")
    assert [f.name for f in (tmp_path / "broken").iterdir()] == ["study.json"]

    import argparse
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "study_text", Path(__file__).resolve().parents[2] / "examples" / "study_text.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    parser = argparse.ArgumentParser()
    script.add_data_arguments(parser)
    args = parser.parse_args(
        [
            "--base-model",
            "bert-dir",
            "--train-data",
            "sst2:train",
            "--id-validation",
            "sst2:validation",
            "--ood",
            "agnews=ag:validation",
            "--ood",
            "trec=trec:validation",
            "--labels",
            "neg",
            "pos",
            "--max-length",
            "64",
        ]
    )
    s = script.study_from_args(args)
    assert (s.base_model, s.train_data, s.id_validation, s.labels, s.max_length) == \
        ("bert-dir", "sst2:train", "sst2:validation", ("neg", "pos"), 64)
    assert s.ood_validation == {"agnews": "ag:validation", "trec": "trec:validation"} and s.finetune_eval == 400
    assert script.study_from_args(parser.parse_args([])) == st.TextStudy()
    with pytest.raises(ValueError, match="names a kind twice"):
        script.study_from_args(parser.parse_args(["--ood", "a=x", "--ood", "a=y"]))
    with pytest.raises(SystemExit):
        parser.parse_args(["--ood", "no-equals-sign"])


def test_candidate_validation():
    with pytest.raises(ValueError, match="candidate 'x': unknown pruning method.*'nope'"):
        st.Candidate("x", method="nope")
    with pytest.raises(ValueError, match="member_steps > 0"):
        st.Candidate("x", start="pretrained", member_steps=0)
    assert st.Candidate("x", method="taylor").selection_key("guardian").endswith("-any")
    assert st.Candidate("x").selection_key("guardian").endswith("-guardian")
    # the keys of the candidates that predate issue 23 are unchanged: their cached masks and cells resume
    assert st.Candidate("x").selection_key("g") == "circuit-avg-r36-k6-n96-m3-g"
    # issue 23: the per-layer budget, one criterion per member, held-out selection, pooled OOD kinds
    circ = st.Candidate("circ", method="circuit-acc,circuit-ood,circuit-avg", remove=None, heads_per_layer=6,
                        selection="heldout", ood_selection="pooled", data_fraction=1.0, samples=1000)
    assert circ.uses_ood and circ.pooled and circ.budget().heads_per_layer == 6
    assert circ.selection_key("g") == "circuit-acc,circuit-ood,circuit-avg-K6-k6-n1000-m3-heldout-pooled-f1-g"
    assert not st.Candidate("t", method="taylor", ood_selection="pooled").pooled  # no OOD data: nothing to pool
    with pytest.raises(ValueError, match="candidate 'x': .*give exactly one budget.*set the other one to None"):
        st.Candidate("x", heads_per_layer=6)  # remove keeps its default of 36
    for bad, words in (({"selection": "test"}, "selection 'test'"), ({"ood_selection": "all"}, "ood_selection 'all'"),
                       ({"data_fraction": 0.0}, "data_fraction must be in"), ({"mlp_keep": 1.5}, "--mlp-keep 1.5")):
        with pytest.raises(ValueError, match=words):
            st.Candidate("x", **bad)


def test_pooled_selection_transfers_to_the_folds_own_kind(tmp_path):
    """A selection on the pooled other kinds is scored on the fold's kind, which it never saw."""
    s = st.TextStudy(ood_validation={"a": "x", "b": "y", "c": "z"})
    _write_single(tmp_path, 0, {"a": 0.70, "b": 0.60, "c": 0.50})
    pooled = st.Candidate("pooled", method="circuit-avg", ood_selection="pooled")
    _write_cell(tmp_path, 0, pooled, "a", {"a": 0.75, "b": 0.90, "c": 0.90})  # selected on b + c, unseen a: +0.05
    _write_cell(tmp_path, 0, pooled, "b", {"a": 0.90, "b": 0.62, "c": 0.90})  # +0.02
    _write_cell(tmp_path, 0, pooled, "c", {"a": 0.90, "b": 0.90, "c": 0.47})  # -0.03
    r = {row["score"]: row for row in st.collect(tmp_path, s, [pooled])["rows"]}["msp"]
    assert r["gain"] == pytest.approx((0.05 + 0.02 - 0.03) / 3) and r["worst_fold_gain"] == pytest.approx(-0.03)
    assert r["gain_a"] == pytest.approx(0.05) and r["gain_c"] == pytest.approx(-0.03)
    # the kinds it selected on: fold a saw b and c (+0.30, +0.40), ...
    assert r["selected_kind_gain"] == pytest.approx(((0.30 + 0.40) / 2 + (0.20 + 0.40) / 2 + (0.20 + 0.30) / 2) / 3)


def test_selection_data_heldout_rows_and_pooled_kinds(tmp_path):
    """selection='heldout' reads the training rows no model trains on; pooled OOD data leaves the fold's kind out."""
    from conftest import write_tiny_tokenizer
    from test_demo_smoke import _reviews
    from transformers import AutoTokenizer

    train = _reviews(40, 0)
    train["text"] = [f"row{i} {t}" for i, t in enumerate(train["text"])]
    train.to_csv(tmp_path / "train.csv", index=False)
    _reviews(60, 1).to_csv(tmp_path / "validation.csv", index=False)
    for kind in "abc":
        pd.DataFrame({"text": [f"{kind} text {i}" for i in range(10)]}).to_csv(tmp_path / f"{kind}.csv", index=False)
    (tmp_path / "tok").mkdir()
    write_tiny_tokenizer(tmp_path / "tok")
    s = st.TextStudy(train_data=str(tmp_path / "train.csv"), heldout_data=str(tmp_path / "train.csv"),
                     id_validation=str(tmp_path / "validation.csv"), finetune_eval=8, max_train_samples=25,
                     ood_validation={k: str(tmp_path / f"{k}.csv") for k in "abc"})
    data = st.study_data(s, AutoTokenizer.from_pretrained(str(tmp_path / "tok")))
    ident, ood = data.selection("a", 12, heldout=True, pooled=True)
    assert [t.split()[0] for t in ident["text"]] == [f"row{i}" for i in range(25, 37)]  # never a training row
    assert sorted({t[0] for t in ood["text"]}) == ["b", "c"] and len(ood) == 12  # 6 of each other kind, none of a
    ident, ood = data.selection("a", 5)
    assert len(ident) == 5 and {t[0] for t in ood["text"]} == {"a"}
    with pytest.raises(ValueError, match="none after the first max_train_samples = 40"):
        st.study_data(dataclasses.replace(s, max_train_samples=40), data.tokenizer).selection(None, 5, heldout=True)


def test_tiny_study_end_to_end(tmp_path, monkeypatch):
    """Two OOD kinds, a CircAvg and a Taylor candidate without fine-tuning and one with 2 steps: every
    cell is written, no test split is read, and a cell's AUROC equals a direct recomputation."""
    from conftest import tiny_bert_config, write_tiny_tokenizer
    from test_demo_smoke import _reviews
    from transformers import AutoTokenizer, BertForSequenceClassification

    from hydra_hf import data as data_mod
    from hydra_hf import metrics
    from hydra_hf.assemble import convert_checkpoint
    from hydra_hf.evaluation import ModelPredictor, make_loader, predict
    from hydra_hf.masks import HeadMasks

    single = tmp_path / "single"
    torch.manual_seed(0)
    BertForSequenceClassification(tiny_bert_config(num_labels=2)).save_pretrained(single)
    write_tiny_tokenizer(single)
    _reviews(64, 0).to_csv(tmp_path / "train.csv", index=False)
    _reviews(60, 1).to_csv(tmp_path / "validation.csv", index=False)
    for name, words in (("ood_a", "x y z"), ("ood_b", "q r s")):
        pd.DataFrame({"text": [f"{words} {i % 7}" for i in range(20)]}).to_csv(tmp_path / f"{name}.csv", index=False)
    read = []
    real = data_mod.resolve_dataset

    def spy(spec, *a, **k):
        read.append(str(spec))
        return real(spec, *a, **k)

    # every module that reads data imports resolve_dataset at its top: spy on each binding of it
    for module in [m for name, m in list(sys.modules.items()) if name == "hydra_hf" or name.startswith("hydra_hf.")]:
        if getattr(module, "resolve_dataset", None) is real:
            monkeypatch.setattr(module, "resolve_dataset", spy)
    s = st.TextStudy(base_model=str(single), train_data=str(tmp_path / "train.csv"),
                     id_validation=str(tmp_path / "validation.csv"),
                     ood_validation={"a": str(tmp_path / "ood_a.csv"), "b": str(tmp_path / "ood_b.csv")},
                     finetune_eval=8, max_score_samples=40, max_length=16, batch_size=8, max_train_samples=64,
                     single_steps=2)  # seed 0's Single is given; seed 1's is trained below
    cands = (st.Candidate("circ", remove=2, heads_per_step=2, samples=8, members=2, member_steps=0),
             st.Candidate("taylor", method="taylor", remove=2, samples=8, members=2, member_steps=0),
             st.Candidate("circ ft", remove=2, heads_per_step=2, samples=8, members=2, member_steps=2),
             st.Candidate("slim", method="taylor", remove=2, samples=8, members=2, member_steps=0, mlp_keep=0.5))
    from hydra_hf.errors import HydraInputError

    with pytest.raises(HydraInputError, match="'.*nope'.* is not a model folder"):
        st.run_study(s, tmp_path / "study", candidates=cands, singles={0: tmp_path / "nope"})
    assert not (tmp_path / "study").exists()  # nothing written
    summary = st.run_study(s, tmp_path / "study", candidates=cands, singles={0: single})
    assert read and not [spec for spec in read if spec.endswith("test") or Path(spec.split(":")[0]).stem == "test"]
    files = sorted(
        p.relative_to(tmp_path / "study" / "cells").as_posix() for p in (tmp_path / "study" / "cells").rglob("*.json")
    )
    assert files == ["seed0/circ/a.json", "seed0/circ/b.json", "seed0/circ_ft/a.json", "seed0/circ_ft/b.json",
                     "seed0/single.json", "seed0/slim/any.json", "seed0/taylor/any.json"]
    assert {r["candidate"] for r in summary["rows"]} == {"circ", "taylor", "circ ft", "slim"}
    # slim members: each keeps half of every layer's MLP neurons, and the cell scored the slim model
    slim_masks = HeadMasks.load(tmp_path / "study" / "masks" / "seed0" / f"{cands[3].selection_key('any')}.json")
    intermediate = json.loads((Path(single) / "config.json").read_text())["intermediate_size"]
    assert cands[3].selection_key("any").endswith("-mlp0.5-any")
    assert {len(n) for member in slim_masks.kept_neurons() for n in member} == {intermediate // 2}
    ft = json.loads((tmp_path / "study" / "cells" / "seed0" / "circ_ft" / "a.json").read_text())
    assert set(ft["fusions"]) == {"average", "per_member"}
    assert not list((tmp_path / "study" / "work").glob("*/members"))  # member checkpoints removed
    # recompute cell (circ, fold a) on kind b from its masks: same AUROC
    cell = json.loads((tmp_path / "study" / "cells" / "seed0" / "circ" / "a.json").read_text())
    masks = HeadMasks.load(tmp_path / "study" / "masks" / "seed0" / f"{cands[0].selection_key('a')}.json")
    hydra = convert_checkpoint(masks, base=single).eval()
    tok = AutoTokenizer.from_pretrained(str(single))
    id_score = real(str(tmp_path / "validation.csv"), require_labels=True, num_labels=2).select(range(8, 48))
    ood_b = real(str(tmp_path / "ood_b.csv"), label_column=None)
    p_id = predict(ModelPredictor(hydra), make_loader(id_score, tok, "text", 64, 16))
    p_b = predict(ModelPredictor(hydra), make_loader(ood_b, tok, "text", 64, 16))
    expected = metrics.ood_report(p_id.ood_scores("mutual_information"), p_b.ood_scores("mutual_information"))["auroc"]
    assert cell["fusions"]["average"]["ood"]["b"]["mutual_information"] == pytest.approx(expected, abs=1e-12)
    # a seed without a given Single trains its own (the study's `train_single`), then runs its cells
    st.run_study(s, tmp_path / "study", candidates=cands[:1], seeds=(1,))
    assert (tmp_path / "study" / "single_seed1" / "work" / "member_0" / "model" / "config.json").is_file()
    assert sorted(p.name for p in (tmp_path / "study" / "cells" / "seed1" / "circ").iterdir()) == ["a.json", "b.json"]
    files = [f for f in files if f.startswith("seed0")]
    # the two-stage protocol: seed 0 screened (done), seed 1 gets exactly the candidates close to the best
    tight = dataclasses.replace(s, replicate_margin=0.0)
    expected = {c.name for c in st.candidates_to_replicate(tmp_path / "study", tight, cands, [0, 1])} | {"circ"}
    st.run_study(tight, tmp_path / "study", candidates=cands, seeds=(0, 1), singles={0: single}, screen=True)
    seed1 = {r["candidate"] for r in st.collect(tmp_path / "study", s, cands, seeds=[1])["rows"]}
    assert seed1 == expected and len(expected) < len(cands)  # with no margin, some candidate is screened out
    # a seed's cells keep their Single: re-running without --single finds it, another one is refused
    st.run_study(s, tmp_path / "study", candidates=cands[:1])  # no singles given: the recorded one
    other = tmp_path / "other-single"
    shutil.copytree(single, other)
    with pytest.raises(ValueError, match="scored against the Single"):
        st.run_study(s, tmp_path / "study", candidates=cands[:1], singles={0: other})
    # other settings or a changed candidate under the same name: refused, nothing written
    before_json = (tmp_path / "study" / "study.json").read_text()
    with pytest.raises(HydraInputError, match="holds cells run with max_length=16, not 32"):
        st.run_study(
            dataclasses.replace(s, max_length=32), tmp_path / "study", candidates=cands[:1], singles={0: single}
        )
    with pytest.raises(HydraInputError, match="another candidate named 'circ'"):
        st.run_study(
            s, tmp_path / "study", candidates=[dataclasses.replace(cands[0], samples=16)], singles={0: single}
        )
    assert (tmp_path / "study" / "study.json").read_text() == before_json
    st.run_study(dataclasses.replace(s, replicate_margin=0.5, max_accuracy_drop=0.5), tmp_path / "study",
                 candidates=cands[:1], singles={0: single})  # decision settings may change
    # re-running resumes: nothing is recomputed
    before = {f: (tmp_path / "study" / "cells" / f).stat().st_mtime_ns for f in files}
    st.run_study(s, tmp_path / "study", candidates=cands, singles={0: single})
    assert before == {f: (tmp_path / "study" / "cells" / f).stat().st_mtime_ns for f in files}


def test_fine_tuning_longer_than_one_pass_over_the_training_rows_runs_every_step(tmp_path):
    """A study run of more steps than one epoch has (64 rows, batch 8: 8 per epoch) trains all of them, over
    further epochs, instead of stopping at the end of the first."""
    from conftest import tiny_bert_config, write_tiny_tokenizer
    from test_demo_smoke import _reviews
    from transformers import BertForSequenceClassification

    base = tmp_path / "base"
    torch.manual_seed(0)
    BertForSequenceClassification(tiny_bert_config(num_labels=2)).save_pretrained(base)
    write_tiny_tokenizer(base)
    _reviews(64, 0).to_csv(tmp_path / "train.csv", index=False)
    _reviews(60, 1).to_csv(tmp_path / "validation.csv", index=False)
    s = st.TextStudy(base_model=str(base), train_data=str(tmp_path / "train.csv"),
                     id_validation=str(tmp_path / "validation.csv"), finetune_eval=8, max_length=16, batch_size=8,
                     max_train_samples=64, single_steps=20)
    st.train_single(s, 0, tmp_path / "single")
    log = [json.loads(line) for line in (tmp_path / "single" / "work" / "log.jsonl").read_text().splitlines()]
    epochs = [r for r in log if "train_loss" in r]
    assert [r["step"] for r in epochs] == [8, 16, 20] and epochs[-1]["epoch"] == 3


def _rewrite(path, n, size):
    for i in range(n):
        st._write_json(path, {"writer": i, "padding": "x" * size})


def test_study_records_are_written_atomically(tmp_path, monkeypatch):
    """Shards of one study run as separate processes that write and read study.json at once (a race a
    4-process run hit): a reader sees the old record or the new one, never a half-written file; a write
    that fails leaves the old record and no temporary file."""
    import multiprocessing

    path = tmp_path / "study.json"
    st._write_json(path, {"writer": -1})
    ctx = multiprocessing.get_context("spawn")
    writers = [ctx.Process(target=_rewrite, args=(path, 300, 200_000)) for _ in range(2)]
    for w in writers:
        w.start()
    reads = 0
    while any(w.is_alive() for w in writers) or reads < 50:
        assert set(json.loads(path.read_text())) >= {"writer"}  # always a whole record
        reads += 1
    for w in writers:
        w.join()
        assert w.exitcode == 0  # two writers never collide on one temporary file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.json"]

    def broken(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(st.os, "replace", broken)
    with pytest.raises(OSError, match="disk full"):
        st._write_json(path, {"writer": "new"})
    assert json.loads(path.read_text())["writer"] == 299 and sorted(p.name for p in tmp_path.iterdir()) == [
        "study.json"
    ]


def test_compare_selections_by_hand():
    a = torch.tensor([0.9, 0.8, 0.7, 0.6, 0.5], dtype=torch.float64)
    same = st.compare_selections(a, a.clone(), top=2)
    assert same == {"spearman": pytest.approx(1.0), "top_jaccard": 1.0, "noise_std": 0.0,
                    "spread_std": pytest.approx(a.std().item())}
    rev = st.compare_selections(a, a.flip(0), top=2)  # the opposite ranking: the top-2 sets are disjoint
    assert rev["spearman"] == pytest.approx(-1.0) and rev["top_jaccard"] == 0.0
    assert rev["noise_std"] == pytest.approx((a - a.flip(0)).std().item() / 2 ** 0.5)
    one = st.compare_selections(a, torch.tensor([0.9, 0.5, 0.8, 0.6, 0.7], dtype=torch.float64), top=2)
    assert one["top_jaccard"] == pytest.approx(1 / 3)  # {0, 1} vs {0, 2}


def _noise_testbed(tmp_path: Path) -> Path:
    """A tiny BERT Single (returned: its folder), 80 labelled reviews (validation.csv) and 40 OOD texts (ood.csv)."""
    from conftest import tiny_bert_config, write_tiny_tokenizer
    from test_demo_smoke import _reviews
    from transformers import BertForSequenceClassification

    single = tmp_path / "single"
    torch.manual_seed(0)
    BertForSequenceClassification(tiny_bert_config(num_labels=2)).save_pretrained(single)
    write_tiny_tokenizer(single)
    _reviews(80, 1).to_csv(tmp_path / "validation.csv", index=False)
    pd.DataFrame({"text": [f"x y {i} z {i % 3}" for i in range(40)]}).to_csv(tmp_path / "ood.csv", index=False)
    return single


def test_first_step_scores_match_the_search_and_selection_noise(tmp_path):
    """The scores the noise study ranks are the circuit search's: its first step (k heads at once)
    removes exactly their top k; the noise study on two disjoint draws runs and stays in range."""
    from hydra_hf.data import make_text_loader, resolve_dataset
    from hydra_hf.pruning import Budget, load_pruning_target
    from hydra_hf.pruning.circuits import circuit_prune

    single = _noise_testbed(tmp_path)
    target = load_pruning_target(single)
    id_data = resolve_dataset(str(tmp_path / "validation.csv"), require_labels=True, num_labels=2).select(range(16))
    ood_data = resolve_dataset(str(tmp_path / "ood.csv"), label_column=None).select(range(16))
    scores = st.first_step_scores(target, id_data, ood_data, max_length=16)
    heads = target.adapter.model.config.num_attention_heads
    for score in ("ood", "avg"):
        res = circuit_prune(target.adapter, list(make_text_loader(id_data, target.tokenizer, 64, 16)),
                            list(make_text_loader(ood_data, target.tokenizer, 64, 16)), Budget(remove=3),
                            score=score, heads_per_step=3)
        removed = {layer * heads + head for layer, head in res.removal_order}
        assert removed == set(torch.argsort(-scores[score], stable=True)[:3].tolist())
    s = st.TextStudy(id_validation=str(tmp_path / "validation.csv"), ood_validation={"o": str(tmp_path / "ood.csv")},
                     finetune_eval=20, max_score_samples=20, max_length=16)
    rows = st.selection_noise(target, st.study_data(s, target.tokenizer), sizes=(8,), repeats=2, top=2)
    assert [(r["n"], r["score"]) for r in rows] == [(8, "ood"), (8, "avg")]
    for r in rows:
        assert -1 <= r["spearman"] <= 1 and 0 <= r["top_jaccard"] <= 1 and r["noise_std"] >= 0
    assert "| o | 8 | CircOOD |" in st.render_selection_noise(rows)
    with pytest.raises(ValueError, match="size 16 needs 2 x 16"):
        st.selection_noise(target, st.study_data(s, target.tokenizer), sizes=(16,))


def test_msp_is_the_headline_and_other_scores_compare_with_the_same_score(tmp_path):
    """Issue 23: a row under another score is compared with the Single under that score (MI: the Single's
    best own score), and the choice is made among MSP rows only, however good another score looks."""
    s = st.TextStudy(ood_validation={"a": "x", "b": "y"})
    f = tmp_path / "cells" / "seed0" / "single.json"
    f.parent.mkdir(parents=True)
    f.write_text(json.dumps({"seed": 0, "numbers": {"accuracy": 0.8, "ece": 0.05, "ood": {
        k: {"msp": 0.60, "entropy": 0.62, "energy": 0.70} for k in "ab"}}}))
    c = st.Candidate("c", method="taylor")
    _write_cell(tmp_path, 0, c, st.ANY_FOLD, {"a": 0.65, "b": 0.65})  # every score 0.65
    rows = {r["score"]: r for r in st.collect(tmp_path, s, [c])["rows"]}
    assert rows["msp"]["gain"] == pytest.approx(0.05) and rows["entropy"]["gain"] == pytest.approx(0.03)
    assert rows["energy"]["gain"] == pytest.approx(-0.05)
    assert rows["mutual_information"]["gain"] == pytest.approx(-0.05)  # against the Single's best: energy 0.70
    better = st.Candidate("d", method="random")
    ood = {k: {"msp": 0.55, "entropy": 0.55, "energy": 0.95, "mutual_information": 0.55,
               "mutual_information_mean": 0.01, "disagreement_mean": 0.1} for k in "ab"}
    cell = tmp_path / "cells" / "seed0" / "d" / "any.json"
    cell.parent.mkdir(parents=True)
    cell.write_text(
        json.dumps(
            {
                "fusions": {
                    "average": {
                        "accuracy": 0.8,
                        "ece": 0.05,
                        "nll": 0.4,
                        "mutual_information": 0.005,
                        "disagreement": 0.05,
                        "ood": ood,
                    }
                }
            }
        )
    )
    summary = st.collect(tmp_path, s, [c, better])
    assert st.decide(summary, s)["candidate"] == "c"  # d's energy row (+0.25) is not an MSP row
    assert st.decide(summary, dataclasses.replace(s, headline_score=None))["score"] == "energy"


def test_selection_noise_script_writes_the_results_file_its_table_renders(tmp_path):
    """`study_text.py --selection-noise --results FILE`: the rows, the Single and the pinned threads in a results
    file whose view renders the same table as OUTPUT/selection_noise.md; a size the pools cannot hold is
    skipped; a second run resumes from the cached rows; bad flags fail in one line and write nothing."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    import render_docs

    single = _noise_testbed(tmp_path)
    script = Path(__file__).resolve().parents[2] / "examples" / "study_text.py"
    base = [sys.executable, str(script), "--output", str(tmp_path / "study"), "--seeds", "0", "--single",
            f"0={single}", "--id-validation", str(tmp_path / "validation.csv"), "--ood",
            f"o={tmp_path / 'ood.csv'}", "--max-length", "16", "--finetune-eval", "20", "--threads", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "2"}

    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([*base, *extra], capture_output=True, text=True, env=env, timeout=300)

    results = tmp_path / "results" / "noise.json"
    noise = ("--selection-noise", "--noise-sizes", "8", "64", "--noise-repeats", "2", "--results", str(results))
    proc = run(*noise)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(results.read_text())
    assert data["seed"] == 0 and data["single"] == str(single) and data["threads"]["torch_threads"] == 1
    assert [(r["kind"], r["n"], r["score"], r["repeats"]) for r in data["rows"]] == [("o", 8, "ood", 2),
                                                                                     ("o", 8, "avg", 2)]
    assert data["command"].startswith("python examples/study_text.py --output")
    rendered = render_docs.VIEWS["selection-noise"](data)
    table = (tmp_path / "study" / "selection_noise.md").read_text()
    assert rendered.startswith(table) and "the Single of seed 0, 2 pairs of disjoint sets per size" in rendered
    assert "skipped for o" in proc.stderr  # 2 x 64 > the 40 OOD texts
    again = run(*noise)  # resumes: the cached rows, not a new search
    assert again.returncode == 0 and json.loads(results.read_text())["rows"] == data["rows"]

    for extra, message in [(("--results", str(tmp_path / "x.json")), "add --selection-noise"),
                           (("--selection-noise", "--noise-kinds", "nope", "--results", str(tmp_path / "x.json")),
                            "--noise-kinds nope: not an OOD kind"),
                           (("--selection-noise", "--noise-sizes", "64", "--results", str(tmp_path / "x.json")),
                            "--noise-sizes 64: no size fits the pools of o"),
                           (("--selection-noise", "--noise-repeats", "0"), "'0' is not a positive whole number")]:
        proc = run(*extra)
        errors = [line for line in proc.stderr.splitlines() if "error:" in line]
        assert proc.returncode == 2 and len(errors) == 1 and message in errors[0], proc.stderr[-2000:]
        assert not (tmp_path / "x.json").exists()
