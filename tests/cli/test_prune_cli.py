"""`hydra-hf prune`: end to end on a tiny checkpoint, errors, seeds, and masks -> converter."""

from __future__ import annotations

import json
import logging

import pandas as pd
import pytest
import torch

from hydra_hf.cli import main
from hydra_hf.masks import HeadMasks

WORDS = "the a movie film good bad great awful plot actor fun boring i it was is and not very".split()


@pytest.fixture
def data_files(tmp_path):
    g = torch.Generator().manual_seed(0)
    def texts(n, offset):
        return [
            " ".join(
                WORDS[int(i)]
                for i in torch.randint(0, len(WORDS), (int(torch.randint(2, 9, (1,), generator=g)),), generator=g)
            )
            + f" {offset + k}"
            for k in range(n)
        ]

    pd.DataFrame({"review": texts(24, 0), "stars": [k % 3 for k in range(24)]}).to_csv(
        tmp_path / "id.csv", index=False
    )
    pd.DataFrame({"text": texts(24, 1000)}).to_csv(tmp_path / "ood.csv", index=False)
    return tmp_path / "id.csv", tmp_path / "ood.csv"


def _prune(model_dir, id_csv, out, *extra):
    return main(["prune", "--model", str(model_dir), "--id-data", str(id_csv), "--text-column", "review",
                 "--label-column", "stars", "--output", str(out), "--no-progress", "--batch-size", "8", *extra])


def test_taylor_members_seeds_and_metadata(tiny_bert_dir, data_files, tmp_path, capsys):
    id_csv, _ = data_files
    out = tmp_path / "masks.json"
    assert (
        _prune(
            tiny_bert_dir, id_csv, out, "--method", "taylor", "--members", "3", "--heads-per-layer", "2", "--seed", "5"
        )
        == 0
    )
    masks = HeadMasks.load(out)
    assert masks.num_members == 3 and all(len(h) == 2 for m in masks.kept_heads for h in m)
    assert len({json.dumps(k) for k in masks.kept_heads}) > 1, "seeds must give different members"
    meta = masks.member_metadata[1]
    assert meta["method"] == "taylor" and meta["seed"] == 6 and len(meta["scores"]) == 3 and len(meta["ranking"]) == 6
    assert masks.metadata["budget"] == {"heads_per_layer": 2, "remove": None}
    assert len(masks.metadata["pairwise_jaccard"]) == 3
    assert "pairwise Jaccard" in capsys.readouterr().out
    again = tmp_path / "again.json"
    assert (
        _prune(
            tiny_bert_dir,
            id_csv,
            again,
            "--method",
            "taylor",
            "--members",
            "3",
            "--heads-per-layer",
            "2",
            "--seed",
            "5",
        )
        == 0
    )
    assert HeadMasks.load(again).kept_heads == masks.kept_heads


def test_circuit_criteria_members_and_include(tiny_bert_dir, data_files, tmp_path):
    id_csv, ood_csv = data_files
    user = tmp_path / "user.json"
    HeadMasks(kept_heads=[[[0, 1, 2, 3], [0], [1, 2]]], num_heads=4).save(user)
    out = tmp_path / "masks.json"
    rc = _prune(tiny_bert_dir, id_csv, out, "--method", "circuit-acc,circuit-ood,circuit-avg", "--members", "3",
                "--remove", "4", "--ood-data", str(ood_csv), "--ood-text-column", "text", "--include-masks", str(user))
    assert rc == 0
    masks = HeadMasks.load(out)
    assert [m["method"] for m in masks.member_metadata[:3]] == ["circuit-acc", "circuit-ood", "circuit-avg"]
    assert all(masks.num_kept(m) == 8 for m in range(3))
    assert masks.kept_heads[3] == [[0, 1, 2, 3], [0], [1, 2]] and masks.member_metadata[3]["source"] == "included"
    assert len(masks.member_metadata[0]["ranking"]) == 4


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--method", "circuit-avg", "--remove", "2"], "needs OOD validation data"),
        (["--method", "taylor", "--remove", "13"], "larger than the model's 12 heads"),
        (["--method", "taylor", "--heads-per-layer", "5"], "larger than the 4 heads per layer"),
        (["--method", "nope", "--remove", "2"], "unknown pruning method"),
    ],
)
def test_bad_arguments(tiny_bert_dir, data_files, tmp_path, capsys, extra, message):
    id_csv, _ = data_files
    out = tmp_path / "m.json"
    assert _prune(tiny_bert_dir, id_csv, out, *extra) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()



def test_a_masked_lm_checkpoint_is_one_line_naming_num_labels(tmp_path, data_files, capfd, caplog):
    """Issue 24 item 9: a masked-LM checkpoint (no trained classification head) printed transformers' ~15-line
    load report, then an error naming config.num_labels. Now one line naming --num-labels; with it, the
    prune runs on a new head without the report; --num-labels against a trained head of another size is one line."""
    from conftest import tiny_bert_config, write_tiny_tokenizer
    from transformers import BertForMaskedLM

    id_csv, _ = data_files
    folder = tmp_path / "mlm"
    BertForMaskedLM(tiny_bert_config(num_labels=2)).save_pretrained(folder)  # a real one's config names no labels
    write_tiny_tokenizer(folder)
    capfd.readouterr()
    caplog.set_level(logging.INFO, logger="hydra_hf.pruning.members")
    out = tmp_path / "m.json"
    assert _prune(folder, id_csv, out, "--method", "taylor", "--members", "2", "--remove", "2") == 2
    captured = capfd.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "--num-labels N" in err[0] and "BertForMaskedLM" in err[0], captured.err
    assert "config.num_labels" not in captured.err and "LOAD REPORT" not in captured.out + captured.err
    assert not out.exists()
    assert (
        _prune(folder, id_csv, out, "--method", "taylor", "--members", "2", "--remove", "2", "--num-labels", "3") == 0
    )
    captured = capfd.readouterr()
    assert "LOAD REPORT" not in captured.out + captured.err and "not sharded" not in captured.err
    assert "no trained classification head: pruning with a new one of 3 classes" in caplog.text
    assert HeadMasks.load(out).num_members == 2
    classifier = tmp_path / "classifier"
    from transformers import BertForSequenceClassification

    BertForSequenceClassification(tiny_bert_config()).save_pretrained(classifier)  # a trained head of 3 classes
    write_tiny_tokenizer(classifier)
    assert _prune(classifier, id_csv, tmp_path / "m2.json", "--method", "taylor", "--members", "2", "--remove", "2",
                  "--num-labels", "4") == 2
    assert "--num-labels 4, but the trained classification head" in capfd.readouterr().err

def test_bad_data(tiny_bert_dir, tmp_path, capsys):
    pd.DataFrame({"review": ["good", "bad"], "stars": [0, 7]}).to_csv(tmp_path / "bad.csv", index=False)
    pd.DataFrame({"review": ["", "  "], "stars": [0, 1]}).to_csv(tmp_path / "empty.csv", index=False)
    cases = [
        ("bad.csv", [], "outside the model's 3 classes"),
        ("empty.csv", [], "is empty"),
        ("bad.csv", ["--label-column", "rating"], "no label column 'rating'"),
    ]
    for name, extra, message in cases:
        out = tmp_path / "m.json"
        rc = main(
            [
                "prune",
                "--model",
                str(tiny_bert_dir),
                "--id-data",
                str(tmp_path / name),
                "--text-column",
                "review",
                "--label-column",
                "stars",
                *extra,
                "--method",
                "taylor",
                "--remove",
                "2",
                "--output",
                str(out),
                "--no-progress",
            ]
        )
        assert rc == 2 and message in capsys.readouterr().err and not out.exists()


def test_masks_convert_into_a_model_matching_its_reference(tiny_bert_dir, data_files, tmp_path):
    from transformers import BertForSequenceClassification

    from hydra_hf.assemble import convert_checkpoint
    from hydra_hf.pruning import HeadGates

    id_csv, _ = data_files
    out = tmp_path / "masks.json"
    assert _prune(tiny_bert_dir, id_csv, out, "--method", "taylor,random", "--members", "3", "--remove", "5") == 0
    masks = HeadMasks.load(out)
    hydra = convert_checkpoint(out, base=tiny_bert_dir, mlp_fusion="average").eval()
    stock = BertForSequenceClassification.from_pretrained(tiny_bert_dir).eval()
    ids = torch.randint(5, 60, (4, 7), generator=torch.Generator().manual_seed(0))
    attention = torch.ones_like(ids)
    attention[1, 4:] = 0
    with torch.no_grad():
        member_logits = hydra(input_ids=ids, attention_mask=attention).member_logits  # (B, M, C)
        with HeadGates(stock) as hg:
            for m in range(masks.num_members):
                hg.set(masks.gates(m))
                ref = stock(input_ids=ids, attention_mask=attention).logits
                assert torch.allclose(member_logits[:, m], ref, atol=1e-5), (
                    m,
                    (member_logits[:, m] - ref).abs().max(),
                )
    assert not torch.allclose(member_logits[:, 0], member_logits[:, 1], atol=1e-4)
