"""The later stages for every family of the registry: a converted folder of each family stages for the
Hub (card, shipped-code audit, safetensors, marker left out), `hydra-hf push --dry-run` validates a
new text and a new image family in a fresh process, and `hydra-hf evaluate` reports on both."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from _family_specs import SPECS, WORDS
from _hostile import run_cli
from conftest import write_masks

KEPT = [[[0, 1], []], [[1, 2, 3], [0]]]  # unequal widths, a member keeping 0 heads in a layer


def _hydra_folder(spec, root):
    from hydra_hf.assemble import convert_checkpoint

    base = root / f"{spec.name}-base"
    if not base.exists():
        spec.stock().save_pretrained(base)
        if spec.text:
            spec.tokenizer().save_pretrained(base)
        else:
            from transformers import ViTImageProcessor

            ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(base)
    out = root / f"{spec.name}-hydra"
    if not out.exists():
        convert_checkpoint(write_masks(root / "masks.json", KEPT, 4), base=base, output_dir=out)
    return base, out


@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_every_family_stages_for_the_hub(spec, tmp_path):
    from hydra_hf.hub import stage_repository

    _, folder = _hydra_folder(spec, tmp_path)
    staged = stage_repository(folder, tmp_path / "staged", repo_id=f"me/hydra-{spec.name.replace('_', '-')}")
    names = {p.name for p in (tmp_path / "staged").iterdir()}
    config = json.loads((folder / "config.json").read_text())
    shipped = {entry.split(".")[0] + ".py" for entry in config["auto_map"].values()}
    assert shipped <= names and "model.safetensors" in names and "README.md" in names
    hidden = {name for name in names if name.startswith(".")}
    assert hidden <= {".hydra_hf_output.json"}, hidden  # only push's own marker (never uploaded)
    assert json.loads((tmp_path / "staged" / ".hydra_hf_output.json").read_text())["command"] == "push"
    card = (tmp_path / "staged" / "README.md").read_text()
    assert "Hydra" in card and staged is not None


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("stages")
    g = torch.Generator().manual_seed(0)
    texts = [" ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (5,), generator=g)) for _ in range(12)]
    pd.DataFrame({"text": texts, "label": [i % 3 for i in range(12)]}).to_csv(root / "id.csv", index=False)
    pd.DataFrame({"text": [t[::-1] for t in texts]}).to_csv(root / "ood.csv", index=False)
    from PIL import Image

    for name in ("id_images", "ood_images"):
        for c in range(3):
            (root / name / f"c{c}").mkdir(parents=True)
            for i in range(2):
                pixels = (torch.rand(16, 16, 3, generator=g) * 255).to(torch.uint8).numpy()
                Image.fromarray(pixels).save(root / name / f"c{c}" / f"{i}.png")
    return root


@pytest.mark.parametrize("name", ["roberta", "deit"])
def test_new_families_push_dry_run_and_evaluate(name, data, tmp_path):
    spec = next(s for s in SPECS if s.name == name)
    base, folder = _hydra_folder(spec, tmp_path)
    rc, _, err = run_cli(["push", str(folder), "--repo-id", f"me/hydra-{name}", "--dry-run",
                          "--staging", str(tmp_path / "staging")])
    assert rc == 0, err[-2000:]
    id_data, ood_data = ("id.csv", "ood.csv") if spec.text else ("id_images", "ood_images")
    rc, out, err = run_cli(["evaluate", "--model", str(folder), "--baseline", f"Single={base}", "--id-data",
                            str(data / id_data), "--ood-data", f"ood={data / ood_data}", "--batch-size", "4",
                            "--bootstrap", "20", "--report", str(tmp_path / "report")])
    assert rc == 0, err[-2000:]
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert [row["method"] for row in report["rows"]] == ["Hydra", "Single"]
    assert report["rows"][0]["members"] == 2 and "ood" in report["rows"][0]
    assert set(report["comparisons"]["Hydra − Single"]) >= {"accuracy", "nll", "ood.auroc"}
