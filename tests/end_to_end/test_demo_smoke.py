"""A smoke run of the demo pipeline (`make demo`) on a tiny configuration: every stage runs, the
report is complete, and the Hub folder loads in a fresh process with the same predictions."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from hydra_hf.recipes import TextPipeline, run_text_pipeline

POS = "good great fun very".split()
NEG = "bad awful boring not".split()
NEUTRAL = "the a movie film plot actor it was is and".split()


def _reviews(n: int, seed: int) -> pd.DataFrame:
    g = torch.Generator().manual_seed(seed)
    texts, labels = [], []
    for i in range(n):
        label = i % 2
        words = [NEUTRAL[int(j)] for j in torch.randint(0, len(NEUTRAL), (4,), generator=g)]
        cue = POS if label else NEG
        words += [cue[int(j)] for j in torch.randint(0, 4, (2,), generator=g)]
        order = torch.randperm(len(words), generator=g).tolist()
        texts.append(" ".join(words[k] for k in order))
        labels.append(label)
    return pd.DataFrame({"text": texts, "label": labels})


def test_text_pipeline_smoke(tmp_path, tiny_bert_dir, monkeypatch):
    from conftest import tiny_bert_config, write_tiny_tokenizer
    from transformers import BertForSequenceClassification

    base = tmp_path / "base"
    torch.manual_seed(0)
    BertForSequenceClassification(tiny_bert_config(num_labels=2, initializer_range=0.02)).save_pretrained(base)
    write_tiny_tokenizer(base)
    for split, n, seed in (("train", 96, 0), ("validation", 32, 1), ("test", 32, 2)):
        _reviews(n, seed).to_csv(tmp_path / f"{split}.csv", index=False)
    for name in ("ood_val", "ood_a", "ood_b"):
        pd.DataFrame({"text": [f"{'x y z' if name != 'ood_b' else 'q r s'} {i % 7}" for i in range(24)]}).to_csv(
            tmp_path / f"{name}.csv", index=False)
    p = TextPipeline(
        base_model=str(base), train_data=str(tmp_path / "train.csv"), validation_data=str(tmp_path / "validation.csv"),
        test_data=str(tmp_path / "test.csv"), ood_validation_data=str(tmp_path / "ood_val.csv"),
        ood_test_data={"a": str(tmp_path / "ood_a.csv"), "b": str(tmp_path / "ood_b.csv")},
        members=2, remove=4, heads_per_step=2, prune_samples=16, max_length=16, batch_size=16,
        learning_rate=1e-3, single_steps=6, member_steps=4, max_train_samples=96, max_validation_samples=32,
        max_test_samples=32, max_ood_samples=24, mc_samples=3, ensemble_heads=2, lora_baselines=True, bootstrap=50,
        ood_score="mutual_information",
    )
    monkeypatch.chdir(tmp_path)
    result = run_text_pipeline(p, "run")  # a relative output folder, as `make demo` passes
    out = tmp_path / "run"
    for stage in ("single", "masks.json", "hydra", "report/report.json", "report/reliability.png",
                  "report/ood_scores.png", "hub/README.md", "hub/config.json", "timings.json"):
        assert (out / stage).exists(), stage
    masks = json.loads((out / "masks.json").read_text())
    assert len(masks["members"]) == 2 and masks["members"][0]["kept_heads"] != masks["members"][1]["kept_heads"]
    removed = sum(4 - len(h) for h in masks["members"][0]["kept_heads"])
    assert removed == 4
    methods = [r["method"] for r in result.report["rows"]]
    assert methods[0].startswith("Hydra") and "Single" in methods and "MC Dropout" in methods
    assert any(m.startswith("Deep Ensembles") for m in methods) and "Single + TS" in methods
    # the int8 ONNX Runtime export of Hydra is one more row, close to the fp32 Hydra row
    rows = {r["method"]: r for r in result.report["rows"]}
    int8 = rows["Hydra int8 (ONNX Runtime, M=2)"]
    assert (out / "onnx" / "model_int8.onnx").is_file() and (out / "onnx" / "quantization_report.json").is_file()
    assert abs(int8["accuracy"] - rows[methods[0]]["accuracy"]) <= 0.1 and int8["nll"] > 0
    for row in result.report["rows"]:
        assert 0.0 <= row["accuracy"] <= 1.0 and 0.0 <= row["a"]["auroc"] <= 1.0
    # the downstream baselines: the Deep Ensemble (the Single is member 0) and LoRA, as M-model ensembles
    de, lora_ens = rows["Deep Ensemble (M=2)"], rows["LoRA-Ensemble (M=2)"]
    assert de["members"] == 2 and de["params_m"] == pytest.approx(2 * rows["Single"]["params_m"])
    assert lora_ens["members"] == 2 and rows["LoRA-Single"]["members"] == 1
    assert (out / "deep_ensemble" / "member_1" / "model" / "config.json").is_file()
    assert not (out / "deep_ensemble" / "member_0").exists()  # member 0 is the Single, not trained twice
    # the Hydra rows use the chosen OOD score, the baselines MSP; paired intervals against Single and the Deep Ensemble
    assert rows[methods[0]]["ood_score"] == "mutual_information" and rows["Single"]["ood_score"] == "msp"
    # issue 23: every extra score is a Hydra row and a Single row under that same score
    extra_hydra, extra_single = rows[f"{methods[0]} [energy]"], rows["Single [energy]"]
    assert extra_hydra["ood_score"] == extra_single["ood_score"] == "energy"
    assert (
        extra_single["accuracy"] == rows["Single"]["accuracy"]
        and extra_hydra["accuracy"] == rows[methods[0]]["accuracy"]
    )
    assert set(result.report["comparisons"]) == {f"{methods[0]} − Single", f"{methods[0]} − Deep Ensemble (M=2)"}
    assert result.report["comparisons"][f"{methods[0]} − Single"]["a.auroc"]["verdict"] in ("better", "worse", "tie")
    card = (out / "hub" / "README.md").read_text()
    assert "Paired differences" in card and f"{methods[0]} − Single" in card
    assert result.hub_check["max_abs_prob_diff"] < 1e-4
    hydra_cfg = json.loads((out / "hydra" / "config.json").read_text())
    assert hydra_cfg["num_members"] == 2 and hydra_cfg["kept_heads"] == [m["kept_heads"] for m in masks["members"]]
    # resume keeps finished stages (no re-training: the fused weights are untouched)
    before = (out / "hydra" / "model.safetensors").read_bytes()
    run_text_pipeline(p, out, resume=True)
    assert (out / "hydra" / "model.safetensors").read_bytes() == before
