"""`hydra-hf prune` with Taylor and circuit-avg members on a tiny model of every new text family,
end to end into `hydra-hf convert` (the circuits use the plain evaluator: the cached one is BERT's)."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from _family_specs import TEXT_SPECS, WORDS

from hydra_hf.cli import main
from hydra_hf.masks import HeadMasks

NEW = [s for s in TEXT_SPECS if s.name != "bert"]  # BERT: tests/cli/test_prune_cli.py


@pytest.fixture(scope="module")
def data_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    g = torch.Generator().manual_seed(0)

    def texts(n: int) -> list[str]:
        return [
            " ".join(
                WORDS[int(i)]
                for i in torch.randint(0, len(WORDS), (int(torch.randint(2, 7, (1,), generator=g)),), generator=g)
            )
            for _ in range(n)
        ]

    pd.DataFrame({"text": texts(16), "label": [k % 3 for k in range(16)]}).to_csv(root / "id.csv", index=False)
    pd.DataFrame({"text": texts(16)}).to_csv(root / "ood.csv", index=False)
    return root / "id.csv", root / "ood.csv"


@pytest.mark.parametrize("spec", NEW, ids=[s.name for s in NEW])
def test_taylor_and_circuit_members_convert(spec, data_files, tmp_path, capsys):
    folder = tmp_path / "stock"
    spec.stock().save_pretrained(folder)
    spec.tokenizer().save_pretrained(folder)
    id_csv, ood_csv = data_files
    masks_file = tmp_path / "masks.json"
    rc = main(["prune", "--model", str(folder), "--id-data", str(id_csv), "--ood-data", str(ood_csv),
               "--method", "taylor,circuit-avg", "--members", "2", "--heads-per-layer", "2", "--seed", "3",
               "--batch-size", "8", "--no-progress", "--output", str(masks_file)])
    assert rc == 0, capsys.readouterr().err
    masks = HeadMasks.load(masks_file)
    assert [m["method"] for m in masks.member_metadata] == ["taylor", "circuit-avg"]
    assert all(len(heads) == 2 for member in masks.kept_heads for heads in member)
    out = tmp_path / "hydra"
    assert main(["convert", "--base", str(folder), "--masks", str(masks_file), "--output", str(out)]) == 0
    assert (out / "model.safetensors").is_file()
