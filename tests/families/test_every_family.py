"""The family tester: one equivalence suite run over every registered family, numbers not shapes. A family is
a line of ``_family_specs.SPECS``; the families whose models are built otherwise (two towers, decoders, timm and
open_clip checkpoints) have suites of their own, named in ``OWN_SUITES``, and a test fails when a registered
family is in neither. For each family of ``SPECS``:

- every member keeping every head == the stock model (fp32, eager and sdpa, padded batches);
- members with unequal heads (one keeps 0 heads in a layer), each from its own checkpoint == the stock
  model with the removed heads' W_O column blocks zeroed (the family's pruning adapter zeroes them);
- gradients == the references' gradients;
- checkpoints with other heads (pre-training, masked LM) convert as bare encoders; unsupported task
  heads and unknown model types are refused in one line (exit 2);
- unfuse -> the family's stock model reproduces each member;
- text families: saved folders load through remote code in a fresh process without hydra_hf (one
  process for all families) and ``pipeline("text-classification")`` returns the ensemble mean.
"""

from __future__ import annotations

import ast
import copy
import json
import shutil

import pytest
import torch
from _family_specs import SPECS, TEXT_SPECS, FamilySpec, inputs, perturbed
from conftest import REPO, TESTS, run_fresh_python

from hydra_hf.assemble import convert_checkpoint
from hydra_hf.cli import main as cli_main
from hydra_hf.convert.reader import Reader
from hydra_hf.errors import HydraInputError
from hydra_hf.families import detect_family, families, family_names, get_family, register_family
from hydra_hf.masks import HeadMasks
from hydra_hf.pruning.gates import zero_head_columns_

ATOL = 1e-5
H = 4
ALL = [[[0, 1, 2, 3]] * 2] * 2
UNEQUAL = [[[0, 1], [2, 3]], [[1, 2, 3], []], [[0], [0, 1, 2, 3]]]  # member 1 keeps no head in layer 1
SENTENCES = ["the movie was very good", "a boring plot and awful actor", "i was not fun"]
ids = [s.name for s in SPECS]
# registered families outside SPECS -> the file that checks their fused models against their references
OWN_SUITES = {
    "clip": "modeling/test_modeling_clip.py",
    "open_clip": "modeling/test_modeling_clip.py",
    "timm_vit": "modeling/test_modeling_vit.py",
    "siglip": "modeling/test_modeling_deit_beit_dinov2_siglip.py",
    "llama": "modeling/test_modeling_llama.py",
    "gpt2": "modeling/test_modeling_gpt2.py",
}


def _reference(spec: FamilySpec, model: torch.nn.Module, kept: list[list[int]]) -> torch.nn.Module:
    """A copy of a stock model with the removed heads' W_O column blocks zeroed (the family's adapter
    says where they are; ALBERT's adapter unties its shared layers first)."""
    ref = copy.deepcopy(model)
    adapter = get_family(spec.name).adapter(ref)
    gates = torch.zeros(len(kept), H)
    for layer, heads in enumerate(kept):
        gates[layer, heads] = 1.0
    zero_head_columns_(ref, gates, adapter=adapter)
    return ref.eval()


def _logits(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch).logits


@pytest.fixture(scope="module")
def stock_dirs(tmp_path_factory):
    """Every family's tiny stock classifier saved with save_pretrained (and its tokenizer)."""
    root = tmp_path_factory.mktemp("stock")
    out = {}
    for spec in SPECS:
        folder = root / spec.name
        spec.stock().save_pretrained(folder)
        if spec.text:
            spec.tokenizer().save_pretrained(folder)
        out[spec.name] = folder
    return out


def test_every_registered_family_is_tested():
    """A new family fails here until it has its line in ``_family_specs.SPECS`` (or a suite of its own)."""
    untested = set(family_names()) - {s.name for s in SPECS} - set(OWN_SUITES)
    assert not untested, f"registered families without a test: {sorted(untested)}; add them to _family_specs.SPECS"
    assert not {s.name for s in SPECS} & set(OWN_SUITES)
    for name, file in OWN_SUITES.items():
        assert name in family_names() and (TESTS / file).is_file(), (name, file)


# --------------------------------------------------------------------------------- equivalence
@pytest.mark.parametrize("spec", SPECS, ids=ids)
def test_all_heads_equal_the_stock_model(spec, stock_dirs):
    stock = spec.stock()
    model = convert_checkpoint(HeadMasks(kept_heads=ALL, num_heads=H), base=stock_dirs[spec.name])
    assert get_family(spec.name) is detect_family(stock_dirs[spec.name])
    batch = inputs(spec, stock)
    for attn in ("sdpa", "eager"):
        model.set_attn_implementation(attn)
        stock.set_attn_implementation(attn)
        with torch.no_grad():
            out = model(**batch)
        expected = _logits(stock, batch)  # (B, C)
        for m in range(2):
            torch.testing.assert_close(out.member_logits[:, m], expected, atol=ATOL, rtol=0)
        torch.testing.assert_close(out.logits, torch.log_softmax(expected, -1), atol=ATOL, rtol=0)


@pytest.mark.parametrize("spec", SPECS, ids=ids)
def test_unequal_heads_equal_the_zeroed_references(spec, tmp_path):
    """Three members, each its own checkpoint (per-member MLPs), keeping 2/4, 3/0 and 1/4 heads;
    eager and sdpa attention."""
    base = spec.stock()
    members = [perturbed(base, seed) for seed in (1, 2, 3)]
    folders = []
    for i, member in enumerate(members):
        member.save_pretrained(tmp_path / f"m{i}")
        folders.append(tmp_path / f"m{i}")
    model = convert_checkpoint(HeadMasks(kept_heads=UNEQUAL, num_heads=H), members=folders, mlp_fusion="per_member")
    batch = inputs(spec, base)
    refs = [_reference(spec, member, UNEQUAL[m]) for m, member in enumerate(members)]
    for attn in ("sdpa", "eager"):
        model.set_attn_implementation(attn)
        with torch.no_grad():
            got = model(**batch).member_logits  # (B, M, C)
        for m, (member, ref) in enumerate(zip(members, refs)):
            ref.set_attn_implementation(attn)
            expected = _logits(ref, batch)
            torch.testing.assert_close(got[:, m], expected, atol=ATOL, rtol=0)
            assert (expected - _logits(member, batch)).abs().max() > 1e-3  # the pruning changes the member
        assert (got[:, 0] - got[:, 1]).abs().max() > 1e-3


def _embedding_weight(model: torch.nn.Module) -> torch.Tensor:
    emb = model.get_input_embeddings()
    return emb.weight if hasattr(emb, "weight") else emb.projection.weight  # ViT: the patch projection


@pytest.mark.parametrize("spec", SPECS, ids=ids)
def test_gradients_equal_the_references(spec, stock_dirs):
    """The mean member loss's gradient: every kept W_O block is its reference's; the shared input
    embedding's is the sum of the references' (each scaled by 1/M)."""
    stock = spec.stock()
    model = convert_checkpoint(
        HeadMasks(kept_heads=UNEQUAL, num_heads=H), base=stock_dirs[spec.name], mlp_fusion="per_member"
    )
    batch, labels = inputs(spec, stock), torch.tensor([0, 2, 1])
    model(**batch, labels=labels).loss.backward()
    dk, M = 8, len(UNEQUAL)
    embedding_grad = torch.zeros_like(_embedding_weight(stock))
    for m in range(M):
        ref = _reference(spec, stock, UNEQUAL[m])
        (torch.nn.functional.cross_entropy(ref(**batch).logits, labels) / M).backward()
        embedding_grad += _embedding_weight(ref).grad
        layers = get_family(spec.name).adapter(ref).towers[get_family(spec.name).towers[0]]
        for layer, heads in enumerate(UNEQUAL[m]):
            if not heads:
                continue
            start = sum(len(UNEQUAL[j][layer]) for j in range(m)) * dk
            fused = model.hydra.layers[layer].attention.o_weight.grad[start : start + len(heads) * dk]  # (k*dk, d)
            cols = torch.cat([torch.arange(h * dk, (h + 1) * dk) for h in heads])
            torch.testing.assert_close(fused, layers[layer].out_proj.weight.grad[:, cols].T, atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(_embedding_weight(model.hydra).grad, embedding_grad, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("spec", SPECS, ids=ids)
def test_unfuse_gives_stock_members(spec, stock_dirs):
    family = get_family(spec.name)
    model = convert_checkpoint(HeadMasks(kept_heads=UNEQUAL, num_heads=H), base=stock_dirs[spec.name])
    batch = inputs(spec, spec.stock())
    with torch.no_grad():
        fused = model(**batch).member_logits  # (B, M, C)
    for m, state in enumerate(family.unfuse(model.state_dict(), model.config)):
        stock = family.stock_model(model.config.base_config, num_labels=3).eval()
        missing, unexpected = stock.load_state_dict(state, strict=False)
        assert not unexpected and all("position_ids" in k or "pooler" in k for k in missing), (missing, unexpected)
        torch.testing.assert_close(_logits(stock, batch), fused[:, m], atol=ATOL, rtol=0)


# ------------------------------------------------------------------------- heads and refusals
@pytest.mark.parametrize("spec", SPECS, ids=ids)
def test_other_heads_convert_as_bare_encoders(spec, tmp_path):
    """A pre-training / masked-LM checkpoint converts: its encoder is read, the classifier is new."""
    stock = spec.stock(head=spec.pretraining)
    stock.save_pretrained(tmp_path / "bare")
    model = convert_checkpoint(HeadMasks(kept_heads=ALL, num_heads=H), base=tmp_path / "bare", num_labels=2)
    assert model.config.num_labels == 2
    body = getattr(stock, stock.base_model_prefix, stock)
    batch = inputs(spec, stock)
    with torch.no_grad():
        expected = body(**batch).last_hidden_state  # (B, T, d)
        got = model.hydra(**batch).member_last_hidden_state  # (B, M, T, d)
    # real tokens only: a padded token whose sliding window holds only padding (ModernBERT) has no defined
    # state (transformers' eager and sdpa paths already disagree there); no output reads it
    keep = batch.get("attention_mask", torch.ones(expected.shape[:2])).bool()  # (B, T)
    torch.testing.assert_close(got[:, 0][keep], expected[keep], atol=ATOL, rtol=0)


@pytest.mark.parametrize("spec", SPECS, ids=ids)
def test_unsupported_task_heads_are_refused(spec, stock_dirs, tmp_path, capsys):
    folder = tmp_path / "head"
    folder.mkdir()
    config = json.loads((stock_dirs[spec.name] / "config.json").read_text())
    config["architectures"] = [f"{spec.prefix}{spec.refused}"]
    (folder / "config.json").write_text(json.dumps(config))
    masks = tmp_path / "m.json"
    HeadMasks(kept_heads=ALL, num_heads=H).save(masks)
    out = tmp_path / "out"
    assert cli_main(["convert", "--base", str(folder), "--masks", str(masks), "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{spec.prefix}{spec.refused}" in err
    assert f"{spec.prefix}ForSequenceClassification" in err or f"{spec.prefix}ForImageClassification" in err
    assert not out.exists()


def test_relative_position_bert_is_refused(stock_dirs, tmp_path, capsys):
    """BERT reads through its TextLayout like every post-LN text family: the fused model implements absolute
    position embeddings only, so a relative-position checkpoint is refused in one line, not converted."""
    folder = tmp_path / "relative"
    shutil.copytree(stock_dirs["bert"], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "position_embedding_type": "relative_key"}))
    masks = tmp_path / "m.json"
    HeadMasks(kept_heads=ALL, num_heads=H).save(masks)
    out = tmp_path / "out"
    assert cli_main(["convert", "--base", str(folder), "--masks", str(masks), "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "position_embedding_type='relative_key'" in err
    assert not out.exists()


def test_unknown_model_type_and_wrong_arch_are_refused(stock_dirs, tmp_path, capsys):
    folder = tmp_path / "gpt"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]})
    )
    masks = tmp_path / "m.json"
    HeadMasks(kept_heads=ALL, num_heads=H).save(masks)
    assert cli_main(["convert", "--base", str(folder), "--masks", str(masks), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "model_type='t5'" in err
    assert all(
        name in err for name in ("bert", "roberta", "xlm_roberta", "electra", "distilbert", "albert", "open_clip")
    )
    # prune refuses a task head it would otherwise re-initialise, before reading any data (the data file is only
    # checked to exist before a model loads; its one row is never read)
    (tmp_path / "none.csv").write_text("text,label\nunread,0\n")
    head = tmp_path / "token-classifier"
    head.mkdir()
    config = json.loads((stock_dirs["bert"] / "config.json").read_text())
    (head / "config.json").write_text(json.dumps({**config, "architectures": ["BertForTokenClassification"]}))
    assert cli_main(["prune", "--model", str(head), "--id-data", str(tmp_path / "none.csv"), "--heads-per-layer", "2",
                     "--output", str(tmp_path / "masks.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        len(err.splitlines()) == 1 and "BertForTokenClassification" in err and not (tmp_path / "masks.json").exists()
    )
    # forcing another family onto a detected one says what the folder is
    args = ["convert", "--base", str(stock_dirs["roberta"]), "--masks", str(masks), "--output", str(tmp_path / "o")]
    assert cli_main([*args, "--arch", "bert"]) == 2
    assert "roberta checkpoint" in capsys.readouterr().err
    # every spelling of a name finds the same family
    assert get_family("open-clip") is get_family("open_clip") is get_family("OPEN_CLIP")
    assert get_family("timm-vit") is get_family("timm_vit") and get_family("xlm-roberta").name == "xlm_roberta"


def test_every_family_holds_a_named_reader():
    """One reader interface: every registered family's Reader names its three functions; a family without one
    is refused when it registers."""
    for family in families():
        assert isinstance(family.reader, Reader), family.name
        assert all(callable(fn) for fn in (family.reader.read_member, family.reader.fuse, family.reader.unfuse))
    readerless = type("ReaderlessFamily", (type(get_family("vit")),), {"name": "readerless", "reader": None})()
    with pytest.raises(HydraInputError, match="family 'readerless' has no reader"):
        register_family(readerless)
    assert "readerless" not in [f.name for f in families()]


def test_shipped_files_import_no_other_family():
    """Each family ships its own modeling file, importing only shared siblings and its own config file
    (every family's but BERT's, whose config is the shared one)."""
    shared = {
        "configuration_hydra.py",
        "hydra_attention.py",
        "hydra_formulas.py",
        "hydra_layers.py",
        "hydra_skeletons.py",
        "pipeline_hydra.py",
    }
    for spec in SPECS:
        family = get_family(spec.name)
        own = set(family.shipped_files) - shared - {family.modeling_file}
        assert all(name.startswith("configuration_hydra_") for name in own), (family.name, own)
        tree = ast.parse((REPO / "src" / "hydra_hf" / "modeling" / family.modeling_file).read_text())
        siblings = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 1}
        assert {f"{name}.py" for name in siblings} <= shared | own, (family.modeling_file, siblings)
        assert shared | {family.modeling_file} <= set(family.shipped_files)


# ------------------------------------------------------------------- remote code and pipeline
def test_fresh_process_remote_code_and_pipeline(stock_dirs, tmp_path):
    """All text families at once: saved folders load with trust_remote_code in a process without
    hydra_hf, give the same logits, and the text-classification pipeline returns the ensemble mean."""
    from transformers import AutoTokenizer

    expected = {}
    for spec in TEXT_SPECS:
        out = tmp_path / spec.name
        model = convert_checkpoint(
            HeadMasks(kept_heads=UNEQUAL, num_heads=H), base=stock_dirs[spec.name], output_dir=out
        )
        config = json.loads((out / "config.json").read_text())
        family = get_family(spec.name)
        assert config["auto_map"] == family.auto_map and (out / family.modeling_file).is_file()
        enc = AutoTokenizer.from_pretrained(out)(SENTENCES, padding=True, return_tensors="pt")
        with torch.no_grad():
            member_logits = model(**enc).member_logits  # (B, M, C)
        expected[spec.name] = (str(out), member_logits)
    code = f"""
        import json, sys, torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline
        result = {{}}
        for name, folder in {json.dumps({k: v[0] for k, v in expected.items()})}.items():
            model = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True).eval()
            tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
            enc = tokenizer({SENTENCES!r}, padding=True, return_tensors="pt")
            with torch.no_grad():
                out = model(**enc)
            pipe = pipeline("text-classification", model=folder, trust_remote_code=True, top_k=None)
            scores = [{{d["label"]: d["score"] for d in row}} for row in pipe({SENTENCES!r})]
            result[name] = {{"member_logits": out.member_logits.tolist(), "module": type(model).__module__,
                            "pipe": [[row[model.config.id2label[c]] for c in range(3)] for row in scores]}}
        assert sys.modules.get("hydra_hf") is None
        print(json.dumps(result))
    """
    stdout = run_fresh_python(code, env={"HF_MODULES_CACHE": str(tmp_path / "modules")})
    assert "Do you wish to run the custom code" not in stdout
    result = json.loads(stdout.strip().splitlines()[-1])
    for name, (_, member_logits) in expected.items():
        got = result[name]
        assert got["module"].startswith("transformers_modules"), got["module"]
        torch.testing.assert_close(torch.tensor(got["member_logits"]), member_logits, atol=ATOL, rtol=0)
        ensemble_mean = torch.softmax(member_logits, -1).mean(1)  # (B, C)
        torch.testing.assert_close(torch.tensor(got["pipe"]), ensemble_mean, atol=ATOL, rtol=0)
