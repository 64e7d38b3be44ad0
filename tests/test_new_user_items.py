"""What a new user following the README meets first (the small items): SigLIP prompts padded to the text tower's
positions, prune checking its data files before loading the model and reading a one-text-per-line ``.txt``,
evaluate's message for a missing ``--model``, a masks file of another model's shape, identical members,
``model.safetensors`` and the umask, ``--no-progress`` on every long command."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from _hostile import assert_one_line_error, run_cli
from conftest import write_tiny_tokenizer
from PIL import Image
from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel

from hydra_hf.families import get_family
from hydra_hf.zero_shot import load_zero_shot_model

SIZE = 32


def _image_folder(root: Path) -> Path:
    g = torch.Generator().manual_seed(0)
    for label in ("cat", "dog"):
        (root / label).mkdir(parents=True)
        for i in range(3):
            pixels = torch.randint(0, 256, (SIZE, SIZE, 3), generator=g, dtype=torch.uint8).numpy()
            Image.fromarray(pixels).save(root / label / f"{i}.png")
    return root


def test_siglip_prompts_are_padded_to_the_text_towers_positions(tmp_path):
    """A SigLIP text tower of 16 positions: prompts are padded to 16 tokens (not 64, past its positions) and
    prune --class-names runs; a tower of 64 or more positions keeps SigLIP's 64."""
    torch.manual_seed(0)
    model = SiglipModel(SiglipConfig(
        text_config=dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=16),
        vision_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                           image_size=SIZE, patch_size=8),
    )).eval()  # fmt: skip
    folder = tmp_path / "siglip"
    model.save_pretrained(folder)
    SiglipImageProcessor(size={"height": SIZE, "width": SIZE}).save_pretrained(folder)
    write_tiny_tokenizer(folder)
    images = _image_folder(tmp_path / "images")
    code, _, err = run_cli(["prune", "--model", str(folder), "--method", "taylor", "--members", "1",
                            "--heads-per-layer", "2", "--id-data", str(images), "--class-names", "cat,dog",
                            "--no-progress", "--output", str(tmp_path / "masks.json")])  # fmt: skip
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
