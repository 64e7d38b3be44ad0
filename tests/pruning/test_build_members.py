"""`hydra_hf.workflows.prune.build_members` without the CLI: data specs or loaded datasets -> masks, the same
masks as `hydra-hf prune` for the same choices."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from hydra_hf.cli import main
from hydra_hf.data import resolve_dataset
from hydra_hf.masks import HeadMasks
from hydra_hf.pruning import Budget, load_pruning_target
from hydra_hf.workflows.prune import build_members

WORDS = "the a movie film good bad great awful plot actor fun boring i it was is and not very".split()


@pytest.fixture
def id_csv(tmp_path):
    g = torch.Generator().manual_seed(0)
    texts = [
        " ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (5,), generator=g)) + f" {k}" for k in range(24)
    ]
    pd.DataFrame({"text": texts, "label": [k % 3 for k in range(24)]}).to_csv(tmp_path / "id.csv", index=False)
    return tmp_path / "id.csv"


def test_specs_datasets_and_the_cli_give_the_same_members(tiny_bert_dir, id_csv, tmp_path):
    kwargs = dict(method="taylor", budget=Budget(remove=3), members=2, seed=4, batch_size=8, progress=False)
    from_spec = build_members(tiny_bert_dir, id_data=str(id_csv), **kwargs)  # a folder and a data spec
    assert from_spec.num_members == 2 and from_spec.kept_heads[0] != from_spec.kept_heads[1]
    assert all(sum(4 - len(h) for h in m) == 3 for m in from_spec.kept_heads)  # 3 of 2 x 4 heads removed
    target = load_pruning_target(tiny_bert_dir)
    assert target.modality == "text" and target.num_labels == 3
    from_dataset = build_members(target, id_data=resolve_dataset(str(id_csv)), **kwargs)  # a loaded dataset
    assert from_dataset.kept_heads == from_spec.kept_heads
    out = tmp_path / "cli.json"
    assert (
        main(
            [
                "prune",
                "--model",
                str(tiny_bert_dir),
                "--id-data",
                str(id_csv),
                "--method",
                "taylor",
                "--remove",
                "3",
                "--members",
                "2",
                "--seed",
                "4",
                "--batch-size",
                "8",
                "--no-progress",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    assert HeadMasks.load(out).kept_heads == from_spec.kept_heads


def test_errors_name_the_problem(tiny_bert_dir, id_csv):
    with pytest.raises(ValueError, match="unknown pruning method"):
        build_members(tiny_bert_dir, method="magic", budget=Budget(remove=1), id_data=str(id_csv))
    with pytest.raises(ValueError, match="need OOD validation data"):
        build_members(
            tiny_bert_dir, method="circuit-avg", budget=Budget(remove=1), id_data=str(id_csv), progress=False
        )
    images = resolve_dataset(str(id_csv)).rename_column("text", "image")
    with pytest.raises(ValueError, match="the model reads texts but --id-data has columns"):
        build_members(tiny_bert_dir, method="taylor", budget=Budget(remove=1), id_data=images)
