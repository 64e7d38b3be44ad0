"""The shared formulas (``hydra_hf.modeling.hydra_formulas``, shipped, imported by the library too) against values
computed by hand or in float64, and the one-copy rule: no other module of the package defines them."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
import torch

from hydra_hf.modeling import hydra_formulas as formulas

PACKAGE = Path(formulas.__file__).resolve().parents[1]


def _entropy(p: list[float]) -> float:
    return -sum(x * math.log(x) for x in p if x > 0)


def test_entropies_count_zero_probabilities_as_zero():
    probs = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]], dtype=torch.float64)
    want = torch.tensor([0.0, math.log(2)], dtype=torch.float64)
    torch.testing.assert_close(formulas.entropy(probs), want)
    torch.testing.assert_close(formulas.entropy_of_log_probs(torch.log(probs)), want)  # log 0 = -inf


def test_mutual_information_by_hand_in_probability_and_log_space():
    """Members [1, 0] and [0.5, 0.5]: H(mean) - mean H, by hand; both spaces and both member axes agree."""
    p1, p2 = [1.0, 0.0], [0.5, 0.5]
    total, expected = _entropy([0.75, 0.25]), (_entropy(p1) + _entropy(p2)) / 2
    member_probs = torch.tensor([[p1, p2]], dtype=torch.float64)  # (N=1, M=2, C=2)
    assert float(formulas.ensemble_mutual_information(member_probs)) == pytest.approx(total - expected, abs=1e-12)
    assert float(formulas.ensemble_mutual_information(member_probs.transpose(0, 1), dim=0)) == pytest.approx(
        total - expected, abs=1e-12)
    u = formulas.log_prob_uncertainty(torch.log(member_probs), dim=1)
    assert float(u["predictive_entropy"]) == pytest.approx(total, abs=1e-12)
    assert float(u["expected_entropy"]) == pytest.approx(expected, abs=1e-12)
    assert float(u["mutual_information"]) == pytest.approx(total - expected, abs=1e-12)
    torch.testing.assert_close(u["log_probs"].exp(), torch.tensor([[0.75, 0.25]], dtype=torch.float64))
    same = torch.tensor([[p2, p2, p2]], dtype=torch.float64)  # members that agree: no mutual information
    assert float(formulas.ensemble_mutual_information(same)) == 0.0


def test_ensemble_log_probs_is_the_log_of_the_members_mean_softmax():
    g = torch.Generator().manual_seed(0)
    member_logits = torch.randn(4, 3, 7, generator=g) * 3  # (B, M, C)
    out = formulas.ensemble_log_probs(member_logits)
    torch.testing.assert_close(out.exp(), member_logits.softmax(-1).mean(dim=1), atol=1e-6, rtol=0)
    decoder = member_logits[:, :, None].expand(4, 3, 5, 7)  # (B, M, T, V)
    torch.testing.assert_close(formulas.ensemble_log_probs(decoder, dim=1)[:, 2], out, atol=0, rtol=0)
    assert formulas.ensemble_log_probs(member_logits.half()).dtype == torch.float16


def test_the_exact_sigmoid_ensemble_keeps_probabilities_a_clamped_one_loses():
    """Why this one: the mean sigmoid's logit from float32 probabilities, clamped to [1e-7, 1 - 1e-7] (the
    multi-label head's former formula), returns the clamp's logit (-16.1, or 16 at the other end) where
    SigLIP's zero-shot scores live; without the clamp it returns -inf once the float32 sigmoid underflows.
    The log-space formula matches the float64 value to 1e-4 nats over the whole range."""
    member_logits = torch.tensor([[[-40.0, -120.0, 3.0, 25.0]], [[-38.0, -118.0, -3.0, 30.0]]]).transpose(0, 1)
    exact = formulas.ensemble_sigmoid_logits(member_logits)  # (1, 4)
    reference = torch.logit(torch.sigmoid(member_logits.double()).mean(dim=1))  # float64
    reference[0, 1] = -118.0 - math.log(2.0) + math.log1p(math.exp(-2.0))  # float64 underflows too: by hand
    torch.testing.assert_close(exact.double(), reference, atol=1e-4, rtol=0)
    p = torch.sigmoid(member_logits).mean(dim=1)  # float32
    clamped = torch.log(p.clamp(1e-7, 1 - 1e-7) / (1 - p.clamp(1e-7, 1 - 1e-7)))
    assert float(clamped[0, 0]) == pytest.approx(math.log(1e-7 / (1 - 1e-7)), abs=1e-3)  # -16.1, not -38.7
    assert float((clamped - reference.float()).abs()[0, :2].min()) > 20  # nats off where the exact one is right
    assert float(clamped[0, 3]) < 16.2 < 25 < float(reference[0, 3])  # the other end: 1 - 1e-7 in float32
    assert float(torch.log(p / (1 - p))[0, 1]) == -math.inf  # unclamped: the float32 sigmoid is 0
    torch.testing.assert_close(exact[0, 2], clamped[0, 2], atol=1e-5, rtol=0)  # inside the clamp: the same


def test_grouped_query_rule():
    assert formulas.kept_kv_heads([0, 5], 8, 2) == [0, 1]
    assert formulas.kept_kv_heads([0, 1, 2, 3], 8, 2) == [0]
    assert formulas.kept_kv_heads([3, 1], 4, 4) == [1, 3]  # multi-head attention: the query heads
    assert formulas.members_kept_kv_heads([[[0, 5], []], [[7], [2, 3]]], 8, 4) == [[[0, 2], []], [[3], [1]]]


def test_no_other_module_defines_a_shared_formula():
    """One copy: every name of ``hydra_formulas.__all__`` is defined in hydra_formulas.py and nowhere else in
    the package (shipped files and library alike import it)."""
    names = set(formulas.__all__)
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:  # module-level functions (not methods)
            if isinstance(node, ast.FunctionDef) and node.name in names:
                found.setdefault(node.name, []).append(path.relative_to(PACKAGE).as_posix())
    assert sorted(found) == sorted(names)
    assert {name: paths for name, paths in found.items() if paths != ["modeling/hydra_formulas.py"]} == {
        "kept_kv_heads": ["masks.py", "modeling/hydra_formulas.py"],  # masks.py: its arguments checked, then the rule
        "members_kept_kv_heads": ["masks.py", "modeling/hydra_formulas.py"],
    }
