"""GGUF checkpoints as input (hydra_hf.convert.gguf, families.resolve_checkpoint), on tiny GGUF files written
with the gguf package's GGUFWriter (tests/_tiny_gguf.py): the materialised folder holds exactly the tensors and
tokenizer transformers' own GGUF loader gives, and records the file; the cache is keyed by the file's SHA-256,
reused, rebuilt when an entry does not match its manifest, safe under two processes at once; the GGUF file and
its folder are never written; an architecture no family builds is one line naming it; prune, convert, finetune
and evaluate take the file."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest
import torch
import transformers
from _tiny_gguf import HEADS, LAYERS, write_texts, write_tiny_gguf
from safetensors.torch import load_file

import hydra_hf.convert.gguf as gguf_module
from hydra_hf.assemble import convert_checkpoint
from hydra_hf.cli import main as cli_main
from hydra_hf.convert.gguf import (
    CACHE_ENV,
    CONFIG_KEY,
    checkpoint_inputs,
    gguf_file,
    gguf_source,
    is_gguf,
    materialize_gguf,
)
from hydra_hf.errors import HydraInputError, HydraOutputError
from hydra_hf.families import resolve_checkpoint
from hydra_hf.hub.card import build_model_card
from hydra_hf.masks import HeadMasks, load_masks

pytest.importorskip("gguf", reason="the gguf package (the [gguf] extra) reads GGUF files")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private cache of materialised GGUF checkpoints, empty at the start."""
    folder = tmp_path / "gguf-cache"
    monkeypatch.setenv(CACHE_ENV, str(folder))
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny Llama GGUF alone in its folder, with the bytes and listing it starts with (nothing may change them)."""
    folder = tmp_path_factory.mktemp("tiny-gguf")
    path = write_tiny_gguf(folder / "tiny-llama.gguf")
    return path


def _snapshot(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_materialised_folder_is_what_transformers_gguf_loader_gives(tiny, cache):
    """Tensors bit for bit and the tokenizer's ids equal transformers' GGUF loader's; the config records the
    file (name, SHA-256, quantisation, architecture) and has no quantization_config; the cache entry is reused,
    not rewritten; the GGUF's folder is unchanged."""
    before = _snapshot(tiny.parent)
    folder = materialize_gguf(tiny)
    assert folder.parent == cache and folder.name == hashlib.sha256(tiny.read_bytes()).hexdigest()
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    assert config[CONFIG_KEY] == {"file": "tiny-llama.gguf", "sha256": folder.name, "quantization": "F32",
                                  "architecture": "llama"}
    stock = transformers.AutoModelForCausalLM.from_pretrained(str(tiny.parent), gguf_file=tiny.name,
                                                              dtype=torch.float32)
    saved = load_file(folder / "model.safetensors")
    expected = {k: v for k, v in stock.state_dict().items() if k != "lm_head.weight"}  # tied: saved once
    assert sorted(saved) == sorted(expected)
    assert all(torch.equal(saved[k], expected[k]) for k in saved)
    plain = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    assert plain.lm_head.weight is plain.model.embed_tokens.weight
    tok_gguf = transformers.AutoTokenizer.from_pretrained(str(tiny.parent), gguf_file=tiny.name)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    text = ["the cat sat on the mat", "a dog"]
    assert tok(text)["input_ids"] == tok_gguf(text)["input_ids"] and len(tok(text)["input_ids"][0]) > 6
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert resolve_checkpoint(tiny.parent) == folder  # the folder holding the file: the same entry, reused
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    assert _snapshot(tiny.parent) == before


def test_gguf_paths(tmp_path, tiny):
    """A .gguf file, or a folder without config.json holding .gguf files, is a GGUF checkpoint; a folder with
    several names them; an HF folder that also holds a .gguf stays an HF folder."""
    assert is_gguf(tiny) and is_gguf(tiny.parent) and gguf_file(tiny.parent) == tiny
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a.gguf", "b.gguf"):
        (two / name).write_bytes(tiny.read_bytes())
    assert is_gguf(two)
    with pytest.raises(HydraInputError, match=r"holds 2 GGUF files \(a.gguf, b.gguf\); pass the one"):
        gguf_file(two)
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "x.gguf").write_bytes(b"")
    assert not is_gguf(hf) and not is_gguf(tmp_path / "missing.gguf")
    assert checkpoint_inputs(hf) == [hf]


def test_broken_cache_entries_are_rebuilt_never_used(tiny, cache, caplog):
    """A truncated weights file, an edited config and a missing manifest make the entry unusable: it is
    materialised again (the same bytes); an entry hydra_hf did not write is refused, not deleted."""
    folder = materialize_gguf(tiny)
    good = _snapshot(folder)
    weights = folder / "model.safetensors"
    for damage in (lambda: weights.write_bytes(weights.read_bytes()[:-100]),
                   lambda: (folder / "config.json").write_text((folder / "config.json").read_text()[:-2]),
                   lambda: (folder / gguf_module.MANIFEST).unlink()):
        damage()
        gguf_module._CHECKED.clear()  # a new process: nothing checked yet
        caplog.clear()
        assert materialize_gguf(tiny) == folder
        assert "cannot be used" in caplog.text
        assert _snapshot(folder) == {**good, **{k: v for k, v in _snapshot(folder).items() if k == gguf_module.MARKER}}
    (folder / gguf_module.MARKER).unlink()
    (folder / gguf_module.MANIFEST).unlink()
    gguf_module._CHECKED.clear()
    with pytest.raises(HydraOutputError, match="was not written by hydra_hf"):
        materialize_gguf(tiny)
    assert (folder / "model.safetensors").is_file()  # nothing of it deleted


def test_two_processes_materialise_once(tiny, cache, tmp_path, monkeypatch):
    """Two processes asking for one file at once: one writes the entry (slowly: the other must meet its lock),
    the other waits and reads it."""
    writes = tmp_path / "writes.txt"
    write_folder = gguf_module._write_folder

    def slow_write_folder(file, record):
        write = write_folder(file, record)

        def recorded(tmp):
            with open(writes, "a") as handle:
                handle.write(f"{os.getpid()}\n")
            time.sleep(1.0)
            write(tmp)

        return recorded

    monkeypatch.setattr(gguf_module, "_write_folder", slow_write_folder)
    context = multiprocessing.get_context("fork")  # the children share this process's patched module
    with context.Pool(2) as pool:
        folders = pool.map(materialize_gguf, [tiny, tiny])
    assert folders[0] == folders[1] and len(writes.read_text().split()) == 1
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")) == [folders[0].name]
    assert _snapshot(folders[0]).keys() >= {"config.json", "model.safetensors", "tokenizer.json"}


def test_unsupported_architectures_are_one_line(tmp_path, cache, capsys):
    """falcon (which transformers reads but no family builds), an architecture transformers does not know,
    and a file that is not GGUF: one line naming it, nothing materialised."""
    falcon = write_tiny_gguf(tmp_path / "falcon" / "tiny-falcon.gguf", arch="falcon")
    with pytest.raises(HydraInputError, match=r"'tiny-falcon.gguf' holds a 'falcon' model .* llama, mistral"):
        resolve_checkpoint(falcon)
    odd = write_tiny_gguf(tmp_path / "odd" / "odd.gguf", arch="rwkv9")
    masks = tmp_path / "m.json"
    HeadMasks(kept_heads=[[list(range(HEADS))] * LAYERS], num_heads=HEADS).save(masks)
    assert cli_main(["convert", "--base", str(odd), "--masks", str(masks), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "holds a 'rwkv9' model (general.architecture)" in err and len(err.strip().splitlines()) == 1
    garbage = tmp_path / "g" / "garbage.gguf"
    garbage.parent.mkdir()
    garbage.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(HydraInputError, match="is not a readable GGUF file"):
        resolve_checkpoint(garbage)
    assert not cache.exists() or not [p for p in cache.iterdir() if not p.name.startswith(".")]
    assert not (tmp_path / "o").exists()


def test_gguf_source_of_a_hostile_config():
    good = {"file": "m.Q4_1.gguf", "sha256": "a" * 64, "quantization": "Q4_1", "architecture": "llama"}
    assert gguf_source({CONFIG_KEY: good}) == good
    for bad in ({**good, "file": "x`](javascript:1).gguf"}, {**good, "sha256": "z" * 64},
                {**good, "quantization": "Q4 <b>"}, {**good, "file": "../m.gguf"}, "m.gguf", None):
        assert gguf_source({CONFIG_KEY: bad}) is None


def _zeroed_reference(folder: Path, kept: list[list[int]]) -> torch.nn.Module:
    """The stock model with the removed heads' o_proj input columns zeroed (the reference of one member)."""
    stock = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    dk = stock.config.head_dim
    with torch.no_grad():
        for layer, heads in zip(stock.model.layers, kept):
            for h in set(range(stock.config.num_attention_heads)) - set(heads):
                layer.self_attn.o_proj.weight[:, h * dk:(h + 1) * dk] = 0
    return stock


def test_cli_prune_convert_evaluate_take_a_gguf_file(tiny, tmp_path, cache, capsys):
    """`prune --model X.gguf` equals pruning its materialised folder; `convert --base X.gguf` fuses members
    equal to the stock model with their removed heads zeroed and records the file in config and card;
    `evaluate --baseline Single=X.gguf` reports the GGUF; no output may land in the GGUF's folder."""
    texts = write_texts(tmp_path / "texts.csv")
    masks = tmp_path / "masks.json"

    def prune(model: Path, output: Path) -> int:
        return cli_main(["prune", "--model", str(model), "--method", "taylor", "--members", "2", "--remove", "3",
                         "--id-data", str(texts), "--max-length", "12", "--no-progress", "--output", str(output)])

    assert prune(tiny, tiny.parent / "masks.json") == 2  # never written into the GGUF's folder
    assert "an input of the GGUF --model" in capsys.readouterr().err and not (tiny.parent / "masks.json").exists()
    assert prune(tiny, masks) == 0
    got = load_masks(masks)
    assert got.metadata["base_model"] == str(tiny) and got.metadata["task"] == "causal_lm"
    assert prune(materialize_gguf(tiny), tmp_path / "masks2.json") == 0
    assert load_masks(tmp_path / "masks2.json").kept_heads == got.kept_heads
    inside = tiny.parent / "out"
    assert cli_main(["convert", "--base", str(tiny), "--masks", str(masks), "--output", str(inside)]) == 2
    assert "lies inside the input folder" in capsys.readouterr().err and not inside.exists()
    out = tmp_path / "hydra"
    assert cli_main(["convert", "--base", str(tiny), "--masks", str(masks), "--output", str(out)]) == 0
    fused = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    config = json.loads((out / "config.json").read_text())
    assert config[CONFIG_KEY]["file"] == "tiny-llama.gguf" and config["base_model_name_or_path"] == "tiny-llama.gguf"
    tok = transformers.AutoTokenizer.from_pretrained(out)
    tok.pad_token = tok.eos_token  # the tiny tokenizer has no pad token
    batch = tok(["the cat sat on the mat", "a dog ran"], return_tensors="pt", padding=True)
    with torch.no_grad():
        member_logits = fused(**batch).member_logits  # (B, M, T, V)
        for m, kept in enumerate(got.kept_heads):
            ref = _zeroed_reference(materialize_gguf(tiny), kept)(**batch).logits
            valid = batch["attention_mask"].bool()
            torch.testing.assert_close(member_logits[:, m][valid], ref[valid], atol=1e-5, rtol=0)
    assert not torch.allclose(member_logits[:, 0], member_logits[:, 1], atol=1e-3)  # the members differ
    card = str(build_model_card(out, repo_id="user/tiny-hydra"))
    assert "From a GGUF checkpoint" in card and config[CONFIG_KEY]["sha256"] in card and "`F32`" in card
    report = tmp_path / "report"
    assert cli_main(["evaluate", "--model", str(out), "--baseline", f"Single={tiny}", "--id-data", str(texts),
                     "--ood-data", f"same={texts}", "--max-length", "12", "--report", str(report)]) == 0
    numbers = json.loads((report / "report.json").read_text())
    assert set(numbers["causal_lm"]) == {"Hydra", "Single"}
    assert all(0 < numbers["causal_lm"][name]["perplexity"] < float("inf") for name in ("Hydra", "Single"))


def test_classes_asked_of_a_gguf_build_the_classifier(tiny, tmp_path, cache):
    """convert --base X.gguf --num-labels 2: a last-token sequence classifier with new heads whose members equal
    a stock LlamaForSequenceClassification with the same head; finetune with --labels trains that classifier."""
    masks = HeadMasks(kept_heads=[[[0, 1, 2, 3], [1, 2]], [[2], [0, 3]]], num_heads=HEADS)
    model = convert_checkpoint(masks, base=tiny, num_labels=2, seed=3)
    assert type(model).__name__ == "HydraEnsembleLlamaForSequenceClassification" and model.config.num_labels == 2
    assert getattr(model.config, CONFIG_KEY)["file"] == "tiny-llama.gguf"
    folder = materialize_gguf(tiny)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    batch = tok(["the cat sat on the mat"], return_tensors="pt")  # one text: no padding token needed
    with torch.no_grad():
        fused = model(**batch).member_logits  # (B, M, C)
        for m, kept in enumerate(masks.kept_heads):
            stock = transformers.LlamaForSequenceClassification.from_pretrained(folder, num_labels=2).eval()
            lm = _zeroed_reference(folder, kept)
            stock.model.load_state_dict(lm.model.state_dict())
            stock.score.weight.copy_(model.score.weight[m])
            torch.testing.assert_close(fused[:, m], stock(**batch).logits, atol=1e-5, rtol=0)
    assert not torch.allclose(fused[:, 0], fused[:, 1], atol=1e-3)
    train = write_texts(tmp_path / "train.csv", n=8)
    assert cli_main(["finetune", "--model", str(tiny), "--masks", str(_save(masks, tmp_path / "m.json")),
                     "--labels", "neg,pos", "--train-data", str(train), "--max-steps", "2", "--batch-size", "4",
                     "--output", str(tmp_path / "cls")]) == 0
    config = json.loads((tmp_path / "cls" / "config.json").read_text())
    assert config["architectures"] == ["HydraEnsembleLlamaForSequenceClassification"]
    assert config["id2label"] == {"0": "neg", "1": "pos"} and config[CONFIG_KEY]["file"] == "tiny-llama.gguf"


def _save(masks: HeadMasks, path: Path) -> Path:
    masks.save(path)
    return path

