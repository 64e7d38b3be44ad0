"""`hydra_hf.workflows.prune.build_members` without the CLI: data specs or loaded datasets -> masks, the same
masks as `hydra-hf prune` for the same choices."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from _tiny_decoders import save_llama, write_data

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


def test_slim_members_from_an_earlier_selection_equal_a_fresh_slim_selection(tmp_path):
    """heads= reuses a selection's heads: its slim members' neurons are those a slim call chooses (a Llama with
    grouped-query attention, so the key/value heads are derived again), and the head scores run once."""
    folder = save_llama(tmp_path / "llama")
    train, _ = write_data(tmp_path)
    kwargs = dict(method="taylor", budget=Budget(heads_per_layer=2), members=3, seed=7, batch_size=8,
                  progress=False)
    target = load_pruning_target(folder)
    data = resolve_dataset(train)
    slim = build_members(target, id_data=data, mlp_keep=0.5, **kwargs)
    heads = build_members(target, id_data=data, **kwargs)
    again = build_members(target, id_data=data, mlp_keep=0.5, heads=heads, **kwargs)
    assert again.kept_heads == slim.kept_heads == heads.kept_heads
    assert again.kept_neurons() == slim.kept_neurons() and len(slim.kept_neurons()[0][0]) == 24  # half of 48
    assert again.to_dict()["members"][0]["kept_kv_heads"] == slim.to_dict()["members"][0]["kept_kv_heads"]
    with pytest.raises(ValueError, match="give mlp_keep"):
        build_members(target, id_data=data, heads=heads, **kwargs)
    with pytest.raises(ValueError, match="holds 3 members but members=2"):
        build_members(target, id_data=data, mlp_keep=0.5, heads=heads, **{**kwargs, "members": 2})
    with pytest.raises(ValueError, match="already keeps MLP neurons"):
        build_members(target, id_data=data, mlp_keep=0.5, heads=slim, **kwargs)
