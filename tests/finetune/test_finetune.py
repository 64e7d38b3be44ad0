"""Fine-tuning members with Accelerate, then fusing (hydra_hf.finetune, `hydra-hf finetune`).

Tiny BERT (3 layers x 4 heads, 3 classes), tiny keyword data; every run takes a few seconds.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
from conftest import free_port, tiny_bert_config, write_masks, write_tiny_tokenizer
from safetensors.torch import load_file

MASKS = [[[0, 1], [1, 2], [0, 3]], [[2, 3], [0, 1], [1, 2, 3]]]  # members keep different heads
TWINS = [[[0, 1], [1, 2], [0, 3]], [[0, 1], [1, 2], [0, 3]]]  # the same heads: only the seeds differ


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """Accelerate keeps process-wide singletons; every test (and every launch) starts clean."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def _save_tiny_bert(folder: Path, dropout: float = 0.1) -> Path:
    from transformers import BertForSequenceClassification

    torch.manual_seed(0)
    config = tiny_bert_config(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    BertForSequenceClassification(config).save_pretrained(folder)
    write_tiny_tokenizer(folder)
    return folder


def _write_data(folder: Path, n_train: int = 48, n_eval: int = 21) -> tuple[Path, Path]:
    """Keyword sentiment with 3 classes (positive / negative / neutral), as csv files."""
    import pandas as pd

    rng = random.Random(0)
    words = {0: ["good", "great", "fun"], 1: ["bad", "awful", "boring"], 2: ["plot", "actor", "movie"]}
    filler = ["the", "a", "it", "was", "plot", "actor", "movie", "film"]
    rows, seen = [], set()
    while len(rows) < n_train + n_eval:
        label = len(rows) % 3
        tokens = [rng.choice(words[label])] + rng.sample(filler, rng.randint(2, 5))
        rng.shuffle(tokens)
        text = " ".join(tokens)
        if text not in seen:
            seen.add(text)
            rows.append({"text": text, "label": label})
    pd.DataFrame(rows[:n_train]).to_csv(folder / "train.csv", index=False)
    pd.DataFrame(rows[n_train:]).to_csv(folder / "eval.csv", index=False)
    return folder / "train.csv", folder / "eval.csv"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("finetune")
    train, evaluation = _write_data(root)
    return {
        "root": root,
        "model": _save_tiny_bert(root / "tiny-bert"),
        "model_nodrop": _save_tiny_bert(root / "tiny-bert-nodrop", dropout=0.0),
        "masks": write_masks(root / "masks.json", MASKS, 4),
        "twins": write_masks(root / "twins.json", TWINS, 4),
        "train": str(train),
        "eval": str(evaluation),
    }


def _config(**overrides):
    from hydra_hf.finetune import text_recipe

    values = dict(learning_rate=2e-3, batch_size=8, eval_batch_size=8, num_epochs=2, log_every_steps=1)
    values.update(overrides)
    return text_recipe(**values)


def _stock(folder: Path):
    from transformers import BertForSequenceClassification

    return BertForSequenceClassification.from_pretrained(folder).eval()


def _batch(model_dir: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    return tok(["the movie was great fun", "awful boring plot", "it was a film"], padding=True, return_tensors="pt")


# ----------------------------------------------------------------------------------- config
def test_recipes_and_config_file(tmp_path):
    from hydra_hf.finetune import FinetuneConfig, image_recipe, text_recipe

    text = text_recipe()
    assert (text.optimizer, text.learning_rate, text.weight_decay, text.warmup_ratio, text.scheduler) == (
        "adamw",
        1e-5,
        0.01,
        0.1,
        "linear",
    )
    assert (
        text.max_grad_norm,
        text.max_length,
        text.num_epochs,
        text.early_stopping_patience,
        text.freeze_embeddings,
    ) == (1.0, 128, 7, 2, True)
    image = image_recipe()
    assert (image.optimizer, image.momentum, image.scheduler, image.label_smoothing) == ("sgd", 0.9, "cosine", 0.1)

    (tmp_path / "c.yaml").write_text("recipe: image\nlearning_rate: 0.003\nmax_steps: 10\n")
    cfg = FinetuneConfig.from_file(tmp_path / "c.yaml", max_steps=20)
    # file over recipe, override over file
    assert (cfg.optimizer, cfg.learning_rate, cfg.max_steps) == ("sgd", 0.003, 20)
    (tmp_path / "c.json").write_text(json.dumps({"learning_rte": 1e-4}))
    with pytest.raises(ValueError, match="unknown settings \\['learning_rte'\\]"):
        FinetuneConfig.from_file(tmp_path / "c.json")
    with pytest.raises(ValueError, match="optimizer='adam' is unknown"):
        FinetuneConfig(optimizer="adam")
    with pytest.raises(ValueError, match="learning_rate=0 must be > 0"):
        FinetuneConfig(learning_rate=0)
    with pytest.raises(TypeError, match="batch_size must be an integer"):
        FinetuneConfig(batch_size=8.0)


# ------------------------------------------------------------------------------ member path
def test_members_finetune_and_fuse_exactly(setup, tmp_path):
    """per-member MLP: the fused model reproduces every fine-tuned member; frozen parts are untouched."""
    from transformers import AutoModelForSequenceClassification

    import hydra_hf  # noqa: F401  (registers the Auto classes)
    from hydra_hf.finetune import finetune_members

    out = finetune_members(
        setup["model"], setup["masks"], setup["train"], setup["eval"], tmp_path / "out",
        _config(mlp_fusion="per_member", num_epochs=3),
    )
    work = tmp_path / "out.work"
    base = load_file(setup["model"] / "model.safetensors")
    fused = AutoModelForSequenceClassification.from_pretrained(out).eval()
    batch = _batch(setup["model"])
    with torch.no_grad():
        member_logits = fused(**batch).member_logits  # (B, M, C)
    for m in range(2):
        folder = work / f"member_{m}" / "model"
        info = json.loads((folder / "finetune_member.json").read_text())
        losses = [h["train_loss"] for h in info["history"]]
        assert losses[-1] < losses[0], losses  # the loss decreases
        assert len(info["history"]) == 3 and info["history"][0]["eval_examples"] == 21
        weights = load_file(folder / "model.safetensors")
        for key in base:
            if ".embeddings." in key:
                assert torch.equal(weights[key], base[key]), key  # frozen: bit-identical
        assert not torch.equal(weights["classifier.weight"], base["classifier.weight"])  # trained
        assert not (tmp_path / "out.work" / f"member_{m}" / "checkpoint").exists()  # removed once done
        with torch.no_grad():
            stock = _stock(folder)(**batch).logits
        torch.testing.assert_close(member_logits[:, m], stock, atol=1e-5, rtol=1e-5)
    fused_state = load_file(out / "model.safetensors")
    assert torch.equal(
        fused_state["hydra.embeddings.word_embeddings.weight"], base["bert.embeddings.word_embeddings.weight"]
    )
    assert [meta["finetune"]["seed"] for meta in fused.config.member_metadata] == [0, 1]
    assert json.loads((out / "finetune_summary.json").read_text())["mode"] == "members"


def test_bf16_then_fp32_in_one_process(setup, tmp_path):
    """mixed_precision="bf16" fine-tunes on a CPU (autocast), and a later fp32 run in the same process
    is not refused by accelerate's process-wide state; the fp32 run equals a fresh fp32 run."""
    from hydra_hf.finetune import finetune_members

    low = finetune_members(setup["model"], setup["masks"], setup["train"], setup["eval"], tmp_path / "bf16",
                           _config(num_epochs=1, mixed_precision="bf16"))
    info = json.loads((tmp_path / "bf16.work" / "member_0" / "model" / "finetune_member.json").read_text())
    assert info["history"] and math.isfinite(info["history"][-1]["train_loss"])
    a = finetune_members(setup["model"], setup["masks"], setup["train"], setup["eval"], tmp_path / "fp32a",
                         _config(num_epochs=1, mixed_precision="no"))
    b = finetune_members(setup["model"], setup["masks"], setup["train"], setup["eval"], tmp_path / "fp32b",
                         _config(num_epochs=1, mixed_precision="no"))
    wa, wb, wl = (load_file(Path(x) / "model.safetensors") for x in (a, b, low))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not torch.equal(wa["classifier.weight"], wl["classifier.weight"])  # bf16 training differs


def test_average_mlp_fusion_is_members_with_averaged_mlp(setup, tmp_path):
    """average MLP: the fused member m is fine-tuned member m with the members' mean MLP."""
    from hydra_hf.assemble import convert_checkpoint
    from hydra_hf.finetune import finetune_members

    out = finetune_members(
        setup["model"], setup["masks"], setup["train"], None, tmp_path / "out", _config(num_epochs=1)
    )
    folders = [tmp_path / "out.work" / f"member_{m}" / "model" for m in range(2)]
    fused = convert_checkpoint(setup["masks"], members=folders, mlp_fusion="average")  # what finetune_members wrote
    saved = load_file(out / "model.safetensors")
    assert all(torch.equal(v, saved[k]) for k, v in fused.state_dict().items())
    states = [load_file(f / "model.safetensors") for f in folders]
    mlp = [k for k in states[0] if ".intermediate.dense." in k or (".output.dense." in k and "attention" not in k)]
    assert mlp and any(not torch.equal(states[0][k], states[1][k]) for k in mlp)  # the members' MLPs differ
    batch = _batch(setup["model"])
    with torch.no_grad():
        member_logits = fused(**batch).member_logits
        for m in range(2):
            stock = _stock(folders[m])
            averaged = {k: (states[0][k].double() + states[1][k].double()).div(2).float() for k in mlp}
            stock.load_state_dict({**states[m], **averaged}, strict=True)
            torch.testing.assert_close(member_logits[:, m], stock(**batch).logits, atol=1e-5, rtol=1e-5)


def test_resume_after_interruption_matches_uninterrupted_run(setup, tmp_path):
    """Interrupt the second member mid-epoch (with dropout on and gradient accumulation), resume: the
    same weights as without the interruption. Twin masks: members differ by their seeds only."""
    from hydra_hf.finetune import TrainingInterrupted, finetune_members

    config = _config(num_epochs=2, gradient_accumulation_steps=2, save_every_steps=2)  # 6 batches, 3 steps per epoch
    full = finetune_members(setup["model"], setup["twins"], setup["train"], setup["eval"], tmp_path / "full", config)

    def interrupt(info):
        if info["tag"] == "member 1" and info["step"] == 5:  # last checkpoint: step 4, 2 batches into epoch 2
            raise TrainingInterrupted("simulated crash")

    part = tmp_path / "part"
    with pytest.raises(TrainingInterrupted):
        finetune_members(
            setup["model"], setup["twins"], setup["train"], setup["eval"], part, config, step_callback=interrupt
        )
    assert not part.exists()  # nothing half-written
    state = json.loads((tmp_path / "part.work" / "member_1" / "checkpoint" / "trainer_state.json").read_text())
    assert (state["epoch"], state["batches_in_epoch"], state["global_step"]) == (1, 2, 4)
    with pytest.raises(FileExistsError, match="--resume"):
        finetune_members(setup["model"], setup["twins"], setup["train"], setup["eval"], part, config)
    resumed = finetune_members(
        setup["model"], setup["twins"], setup["train"], setup["eval"], part, config, resume=True
    )

    a, b = load_file(full / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], atol=1e-6, rtol=0, msg=key)
    for m in range(2):
        infos = [
            json.loads((w / f"member_{m}" / "model" / "finetune_member.json").read_text())
            for w in (tmp_path / "full.work", tmp_path / "part.work")
        ]
        assert infos[0]["history"] == infos[1]["history"]  # train loss (the interrupted epoch's too) and eval
    assert (tmp_path / "full.work" / "log.jsonl").read_text() == (tmp_path / "part.work" / "log.jsonl").read_text()
    m0 = load_file(tmp_path / "full.work" / "member_0" / "model" / "model.safetensors")
    m1 = load_file(tmp_path / "full.work" / "member_1" / "model" / "model.safetensors")
    assert (m0["classifier.weight"] - m1["classifier.weight"]).abs().max() > 1e-4  # seeds 0 and 1 differ


# Member 0 keeps no head in layer 1 (its one-member model has empty Q/K/V/O projections there) and
# the members' widths differ in every layer: what DDP used to stop on.
ODD_MASKS = [[[0, 1], [], [0, 3]], [[1, 2, 3], [0], [1, 2, 3]]]


def test_accelerate_launch_two_processes_match_one_process(setup, tmp_path):
    """`accelerate launch --multi_gpu --num_processes 2 -m hydra_hf.cli finetune` (2 gloo ranks) with a
    member that keeps 0 heads in a layer and unequal widths takes the same steps as 1 process with the
    same global batch (dropout off): every weight within 1e-6 of its tensor's scale (measured 1.8e-7)."""
    import os
    import subprocess
    import sys

    from hydra_hf.cli import main

    masks = write_masks(tmp_path / "odd.json", ODD_MASKS, 4)
    flags = ["finetune", "--model", str(setup["model_nodrop"]), "--masks", str(masks), "--train-data", setup["train"],
             "--eval-data", setup["eval"], "--batch-size", "8", "--eval-batch-size", "8", "--num-epochs", "2",
             "--learning-rate", "2e-3", "--max-grad-norm", "0.5", "--log-every-steps", "1"]
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
              "--main_process_port", str(free_port()), "-m", "hydra_hf.cli"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # two ranks on the CI's two cores
    done = subprocess.run(
        [*launch, *flags, "--output", str(tmp_path / "two")], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert main([*flags, "--output", str(tmp_path / "one")]) == 0

    a, b = load_file(tmp_path / "one" / "model.safetensors"), load_file(tmp_path / "two" / "model.safetensors")
    assert a.keys() == b.keys() and a["hydra.layers.1.attention.qkv_weight"].shape == (24, 32)  # member 1's one head
    for key in a:
        if a[key].numel():
            assert float((b[key] - a[key]).abs().max()) <= 1e-6 * max(float(a[key].abs().max()), 1.0), key
    base = load_file(setup["model_nodrop"] / "model.safetensors")
    assert not torch.allclose(a["classifier.weight"][0], base["classifier.weight"], atol=1e-4)  # it did train
    one_log = [json.loads(x) for x in (tmp_path / "one.work" / "log.jsonl").read_text().splitlines()]
    two_log = [json.loads(x) for x in (tmp_path / "two.work" / "log.jsonl").read_text().splitlines()]
    assert len(one_log) == len(two_log) == 4
    for x, y in zip(one_log, two_log):
        assert x["eval_examples"] == y["eval_examples"] == 21  # gather_for_metrics drops the padding duplicates
        assert x["eval_accuracy"] == y["eval_accuracy"]
        assert x["train_loss"] == pytest.approx(y["train_loss"], abs=1e-6)


# ------------------------------------------------------------------------------- fused path
def test_fused_training_is_members_in_lockstep(setup, tmp_path):
    """Per-member MLP, frozen embeddings, no clipping, plain SGD: training the fused model with lr M*eta
    (its loss is the members' mean) equals training each member alone with eta on the same batches."""
    from hydra_hf.finetune import finetune_fused, finetune_members
    from hydra_hf.masks import HeadMasks

    common = dict(
        optimizer="sgd", momentum=0.0, weight_decay=0.0, max_grad_norm=None, num_epochs=1, mlp_fusion="per_member"
    )
    fused_out = finetune_fused(setup["model_nodrop"], setup["masks"], setup["train"], None, tmp_path / "fused",
                               _config(learning_rate=0.2, **common))
    fused = load_file(fused_out / "model.safetensors")
    assert json.loads((fused_out / "finetune_summary.json").read_text())["mode"] == "fused"
    masks = HeadMasks.load(setup["masks"])
    alone = []
    for m in range(2):
        one = HeadMasks(kept_heads=[masks.kept_heads[m]], num_heads=4)  # seed + 0: the fused run's batch order
        out = finetune_members(setup["model_nodrop"], one, setup["train"], None, tmp_path / f"alone{m}",
                               _config(learning_rate=0.1, **common))
        alone.append(tmp_path / f"alone{m}.work" / "member_0" / "model")
    from hydra_hf.assemble import convert_checkpoint

    reference = convert_checkpoint(masks, members=alone, mlp_fusion="per_member").state_dict()
    base = load_file(setup["model_nodrop"] / "model.safetensors")
    assert not torch.allclose(fused["classifier.weight"][0], base["classifier.weight"], atol=1e-3)
    for key, value in reference.items():
        torch.testing.assert_close(fused[key], value, atol=2e-5, rtol=1e-4, msg=key)
    assert out is not None


# ------------------------------------------------------------------------------- bad input
def test_bad_inputs_fail_early_and_write_nothing(setup, tmp_path):
    import pandas as pd

    from hydra_hf.finetune import finetune_members

    args = (setup["model"], setup["masks"], setup["train"], setup["eval"])
    pd.DataFrame({"review": ["good"] * 10, "label": [0] * 10}).to_csv(tmp_path / "nocol.csv", index=False)
    with pytest.raises(ValueError, match="no text column 'text'.*--text-column"):
        finetune_members(setup["model"], setup["masks"], str(tmp_path / "nocol.csv"), None, tmp_path / "o1", _config())
    with pytest.raises(ValueError, match="no label column 'stars'"):
        finetune_members(*args, tmp_path / "o2", _config(label_column="stars"))
    other = write_masks(tmp_path / "other.json", [[[0], [1]]], 4)  # 2 layers: made for another model
    with pytest.raises(ValueError, match="masks are for 2 layers x 4 heads but the model"):
        finetune_members(setup["model"], other, setup["train"], None, tmp_path / "o3", _config())
    existing = tmp_path / "exists"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="--overwrite"):
        finetune_members(*args, existing, _config())
    assert [p.name for p in existing.iterdir()] == ["keep.txt"] and (existing / "keep.txt").read_text() == "mine"
    with pytest.raises(ValueError, match="labels \\[3\\] outside the model's 3 classes"):
        pd.DataFrame({"text": ["good film", "bad film"], "label": [0, 3]}).to_csv(tmp_path / "bad.csv", index=False)
        finetune_members(
            setup["model"], setup["masks"], str(tmp_path / "bad.csv"), None, tmp_path / "o4", _config(batch_size=2)
        )
    # no work dirs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv", "exists", "nocol.csv", "other.json"]


def test_cli_finetune(setup, tmp_path, capsys):
    from hydra_hf.cli import main

    (tmp_path / "settings.json").write_text(json.dumps({"learning_rate": 1e-3, "batch_size": 8, "num_epochs": 3}))
    argv = ["finetune", "--model", str(setup["model"]), "--masks", str(setup["masks"]), "--train-data", setup["train"],
            "--output", str(tmp_path / "out"), "--config", str(tmp_path / "settings.json"), "--num-epochs", "1",
            "--max-steps", "2", "--early-stopping-patience", "none", "--no-freeze-embeddings"]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed == {"output": str(tmp_path / "out"), "mode": "members"}
    saved = json.loads((tmp_path / "out.work" / "finetune_config.json").read_text())
    assert (saved["learning_rate"], saved["num_epochs"], saved["max_steps"], saved["freeze_embeddings"]) == (
        1e-3,
        1,
        2,
        False,
    )
    assert saved["early_stopping_patience"] is None
    info = json.loads((tmp_path / "out.work" / "member_0" / "model" / "finetune_member.json").read_text())
    assert info["steps"] == 2
    assert main(argv) == 2  # the output exists now
    assert "exists and is not empty" in capsys.readouterr().err


# -------------------------------------------------------------------------------------- ViT
def test_vit_members_with_the_image_recipe(tmp_path):
    """The same path for a Hugging Face ViT: image folder data, SGD + cosine + label smoothing."""
    import dataclasses

    import numpy as np
    from PIL import Image
    from transformers import (
        AutoModelForImageClassification,
        ViTConfig,
        ViTForImageClassification,
        ViTImageProcessor,
    )

    import hydra_hf  # noqa: F401
    from hydra_hf.finetune import default_recipe, finetune_members

    torch.manual_seed(0)
    config = ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=16,
                       patch_size=8, num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    base = tmp_path / "tiny-vit"
    ViTForImageClassification(config).save_pretrained(base)
    ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(base)
    rng = np.random.default_rng(0)
    for label, (name, level) in enumerate((("dark", 60), ("bright", 190))):
        (tmp_path / "images" / name).mkdir(parents=True)
        for i in range(12):
            pixels = np.clip(rng.normal(level, 40, size=(16, 16, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(tmp_path / "images" / name / f"{i}.png")
    masks = write_masks(tmp_path / "masks.json", [[[0, 1], [2, 3]], [[1, 2], [0, 3]]], 4)
    recipe = default_recipe(base)
    assert (recipe.optimizer, recipe.scheduler, recipe.label_smoothing) == ("sgd", "cosine", 0.1)
    cfg = dataclasses.replace(
        recipe, learning_rate=0.05, batch_size=8, eval_batch_size=8, num_epochs=2, mlp_fusion="per_member"
    )
    images = str(tmp_path / "images")
    out = finetune_members(base, masks, images, images, tmp_path / "out", cfg)

    fused = AutoModelForImageClassification.from_pretrained(out).eval()
    pixels = torch.rand(3, 3, 16, 16)
    with torch.no_grad():
        member_logits = fused(pixel_values=pixels).member_logits  # (B, M, C)
        for m in range(2):
            folder = tmp_path / "out.work" / f"member_{m}" / "model"
            stock = ViTForImageClassification.from_pretrained(folder).eval()
            torch.testing.assert_close(member_logits[:, m], stock(pixel_values=pixels).logits, atol=1e-5, rtol=1e-5)
    info = json.loads((tmp_path / "out.work" / "member_0" / "model" / "finetune_member.json").read_text())
    assert info["history"][0]["eval_examples"] == 24
    trained = load_file(out / "model.safetensors")
    original = load_file(base / "model.safetensors")
    assert torch.equal(trained["hydra.embeddings.cls_token"], original["vit.embeddings.cls_token"])  # frozen
