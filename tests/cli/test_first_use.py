"""What a new user following the README meets first (the small items): SigLIP prompts padded to the text tower's
positions, prune checking its data files before loading the model and reading a one-text-per-line ``.txt``,
evaluate's message for a missing ``--model``, a masks file of another model's shape, identical members,
``model.safetensors`` and the umask, ``--no-progress`` on every long command."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from _hostile import assert_one_line_error, run_cli
from _tiny_decoders import save_gpt2
from conftest import write_tiny_tokenizer
from PIL import Image
from transformers import (
    CLIPConfig,
    CLIPImageProcessor,
    CLIPModel,
    SiglipConfig,
    SiglipImageProcessor,
    SiglipModel,
    ViTConfig,
    ViTForImageClassification,
    ViTImageProcessor,
    pipeline,
)

from hydra_hf.assemble import convert_checkpoint
from hydra_hf.cli import LONG_COMMANDS, build_parser
from hydra_hf.evaluation.zero_shot import load_zero_shot_model
from hydra_hf.families import get_family
from hydra_hf.masks import HeadMasks

SIZE = 32


def _image_folder(root: Path) -> Path:
    g = torch.Generator().manual_seed(0)
    for label in ("cat", "dog"):
        (root / label).mkdir(parents=True)
        for i in range(3):
            pixels = torch.randint(0, 256, (SIZE, SIZE, 3), generator=g, dtype=torch.uint8).numpy()
            Image.fromarray(pixels).save(root / label / f"{i}.png")
    return root


def _siglip(folder: Path, positions: int = 16) -> SiglipModel:
    """A tiny SigLIP whose text tower has ``positions`` positions, saved with its tokenizer and processor."""
    torch.manual_seed(0)
    model = SiglipModel(SiglipConfig(
        text_config=dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=positions),
        vision_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                           image_size=SIZE, patch_size=8),
    )).eval()
    model.save_pretrained(folder)
    SiglipImageProcessor(size={"height": SIZE, "width": SIZE}).save_pretrained(folder)
    write_tiny_tokenizer(folder)
    return model


def test_siglip_prompts_are_padded_to_the_text_towers_positions(tmp_path):
    """A SigLIP text tower of 16 positions: prompts are padded to 16 tokens (not 64, past its positions) and
    prune --class-names runs; a tower of 64 or more positions keeps SigLIP's 64."""
    folder = tmp_path / "siglip"
    model = _siglip(folder)
    images = _image_folder(tmp_path / "images")
    code, _, err = run_cli(["prune", "--model", str(folder), "--method", "taylor", "--members", "1",
                            "--heads-per-layer", "2", "--id-data", str(images), "--class-names", "cat,dog",
                            "--no-progress", "--output", str(tmp_path / "masks.json")])
    assert code == 0, err
    assert json.loads((tmp_path / "masks.json").read_text())["format"] == "hydra-head-masks"
    family = get_family("siglip")
    assert family.prompt_tokenizer_kwargs_for(model.config)["max_length"] == 16
    assert family.prompt_tokenizer_kwargs_for(SiglipConfig())["max_length"] == 64
    loaded = load_zero_shot_model(folder)
    tokens = loaded.tokenize(["a photo of a cat", "a photo of a dog"])
    assert tokens["input_ids"].shape == (2, 16)
    with torch.no_grad():
        out = loaded.model(input_ids=tokens["input_ids"], pixel_values=torch.zeros(1, 3, SIZE, SIZE))
    assert torch.isfinite(out.logits_per_image).all()


def test_prune_checks_its_data_before_loading_the_model_and_reads_a_txt_file(tmp_path):
    """A missing --id-data is named before the model is read (the model's weights here are not even a
    safetensors file); a .txt file of one text per line prunes a causal LM to the masks the same texts give
    as a .jsonl file."""
    base = save_gpt2(tmp_path / "gpt2", head="LMHeadModel")
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in os.listdir(base):
        (broken / name).write_bytes((base / name).read_bytes())
    (broken / "model.safetensors").write_bytes(b"not weights")
    for missing in ("--id-data", "--ood-data"):
        data = {"--id-data": str(tmp_path / "id.jsonl"), "--ood-data": str(tmp_path / "ood.jsonl")}
        (tmp_path / "id.jsonl").write_text('{"text": "the movie"}\n')
        (tmp_path / "ood.jsonl").write_text('{"text": "a plot"}\n')
        data[missing] = str(tmp_path / "missing.jsonl")
        code, _, err = run_cli(["prune", "--model", str(broken), "--method", "circuit-avg", "--members", "1",
                                "--heads-per-layer", "2", "--id-data", data["--id-data"], "--ood-data",
                                data["--ood-data"], "--output", str(tmp_path / "m.json")])
        assert code == 2 and "missing.jsonl' does not exist" in assert_one_line_error(err)
    texts = ["the movie was good fun", "a plot it was boring", "bad actor awful film", "great fun the movie"] * 2
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
    (tmp_path / "texts.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in texts))
    kept = {}
    for suffix in ("txt", "jsonl"):
        code, _, err = run_cli(["prune", "--model", str(base), "--method", "taylor", "--members", "1",
                                "--heads-per-layer", "2", "--id-data", str(tmp_path / f"texts.{suffix}"),
                                "--no-progress", "--output", str(tmp_path / f"{suffix}.json")])
        assert code == 0, err
        kept[suffix] = json.loads((tmp_path / f"{suffix}.json").read_text())["members"][0]["kept_heads"]
    assert kept["txt"] == kept["jsonl"]


def test_evaluate_names_a_missing_model_before_anything_else(tmp_path):
    """A missing --model beside a zero-shot baseline: "does not exist", not "--model is a classifier"; a missing
    baseline and missing data the same, before any model is loaded."""
    _siglip(tmp_path / "siglip")
    images = _image_folder(tmp_path / "images")
    common = ["--id-data", str(images), "--ood-data", str(images), "--report", str(tmp_path / "report")]
    code, _, err = run_cli(["evaluate", "--model", str(tmp_path / "missing"), "--baseline",
                            f"Single={tmp_path / 'siglip'}", *common])
    line = assert_one_line_error(err)
    assert code == 2 and "--model" in line and "missing' does not exist" in line and "classifier" not in line
    code, _, err = run_cli(["evaluate", "--model", str(tmp_path / "siglip"), "--baseline",
                            f"Other={tmp_path / 'gone'}", *common])
    assert code == 2 and "--baseline Other=" in assert_one_line_error(err) and "gone' does not exist" in err
    code, _, err = run_cli(["evaluate", "--model", str(tmp_path / "siglip"), "--id-data", str(images), "--ood-data",
                            f"far={tmp_path / 'nothing.jsonl'}", "--report", str(tmp_path / "report")])
    assert code == 2 and "nothing.jsonl' does not exist" in assert_one_line_error(err)
    assert not (tmp_path / "report").exists()


def test_output_folders_and_model_safetensors_get_the_umask_permissions(tmp_path):
    """model.safetensors (written 0o600 by safetensors) and every other file of a converted folder are 0o666 less
    the umask, under two umasks (every command's output folder goes through the same writer)."""
    base = save_gpt2(tmp_path / "gpt2", head="LMHeadModel")
    masks = tmp_path / "masks.json"
    masks.write_text(json.dumps({"format": "hydra-head-masks", "version": 1, "num_layers": 2, "num_heads": 4,
                                 "members": [{"kept_heads": [[0, 1], [2]]}, {"kept_heads": [[2, 3], [0, 1]]}]}))
    for umask in (0o022, 0o007):
        old = os.umask(umask)
        try:
            out = tmp_path / f"hydra-{umask:o}"
            code, _, err = run_cli(["convert", "--base", str(base), "--masks", str(masks), "--output", str(out)])
        finally:
            os.umask(old)
        assert code == 0, err
        modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir() if p.is_file()}
        assert modes["model.safetensors"] == 0o666 & ~umask
        assert set(modes.values()) == {0o666 & ~umask}, modes


def test_identical_members_are_warned_about(tmp_path, caplog):
    """Two members keeping the same heads (Jaccard 1.0) fused from one base: one model counted twice, a warning
    naming them; different heads, none."""
    base = save_gpt2(tmp_path / "gpt2", head="LMHeadModel")
    same = HeadMasks(kept_heads=[[[0, 1], [2]], [[0, 1], [2]], [[1], [3]]], num_heads=4)
    assert same.identical_members() == [(0, 1)]
    with caplog.at_level("WARNING"):
        convert_checkpoint(same, base=base)
    assert "members 0 and 1 of the masks keep the same heads (Jaccard 1.0)" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        convert_checkpoint(HeadMasks(kept_heads=[[[0, 1], [2]], [[1], [3]]], num_heads=4), base=base)
    assert "Jaccard 1.0" not in caplog.text


def test_no_progress_on_every_long_command(tmp_path):
    """Every command that loads models or data takes --no-progress; with it, convert and evaluate write no
    progress bar (transformers' weight writing, datasets' preparation, hydra-hf's evaluation), without it they do."""
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    assert all("--no-progress" in commands[name]._option_string_actions for name in LONG_COMMANDS)
    base = save_gpt2(tmp_path / "gpt2", head="LMHeadModel")
    masks = tmp_path / "masks.json"
    masks.write_text(json.dumps({"format": "hydra-head-masks", "version": 1, "num_layers": 2, "num_heads": 4,
                                 "members": [{"kept_heads": [[0, 1], [2]]}, {"kept_heads": [[2, 3], [0, 1]]}]}))
    (tmp_path / "id.jsonl").write_text(
        "\n".join(json.dumps({"text": "the movie was good fun " * (i + 1)}) for i in range(4))
    )
    bars = {}
    for flag in ([], ["--no-progress"]):
        out = tmp_path / f"hydra{len(flag)}"
        code, _, err = run_cli(["convert", "--base", str(base), "--masks", str(masks), "--output", str(out), *flag])
        assert code == 0, err
        code, _, err2 = run_cli(
            [
                "evaluate",
                "--model",
                str(out),
                "--id-data",
                str(tmp_path / "id.jsonl"),
                "--ood-data",
                str(tmp_path / "id.jsonl"),
                "--report",
                str(tmp_path / f"report{len(flag)}"),
                *flag,
            ]
        )
        assert code == 0, err2
        bars[bool(flag)] = [line for line in (err + err2).splitlines() if "%|" in line]
    assert bars[False] and not bars[True], bars[True]


def _close(a, b) -> bool:
    """Two pipeline results equal, numbers to 1e-6 (a padded batch rounds differently)."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return abs(a - b) <= 1e-6
    return a == b


def test_the_image_pipelines_batch(tmp_path):
    """hydra-image-classification and hydra-zero-shot-image-classification with batch_size=2 give the results
    of one image at a time (the text pipelines: tests/modeling/test_pipeline_uncertainty.py,
    tests/modeling/test_decoder_edges.py)."""
    torch.manual_seed(0)
    vit = ViTForImageClassification(ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                              intermediate_size=64, image_size=16, patch_size=8, num_labels=3))
    vit.eval().save_pretrained(tmp_path / "vit")
    ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(tmp_path / "vit")
    kept = [[[0, 1], [2]], [[2, 3], [0, 1]]]
    convert_checkpoint(HeadMasks(kept_heads=kept, num_heads=4), base=tmp_path / "vit", output_dir=tmp_path / "hvit")
    g = torch.Generator().manual_seed(1)
    images = [
        Image.fromarray(torch.randint(0, 256, (16, 16, 3), generator=g, dtype=torch.uint8).numpy()) for _ in range(3)
    ]
    pipe = pipeline("hydra-image-classification", model=str(tmp_path / "hvit"), trust_remote_code=True)
    assert _close(pipe(images), pipe(images, batch_size=2))
    tower = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    CLIPModel(
        CLIPConfig(
            text_config=dict(vocab_size=99, max_position_embeddings=32, **tower),
            vision_config=dict(image_size=16, patch_size=8, **tower),
        )
    ).eval().save_pretrained(tmp_path / "clip")
    CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16}).save_pretrained(
        tmp_path / "clip"
    )
    write_tiny_tokenizer(tmp_path / "clip")
    towers = {t: HeadMasks(kept_heads=kept, num_heads=4) for t in ("vision", "text")}
    convert_checkpoint(HeadMasks(towers=towers), base=tmp_path / "clip", output_dir=tmp_path / "hclip")
    pipe = pipeline("hydra-zero-shot-image-classification", model=str(tmp_path / "hclip"), trust_remote_code=True)
    one = pipe(images, candidate_labels=["cat", "dog"])
    batched = pipe(images, candidate_labels=["cat", "dog"], batch_size=2)
    assert len(one) == len(batched) == 3
    for a, b in zip(one, batched):  # by label: near-tied scores may swap the order
        assert _close({s["label"]: s["score"] for s in a["scores"]}, {s["label"]: s["score"] for s in b["scores"]})
        assert _close(a["uncertainty"], b["uncertainty"]) and _close(a["member_scores"], b["member_scores"])
