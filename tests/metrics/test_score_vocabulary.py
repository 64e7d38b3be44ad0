"""One vocabulary of scores: every entry of the registry says its direction (``sign``), ``evaluate --score`` and
``calibrate --score`` take the registry's names (an older spelling, ``mi``, with one deprecation line), and the
spelling ``calibrate`` stores is the one the shipped pipelines read."""

from __future__ import annotations

import logging

import pytest
import torch

from hydra_hf import metrics
from hydra_hf.cli import build_parser
from hydra_hf.errors import HydraInputError
from hydra_hf.modeling.hydra_decoder import GENERATION_SCORES
from hydra_hf.modeling.pipeline_hydra import SELECTIVE_SCORES, selective_uncertainty


def _member_probs() -> torch.Tensor:
    """Input 0: members agree on one class (sure); input 1: they split (unsure)."""
    sure = torch.tensor([[0.98, 0.01, 0.01]] * 3)
    unsure = torch.tensor([[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8]])
    return torch.stack([sure, unsure]).double()  # (2, M=3, C=3)


def test_every_example_score_says_its_direction():
    """``sign`` is the direction of the score's quantity: the score (sign x quantity) is higher for the sure input,
    the quantity's uncertainty (what abstention thresholds) higher for the unsure one."""
    member_probs = _member_probs()
    logits = torch.log(member_probs.mean(dim=1))
    for name, score in metrics.OOD_SCORES.items():
        assert score.sign in (1.0, -1.0), name
        values = metrics.ood_score(name, member_probs=member_probs, logits=logits)
        assert float(values[0]) > float(values[1]), name  # higher = more in-distribution
        if score.stored is not None:
            uncertainty = selective_uncertainty(member_probs, score.stored)
            assert float(uncertainty[1]) > float(uncertainty[0]), name
    assert {n: s.sign for n, s in metrics.OOD_SCORES.items()} == {
        "msp": 1.0, "entropy": -1.0, "mutual_information": -1.0, "energy": 1.0}


def test_the_stored_spellings_are_the_ones_the_shipped_pipelines_read():
    assert {s.stored for s in metrics.OOD_SCORES.values() if s.stored} == set(SELECTIVE_SCORES)
    assert {s.stored for s in metrics.SEQUENCE_SCORES.values() if s.stored} == set(GENERATION_SCORES)
    assert metrics.stored_score("mutual_information") == "mi" == metrics.stored_score("mutual_information", "sequence")
    with pytest.raises(HydraInputError, match="energy cannot decide abstention; use one of msp, entropy"):
        metrics.stored_score("energy")
    with pytest.raises(HydraInputError, match="'margin' is not a example score; use one of msp, entropy"):
        metrics.resolve_score("margin")


def test_the_old_spelling_is_read_with_one_deprecation_line(caplog):
    with caplog.at_level(logging.WARNING, logger="hydra_hf.metrics.scores"):
        assert metrics.resolve_score("mi").name == "mutual_information"
    assert [r.getMessage() for r in caplog.records] == [
        "--score mi is the old spelling of mutual_information; write mutual_information (the old one is read for now)"
    ]
    assert metrics.canonical_score_name("msp") == "msp" and metrics.canonical_score_name("margin") == "margin"


@pytest.mark.parametrize("command", ["evaluate", "calibrate"])
def test_both_commands_take_the_registrys_names(command):
    required = {"evaluate": ["--model", "m", "--id-data", "d", "--ood-data", "o", "--report", "r"],
                "calibrate": ["m", "--data", "d", "--output", "o"]}
    parser = build_parser()
    for given in ("mutual_information", "mi"):
        args = parser.parse_args([command, *required[command], "--score", given])
        assert args.score == "mutual_information"
    with pytest.raises(SystemExit):  # argparse's "invalid choice" line
        parser.parse_args([command, *required[command], "--score", "margin"])
