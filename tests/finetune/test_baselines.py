"""The trained baselines (hydra_hf.finetune.baselines) and their evaluation (EnsemblePredictor).

Tiny BERT (hidden 32, 2 layers x 4 heads, 3 classes), 48 keyword texts, 6-step runs.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_bert_config, write_tiny_tokenizer
from safetensors.torch import load_file


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """Accelerate keeps process-wide singletons; every run starts clean."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def _write_data(folder: Path, n_train: int = 48, n_eval: int = 15) -> tuple[str, str]:
    """Keyword sentiment with 3 classes, as csv files."""
    import pandas as pd

    rng = random.Random(0)
    words = {0: ["good", "great", "fun"], 1: ["bad", "awful", "boring"], 2: ["plot", "actor", "movie"]}
    filler = ["the", "a", "it", "was", "plot", "actor", "movie", "film"]
    rows, seen = [], set()
    while len(rows) < n_train + n_eval:
        label = len(rows) % 3
        tokens = [rng.choice(words[label])] + rng.sample(filler, rng.randint(2, 5))
        rng.shuffle(tokens)
        if (text := " ".join(tokens)) not in seen:
            seen.add(text)
            rows.append({"text": text, "label": label})
    pd.DataFrame(rows[:n_train]).to_csv(folder / "train.csv", index=False)
    pd.DataFrame(rows[n_train:]).to_csv(folder / "eval.csv", index=False)
    return str(folder / "train.csv"), str(folder / "eval.csv")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from transformers import BertForSequenceClassification, BertModel

    root = tmp_path_factory.mktemp("baselines")
    train, evaluation = _write_data(root)
    torch.manual_seed(0)
    config = tiny_bert_config(num_hidden_layers=2, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    BertForSequenceClassification(config).save_pretrained(root / "tiny-bert")
    write_tiny_tokenizer(root / "tiny-bert")
    BertModel(config, add_pooling_layer=False).save_pretrained(root / "bare")  # no classifier, no pooler
    write_tiny_tokenizer(root / "bare")
    return {"root": root, "model": root / "tiny-bert", "bare": root / "bare", "train": train, "eval": evaluation}


def _config(**overrides):
    from hydra_hf.finetune import text_recipe

    values = dict(learning_rate=2e-3, batch_size=8, eval_batch_size=16, num_epochs=1, max_steps=6, log_every_steps=1)
    values.update(overrides)
    return text_recipe(**values)


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def _batch(model_dir: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    return dict(
        tok(["the movie was great fun", "awful boring plot", "it was a film"], padding=True, return_tensors="pt")
    )


def _stock(folder: Path):
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(folder).eval()


# ------------------------------------------------------------------------------ EnsemblePredictor
def test_ensemble_predictor_is_the_mean_of_the_members_softmaxes(setup):
    from hydra_hf.evaluation import (
        EnsemblePredictor,
        ModelPredictor,
        Predictions,
        evaluate_predictors,
        interleaved_latency_ms,
        predict,
    )

    models = []
    for seed in range(3):
        torch.manual_seed(seed)
        from transformers import BertForSequenceClassification

        models.append(BertForSequenceClassification(tiny_bert_config(num_hidden_layers=2)).eval())
    batch = _batch(setup["model"])
    ensemble = EnsemblePredictor([models[0], ModelPredictor(models[1]), models[2]])
    with torch.no_grad():
        by_hand = [torch.softmax(m(**batch).logits.double(), -1) for m in models]  # 3 x (B, C)
    preds = predict(ensemble, [{**batch, "labels": torch.tensor([0, 1, 2])}])
    assert preds.member_logits.shape == (3, 3, 3)  # (B, M, C)
    torch.testing.assert_close(preds.probs, torch.stack(by_hand).mean(0), atol=1e-6, rtol=0)
    assert not torch.allclose(by_hand[0], by_hand[1])  # the members really differ: the mean is not one of them
    assert preds.member_probs.shape[1] == 3 and isinstance(preds, Predictions)
    assert ensemble.num_parameters() == 3 * sum(p.numel() for p in models[0].parameters())
    # the members run one after another, each once per batch (a timing comparison here failed on a loaded
    # machine: speed belongs in bench/, the order of the calls is what the predictor promises)
    calls = []
    hooks = [m.register_forward_hook(lambda mod, args, out, i=i: calls.append(i)) for i, m in enumerate(models)]
    with torch.no_grad():
        ensemble.member_logits(batch)
    for hook in hooks:
        hook.remove()
    assert calls == [0, 1, 2]
    one, three = interleaved_latency_ms([ModelPredictor(models[0]), ensemble], batch, rounds=3)
    assert one > 0 and three > 0
    result = evaluate_predictors({"Single": ModelPredictor(models[0]), "Deep Ensemble": ensemble},
                                 [{**batch, "labels": torch.tensor([0, 1, 2])}], {"ood": [batch]}, latency_batch=batch)
    single_row, ensemble_row = result.rows
    assert (single_row["members"], ensemble_row["members"]) == (1, 3)
    assert ensemble_row["params_m"] == pytest.approx(3 * single_row["params_m"])
    assert ensemble_row["mutual_information"] > 0 and ensemble_row["latency_ms"] > 0
    assert len(EnsemblePredictor(torch.nn.ModuleList(models)).members) == 3
    with pytest.raises(ValueError, match="at least one"):
        EnsemblePredictor([])
    with pytest.raises(TypeError, match="list of models"):
        EnsemblePredictor(models[0])


# ---------------------------------------------------------------------------------- deep ensembles
def test_deep_ensemble_members_differ_and_member0_is_the_single_model(setup, tmp_path):
    from hydra_hf.finetune import finetune_members
    from hydra_hf.finetune.baselines import all_heads_masks, train_deep_ensemble

    config = _config()
    finetune_members(
        setup["model"],
        all_heads_masks(setup["model"]),
        setup["train"],
        setup["eval"],
        tmp_path / "single",
        config,
        work_dir=tmp_path / "single.work",
    )
    single = tmp_path / "single.work" / "member_0" / "model"
    folders = train_deep_ensemble(setup["model"], setup["train"], setup["eval"], tmp_path / "de", config, members=2)
    assert folders == [tmp_path / "de" / f"member_{m}" / "model" for m in range(2)]
    assert not (tmp_path / "de.fused").exists()  # the members are not fused
    single_w, w0, w1, base = _weights(single), _weights(folders[0]), _weights(folders[1]), _weights(setup["model"])
    assert single_w.keys() == w0.keys() == w1.keys()
    for name in single_w:  # member 0 (seed 0) is the Single model, weight for weight
        torch.testing.assert_close(w0[name], single_w[name], atol=0, rtol=0)
    trained = [n for n in w0 if not torch.equal(w0[n], base[n])]
    assert "classifier.weight" in trained and any(".attention.self.query." in n for n in trained)
    assert all(not n.startswith("bert.embeddings.") for n in trained)  # the recipe's frozen embeddings
    differ = [n for n in trained if not torch.allclose(w0[n], w1[n])]
    assert len(differ) > len(trained) // 2  # seed 1: another data order and dropout
    assert json.loads((folders[1] / "finetune_member.json").read_text())["seed"] == 1

    # reuse the Single as member 0: only member 1 is trained, and it is the member 1 trained above
    reused = train_deep_ensemble(setup["model"], setup["train"], setup["eval"], tmp_path / "de2", config, members=2,
                                 reuse_member0=single)
    assert reused[0] == single and not (tmp_path / "de2" / "member_0").exists()
    w1_again = _weights(reused[1])
    for name in w1:
        torch.testing.assert_close(w1_again[name], w1[name], atol=0, rtol=0)
    with pytest.raises(ValueError, match="seed 0"):  # member 0 of a seed-5 ensemble is not this Single
        train_deep_ensemble(setup["model"], setup["train"], setup["eval"], tmp_path / "de3", _config(seed=5),
                            members=2, reuse_member0=single)
    with pytest.raises(ValueError, match="other settings"):
        train_deep_ensemble(
            setup["model"],
            setup["train"],
            setup["eval"],
            tmp_path / "de4",
            _config(learning_rate=1e-3),
            members=2,
            reuse_member0=single,
        )


# ------------------------------------------------------------------------------------------- LoRA
def test_lora_trains_adapters_and_head_only_and_merges_exactly(setup, tmp_path):
    pytest.importorskip("peft")  # a guard only: tools/bootstrap.sh installs the peft extra
    from peft import PeftModel

    from hydra_hf.finetune.baselines import ADAPTER_DIR, LORA_INFO, train_lora

    out = train_lora(setup["model"], setup["train"], setup["eval"], tmp_path / "lora", _config(), seed=0, r=4, alpha=8)
    info = json.loads((out / LORA_INFO).read_text())
    assert info["steps"] == 6 and info["modules_to_save"] == ["classifier"]
    base = _stock(setup["model"])
    # the adapter on the untouched base, as peft loads it: its base weights are the checkpoint's
    unmerged = PeftModel.from_pretrained(_stock(setup["model"]), out / ADAPTER_DIR).eval()
    trained = {n: p for n, p in unmerged.named_parameters() if "lora_" in n or "modules_to_save" in n}
    assert trained and all(p.abs().sum() > 0 for n, p in trained.items() if "lora_B" in n)  # B starts at 0: trained
    base_state = base.state_dict()
    for name, param in unmerged.get_base_model().state_dict().items():
        if "lora_" in name or "modules_to_save" in name:
            continue
        plain = name.replace("base_layer.", "").replace("original_module.", "")
        torch.testing.assert_close(param, base_state[plain], atol=0, rtol=0)  # base weights unchanged before merge
    assert info["trainable_parameters"] == sum(p.numel() for p in trained.values())
    assert info["trainable_parameters"] < 0.2 * info["base_parameters"]
    # the merged stock checkpoint gives the unmerged model's logits, and they are not the base model's
    merged = _stock(out)
    assert type(merged).__name__ == "BertForSequenceClassification"
    batch = _batch(setup["model"])
    with torch.no_grad():
        got, want, before = merged(**batch).logits, unmerged(**batch).logits, base(**batch).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert (got - before).abs().max() > 1e-3
    assert info["merge_max_abs_diff"] <= 1e-5
    merged_w, base_w = _weights(out), _weights(setup["model"])
    changed = sorted(n for n in merged_w if not torch.equal(merged_w[n], base_w[n]))
    assert set(changed) <= {n for n in merged_w if n.startswith("classifier.") or ".attention.self.query." in n
                            or ".attention.self.value." in n}
    assert any(".attention.self.query.weight" in n for n in changed) and "classifier.weight" in changed


def test_lora_trains_in_bf16_mixed_precision(setup, tmp_path):
    """`make demo` trains in bf16 on CPUs with native bf16: LoRA under CPU autocast trains, merges, and
    its merged checkpoint reproduces the unmerged adapter."""
    pytest.importorskip("peft")
    from hydra_hf.finetune.baselines import LORA_INFO, train_lora

    out = train_lora(setup["model"], setup["train"], setup["eval"], tmp_path / "lora", _config(mixed_precision="bf16"),
                     seed=0, r=4, alpha=8)
    info = json.loads((out / LORA_INFO).read_text())
    assert info["steps"] == 6 and info["merge_max_abs_diff"] <= 1e-5
    merged_w, base_w = _weights(out), _weights(setup["model"])
    assert not torch.equal(merged_w["classifier.weight"], base_w["classifier.weight"])


def test_lora_ensemble_from_a_bare_encoder(setup, tmp_path):
    pytest.importorskip("peft")  # a guard only: tools/bootstrap.sh installs the peft extra
    from hydra_hf.finetune.baselines import LORA_INFO, train_lora_ensemble

    config = _config(max_steps=3)
    folders = train_lora_ensemble(setup["bare"], setup["train"], setup["eval"], tmp_path / "le", config, members=2,
                                  id2label={0: "pos", 1: "neg", 2: "neutral"})
    infos = [json.loads((f / LORA_INFO).read_text()) for f in folders]
    assert [i["seed"] for i in infos] == [0, 1]
    assert infos[0]["modules_to_save"] == ["classifier", "bert.pooler.dense"]  # the head and the missing pooler
    models = [_stock(f) for f in folders]
    assert models[0].config.id2label == {0: "pos", 1: "neg", 2: "neutral"}
    w0, w1 = _weights(folders[0]), _weights(folders[1])
    assert not torch.allclose(w0["classifier.weight"], w1["classifier.weight"])  # own seeds: own initialisation
    batch = _batch(setup["bare"])
    with torch.no_grad():
        assert not torch.allclose(models[0](**batch).logits, models[1](**batch).logits)
    mtime = (folders[0] / "model.safetensors").stat().st_mtime_ns
    again = train_lora_ensemble(setup["bare"], setup["train"], setup["eval"], tmp_path / "le", config, members=2,
                                id2label={0: "pos", 1: "neg", 2: "neutral"})
    assert again == folders and (folders[0] / "model.safetensors").stat().st_mtime_ns == mtime  # kept, not retrained


def test_missing_peft_is_a_one_line_error(setup, tmp_path, monkeypatch):
    from hydra_hf.errors import HydraInputError
    from hydra_hf.finetune.baselines import train_lora

    monkeypatch.setitem(sys.modules, "peft", None)  # `import peft` raises ImportError
    with pytest.raises(HydraInputError) as info:
        train_lora(setup["model"], setup["train"], setup["eval"], tmp_path / "lora", _config())
    assert "pip install hydra-hf[peft]" in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "lora").exists()
