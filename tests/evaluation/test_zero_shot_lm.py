"""A causal LM as a zero-shot classifier (hydra_hf.prompting, hydra_hf.evaluation.zero_shot_lm,
hydra_hf.pruning.zero_shot_lm, `hydra-hf evaluate --prompt`), on tiny Llama and GPT-2 LMs whose word-level
tokenizer has a chat template.

Values, not shapes: the predictor's class logits equal the label words' log-probabilities of the stock model run
on each whole prompt by hand (with and without the prefix cache, stock and Hydra, Llama and GPT-2); a Hydra member
keeping every head equals the stock model; a prompt ensemble stacks prompts as members; the pruning adapter's loss
is the cross-entropy of the renormalised label-word distribution, and build_members on a prompted target equals
taylor_prune on its prompt batches; the CLI's report equals the predictor's accuracy and NLL computed by hand.
"""

from __future__ import annotations

import json
import math

import datasets
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from _tiny_decoders import save_gpt2, save_llama, write_masks
from transformers import AutoModelForCausalLM, AutoTokenizer

from hydra_hf.assemble import convert_checkpoint
from hydra_hf.cli import main as cli_main
from hydra_hf.errors import HydraInputError
from hydra_hf.evaluation import predict
from hydra_hf.evaluation.zero_shot_lm import ZeroShotLMPredictor, make_text_batches
from hydra_hf.masks import HeadMasks
from hydra_hf.prompting import (
    ZeroShotPrompt,
    label_word_logits,
    left_padded,
    parse_label_words,
    read_zero_shot_prompts,
)
from hydra_hf.pruning import Budget, load_zero_shot_lm_target, taylor_prune, zero_shot_lm_batches
from hydra_hf.workflows.evaluate import EvaluationSpec, evaluate_folder
from hydra_hf.workflows.prune import build_members

CHAT = ("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} .\n{% endfor %}"
        "{% if add_generation_prompt %}assistant :{% endif %}")
PROMPT = ZeroShotPrompt("the movie was {text} it was", [["good", "great"], ["bad"]], system="a film plot")
TEXTS = ["good fun movie", "awful", "the plot was boring and the actor bad", "great", "it was a film"]
MORE = TEXTS + ["bad bad film", "a great actor", "boring", "fun fun fun", "the plot"]  # 10 texts (files: no repeats)


def _with_chat(folder):
    tok = AutoTokenizer.from_pretrained(folder)
    tok.chat_template = CHAT
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def lms(tmp_path_factory):
    root = tmp_path_factory.mktemp("zero_shot_lm")
    return {"llama": _with_chat(save_llama(root / "llama", head="ForCausalLM")),
            "gpt2": _with_chat(save_gpt2(root / "gpt2", head="LMHeadModel"))}


def _by_hand(model, tok, prompt, texts):
    """The label words' log-probabilities of the stock model run on each whole prompt alone (no padding)."""
    rows = []
    with torch.no_grad():
        for text in texts:
            prefix, rest = prompt.encode(tok, text, 64)
            logits = model(input_ids=torch.tensor([prefix + rest])).logits[0, -1]  # (V,)
            rows.append(label_word_logits(logits, prompt.label_token_ids(tok)))
    return torch.stack(rows)  # (N, C)


def test_the_prompt_renders_through_the_chat_template_and_encodes_as_the_whole_prompt(lms):
    tok = AutoTokenizer.from_pretrained(lms["llama"])
    before, after = PROMPT.render(tok)
    assert before == "system : a film plot .\nuser : the movie was " and after == " it was .\nassistant :"
    prefix, lead, suffix = PROMPT.parts(tok)
    assert lead == " " and prefix == tok(before.rstrip(" "), add_special_tokens=False)["input_ids"]
    assert suffix == tok(after, add_special_tokens=False)["input_ids"]
    whole = tok(before + "good fun" + after, add_special_tokens=False)["input_ids"]
    assert sum(PROMPT.encode(tok, "good fun", 64), []) == whole
    assert PROMPT.encode(tok, "good fun movie", 2)[1][:2] == tok("good fun", add_special_tokens=False)["input_ids"]
    vocab = tok.get_vocab()
    assert PROMPT.label_token_ids(tok) == [[vocab["good"], vocab["great"]], [vocab["bad"]]]
    # without a chat template: system, blank line, user message, newline, the answer's start
    plain = AutoTokenizer.from_pretrained(lms["llama"])
    plain.chat_template = None
    prompt = ZeroShotPrompt("the movie was {text}", [["good"], ["bad"]], system="a plot", answer_prefix="it was")
    assert prompt.render(plain) == ("a plot\n\nthe movie was ", "\nit was")


def test_label_word_logits_renormalise_the_label_words():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0], [1.0, 1.0, 1.0, 1.0]])
    out = label_word_logits(logits, [[0, 2], [3]])
    p = logits.softmax(-1)
    assert torch.allclose(out.softmax(-1)[:, 0], (p[:, 0] + p[:, 2]) / (p[:, 0] + p[:, 2] + p[:, 3]))
    assert torch.allclose(out[:, 1], p[:, 3].log())
    batch = left_padded([[5, 6, 7], [8]], pad_token_id=0, offset=4)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [0, 0, 8]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert batch["position_ids"].tolist() == [[4, 5, 6], [4, 4, 4]]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_the_predictor_equals_each_whole_prompt_run_by_hand_with_and_without_the_prefix_cache(lms, family):
    tok = AutoTokenizer.from_pretrained(lms[family])
    model = AutoModelForCausalLM.from_pretrained(lms[family]).eval()
    want = _by_hand(model, tok, PROMPT, TEXTS)
    other = ZeroShotPrompt("{text} so the film was", [["good"], ["bad", "awful"]], answer_prefix="it")
    with torch.inference_mode():
        cached = ZeroShotLMPredictor(model, tok, [PROMPT, other]).member_logits({"text": TEXTS})
        full = ZeroShotLMPredictor(model, tok, PROMPT, prefix_cache=False).member_logits({"text": TEXTS})
    assert cached.shape == (5, 2, 2) and full.shape == (5, 1, 2)
    torch.testing.assert_close(cached[:, 0], want, atol=1e-5, rtol=0)
    torch.testing.assert_close(full[:, 0], want, atol=1e-5, rtol=0)
    torch.testing.assert_close(cached[:, 1], _by_hand(model, tok, other, TEXTS), atol=1e-5, rtol=0)
    assert not torch.allclose(cached[:, 0], cached[:, 1])  # the prompts differ: a prompt ensemble has members
    # a Hydra LM: its members (one keeps every head) side by side; the pruned members are other models
    masks = HeadMasks.load(write_masks(lms[family].parent / f"{family}.json",
                                       kept=[[[0, 1], [1, 2, 3]], [[0, 1, 2, 3], [0, 1, 2, 3]]]))
    hydra = convert_checkpoint(masks, base=lms[family]).eval()
    predictor = ZeroShotLMPredictor(hydra, tok, PROMPT)
    with torch.inference_mode():
        members = predictor.member_logits({"text": TEXTS})
        again = ZeroShotLMPredictor(hydra, tok, PROMPT, prefix_cache=False).member_logits({"text": TEXTS})
    assert members.shape == (5, 2, 2)
    torch.testing.assert_close(members[:, 1], want, atol=1e-5, rtol=0)
    torch.testing.assert_close(members, again, atol=1e-5, rtol=0)
    assert (members[:, 0] - want).abs().max() > 1e-3
    assert predictor.compute_ratio() < 2.0 and ZeroShotLMPredictor(model, tok, [PROMPT, other]).compute_ratio() == 2


def test_predict_reads_text_batches_with_labels(lms):
    tok = AutoTokenizer.from_pretrained(lms["llama"])
    model = AutoModelForCausalLM.from_pretrained(lms["llama"]).eval()
    data = datasets.Dataset.from_dict({"text": TEXTS, "label": [0, 1, 1, 0, 0]})
    preds = predict(ZeroShotLMPredictor(model, tok, PROMPT), make_text_batches(data, batch_size=2))
    assert preds.labels.tolist() == [0, 1, 1, 0, 0]
    torch.testing.assert_close(preds.member_logits[:, 0], _by_hand(model, tok, PROMPT, TEXTS), atol=1e-5, rtol=0)


def test_the_pruning_loss_is_the_label_word_cross_entropy_and_build_members_prunes_on_it(lms, tmp_path):
    data = datasets.Dataset.from_dict({"text": TEXTS * 2, "label": [0, 1, 1, 0, 0] * 2})
    target = load_zero_shot_lm_target(lms["llama"], PROMPT, class_names=["fresh", "rotten"])
    assert target.num_labels == 2 and target.label2id == {"fresh": 0, "rotten": 1} and target.prompt == PROMPT
    batches = zero_shot_lm_batches(target.tokenizer, PROMPT, data, batch_size=4, max_text_tokens=64)
    assert [len(b["labels"]) for b in batches] == [4, 4, 2]
    logits = torch.cat([target.adapter.logits(b) for b in batches]).detach()  # (N, C)
    model = AutoModelForCausalLM.from_pretrained(lms["llama"]).eval()
    torch.testing.assert_close(logits, _by_hand(model, target.tokenizer, PROMPT, TEXTS * 2), atol=1e-5, rtol=0)
    loss = F.cross_entropy(logits, torch.tensor(data["label"]))
    p = logits.softmax(-1)[torch.arange(10), torch.tensor(data["label"])]
    assert math.isclose(float(loss), float(-p.log().mean()), rel_tol=1e-6)
    masks = build_members(target, method="taylor", budget=Budget(heads_per_layer=2), id_data=data, members=1,
                          seed=0, batch_size=4, max_length=64, progress=False)
    by_hand = taylor_prune(target.adapter, batches, Budget(heads_per_layer=2), progress=False)
    assert masks.kept_heads[0] == [torch.nonzero(g).flatten().tolist() for g in by_hand.gates]
    assert masks.to_dict()["num_key_value_heads"] == 2


def test_prompts_and_label_words_from_the_command_line(tmp_path):
    assert parse_label_words("negative|bad,positive") == [["negative", "bad"], ["positive"]]
    file = tmp_path / "prompts.json"
    file.write_text(json.dumps([{"template": "A {text}", "label_words": ["x", "y"], "name": "first"},
                                {"template": "B {text}", "system": "s", "answer_prefix": " so"}]))
    prompts = read_zero_shot_prompts([str(file), "C\\n{text}"], [["good"], ["bad"]])
    assert [p.name for p in prompts] == ["first", "B ...", "C ..."]
    assert prompts[0].label_words == (("x",), ("y",)) and prompts[1].label_words == (("good",), ("bad",))
    assert prompts[2].template == "C\n{text}" and prompts[1].system == "s"
    for bad, match in [(lambda: ZeroShotPrompt("no text here", [["a"], ["b"]]), "exactly once"),
                       (lambda: ZeroShotPrompt("{text}", [["a"]]), "2 classes or more"),
                       (lambda: ZeroShotPrompt("{text}", [["a"], [" "]]), "non-empty word"),
                       (lambda: parse_label_words("only"), "one word per class"),
                       (lambda: read_zero_shot_prompts(["{text}"], None), "label words"),
                       (lambda: read_zero_shot_prompts([str(tmp_path / "missing.json")], None), "no such file")]:
        with pytest.raises(HydraInputError, match=match):
            bad()


def test_label_words_that_share_a_first_token_are_refused(lms):
    tok = AutoTokenizer.from_pretrained(lms["llama"])
    with pytest.raises(HydraInputError, match="start with the same token"):
        ZeroShotPrompt("{text}", [["good"], ["good fun"]]).label_token_ids(tok)


@pytest.fixture(scope="module")
def data_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("zero_shot_lm_data")
    pd.DataFrame({"text": MORE, "label": ["good", "bad", "bad", "good", "good"] * 2}).to_csv(
        root / "id.csv", index=False)
    pd.DataFrame({"text": ["a a a", "it it", "the the the", "plot"]}).to_csv(root / "ood.csv", index=False)
    return root


def test_evaluate_classifies_zero_shot_with_prompts_and_reports_what_the_predictor_gives(lms, data_files, tmp_path):
    report = tmp_path / "report"
    args = ["evaluate", "--model", str(lms["llama"]), "--baseline", f"Other={lms['gpt2']}", "--prompt",
            PROMPT.template, "--label-words", "good|great,bad", "--class-names", "good,bad", "--id-data",
            str(data_files / "id.csv"), "--ood-data", f"noise={data_files / 'ood.csv'}", "--report", str(report),
            "--bootstrap", "20", "--no-progress"]
    assert cli_main(args) == 0
    rows = {r["method"]: r for r in json.loads((report / "report.json").read_text())["rows"]}
    tok = AutoTokenizer.from_pretrained(lms["llama"])
    model = AutoModelForCausalLM.from_pretrained(lms["llama"]).eval()
    prompt = ZeroShotPrompt(PROMPT.template, [["good", "great"], ["bad"]])  # no system message: the CLI's
    probs = _by_hand(model, tok, prompt, MORE).softmax(-1)
    labels = torch.tensor([0, 1, 1, 0, 0] * 2)
    assert math.isclose(rows["Hydra"]["accuracy"], float((probs.argmax(-1) == labels).double().mean()), abs_tol=1e-9)
    assert math.isclose(rows["Hydra"]["nll"], float(-probs[torch.arange(10), labels].log().mean()), rel_tol=1e-4)
    assert rows["Other"]["members"] == 1 and 0 <= rows["Hydra"]["noise"]["auroc"] <= 1
    settings = json.loads((report / "report.json").read_text())["settings"]
    assert settings["class_names"] == ["good", "bad"] and settings["prompts"][0]["template"] == PROMPT.template
    # the library call behind it: a Hydra LM folder gives its members' rows
    masks = write_masks(tmp_path / "m.json", kept=[[[0, 1], [1, 2, 3]], [[2, 3], [0]], [[0, 1, 2, 3]] * 2])
    assert cli_main(["convert", "--base", str(lms["llama"]), "--masks", str(masks), "--output",
                     str(tmp_path / "hydra")]) == 0
    done = evaluate_folder(EvaluationSpec(model=str(tmp_path / "hydra"), id_data=str(data_files / "id.csv"),
                                          ood_data=[str(data_files / "ood.csv")], report=str(tmp_path / "r2"),
                                          prompt=[PROMPT.template], class_names="good,bad", bootstrap=0))
    assert done.kind == "zero_shot_lm" and done.result.rows[0]["members"] == 3
    member = done.result.id_predictions["Hydra"].member_logits[:, 2]  # every head kept: the stock model
    torch.testing.assert_close(member.softmax(-1), _by_hand(model, tok, ZeroShotPrompt(
        PROMPT.template, [["good"], ["bad"]]), MORE).softmax(-1), atol=1e-5, rtol=0)


@pytest.mark.parametrize("extra, match", [
    (["--templates", "simple"], "--templates does not apply"),
    (["--mc-dropout", "Hydra"], "--mc-dropout does not apply"),
    (["--class-names", "a,b,c", "--label-words", "good,bad"], "gives 3 classes"),
])
def test_evaluate_refuses_what_does_not_fit_a_prompted_lm(lms, data_files, tmp_path, extra, match, capsys):
    args = ["evaluate", "--model", str(lms["llama"]), "--prompt", "the movie was {text}", "--id-data",
            str(data_files / "id.csv"), "--ood-data", str(data_files / "ood.csv"), "--report", str(tmp_path / "r")]
    if "--class-names" not in extra:
        args += ["--class-names", "good,bad"]
    assert cli_main(args + extra) == 2 and match in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_prompt_options_are_refused_without_a_causal_lm(tiny_bert_dir, data_files, tmp_path, capsys):
    base = ["evaluate", "--model", str(tiny_bert_dir), "--id-data", str(data_files / "id.csv"), "--ood-data",
            str(data_files / "ood.csv"), "--report", str(tmp_path / "r")]
    for extra, match in [(["--prompt", "x {text}"], "is not one"), (["--label-words", "a,b"], "give the prompt")]:
        assert cli_main(base + extra) == 2 and match in capsys.readouterr().err


def test_prune_with_a_prompt_gives_the_library_members(lms, data_files, tmp_path, capsys):
    out = tmp_path / "masks.json"
    args = ["prune", "--model", str(lms["llama"]), "--prompt", PROMPT.template, "--label-words", "good|great,bad",
            "--class-names", "good,bad", "--method", "taylor", "--members", "2", "--heads-per-layer", "2",
            "--seed", "3", "--id-data", str(data_files / "id.csv"), "--max-length", "16", "--no-progress",
            "--output", str(out)]
    assert cli_main(args) == 0
    target = load_zero_shot_lm_target(lms["llama"], ZeroShotPrompt(PROMPT.template, [["good", "great"], ["bad"]]),
                                      class_names=["good", "bad"])
    want = build_members(target, method="taylor", budget=Budget(heads_per_layer=2), id_data=str(data_files / "id.csv"),
                         members=2, seed=3, batch_size=8, max_length=16, progress=False)
    masks = HeadMasks.load(out)
    assert masks.kept_heads == want.kept_heads and masks.kept_heads[0] != masks.kept_heads[1]
    assert masks.metadata["prompt"]["template"] == PROMPT.template and masks.metadata["class_names"] == ["good", "bad"]
    base = ["prune", "--method", "taylor", "--members", "1", "--remove", "1", "--id-data", str(data_files / "id.csv"),
            "--output", str(tmp_path / "m2.json")]
    assert cli_main(base + ["--model", str(lms["llama"]), "--label-words", "a,b"]) == 2
    assert "give the prompt too" in capsys.readouterr().err
