"""Data loading: embedded corpora, local files, folders, label checks, tokenized loaders."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pandas as pd
import pytest
import torch

from hydra_hf.data import EMBEDDED_DATASETS, load_embedded, make_text_loader, resolve_dataset


def test_embedded_splits_are_deterministic_disjoint_and_labelled():
    splits = {s: load_embedded("rotten_tomatoes", s) for s in ("train", "validation", "test")}
    sizes = {s: len(d) for s, d in splits.items()}
    total = sum(sizes.values())
    assert total > 12000 and abs(sizes["train"] / total - 0.8) < 0.01
    texts = [set(d["text"]) for d in splits.values()]
    assert not (texts[0] & texts[1]) and not (texts[0] & texts[2]) and not (texts[1] & texts[2])
    assert set(splits["validation"]["label"]) == {0, 1}
    again = load_embedded("rotten_tomatoes", "validation")
    assert again["text"] == splits["validation"]["text"]
    assert load_embedded("rotten_tomatoes", "validation", seed=1)["text"] != splits["validation"]["text"]
    assert len(load_embedded("rotten_tomatoes", "test", max_samples=7)) == 7


@pytest.mark.parametrize("name", [n for n in EMBEDDED_DATASETS if n != "rotten_tomatoes"])
def test_embedded_ood_sets(name):
    val, test = load_embedded(name, "ood_validation"), load_embedded(name, "ood_test")
    assert val.column_names == ["text"] and len(val) > 100
    assert not set(val["text"]) & set(test["text"])
    assert all(t == t.strip() and t for t in val["text"])


def test_resolve_spec_forms_and_errors(tmp_path):
    d = resolve_dataset("guardian_headlines:ood_test", max_samples=5)
    assert len(d) == 5 and d.column_names == ["text"]
    with pytest.raises(ValueError, match="no split 'nope'"):
        resolve_dataset("rotten_tomatoes:nope")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_dataset(str(tmp_path / "missing.csv"))
    with pytest.raises(ValueError, match="no label column .label."):
        resolve_dataset("guardian_headlines:ood_test", require_labels=True)


def test_local_files_columns_labels_and_cleaning(tmp_path):
    frame = pd.DataFrame(
        {"review": [" good  film ", "bad", "", "good film", "meh"], "y": ["pos", "neg", "pos", "pos", "neg"]}
    )
    frame.to_csv(tmp_path / "a.csv", index=False)
    with open(tmp_path / "a.jsonl", "w") as f:
        for r, y in zip(frame["review"], frame["y"]):
            f.write(json.dumps({"review": r, "y": y}) + "\n")
    frame.to_parquet(tmp_path / "a.parquet")
    for suffix in ("csv", "jsonl", "parquet"):
        d = resolve_dataset(
            str(tmp_path / f"a.{suffix}"),
            text_column="review",
            label_column="y",
            label2id={"neg": 0, "pos": 1},
            num_labels=2,
        )
        assert d["text"] == ["good film", "bad", "meh"]  # stripped, empty and duplicate dropped
        assert d["label"] == [1, 0, 0]
    with pytest.raises(ValueError, match=r"no text column 'text'; its columns are \['review', 'y'\]"):
        resolve_dataset(str(tmp_path / "a.csv"))
    with pytest.raises(ValueError, match="no label column 'stars'"):
        resolve_dataset(str(tmp_path / "a.csv"), text_column="review", label_column="stars")
    with pytest.raises(ValueError, match="outside the model's 2 classes"):
        resolve_dataset(
            str(tmp_path / "a.csv"),
            text_column="review",
            label_column="y",
            label2id={"neg": 0, "pos": 2},
            num_labels=2,
        )
    with pytest.raises(ValueError, match="string labels"):
        resolve_dataset(str(tmp_path / "a.csv"), text_column="review", label_column="y")
    pd.DataFrame({"text": ["", " "], "label": [0, 1]}).to_csv(tmp_path / "empty.csv", index=False)
    with pytest.raises(ValueError, match="empty"):
        resolve_dataset(str(tmp_path / "empty.csv"))


def test_save_to_disk_folders_and_image_folder(tmp_path):
    ds = datasets.Dataset.from_dict({"sentence": ["a", "b", "c"], "label": [0, 1, 1]})
    ds.save_to_disk(str(tmp_path / "single"))
    datasets.DatasetDict({"train": ds, "validation": ds.select([0])}).save_to_disk(str(tmp_path / "dict"))
    assert resolve_dataset(str(tmp_path / "single"), text_column="sentence", num_labels=2)["label"] == [0, 1, 1]
    assert len(resolve_dataset(str(tmp_path / "dict") + ":validation", text_column="sentence")) == 1
    with pytest.raises(ValueError, match="splits"):
        resolve_dataset(str(tmp_path / "dict"), text_column="sentence")
    from PIL import Image

    for cls in ("cat", "dog"):
        (tmp_path / "imgs" / cls).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (8, 8), color=(i * 50, 0, 0)).save(tmp_path / "imgs" / cls / f"{i}.png")
    images = resolve_dataset(str(tmp_path / "imgs"), num_labels=2)
    assert images.column_names == ["image", "label"] and images["label"] == [0, 0, 1, 1]
    assert images[0]["image"].size == (8, 8)


def test_text_loader_dynamic_padding_and_shuffle():
    import tempfile
    from pathlib import Path

    from conftest import write_tiny_tokenizer
    from transformers import BertTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        write_tiny_tokenizer(Path(tmp))
        tok = BertTokenizer.from_pretrained(tmp)
    data = datasets.Dataset.from_dict(
        {"text": ["a", "the movie was very good and fun", "bad", "it"], "label": [0, 1, 0, 1]}
    )
    batches = list(make_text_loader(data, tok, batch_size=2, max_length=6))
    assert set(batches[0]) == {"input_ids", "attention_mask", "token_type_ids", "labels"}
    assert batches[0]["input_ids"].shape[1] == 6 and batches[1]["input_ids"].shape[1] < 6  # padded per batch
    assert batches[0]["labels"].tolist() == [0, 1]
    order = lambda seed: torch.cat(  # noqa: E731
        [b["labels"] for b in make_text_loader(data, tok, 1, 8, shuffle=True, seed=seed)]
    ).tolist()
    assert order(3) == order(3)
    unlabelled = datasets.Dataset.from_dict({"text": ["a"]})
    assert "labels" not in next(iter(make_text_loader(unlabelled, tok, 1, 8)))


@pytest.mark.parametrize("name", ["hamlet", "convention_speeches"])
def test_further_ood_text_kinds(name):
    from hydra_hf.data import load_embedded

    val, test = load_embedded(name, "ood_validation"), load_embedded(name, "ood_test")
    assert len(val) > 300 and abs(len(val) - len(test)) <= 1 and "label" not in val.column_names
    assert not set(val["text"]) & set(test["text"]), "a text in both splits"
    texts = list(val["text"]) + list(test["text"])
    assert all(len(t.split()) >= 5 for t in texts)
    assert not any(t.startswith(("ACT ", "SCENE ", "Enter ")) or t.isupper() for t in texts)


def test_data_spec_paths_name_the_local_files_a_spec_reads(tmp_path, monkeypatch):
    """The inputs a command keeps out of its output: a file, a folder (FOLDER:SPLIT's folder), the files of
    --class-names / --templates; nothing for embedded data sets, template sets, name lists or datasets."""
    from hydra_hf.data import data_spec_paths, zero_shot_paths

    monkeypatch.chdir(tmp_path)
    (tmp_path / "id.csv").write_text("text,label\na,0\n")
    (tmp_path / "dd").mkdir()
    (tmp_path / "names.txt").write_text("cat\ndog\n")
    assert data_spec_paths(str(tmp_path / "id.csv")) == [tmp_path / "id.csv"]
    assert data_spec_paths(tmp_path / "id.csv") == [tmp_path / "id.csv"]
    assert data_spec_paths(f"{tmp_path / 'dd'}:validation") == [tmp_path / "dd"]
    assert data_spec_paths("rotten_tomatoes:validation") == data_spec_paths("guardian_headlines") == []
    assert data_spec_paths(None) == data_spec_paths(datasets.Dataset.from_dict({"text": ["a"]})) == []
    assert data_spec_paths(str(tmp_path / "missing.csv")) == []  # reading it fails first, naming it
    (tmp_path / "rotten_tomatoes").mkdir()  # a local folder wins over the embedded name, as resolve_dataset reads it
    assert data_spec_paths("rotten_tomatoes:test") == [Path("rotten_tomatoes")]
    assert zero_shot_paths(str(tmp_path / "names.txt"), "openai") == [tmp_path / "names.txt"]
    assert zero_shot_paths("cat,dog", "a photo of a {}.") == zero_shot_paths(["cat"], None) == []
    (tmp_path / "openai").write_text("a {}\n")  # a template set's name is read as the set, never as a file
    assert zero_shot_paths(None, "openai") == [] and zero_shot_paths(None, "names.txt") == [Path("names.txt")]
