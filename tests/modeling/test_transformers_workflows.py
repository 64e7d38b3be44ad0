"""A Hydra model through everything a Hugging Face user does with a model (issue 12, items 1-3): the four
save paths (``save_pretrained``, ``push_to_hub``, ``Trainer.save_model``, Trainer checkpoints) from a
model loaded as remote code and from one built with hydra_hf imported, ``Trainer.predict`` /
``evaluate`` as in the tutorials, gradient checkpointing, ``torch.compile`` / ``torch.export`` and
``output_attentions`` with sdpa; for BERT, ViT and CLIP. Also runs the snippets of docs/transformers.md."""

from __future__ import annotations

import functools
import json
import logging
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO, run_fresh_python, tiny_bert_config, write_tiny_tokenizer
from safetensors.torch import load_file, save_file
from transformers import (
    BertModel,
    CLIPConfig,
    CLIPImageProcessor,
    CLIPModel,
    CLIPProcessor,
    CLIPTokenizer,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    ViTConfig,
    ViTImageProcessor,
)

import hydra_hf  # noqa: F401  (registration: the hydra_hf-imported side of every test)
from hydra_hf.modeling.configuration_hydra import HydraEnsembleConfig, custom_pipelines_for
from hydra_hf.modeling.configuration_hydra_clip import HydraEnsembleCLIPConfig
from hydra_hf.modeling.configuration_hydra_vit import HydraEnsembleViTConfig
from hydra_hf.modeling.modeling_hydra_bert import HydraEnsembleForSequenceClassification
from hydra_hf.modeling.modeling_hydra_clip import HydraEnsembleCLIPModel
from hydra_hf.modeling.modeling_hydra_vit import HydraEnsembleForImageClassification
from hydra_hf.saving import SHIPPED, save_hydra_model

ATOL = 1e-5
FAMILIES = ("bert", "vit", "clip")
KEPT = [[[0, 1], [2, 3], [1]], [[1, 2, 3], [0], []], [[0], [0, 1, 2, 3], [0, 2]]]  # unequal, a 0-head member layer
TEXT_KEPT = [[[0, 1], []], [[3], [0, 1]], [[0, 2], [1, 2, 3]]]
SENTENCES = ["the movie was very good", "bad", "a boring plot and awful actor"]
LABELS = [2, 0, 1]
# The Auto class a user loads each family with, and the inputs its model takes.
AUTO_CLASS = {
    "bert": "AutoModelForSequenceClassification",
    "vit": "AutoModelForImageClassification",
    "clip": "AutoModel",
}
OUTPUT_KEY = {"bert": "logits", "vit": "logits", "clip": "logits_per_image"}


# ------------------------------------------------------------------------------------- tiny models
def _clip_tokenizer(max_length: int = 32) -> CLIPTokenizer:
    """A byte-level CLIP tokenizer without merges (514 tokens), built offline."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    chars = list(bytes_to_unicode().values())
    vocab = {c: i for i, c in enumerate(chars)} | {f"{c}</w>": len(chars) + i for i, c in enumerate(chars)}
    vocab |= {"<|startoftext|>": 512, "<|endoftext|>": 513}
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=max_length)


def _perturb(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # biases, LayerNorms and members that really differ
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model


def tiny_hydra(family: str, seed: int = 0, kept=KEPT):
    """A Hydra model of ``family`` built with hydra_hf's classes (random weights, members differ)."""
    torch.manual_seed(seed)
    if family == "bert":
        config = HydraEnsembleConfig(base_config=tiny_bert_config().to_dict(), kept_heads=kept, num_labels=3)
        model = HydraEnsembleForSequenceClassification(config)
    elif family == "vit":
        base = ViTConfig(
            hidden_size=32,
            num_hidden_layers=3,
            num_attention_heads=4,
            intermediate_size=64,
            image_size=16,
            patch_size=8,
            initializer_range=0.2,
        )  # dropout 0.1 (the ViT defaults are 0)
        base.hidden_dropout_prob = base.attention_probs_dropout_prob = 0.1
        config = HydraEnsembleViTConfig(base_config=base.to_dict(), kept_heads=kept, num_labels=3,
                                        id2label={0: "cat", 1: "dog", 2: "bird"})
        model = HydraEnsembleForImageClassification(config)
    else:
        base = CLIPConfig(
            text_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                             vocab_size=514, max_position_embeddings=32, bos_token_id=512, eos_token_id=513,
                             pad_token_id=513),
            vision_config=dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
                               image_size=16, patch_size=8),
            projection_dim=24,
        )
        config = HydraEnsembleCLIPConfig(base_config=base.to_dict(), vision_kept_heads=kept, text_kept_heads=TEXT_KEPT)
        model = HydraEnsembleCLIPModel(config)
    return _perturb(model, seed).eval()


def save_preprocessor(family: str, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if family == "bert":
        write_tiny_tokenizer(folder)
    elif family == "vit":
        ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(folder)
    else:
        image_processor = CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
        CLIPProcessor(image_processor=image_processor, tokenizer=_clip_tokenizer()).save_pretrained(folder)


def make_inputs(family: str, folder: Path) -> dict[str, torch.Tensor]:
    """Model inputs of 3 examples (text padded: the masks mask something), from ``folder``'s preprocessor."""
    from transformers import AutoTokenizer

    pixels = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    if family == "vit":
        return {"pixel_values": pixels}
    tok = AutoTokenizer.from_pretrained(folder)
    enc = dict(
        tok(SENTENCES if family == "bert" else ["a cat", "a dog is here", "x"], padding=True, return_tensors="pt")
    )
    assert (enc["attention_mask"] == 0).any()
    return enc if family == "bert" else {**enc, "pixel_values": pixels}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """Per family: ``d0`` (save_hydra_model: the folder a Hub user downloads) with its preprocessor, and
    ``inputs.safetensors`` (the same inputs in every process)."""
    out = {}
    for family in FAMILIES:
        root = tmp_path_factory.mktemp(family)
        save_preprocessor(family, root / "prep")
        save_hydra_model(tiny_hydra(family), root / "d0", preprocessor_from=root / "prep")
        save_file(make_inputs(family, root / "prep"), str(root / "inputs.safetensors"))
        out[family] = root
    return out


def expected_outputs(model, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        out = model.eval()(**inputs)
    return out["logits_per_image" if "logits_per_image" in out else "logits"]


# ----------------------------------------------------------------------------------- 1. saving
def check_saved_folder(folder: Path, family: str) -> None:
    """Every shipped file, byte for byte, and a config that names them (auto_map, custom_pipelines)."""
    names = {p.name for p in folder.iterdir() if p.is_file()}
    shipped = SHIPPED[family]["files"]
    assert {"config.json", "model.safetensors", "pipeline_hydra.py", *shipped} <= names, (folder, sorted(names))
    for name in shipped:
        assert (folder / name).read_bytes() == (REPO / "src/hydra_hf/modeling" / name).read_bytes(), name
    config = json.loads((folder / "config.json").read_text())
    assert config["auto_map"] == SHIPPED[family]["auto_map"]
    assert not any("hydra_hf" in ref for ref in config["auto_map"].values())
    assert config["custom_pipelines"] == custom_pipelines_for(config["auto_map"]) != {}


# the Trainer runs of the save tests: one step at learning rate 0 (the weights stay those of d0) that
# writes checkpoint-1, then save_model; used in this process and, as source text, in the fresh one
TRAINER_SAVES = '''
def trainer_saves(model, family, inputs, processor, out_dir):
    from transformers import Trainer, TrainingArguments, default_data_collator

    n = next(iter(inputs.values())).shape[0]
    rows = [{k: v[i] for k, v in inputs.items()} for i in range(n)]
    if family != "clip":
        rows = [{**row, "labels": torch.tensor(label)} for row, label in zip(rows, [2, 0, 1])]
    collate = default_data_collator
    if family == "clip":
        collate = lambda f: {**default_data_collator(f), "return_loss": True}  # noqa: E731
    args = TrainingArguments(
        output_dir=str(out_dir / "checkpoints"), max_steps=1, save_strategy="steps", save_steps=1,
        learning_rate=0.0, per_device_train_batch_size=n, report_to=[], use_cpu=True, disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=rows, data_collator=collate, processing_class=processor)
    trainer.train()
    trainer.save_model(str(out_dir / "save_model"))
    return [out_dir / "checkpoints" / "checkpoint-1", out_dir / "save_model"]
'''
exec(TRAINER_SAVES)  # defines trainer_saves (the same code runs in the fresh process below)

PREPROCESSOR_LOADER = {"bert": "AutoTokenizer", "vit": "AutoImageProcessor", "clip": "AutoProcessor"}

REMOTE_SAVES = '''
import shutil, sys, types
from pathlib import Path
import torch
import transformers.utils.hub as hf_hub
from safetensors.torch import load_file
from transformers import {auto}, {loader}

src, out, family = Path({src!r}), Path({out!r}), {family!r}
model = {auto}.from_pretrained(src, trust_remote_code=True)
assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
model.save_pretrained(out / "save_pretrained")

class UploadToFolder:  # transformers' push_to_hub saves into a temporary folder, then uploads: here, a copy
    def create_repo(self, repo_id, **kwargs):
        return types.SimpleNamespace(repo_id=repo_id)

    def create_commit(self, repo_id, operations, **kwargs):
        (out / "push_to_hub").mkdir(parents=True)
        for op in operations:
            shutil.copyfile(op.path_or_fileobj, out / "push_to_hub" / op.path_in_repo)

hf_hub.hf_api = UploadToFolder
hf_hub.create_and_tag_model_card = lambda *args, **kwargs: types.SimpleNamespace(save=lambda path: None)
model.push_to_hub("me/hydra")
{trainer_saves}
trainer_saves(model, family, load_file({inputs!r}), {loader}.from_pretrained(src), out)
assert sys.modules.get("hydra_hf") is None
'''

REMOTE_LOADS = '''
import json, sys
import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file
from transformers import {auto}, pipeline

inputs = load_file({inputs!r})
image = Image.fromarray((np.random.default_rng(0).random((20, 24, 3)) * 255).astype("uint8"))
result = {{}}
for folder in {folders!r}:
    model = {auto}.from_pretrained(folder, trust_remote_code=True).eval()
    with torch.no_grad():
        logits = model(**inputs)[{key!r}]
    pipe = pipeline(model=folder, trust_remote_code=True)  # the task: config.custom_pipelines
    if {family!r} == "clip":
        pred = pipe(image, candidate_labels=["cat", "dog"])
    else:
        pred = pipe(image if {family!r} == "vit" else "good")
    result[folder] = {{"logits": logits.tolist(), "pipeline": type(pipe).__name__, "keys": sorted(pred)}}
assert sys.modules.get("hydra_hf") is None
print(json.dumps(result))
'''


def _with_preprocessor(folder: Path, source: Path) -> Path:
    """What a user does next to ``model.save_pretrained``: save the tokenizer / processor too."""
    for f in source.iterdir():
        if (
            f.is_file()
            and not f.name.endswith((".py", ".safetensors"))
            and f.name not in ("config.json",)
            and not f.name.startswith(".")
        ):
            if not (folder / f.name).exists():
                shutil.copyfile(f, folder / f.name)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_every_save_path_keeps_the_code(family, folders, tmp_path):
    """save_pretrained, push_to_hub, Trainer.save_model and a Trainer checkpoint, from a model loaded as
    remote code (fresh process, hydra_hf not importable) and from one built with hydra_hf imported,
    write every shipped file; each folder loads in a fresh process without hydra_hf, gives the same
    outputs, and its `pipeline(model=folder, trust_remote_code=True)` is the Hydra pipeline."""
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

    root = folders[family]
    inputs = load_file(str(root / "inputs.safetensors"))
    model = tiny_hydra(family)
    expected = expected_outputs(model, inputs)
    loader = {"bert": AutoTokenizer, "vit": AutoImageProcessor, "clip": AutoProcessor}[family]

    # hydra_hf imported: the classes of hydra_hf.modeling (module names hydra_hf.modeling.*)
    assert type(model).__module__.startswith("hydra_hf.modeling.")
    local = tmp_path / "local"
    model.save_pretrained(local / "save_pretrained")
    saves = trainer_saves(model, family, inputs, loader.from_pretrained(root / "d0"), local)  # noqa: F821 (exec above)
    local_saved = [local / "save_pretrained", *saves]

    # remote code: transformers_modules.* classes, in a process where hydra_hf cannot be imported
    remote = tmp_path / "remote"
    modules = {"HF_MODULES_CACHE": str(tmp_path / "modules")}
    run_fresh_python(
        REMOTE_SAVES.format(
            auto=AUTO_CLASS[family],
            loader=PREPROCESSOR_LOADER[family],
            src=str(root / "d0"),
            out=str(remote),
            family=family,
            inputs=str(root / "inputs.safetensors"),
            trainer_saves=TRAINER_SAVES,
        ),
        env=modules,
    )
    remote_saved = [remote / "save_pretrained", remote / "push_to_hub", remote / "checkpoints" / "checkpoint-1",
                    remote / "save_model"]

    saved = local_saved + remote_saved
    for folder in saved:
        check_saved_folder(folder, family)
        _with_preprocessor(folder, root / "d0")
    stdout = run_fresh_python(
        REMOTE_LOADS.format(
            auto=AUTO_CLASS[family],
            inputs=str(root / "inputs.safetensors"),
            folders=[str(f) for f in saved],
            key=OUTPUT_KEY[family],
            family=family,
        ),
        env=modules,
    )
    result = json.loads(stdout.strip().splitlines()[-1])
    for folder in saved:
        got = result[str(folder)]
        torch.testing.assert_close(torch.tensor(got["logits"]), expected, atol=ATOL, rtol=0)
        assert got["pipeline"].startswith("Hydra") and got["pipeline"].endswith("ClassificationPipeline"), got
        assert {"label", "score", "uncertainty", "member_scores"} <= set(got["keys"]), got


@pytest.mark.slow
def test_push_to_hub_with_hydra_hf_imported_stages_a_complete_repository(folders, tmp_path):
    """With hydra_hf imported, ``model.push_to_hub`` is hydra_hf's (docs/hub.md): its dry run stages and
    validates (fresh process) the repository that save_pretrained writes."""
    model = tiny_hydra("bert")
    result = model.push_to_hub("me/hydra", dry_run=True, staging_dir=tmp_path / "staged",
                               preprocessor_from=folders["bert"] / "prep")
    check_saved_folder(tmp_path / "staged", "bert")
    assert "README.md" in result.files


def test_config_names_every_head_and_pipeline_by_default():
    """A config built from scratch (no auto_map given) names the family's classes and pipeline; entries
    given explicitly (code kept in another repository) win."""
    for family, cls in (
        ("bert", HydraEnsembleConfig),
        ("vit", HydraEnsembleViTConfig),
        ("clip", HydraEnsembleCLIPConfig),
    ):
        config = tiny_hydra(family).config
        assert isinstance(config, cls) and config.auto_map == SHIPPED[family]["auto_map"]
        assert config.to_dict()["custom_pipelines"] == custom_pipelines_for(config.auto_map)
    other = {"AutoModel": "org/code--modeling_hydra_bert.HydraEnsembleModel"}
    config = HydraEnsembleConfig(base_config=tiny_bert_config().to_dict(), kept_heads=KEPT, auto_map=other)
    assert config.auto_map["AutoModel"] == other["AutoModel"]
    assert config.auto_map["AutoConfig"] == "configuration_hydra.HydraEnsembleConfig"


def test_save_pretrained_with_hydra_hf_imported_writes_the_code(tmp_path):
    """The quick version of the save test (no fresh process): the regression of issue 12's first row."""
    model = tiny_hydra("bert")
    model.save_pretrained(tmp_path / "d")
    check_saved_folder(tmp_path / "d", "bert")


def test_registered_pipeline_builds_from_a_model_object(folders):
    """With hydra_hf imported, the uncertainty pipelines are registered tasks (transformers'
    PIPELINE_REGISTRY), so they build from an in-memory model."""
    from transformers import AutoTokenizer, pipeline

    pipe = pipeline("hydra-text-classification", model=tiny_hydra("bert"),
                    tokenizer=AutoTokenizer.from_pretrained(folders["bert"] / "prep"))
    assert type(pipe).__name__ == "HydraTextClassificationPipeline"
    assert len(pipe("a good film")["member_scores"]) == 3


# ---------------------------------------------------------------------------------- 2. Trainer
def _dataset(family: str, folders) -> list[dict[str, torch.Tensor]]:
    inputs = load_file(str(folders[family] / "inputs.safetensors"))
    rows = [{k: v[i] for k, v in inputs.items()} for i in range(3)]
    if family != "clip":
        rows = [{**row, "labels": torch.tensor(label)} for row, label in zip(rows, LABELS)]
    return rows


def _collator(family: str):
    from transformers import default_data_collator

    if family == "clip":
        return lambda features: {**default_data_collator(features), "return_loss": True}
    return default_data_collator


def _args(tmp_path, **overrides) -> TrainingArguments:
    kwargs = dict(output_dir=str(tmp_path / "trainer"), per_device_train_batch_size=3, per_device_eval_batch_size=2,
                  report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no", seed=0)
    return TrainingArguments(**{**kwargs, **overrides})


def compute_metrics(eval_pred):
    """The transformers text-classification tutorial's, with numpy's accuracy (offline)."""
    predictions, labels = eval_pred
    predictions = np.argmax(predictions, axis=1)
    return {"accuracy": float((predictions == labels).mean())}


@pytest.mark.parametrize("family", ["bert", "vit"])
def test_trainer_predict_and_evaluate_as_in_the_tutorial(family, folders, tmp_path):
    model = tiny_hydra(family)
    rows = _dataset(family, folders)
    inputs = {k: torch.stack([r[k] for r in rows]) for k in rows[0] if k != "labels"}
    with torch.no_grad():
        out = model(**inputs)
    trainer = Trainer(model=model, args=_args(tmp_path), eval_dataset=rows, compute_metrics=compute_metrics)
    pred = trainer.predict(rows)  # two batches: concatenated
    assert isinstance(pred.predictions, np.ndarray) and pred.predictions.shape == (3, 3)
    torch.testing.assert_close(torch.from_numpy(pred.predictions), out.logits, atol=ATOL, rtol=0)
    accuracy = float((out.logits.argmax(-1) == torch.tensor(LABELS)).float().mean())
    assert pred.metrics["test_accuracy"] == pytest.approx(accuracy)
    assert trainer.evaluate()["eval_accuracy"] == pytest.approx(accuracy)
    # the members: ignore nothing (predictions are then a tuple, which the tutorial's compute_metrics does not take)
    trainer.compute_metrics = None
    logits, member_logits = trainer.predict(rows, ignore_keys=[]).predictions
    torch.testing.assert_close(torch.from_numpy(member_logits), out.member_logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(torch.from_numpy(logits), out.logits, atol=ATOL, rtol=0)


def test_trainer_predict_clip_mirrors_stock_clip(folders, tmp_path):
    """A stock CLIPModel's predictions are (logits_per_image, logits_per_text, text_embeds, image_embeds,
    text_model_output, vision_model_output); a Hydra CLIP model's have the same entries, members left out."""
    model = tiny_hydra("clip")
    rows = _dataset("clip", folders)
    args = _args(tmp_path, per_device_eval_batch_size=3)
    pred = Trainer(model=model, args=args, data_collator=_collator("clip")).predict(rows)
    stock_config = CLIPConfig.from_dict(model.config.base_config)
    stock = Trainer(model=CLIPModel(stock_config), args=args, data_collator=_collator("clip")).predict(rows)
    assert len(pred.predictions) == len(stock.predictions)
    inputs = {k: torch.stack([r[k] for r in rows]) for k in rows[0]}
    with torch.no_grad():
        out = model(**inputs)
    torch.testing.assert_close(torch.from_numpy(pred.predictions[0]), out.logits_per_image, atol=ATOL, rtol=0)
    assert pred.metrics["test_loss"] == pytest.approx(float(model(**inputs, return_loss=True).loss), abs=1e-5)


class _GradCapture(TrainerCallback):
    """The gradients the optimizer is about to apply (clipping off: max_grad_norm=0)."""

    def __init__(self) -> None:
        self.grads: dict[str, torch.Tensor] = {}

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _count_attention_calls(model) -> list[int]:
    calls = [0]
    for name, module in model.named_modules():
        if type(module).__name__ == "HydraSelfAttention":
            module.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize("family", FAMILIES)
def test_trainer_gradient_checkpointing_gives_the_same_gradients(family, folders, tmp_path):
    """Trainer(gradient_checkpointing=True) trains (dropout on for BERT and ViT: the recomputation replays
    the same masks) and the gradients equal those without checkpointing; the layers really are recomputed."""
    grads, calls = {}, {}
    for checkpointing in (False, True):
        model = tiny_hydra(family).train()
        counter = _count_attention_calls(model)
        capture = _GradCapture()
        args = _args(
            tmp_path, max_steps=1, gradient_checkpointing=checkpointing, max_grad_norm=0.0, learning_rate=1e-3
        )
        trainer = Trainer(model=model, args=args, train_dataset=_dataset(family, folders),
                          data_collator=_collator(family), callbacks=[capture])
        trainer.train()
        grads[checkpointing], calls[checkpointing] = capture.grads, counter[0]
    layers = sum(1 for m in tiny_hydra(family).modules() if type(m).__name__ == "HydraSelfAttention")
    assert calls == {False: layers, True: 2 * layers}  # forward, then again in the backward pass
    assert grads[False].keys() == grads[True].keys() and len(grads[False]) > 10
    for name, grad in grads[False].items():
        torch.testing.assert_close(grads[True][name], grad, atol=1e-6, rtol=0, msg=name)
    assert any(g.abs().max() > 1e-4 for g in grads[False].values())


# --------------------------------------------------------------------------- 3. compile and export
def _export_case(family: str, folders):
    """(model, example kwargs, dynamic shapes, other kwargs of different sizes) for torch.export."""
    from torch.export import Dim

    model = tiny_hydra(family)
    inputs = load_file(str(folders[family] / "inputs.safetensors"))
    batch, seq = Dim("batch", min=1, max=64), Dim("seq", min=2, max=32)
    g = torch.Generator().manual_seed(5)
    if family == "vit":
        return model, inputs, {"pixel_values": {0: batch}}, {"pixel_values": torch.randn(5, 3, 16, 16, generator=g)}
    ids = torch.randint(5, 99 if family == "bert" else 512, (5, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    mask[3, 7:] = 0
    other = {"input_ids": ids, "attention_mask": mask}
    shapes = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
    if family == "clip":  # the end-of-text token (CLIP pools there) ends every text, then pads it
        for row, length in ((0, 11), (1, 4), (2, 11), (3, 7), (4, 11)):
            ids[row, length - 1 :] = 513
        images = Dim("images", min=1, max=64)
        other["pixel_values"] = torch.randn(4, 3, 16, 16, generator=g)
        shapes["pixel_values"] = {0: images}
    return model, {k: inputs[k] for k in shapes}, shapes, other


def _main_outputs(out) -> dict[str, torch.Tensor]:
    keys = ("logits", "member_logits", "logits_per_image", "member_logits_per_image", "logits_per_text")
    return {k: out[k] for k in keys if k in out and out[k] is not None}


@pytest.mark.parametrize("family", FAMILIES)
def test_torch_export_with_padding_and_dynamic_shapes_equals_eager(family, folders):
    """Exported once (padded masks, dynamic batch and sequence; dynamic image batch), the program gives
    eager's outputs on inputs of other sizes. The old code failed here (a Python branch on
    ``attention_mask.all()``; a branch on the token count pinned the shapes)."""
    model, example, shapes, other = _export_case(family, folders)
    program = torch.export.export(model, (), kwargs=example, dynamic_shapes=shapes)
    for inputs in (example, other):
        with torch.no_grad():
            expected = _main_outputs(model(**inputs))
            got = program.module()(**inputs)
        for key, value in expected.items():
            torch.testing.assert_close(got[key], value, atol=ATOL, rtol=0, msg=key)
    if family != "vit":  # a batch with nothing padded: the mask is applied in the graph (no branch on its values)
        full = {**other, "attention_mask": torch.ones_like(other["attention_mask"])}
        with torch.no_grad():
            torch.testing.assert_close(program.module()(**full)[OUTPUT_KEY[family]], model(**full)[OUTPUT_KEY[family]],
                                       atol=ATOL, rtol=0)


@pytest.mark.slow  # dynamo traces the whole model with symbolic shapes: 10-30 s per family here
@pytest.mark.parametrize("family", FAMILIES)
def test_torch_compile_fullgraph(family, folders):
    """``torch.compile(fullgraph=True)`` captures the whole forward (no graph break: fullgraph raises on
    one) with dynamic shapes and padding. The eager backend keeps the test fast: capturing the graph is
    what can fail here, and the exported graphs above are the lowered ones."""
    model, example, _, other = _export_case(family, folders)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend="eager")
    with torch.no_grad():
        for inputs in (example, other):
            got, expected = _main_outputs(compiled(**inputs)), _main_outputs(model(**inputs))
            for key, value in expected.items():
                torch.testing.assert_close(got[key], value, atol=ATOL, rtol=0, msg=key)


# ------------------------------------------------------------------------------ output_attentions
class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _sdpa_warnings(call) -> list[str]:
    """The warnings of transformers' sdpa attention function during ``call()`` (its warning_once cache
    cleared first)."""
    sdpa_logger = logging.getLogger("transformers.integrations.sdpa_attention")
    handler, level = _Records(), sdpa_logger.level
    sdpa_logger.addHandler(handler)
    sdpa_logger.setLevel(logging.WARNING)
    try:
        type(sdpa_logger).warning_once.cache_clear()
        call()
    finally:
        sdpa_logger.removeHandler(handler)
        sdpa_logger.setLevel(level)
    return [m for m in handler.messages if "output_attentions" in m]


def test_output_attentions_with_sdpa_behaves_as_stock_bert():
    """Stock transformers 5 with sdpa and output_attentions=True: a warning and no weights (an empty
    tuple). A Hydra model does the same instead of returning a tuple of Nones silently."""
    ids = torch.randint(5, 99, (2, 6))
    stock = BertModel(tiny_bert_config()).eval()
    model = tiny_hydra("bert")
    assert stock.config._attn_implementation == model.config._attn_implementation == "sdpa"
    results = {}
    for name, m in (("stock", stock), ("hydra", model)):
        with torch.no_grad():
            messages = _sdpa_warnings(lambda: results.__setitem__(name, m(input_ids=ids, output_attentions=True)))
        assert len(messages) == 1, (name, messages)
    assert results["stock"].attentions == () and results["hydra"].attentions == ()


def test_output_attentions_eager_has_one_entry_per_layer():
    """Eager attention: one ``(B, K_l, T, T)`` tensor per layer, a layer where no member keeps a head
    included (``K_l = 0``)."""
    kept = [[[0, 1], [2], []], [[3], [0, 1, 2], []]]  # layer 2: no head left in any member
    model = tiny_hydra("bert", kept=kept)
    model.set_attn_implementation("eager")
    ids = torch.randint(5, 99, (2, 6))
    with torch.no_grad():
        attentions = model(input_ids=ids, attention_mask=torch.tensor([[1] * 6, [1] * 4 + [0] * 2]),
                           output_attentions=True).attentions
    assert [tuple(a.shape) for a in attentions] == [(2, 3, 6, 6), (2, 4, 6, 6), (2, 0, 6, 6)]
    assert torch.all(attentions[0][1, :, :, 4:] == 0)  # padding gets no attention
    torch.testing.assert_close(attentions[1].sum(-1), torch.ones(2, 4, 6))


# --------------------------------------------------------------------------- docs/transformers.md
def test_docs_transformers_snippets_run(folders, tmp_path, monkeypatch):
    """Every ```python block of docs/transformers.md, in order, in one namespace, next to a tiny Hydra
    folder named as in the text (``hydra-bert`` on that page, the Quickstart's ``hydra-rt`` in the README)."""
    text = (REPO / "docs" / "transformers.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 4
    readme = (REPO / "README.md").read_text().split("## Using it with transformers", 1)[1].split("\n## ", 1)[0]
    blocks += re.findall(r"```python\n(.*?)```", readme, flags=re.S)  # the README's section, after the page's
    assert len(re.findall(r"```python\n", readme)) >= 1
    for name in ("hydra-bert", "hydra-rt"):
        shutil.copytree(folders["bert"] / "d0", tmp_path / name)
    monkeypatch.chdir(tmp_path)
    # torch.compile's graph capture (what fullgraph=True checks) without inductor's C++ build: seconds, not minutes
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    namespace: dict = {"__name__": "__docs__"}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"docs/transformers.md[python block {i}]", "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"python block {i} of docs/transformers.md failed:\n{block}") from exc
