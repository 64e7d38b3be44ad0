"""Decoder edges a user meets first: texts longer than GPT-2's positions (``n_positions``), tokenizers without a
pad token, ``num_return_sequences`` with a padded batch, an empty prompt and ``batch_size=`` in the
``hydra-text-generation`` pipeline. Every check compares numbers with a reference computed here.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
import transformers
from _tiny_decoders import EOS, save_gpt2, save_llama, write_data, write_masks

from hydra_hf.assemble import convert_checkpoint
from hydra_hf.cli import main as cli_main
from hydra_hf.evaluation import max_text_positions
from hydra_hf.evaluation.causal_lm import evaluate_causal_lm
from hydra_hf.evaluation.loading import load_causal_lm

ATOL = 1e-5
SAVERS = {"llama": (save_llama, "ForCausalLM"), "gpt2": (save_gpt2, "LMHeadModel")}
PROMPTS = ["the movie was", "good", "a plot it was fun"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Per family: a converted 2-member causal LM whose tokenizer pads (with ``<eos>``) on the left."""
    root = tmp_path_factory.mktemp("decoder-edges")
    masks = write_masks(root / "masks.json")
    out = {}
    for family, (save, head) in SAVERS.items():
        base = save(root / f"{family}-base", head=head, padding_side="left", pad=True)
        out[family] = root / f"{family}-hydra"
        convert_checkpoint(masks, base=base, output_dir=out[family])
    return out


def _lm(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(folder).eval()


# ---------------------------------------------------------------------------------- item: positions
@pytest.mark.parametrize("config, limit", [
    (transformers.GPT2Config(n_positions=48), 48),
    (transformers.LlamaConfig(max_position_embeddings=40), 40),
    (transformers.BertConfig(max_position_embeddings=72), 72),
    (transformers.RobertaConfig(max_position_embeddings=66, pad_token_id=1), 64),  # less the padding offset
], ids=["gpt2", "llama", "bert", "roberta"])
def test_max_text_positions_reads_the_name_each_config_class_gives_it(config, limit):
    assert max_text_positions(config) == limit


def test_evaluate_gpt2_causal_lm_truncates_texts_to_its_positions(folders, tmp_path, capsys):
    """Texts of 160 tokens for a GPT-2 of 64 positions: the report equals evaluate_causal_lm at max_length 64."""
    folder = folders["gpt2"]
    assert max_text_positions(transformers.AutoConfig.from_pretrained(folder)) == 64
    texts = [" ".join(["the movie was good"] * 40), " ".join(["a plot it was fun bad"] * 30)] * 2
    ood = ["boring awful actor film", "great fun the a it"] * 2
    (tmp_path / "id.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in texts))
    (tmp_path / "ood.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in ood))
    code = cli_main(["evaluate", "--model", str(folder), "--id-data", str(tmp_path / "id.jsonl"), "--ood-data",
                     f"ood={tmp_path / 'ood.jsonl'}", "--report", str(tmp_path / "report")])
    assert code == 0, capsys.readouterr().err
    (row,) = json.loads((tmp_path / "report" / "report.json").read_text())["rows"]
    model, tokenizer = load_causal_lm(folder)
    expected = evaluate_causal_lm(model, texts, {"ood": ood}, tokenizer=tokenizer, max_length=64, progress=False)
    assert row["perplexity"] == pytest.approx(expected["perplexity"], rel=1e-6)
    longer = evaluate_causal_lm(model, texts, tokenizer=tokenizer, max_length=512, progress=False)  # capped the same
    assert longer["num_tokens"] == expected["num_tokens"] == 4 * 63


# ------------------------------------------------------------------------------ item: no pad token
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_prune_and_evaluate_a_decoder_classifier_whose_tokenizer_has_no_pad_token(family, tmp_path, capsys):
    """As fine-tuning: the tokenizer pads with <eos> and the classifier pools every row's last other token;
    the report's accuracy equals the converted model's on the texts, computed here one text at a time."""
    save = save_llama if family == "llama" else save_gpt2
    base = save(tmp_path / "base")  # no pad token in the tokenizer or the config
    train, evaluation = write_data(tmp_path)
    args = ["prune", "--model", base, "--method", "taylor", "--members", 2, "--heads-per-layer", 3, "--id-data", train,
            "--no-progress", "--output", tmp_path / "masks.json"]
    assert cli_main([str(a) for a in args]) == 0, capsys.readouterr().err
    args = ["convert", "--base", base, "--masks", tmp_path / "masks.json", "--output", tmp_path / "hydra"]
    assert cli_main([str(a) for a in args]) == 0, capsys.readouterr().err
    args = ["evaluate", "--model", tmp_path / "hydra", "--id-data", evaluation, "--ood-data", train, "--bootstrap", 0,
            "--report", tmp_path / "report"]
    assert cli_main([str(a) for a in args]) == 0, capsys.readouterr().err
    row = json.loads((tmp_path / "report" / "report.json").read_text())["rows"][0]
    model = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hydra").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hydra")
    assert tokenizer.pad_token is None and model.config.pad_token_id is None
    frame = pd.read_csv(evaluation)
    with torch.no_grad():
        predicted = [int(model(**tokenizer(t, return_tensors="pt")).logits.argmax(-1)) for t in frame["text"]]
    assert row["accuracy"] == pytest.approx(
        float((torch.tensor(predicted) == torch.tensor(frame["label"])).float().mean())
    )


# ------------------------------------------------------------------ item: generation and the pipeline
def _left_pads(attention_mask: torch.Tensor) -> list[int]:
    return (attention_mask == 0).sum(-1).tolist()


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_generate_with_uncertainty_returns_several_sequences_per_padded_prompt(family, folders):
    """num_return_sequences=2 on a left-padded batch: every returned row's uncertainty equals the one of that row
    scored alone, without padding (the prompts' mask repeated to the returned rows)."""
    model = _lm(folders[family])
    tokenizer = transformers.AutoTokenizer.from_pretrained(folders[family])
    enc = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    out = model.generate_with_uncertainty(**enc, num_beams=2, num_return_sequences=2, max_new_tokens=4,
                                          do_sample=False)
    assert out.sequences.shape[0] == 2 * len(PROMPTS)
    P = enc["input_ids"].shape[1]
    for row, pads in enumerate(sum(([p, p] for p in _left_pads(enc["attention_mask"])), [])):
        alone = model.score_generated(out.sequences[row : row + 1, pads:], P - pads)
        torch.testing.assert_close(out.token_entropy[row : row + 1], alone.token_entropy, atol=ATOL, rtol=0)
        torch.testing.assert_close(out.token_mutual_information[row : row + 1], alone.token_mutual_information,
                                   atol=ATOL, rtol=0)
    assert min(_left_pads(enc["attention_mask"])) == 0 < max(_left_pads(enc["attention_mask"]))  # padded rows too
    with pytest.raises(ValueError, match="repeat_interleave"):  # the mask of the prompts, not of the sequences
        model.score_generated(out.sequences, P, enc["attention_mask"])


def test_generation_pipeline_on_an_empty_prompt_scores_from_the_start_token(folders):
    """GPT-2 generates from its start token: the record's numbers are those of the sequence [<bos>, generated...]
    scored with a one-token prompt."""
    pipe = transformers.pipeline("hydra-text-generation", model=str(folders["gpt2"]), trust_remote_code=True)
    (record,) = pipe("", min_new_tokens=4, max_new_tokens=4, do_sample=False)
    sequence = torch.tensor([[EOS, *record["generated_token_ids"]]])  # GPT-2's start token is its <eos>
    assert sequence.shape[1] == 5
    expected = pipe.model.score_generated(sequence, 1)
    assert record["token_entropy"] == pytest.approx(expected.token_entropy[0].tolist(), abs=ATOL)
    assert record["token_probability"] == pytest.approx(expected.token_probability[0].tolist(), abs=ATOL)
    assert record["sequence_entropy"] == pytest.approx(float(expected.sequence_entropy[0]), abs=ATOL)
    with pytest.raises(ValueError, match="prompt_length=0"):
        pipe.model.score_generated(sequence, 0)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_generation_pipeline_batches(family, folders):
    """batch_size=2 (a padded batch) gives the records of one prompt at a time: texts, token ids and numbers."""
    pipe = transformers.pipeline("hydra-text-generation", model=str(folders[family]), trust_remote_code=True)
    one = pipe(PROMPTS, max_new_tokens=4, do_sample=False)
    batched = pipe(PROMPTS, max_new_tokens=4, do_sample=False, batch_size=2)
    assert len(batched) == len(PROMPTS)
    for (a,), (b,) in zip(one, batched):
        assert a["generated_text"] == b["generated_text"]
        assert a["generated_token_ids"] == b["generated_token_ids"]
        assert set(a) == set(b) and "hydra_generated" not in b  # the documented keys only
        for key in ("token_entropy", "token_mutual_information", "token_probability"):
            assert a[key] == pytest.approx(b[key], abs=ATOL)
        assert a["sequence_entropy"] == pytest.approx(b["sequence_entropy"], abs=ATOL)


# ------------------------------------------------------------------------- item: aggregate of seeds
def test_aggregate_reads_seeds_of_a_llama_recipe_whose_parameter_counts_differ(tmp_path, capsys):
    """Two seeds of one Llama recipe (2 members, 2 of 4 query heads per layer): one keeps query heads reading
    one key/value head, the other heads reading two, so their parameter counts differ; aggregate averages them
    (the recipe is the same) and still refuses a report of another recipe under the same name."""
    base = save_llama(tmp_path / "base", pad=True)
    train, evaluation = write_data(tmp_path)
    seeds = {"a": [[[0, 1], [0, 1]], [[2, 3], [2, 3]]], "b": [[[0, 2], [1, 3]], [[1, 2], [0, 3]]],
             "other": [[[0, 1, 2], [0, 1, 2]], [[1, 2, 3], [0, 2, 3]]]}
    rows = {}
    for seed, kept in seeds.items():
        write_masks(tmp_path / f"{seed}.json", kept=kept)
        convert_checkpoint(tmp_path / f"{seed}.json", base=base, output_dir=tmp_path / seed)
        args = ["evaluate", "--model", tmp_path / seed, "--id-data", evaluation, "--ood-data", train, "--bootstrap", 0,
                "--report", tmp_path / f"report-{seed}"]
        assert cli_main([str(a) for a in args]) == 0, capsys.readouterr().err
        (rows[seed],) = json.loads((tmp_path / f"report-{seed}" / "report.json").read_text())["rows"]
    assert rows["a"]["params_m"] != rows["b"]["params_m"] and rows["a"]["recipe"] == rows["b"]["recipe"]
    capsys.readouterr()
    code = cli_main(
        ["aggregate", str(tmp_path / "report-a"), str(tmp_path / "report-b"), "--output", str(tmp_path / "agg")]
    )
    assert code == 0, capsys.readouterr().err
    (mean,) = json.loads((tmp_path / "agg" / "report.json").read_text())["rows"]
    assert mean["accuracy"] == pytest.approx((rows["a"]["accuracy"] + rows["b"]["accuracy"]) / 2)
    code = cli_main(["aggregate", str(tmp_path / "report-a"), str(tmp_path / "report-other"), "--output",
                     str(tmp_path / "agg2")])
    err = capsys.readouterr().err
    assert code == 2 and "other models under one name" in err and "keeping 12 heads" in err
