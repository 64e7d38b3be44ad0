"""The user-facing commands on decoders (issue 28): `hydra-hf prune` / `convert` / `evaluate` / `push --dry-run`
on tiny Llama causal LMs and sequence classifiers with a WordPiece tokenizer saved next to them.

Values, not only exit codes: the masks of the CLI equal the library's (build_members, and for one member
taylor_prune / circuit_prune on next-token batches); the evaluate report's numbers equal evaluate_causal_lm's
(causal LM) or the accuracy of the converted classifier computed by hand; the staged card of a causal LM names
AutoModelForCausalLM and the hydra-text-generation pipeline and carries the report's perplexity.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import transformers
from _family_specs import WORDS, wordpiece

from hydra_hf.cli import main as cli_main
from hydra_hf.evaluation.causal_lm import evaluate_causal_lm
from hydra_hf.evaluation.loading import load_causal_lm
from hydra_hf.hub.card import model_kind
from hydra_hf.masks import HeadMasks, load_masks
from hydra_hf.pruning.budget import Budget
from hydra_hf.pruning.circuits import circuit_prune
from hydra_hf.pruning.lm import causal_lm_adapter, lm_batches
from hydra_hf.pruning.members import load_pruning_target
from hydra_hf.pruning.taylor import taylor_prune
from hydra_hf.workflows.prune import build_members

MAX_LENGTH, BATCH = 16, 4


def _config(vocab: int, **extra):
    return transformers.LlamaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64,
                                    pad_token_id=0, tie_word_embeddings=False, initializer_range=0.1, **extra)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny Llama causal LM and a tiny Llama classifier (each with the tokenizer), ID texts with labels,
    OOD texts (letter strings: other tokens than the ID words)."""
    root = tmp_path_factory.mktemp("decoder_cli")
    tokenizer = wordpiece("BertTokenizer")()
    vocab = max(tokenizer.get_vocab().values()) + 1
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(_config(vocab)).eval().save_pretrained(root / "lm")
    torch.manual_seed(1)
    transformers.LlamaForSequenceClassification(_config(vocab, num_labels=2)).eval().save_pretrained(root / "cls")
    for name in ("lm", "cls"):
        tokenizer.save_pretrained(root / name)
    rng = random.Random(0)
    rows = [{"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 7))), "label": i % 2} for i in range(12)]
    ood = [{"text": " ".join("".join(rng.choice("xyzqkv") for _ in range(4)) for _ in range(3))} for _ in range(8)]
    (root / "id.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (root / "ood.jsonl").write_text("\n".join(json.dumps(r) for r in ood))
    return root, [r["text"] for r in rows], [r["label"] for r in rows], [r["text"] for r in ood]


def _run(args, capsys) -> str:
    code = cli_main([str(a) for a in args])
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out


def _error(args, capsys) -> str:
    capsys.readouterr()  # what earlier calls printed
    code = cli_main([str(a) for a in args])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    lines = [line for line in err.splitlines() if "it/s]" not in line and "examples/s]" not in line]  # progress bars
    assert len(lines) == 1 and lines[0].startswith("hydra-hf "), err
    return lines[0]


def _kept(masks) -> list:
    return [[sorted(h) for h in member] for member in masks.kept_heads]


def _kept_from_gates(gates: torch.Tensor) -> list:
    return [torch.nonzero(row > 0.5).flatten().tolist() for row in gates]


# ------------------------------------------------------------------------------------------------ prune
def test_prune_causal_lm_taylor_equals_the_library(files, tmp_path, capsys):
    """Two seeded Taylor members through the CLI == build_members; one member == taylor_prune on the
    next-token batches of every ID text (no subset, no sampling)."""
    root, texts, _, _ = files
    common = ["--model", root / "lm", "--method", "taylor", "--heads-per-layer", 2, "--id-data", root / "id.jsonl",
              "--max-length", MAX_LENGTH, "--batch-size", BATCH, "--no-progress"]
    _run(["prune", *common, "--members", 2, "--seed", 3, "--output", tmp_path / "two.json"], capsys)
    two = load_masks(tmp_path / "two.json")
    library = build_members(load_pruning_target(root / "lm"), method="taylor", budget=Budget(heads_per_layer=2),
                            id_data=str(root / "id.jsonl"), members=2, seed=3, max_length=MAX_LENGTH,
                            batch_size=BATCH, progress=False)
    assert _kept(two) == _kept(library)
    assert all(len(layer) == 2 for member in two.kept_heads for layer in member)
    assert two.metadata["task"] == "causal_lm" and "num_labels" not in two.metadata

    _run(["prune", *common, "--members", 1, "--seed", 0, "--output", tmp_path / "one.json"], capsys)
    target = load_pruning_target(root / "lm")
    assert target.causal_lm and target.num_labels == target.adapter.model.config.vocab_size
    batches = lm_batches(target.tokenizer, texts, max_length=MAX_LENGTH, batch_size=BATCH)
    direct = taylor_prune(causal_lm_adapter(target.adapter.model), batches, Budget(heads_per_layer=2), progress=False)
    assert _kept(load_masks(tmp_path / "one.json"))[0] == _kept_from_gates(direct.gates)


def test_prune_causal_lm_circuit_avg_then_convert(files, tmp_path, capsys):
    """circuit-avg on ID and OOD texts == circuit_prune(score='avg') on the same next-token batches; the
    masks convert into a fused causal LM that keeps exactly those heads."""
    root, texts, _, ood_texts = files
    _run(["prune", "--model", root / "lm", "--method", "circuit-avg", "--members", 1, "--remove", 2,
          "--id-data", root / "id.jsonl", "--ood-data", root / "ood.jsonl", "--max-length", MAX_LENGTH,
          "--batch-size", BATCH, "--no-progress", "--output", tmp_path / "masks.json"], capsys)
    masks = load_masks(tmp_path / "masks.json")
    target = load_pruning_target(root / "lm")
    tok = target.tokenizer
    direct = circuit_prune(target.adapter, lm_batches(tok, texts, max_length=MAX_LENGTH, batch_size=BATCH),
                           lm_batches(tok, ood_texts, max_length=MAX_LENGTH, batch_size=BATCH), Budget(remove=2),
                           score="avg", progress=False)
    assert _kept(masks)[0] == _kept_from_gates(direct.gates)
    assert sum(len(h) for h in masks.kept_heads[0]) == 8 - 2

    _run(
        ["convert", "--base", root / "lm", "--masks", tmp_path / "masks.json", "--output", tmp_path / "hydra"], capsys
    )
    config = json.loads((tmp_path / "hydra" / "config.json").read_text())
    assert config["architectures"] == ["HydraEnsembleLlamaForCausalLM"]
    assert config["kept_heads"] == masks.kept_heads
    assert model_kind(config) == "text-generation"


def test_prune_causal_lm_misuse_is_one_line(files, tmp_path, capsys):
    root, _, _, _ = files
    base = ["prune", "--model", root / "lm", "--method", "taylor", "--members", 1, "--heads-per-layer", 2,
            "--id-data", root / "id.jsonl", "--output", tmp_path / "m.json"]
    assert "--label-column 'label' does not apply to the causal LM" in _error(
        [*base, "--label-column", "label"], capsys
    )
    assert "--num-labels 2 does not apply to the causal LM" in _error([*base, "--num-labels", 2], capsys)
    assert "needs at least 2 tokens" in _error([*base, "--max-length", 1], capsys)
    ood = [*base[:4], "circuit-ood", *base[5:]]
    assert "--ood-data" in _error(ood, capsys)
    assert not (tmp_path / "m.json").exists()

    # a tokenizer of another model (ids past the embeddings): one line from prune and from evaluate
    (tmp_path / "other").mkdir()
    for name in ("config.json", "model.safetensors"):
        (tmp_path / "other" / name).write_bytes((root / "lm" / name).read_bytes())
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, **{w: 200 + i for i, w in enumerate(WORDS)}}
    transformers.BertTokenizer(vocab=vocab).save_pretrained(tmp_path / "other")
    other = ["--model", tmp_path / "other", *base[3:]]
    assert "the tokenizer gives token id" in _error(["prune", *other], capsys)
    assert "has token ids up to 218 but the model has 76 token embeddings" in _error(
        ["evaluate", "--model", tmp_path / "other", "--id-data", root / "id.jsonl", "--ood-data", root / "ood.jsonl",
         "--report", tmp_path / "r"], capsys)


# --------------------------------------------------------------------------------------------- evaluate
def test_evaluate_causal_lm_report_equals_evaluate_causal_lm(files, tmp_path, capsys):
    """The report of a Hydra causal LM and its single base: every number from evaluate_causal_lm."""
    root, texts, _, ood_texts = files
    HeadMasks([[[0, 1], [2, 3]], [[1, 2], [0, 3]]], num_heads=4).save(tmp_path / "masks.json")
    _run(
        ["convert", "--base", root / "lm", "--masks", tmp_path / "masks.json", "--output", tmp_path / "hydra"], capsys
    )
    out = _run(
        [
            "evaluate",
            "--model",
            tmp_path / "hydra",
            "--baseline",
            f"Single={root / 'lm'}",
            "--id-data",
            root / "id.jsonl",
            "--ood-data",
            f"Letters={root / 'ood.jsonl'}",
            "--max-length",
            MAX_LENGTH,
            "--batch-size",
            BATCH,
            "--report",
            tmp_path / "report",
        ],
        capsys,
    )
    assert "Hydra: perplexity" in out
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    rows = {row["method"]: row for row in report["rows"]}
    for name, folder in (("Hydra", tmp_path / "hydra"), ("Single", root / "lm")):
        model, tokenizer = load_causal_lm(folder)
        expected = evaluate_causal_lm(model, texts, {"Letters": ood_texts}, tokenizer=tokenizer, max_length=MAX_LENGTH,
                                      batch_size=BATCH, progress=False)
        for key in ("perplexity", "nll", "accuracy", "ece", "mutual_information"):
            assert rows[name][key] == pytest.approx(expected[key], rel=1e-9, abs=1e-12), (name, key)
        for key in ("auroc", "fpr95"):
            assert rows[name][f"Letters/{key}"] == pytest.approx(expected["ood"]["Letters"]["scores"]["msp"][key])
        assert rows[name]["members"] == (2 if name == "Hydra" else 1)
        assert report["causal_lm"][name]["ood"]["Letters"]["scores"]["likelihood"]["auroc"] == pytest.approx(
            expected["ood"]["Letters"]["scores"]["likelihood"]["auroc"])
    assert rows["Hydra"]["mutual_information"] > 0 and rows["Single"]["mutual_information"] == pytest.approx(
        0, abs=1e-7
    )
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert "PPL ↓" in markdown and "Letters AUROC ↑" in markdown and "likelihood AUROC ↑" in markdown
    assert report["task"] == "causal_lm" and report["settings"]["id_data"] == str(root / "id.jsonl")

    # classifier options and non-LM baselines are one line each
    base = [
        "evaluate",
        "--model",
        tmp_path / "hydra",
        "--id-data",
        root / "id.jsonl",
        "--ood-data",
        root / "ood.jsonl",
        "--report",
        tmp_path / "r2",
    ]
    assert "--temperature-scaling does not apply" in _error([*base, "--temperature-scaling", "--val-data",
                                                            root / "id.jsonl"], capsys)
    assert "is not a causal LM folder" in _error([*base, "--baseline", f"C={root / 'cls'}"], capsys)
    assert "not a sequence score of a causal LM" in _error([*base, "--score", "energy"], capsys)

    # ------------------------------------------------------------------------------ push --dry-run: the card
    out = _run(["push", tmp_path / "hydra", "--repo-id", "org/hydra-tiny-llama", "--report", tmp_path / "report",
                "--dry-run", "--staging", tmp_path / "staged"], capsys)
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["validated"]["auto_class"] == "AutoModelForCausalLM"
    assert summary["validated"]["pipeline"] == "HydraTextGenerationPipeline"
    card = (tmp_path / "staged" / "README.md").read_text()
    assert "pipeline_tag: text-generation" in card
    assert "AutoModelForCausalLM.from_pretrained(repo_id" in card and 'pipeline("hydra-text-generation"' in card
    assert "generate_with_uncertainty" in card and "type: perplexity" in card
    assert f"{rows['Hydra']['perplexity']:.4g}" in card  # the report's table
    assert (tmp_path / "staged" / "evaluation" / "report.json").is_file()


# ------------------------------------------------------------------------------ decoder classifier round trip
def test_decoder_classifier_prune_convert_evaluate(files, tmp_path, capsys):
    """A Llama sequence classifier goes through the classifier paths: prune (labelled data), convert, evaluate;
    the report's accuracy equals the converted model's on the ID texts, computed here."""
    root, texts, labels, _ = files
    _run(["prune", "--model", root / "cls", "--method", "taylor", "--members", 2, "--heads-per-layer", 3,
          "--id-data", root / "id.jsonl", "--no-progress", "--output", tmp_path / "masks.json"], capsys)
    masks = load_masks(tmp_path / "masks.json")
    assert masks.metadata["num_labels"] == 2 and all(len(h) == 3 for m in masks.kept_heads for h in m)
    _run(
        ["convert", "--base", root / "cls", "--masks", tmp_path / "masks.json", "--output", tmp_path / "hydra"], capsys
    )
    assert model_kind(json.loads((tmp_path / "hydra" / "config.json").read_text())) == "text"
    _run(["evaluate", "--model", tmp_path / "hydra", "--id-data", root / "id.jsonl", "--ood-data", root / "ood.jsonl",
          "--bootstrap", 0, "--report", tmp_path / "report"], capsys)
    row = json.loads((tmp_path / "report" / "report.json").read_text())["rows"][0]
    model = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hydra").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hydra")
    with torch.no_grad():
        enc = tokenizer(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
        predicted = model(**enc).logits.argmax(-1)
    assert row["accuracy"] == pytest.approx(float((predicted == torch.tensor(labels)).float().mean()))
    assert Path(tmp_path / "report" / "report.md").is_file()


def test_gpt2_causal_lm_prune_and_evaluate_a_stock_model(files, tmp_path, capsys):
    """GPT-2 (Conv1D weights): circuit-acc through the CLI == circuit_prune(score='acc') on the next-token batches;
    a stock causal LM as --model evaluates as one member, its numbers those of evaluate_causal_lm."""
    root, texts, _, ood_texts = files
    tokenizer = transformers.AutoTokenizer.from_pretrained(root / "lm")
    torch.manual_seed(2)
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=len(tokenizer.get_vocab()) + 2,
                                     n_positions=64, pad_token_id=0, initializer_range=0.2)
    transformers.GPT2LMHeadModel(config).eval().save_pretrained(tmp_path / "gpt2")
    tokenizer.save_pretrained(tmp_path / "gpt2")
    _run(["prune", "--model", tmp_path / "gpt2", "--method", "circuit-acc", "--members", 1, "--heads-per-layer", 3,
          "--id-data", root / "id.jsonl", "--max-length", MAX_LENGTH, "--batch-size", BATCH, "--no-progress",
          "--output", tmp_path / "masks.json"], capsys)
    target = load_pruning_target(tmp_path / "gpt2")
    direct = circuit_prune(
        target.adapter,
        lm_batches(target.tokenizer, texts, max_length=MAX_LENGTH, batch_size=BATCH),
        None,
        Budget(heads_per_layer=3),
        score="acc",
        progress=False,
    )
    assert _kept(load_masks(tmp_path / "masks.json"))[0] == _kept_from_gates(direct.gates)

    _run(["evaluate", "--model", tmp_path / "gpt2", "--name", "GPT-2", "--id-data", root / "id.jsonl", "--ood-data",
          root / "ood.jsonl", "--score", "likelihood", "--max-length", MAX_LENGTH, "--report", tmp_path / "report"],
         capsys)
    (row,) = json.loads((tmp_path / "report" / "report.json").read_text())["rows"]
    model, tok = load_causal_lm(tmp_path / "gpt2")
    name = str(root / "ood.jsonl")  # an unnamed --ood-data is named by its spec, as for classifiers
    expected = evaluate_causal_lm(model, texts, {name: ood_texts}, tokenizer=tok, max_length=MAX_LENGTH,
                                  batch_size=32, progress=False)
    assert (row["method"], row["members"]) == ("GPT-2", 1)
    assert row["perplexity"] == pytest.approx(expected["perplexity"], rel=1e-9)
    assert row[f"{name}/auroc"] == pytest.approx(expected["ood"][name]["scores"]["likelihood"]["auroc"])
