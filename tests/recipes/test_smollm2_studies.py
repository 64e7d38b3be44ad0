"""The SmolLM2 classification studies at tiny scale: examples/smollm2_zero_shot.py and examples/smollm2_classify.py
end to end on a tiny random Llama causal LM (a word-level tokenizer with a chat template and the label words),
each run twice (the second from the cache, no model trained or predicted again), and the shared helpers of
hydra_hf.recipes.smollm2 by value: the comparison rule over seeds, the metrics, the cached predictions."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers

from hydra_hf import metrics
from hydra_hf.errors import HydraInputError
from hydra_hf.evaluation import Predictions
from hydra_hf.recipes import smollm2

REPO = Path(__file__).resolve().parents[2]
CHAT = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n' }}{% endif %}"
        "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
WORDS = ("negative positive review movie film the a is this it of and to was good bad not").split()


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory) -> Path:
    """A tiny Llama causal LM (4 query / 2 key-value heads, 2 layers) whose word-level tokenizer knows the label
    words and has a SmolLM2-style chat template (its special tokens are words of the vocabulary)."""
    folder = tmp_path_factory.mktemp("tiny_smollm2")
    vocab = {"<unk>": 0, "<|im_end|>": 1, "<|im_start|>": 2}
    for word in WORDS:
        vocab.setdefault(word, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<|im_end|>",
                                                     pad_token="<|im_end|>",
                                                     additional_special_tokens=["<|im_start|>"])
    tokenizer.chat_template = CHAT
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                                      max_position_embeddings=256, eos_token_id=1, pad_token_id=1, bos_token_id=2,
                                      initializer_range=0.1, tie_word_embeddings=True)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


_render_spec = importlib.util.spec_from_file_location("render_docs_for_smollm2", REPO / "tools" / "render_docs.py")
render_docs = importlib.util.module_from_spec(_render_spec)
_render_spec.loader.exec_module(render_docs)


def _same_cells(first: dict, second: dict) -> None:
    for key in ("rows", "comparisons", "numbers", "test_sizes"):
        assert json.dumps(first[key], sort_keys=True) == json.dumps(second[key], sort_keys=True), key


def test_the_zero_shot_study_runs_end_to_end_and_resumes_from_its_cache(tiny_lm, tmp_path, monkeypatch):
    study = _load("smollm2_zero_shot")
    out, results = tmp_path / "zero_shot", tmp_path / "zero_shot.json"
    args = ["--base", str(tiny_lm), "--output", str(out), "--results", str(results), "--seeds", "0", "1",
            "--hydra", "remove=3", "heads-per-layer=2", "--selection", "8", "--taylor-rounds", "1",
            "--max-text-tokens", "16", "--batch-size", "8", "--no-bf16", "--id-test", "16",
            "--ood-test", "6", "--n-boot", "20"]
    assert study.main(args) == 0
    first = json.loads(results.read_text())
    main, half = "Hydra (Taylor, 3 heads removed)", "Hydra (Taylor, 2 heads kept in every layer)"
    assert [r["model"] for r in first["rows"]] == ["Single", "Prompt ensemble", main, half]
    rows = {r["model"]: r for r in first["rows"]}
    assert rows["Prompt ensemble"]["members"] == 4 and rows[main]["members"] == 3
    assert rows[main]["seeds"] == 2 and rows["Prompt ensemble"]["compute_x"] == 4.0
    assert 1 < rows[half]["compute_x"] < rows[main]["compute_x"] < 3
    assert first["test_sizes"] == {"id": 16, "guardian": 6, "debates": 6, "hamlet": 6, "speeches": 6}
    assert set(first["comparisons"]) == {f"{main} - Single", f"{main} - Prompt ensemble", f"{half} - Single",
                                         f"{half} - Prompt ensemble", "Prompt ensemble - Single"}
    assert first["comparisons"]["Prompt ensemble - Single"]["accuracy"]["p"] is None  # no seeds: bootstrap alone
    masks = json.loads((out / "masks" / "hydra_k2_seed1.json").read_text())
    assert [m["seed"] for m in masks["members"]] == [10, 11, 12]
    assert all(len(layer) == 2 for m in masks["members"] for layer in m["kept_heads"])
    masks = json.loads((out / "masks" / "hydra_remove3_seed1.json").read_text())
    assert all(sum(map(len, m["kept_heads"])) == 8 - 3 for m in masks["members"])  # 2 layers x 4 heads, 3 removed
    assert first["budgets"][main]["query_heads_kept"] == 5 and first["budgets"][half]["kv_heads_kept"] <= 4
    assert set(first["single_check"]) == {"accuracy", "majority", "above_chance"}
    # the Single's predictions are those of the library predictor with the headline prompt, read back from the cache
    single = torch.load(out / "predictions" / "single_prompt0.pt", weights_only=True)
    assert single["id"]["member_logits"].shape == (16, 1, 2)
    assert math.isclose(rows["Single"]["accuracy"], float(
        (single["id"]["member_logits"][:, 0].argmax(-1) == single["id"]["labels"]).double().mean()), abs_tol=1e-12)
    # the docs' views render the file: its rows, every comparison and the prompts
    page = render_docs.VIEWS["smollm2-zero-shot"](first)
    assert all(f"| {name} |" in page for name in ("Single", "Prompt ensemble", main, half, f"{main} - Single"))
    assert f"| {100 * rows['Single']['accuracy']:.1f} |" in page and "| classify the sentiment |" in page
    readme = render_docs.VIEWS["smollm2-zero-shot-readme"](first)
    assert "Prompt ensemble - Single:" in readme and f"{rows[main]['compute_x']:.2f}" in readme
    # a second run resumes: nothing is pruned or predicted again, the same numbers come out
    monkeypatch.setattr(study, "build_members", lambda *a, **k: pytest.fail("pruned again"))
    monkeypatch.setattr(study, "predictions_of", lambda *a, **k: pytest.fail("predicted again"))
    assert study.main(args) == 0
    _same_cells(first, json.loads(results.read_text()))
    # --from-cache writes what a stopped run left: a seed not run is named, a one-seed Hydra compared with nothing
    (out / "predictions" / "hydra_k2_seed1.pt").unlink()
    assert study.main([*args, "--from-cache"]) == 0
    partial = json.loads(results.read_text())
    assert partial["missing"] == [f"{half}, seed 1"] and {r["model"]: r["seeds"] for r in partial["rows"]}[half] == 1
    assert set(partial["comparisons"]) == {f"{main} - Single", f"{main} - Prompt ensemble", "Prompt ensemble - Single"}
    assert partial["comparisons"][f"{main} - Single"] == first["comparisons"][f"{main} - Single"]
    assert "seed 1" in render_docs.VIEWS["smollm2-zero-shot"](partial)
    aside = (out / "predictions" / "single_prompt2.pt").rename(tmp_path / "single_prompt2.pt")
    with pytest.raises(Exception, match="single_prompt2.pt"):
        study.main([*args, "--from-cache"])
    aside.rename(out / "predictions" / "single_prompt2.pt")
    other = list(args)
    other[other.index("--selection") + 1] = "6"
    with pytest.raises(Exception, match="other selection"):
        study.main(other)
    # a cached masks file of another budget under this budget's name is refused, never mixed in
    cell = out / "masks" / "hydra_k2_seed0.json"
    cell.write_text((out / "masks" / "hydra_remove3_seed0.json").read_text())
    with pytest.raises(Exception, match="pruned with the budget"):
        study.main(args)


HYDRA, SLIM = "Hydra (Taylor, 2 heads per layer)", "Slim Hydra (Taylor, 2 heads per layer, top 50 % MLP)"


def test_the_fine_tuned_study_runs_end_to_end_and_resumes_from_its_cache(tiny_lm, tmp_path, monkeypatch):
    study = _load("smollm2_classify")
    out, results = tmp_path / "classify", tmp_path / "classify.json"
    args = ["--base", str(tiny_lm), "--output", str(out), "--results", str(results), "--seeds", "0", "1",
            "--train-samples", "16", "--epochs", "1", "--batch-size", "8", "--max-length", "16", "--no-bf16",
            "--heads", "2", "--selection", "8", "--taylor-rounds", "1", "--member-steps", "1", "--slim-steps", "2",
            "--slim-mlp", "0.5", "--id-test", "16", "--ood-test", "6", "--n-boot", "20"]
    assert study.main(args) == 0
    first = json.loads(results.read_text())
    rows = {r["model"]: r for r in first["rows"]}
    assert set(rows) == {"Single", HYDRA, SLIM, "Deep Ensemble"}
    assert rows["Deep Ensemble"]["members"] == 2 and rows["Deep Ensemble"]["compute_x"] == 2.0
    assert rows[SLIM]["compute_x"] < rows[HYDRA]["compute_x"]
    assert first["training"]["single_seed0"]["steps_run"] == 2 and first["single_steps_per_s"] > 0
    assert first["training"]["slim_seed1"]["members"][2]["history"][-1]["step"] == 2
    hydra = json.loads((out / "masks" / "hydra_seed1.json").read_text())
    slim = json.loads((out / "masks" / "slim_seed1.json").read_text())
    assert [m["kept_heads"] for m in slim["members"]] == [m["kept_heads"] for m in hydra["members"]]
    assert all(len(layer) == 24 for m in slim["members"] for layer in m["kept_neurons"])  # half of 48
    assert not (out / "hydra_seed0").exists()  # member checkpoints go once their predictions are written
    assert set(first["single_checks"]["0"]) >= {"loss_first_tenth", "loss_last_tenth", "learned"}
    checks = first["member_checks"]["slim_seed1"]
    assert len(checks) == 3 and all(len(c["validation_accuracy"]) == len(m["history"]) for c, m in zip(
        checks, first["training"]["slim_seed1"]["members"]))
    page = render_docs.VIEWS["smollm2-classify"](first)
    assert "| Deep Ensemble - Single |" in page and "| seed 1 |" in page and "steps/s" in page
    assert first["cells_cpu_s"] == pytest.approx(sum(first["training"][k]["cpu_seconds"] for k in first["training"]))
    assert f"its fine-tuning cells took {first['cells_cpu_s'] / 3600:.1f} h of CPU time" in page
    best = 100 * max(a for a in checks[0]["validation_accuracy"] if a is not None)
    assert f"| {SLIM} | 1 | {checks[0]['loss_first_tenth']:.3f} → " in page
    assert f"{best:.1f}" in page
    assert "Slim - Hydra:" in render_docs.VIEWS["smollm2-classify-readme"](first)
    monkeypatch.setattr(study, "finetune_members", lambda *a, **k: pytest.fail("trained again"))
    monkeypatch.setattr(study, "predictions_of", lambda *a, **k: pytest.fail("predicted again"))
    assert study.main(args) == 0
    _same_cells(first, json.loads(results.read_text()))
    # --estimate-only: one step's cost in both precisions and the study's core-hours, rendered
    cost_file = tmp_path / "cost.json"
    assert study.main([*args[:args.index("--results")], "--results", str(cost_file), *args[args.index("--seeds"):],
                       "--estimate-only", "--estimate-steps", "1"]) == 0
    cost = json.loads(cost_file.read_text())
    assert set(cost["measured"]) == {"bf16", "fp32"} and cost["precision"] == "fp32"
    assert cost["core_hours"] == pytest.approx(cost["core_minutes"]["total"] / 60) and cost["core_hours"] > 0
    text = render_docs.VIEWS["smollm2-classify-cost"](cost)
    assert f"{cost['measured']['fp32']['steps_per_s']:.2f} steps/s" in text and "(2 seeds)" in text
    # --from-cache: a slim seed whose cells are gone is named and its recipe compared with nothing; no cell computed
    (out / "predictions" / "slim_seed1.pt").unlink()
    assert study.main([*args, "--from-cache"]) == 0
    partial = json.loads(results.read_text())
    assert partial["missing"] == [f"{SLIM}, seed 1"]
    assert not any(name.startswith("Slim") for name in partial["comparisons"])
    assert {"Deep Ensemble - Single", "Hydra - Single", "Hydra - Deep Ensemble"} <= set(partial["comparisons"])
    assert partial["comparisons"]["Hydra - Single"] == first["comparisons"]["Hydra - Single"]
    assert f"The run stopped before these cells: {SLIM}, seed 1" in render_docs.VIEWS[
        "smollm2-classify"](partial)
    (out / "records" / "single_seed0.json").unlink()
    with pytest.raises(HydraInputError, match="lacks the Single of seed 0"):
        study.main([*args, "--from-cache"])


def _predictions(seed: int, shift: float, n: int = 200) -> smollm2.PredictionSet:
    """Two-class predictions whose ID accuracy grows with ``shift`` (logit of the true class); the labels are the
    same for every seed (one test set)."""
    labels = torch.randint(0, 2, (n,), generator=torch.Generator().manual_seed(1234))
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, 1, 2, generator=g)
    logits[torch.arange(n), 0, labels] += shift
    out = {"id": Predictions(logits, labels)}
    for kind in smollm2.OOD_TEST:
        out[kind] = Predictions(torch.randn(n // 2, 1, 2, generator=g) * 0.5, None)
    return out


def test_compare_over_seeds_decides_only_what_every_seed_and_the_t_test_agree_on():
    strong = {s: _predictions(s, 3.0) for s in range(3)}
    weak = {s: _predictions(s, 0.5) for s in range(3)}
    out = smollm2.compare_over_seeds(strong, weak, n_boot=200)
    acc = out["accuracy"]
    by_hand = [smollm2.model_numbers(strong[s])["accuracy"] - smollm2.model_numbers(weak[s])["accuracy"]
               for s in range(3)]
    assert acc["differences"] == pytest.approx(by_hand) and acc["decided"] and acc["direction"] == "higher"
    assert all(lo > 0 for lo, _ in acc["intervals"]) and acc["p"] < 0.05
    # a model against itself plus noise of either sign: never decided
    noisy = {s: _predictions(s, 0.5 + (0.4 if s == 1 else -0.05)) for s in range(3)}
    assert not smollm2.compare_over_seeds(noisy, weak, n_boot=200)["accuracy"]["decided"]
    # one model without seeds against seeded ones; two models without seeds: the bootstrap alone
    against_one = smollm2.compare_over_seeds(strong, {"stock": weak[0]}, n_boot=200)["accuracy"]
    assert len(against_one["differences"]) == 3
    single = smollm2.compare_over_seeds({"a": strong[0]}, {"b": weak[0]}, n_boot=200)["accuracy"]
    assert single["p"] is None and single["decided"]
    with pytest.raises(ValueError, match="same seeds"):
        smollm2.compare_over_seeds(strong, {0: weak[0], 1: weak[1]}, n_boot=10)


def test_model_numbers_ensembles_and_cached_predictions(tmp_path):
    a, b = _predictions(0, 2.0), _predictions(1, 2.0)
    numbers = smollm2.model_numbers(a)
    probs = a["id"].member_logits[:, 0].softmax(-1)
    assert numbers["accuracy"] == pytest.approx(float((probs.argmax(-1) == a["id"].labels).double().mean()))
    want = metrics.ood_report(probs.max(-1).values, a["guardian"].member_logits[:, 0].softmax(-1).max(-1).values)
    assert numbers["ood"]["guardian"]["msp"] == pytest.approx(want["auroc"])
    assert "mutual_information" not in numbers["ood"]["guardian"]
    both = smollm2.ensemble_of([a, b])
    assert both["id"].member_logits.shape == (200, 2, 2) and "mutual_information" in smollm2.model_numbers(
        both)["ood"]["hamlet"]
    calls = []
    first = smollm2.cached_predictions(tmp_path / "p.pt", lambda: calls.append(1) or a)
    again = smollm2.cached_predictions(tmp_path / "p.pt", lambda: calls.append(1) or b)
    assert calls == [1] and torch.equal(again["id"].member_logits, first["id"].member_logits)
    assert torch.equal(again["id"].labels, a["id"].labels) and again["hamlet"].labels is None
