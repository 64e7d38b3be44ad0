"""The shipped modeling files keep their own copies of the uncertainty maths (they cannot import
hydra_hf); these tests hold every copy equal to the library's one (hydra_hf.metrics.uncertainty) on
random inputs, and show that the inputs reach the cases where a careless copy would differ."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from hydra_hf.metrics import uncertainty
from hydra_hf.metrics.causal_lm import next_token_uncertainty
from hydra_hf.modeling import hydra_decoder, hydra_layers, modeling_hydra_siglip, pipeline_hydra


def _member_logits(seed: int, shape: tuple[int, ...], scale: float = 4.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64) * scale


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pipeline_entropies_and_mutual_information_equal_the_library(seed: int) -> None:
    member_logits = _member_logits(seed, (64, 4, 7))  # (N, M, C)
    shipped = pipeline_hydra.uncertainty_from_member_logits(member_logits)
    member_probs = torch.softmax(member_logits, dim=-1)
    probs = member_probs.mean(dim=1)
    torch.testing.assert_close(shipped["predictive_entropy"], uncertainty.entropy(probs), rtol=0, atol=1e-12)
    torch.testing.assert_close(
        shipped["expected_entropy"], uncertainty.entropy(member_probs).mean(dim=1), rtol=0, atol=1e-12
    )
    mi = uncertainty.ensemble_mutual_information(member_probs)
    torch.testing.assert_close(shipped["mutual_information"], mi, rtol=0, atol=1e-12)
    assert float(mi.min()) >= 0 and float(mi.max()) > 0.05  # the members disagree on some inputs
    for score, expected in (("entropy", uncertainty.entropy(probs)), ("mi", mi)):
        torch.testing.assert_close(
            pipeline_hydra.selective_uncertainty(member_probs, score), expected, rtol=0, atol=1e-12
        )


def test_entropy_counts_zero_probabilities_as_zero() -> None:
    probs = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(uncertainty.entropy(probs), torch.tensor([0.0, math.log(2)], dtype=torch.float64))
    log_probs = torch.log(probs)  # -inf where a probability is 0
    torch.testing.assert_close(
        uncertainty.entropy_of_log_probs(log_probs), torch.tensor([0.0, math.log(2)], dtype=torch.float64)
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_decoder_token_uncertainty_equals_the_library(seed: int) -> None:
    member_logits = _member_logits(seed, (3, 5, 4, 11)).float()  # (B, T, M, V)
    shipped = hydra_decoder.token_uncertainty(member_logits)
    log_p = F.log_softmax(member_logits, dim=-1)  # (B, T, M, V)
    mean_log = torch.logsumexp(log_p, dim=-2) - math.log(member_logits.shape[-2])  # (B, T, V)
    entropy = uncertainty.entropy_of_log_probs(mean_log)
    mi = (entropy - uncertainty.entropy_of_log_probs(log_p).mean(-1)).clamp_min(0.0)
    torch.testing.assert_close(shipped["entropy"], entropy, rtol=0, atol=1e-6)
    torch.testing.assert_close(shipped["mutual_information"], mi, rtol=0, atol=1e-6)
    # the causal-LM metrics compute the same per-token quantities from (B, M, T, V)
    targets = torch.zeros(3, 5, dtype=torch.long)
    tokens = next_token_uncertainty(member_logits.permute(0, 2, 1, 3), targets)
    torch.testing.assert_close(tokens["predictive_entropy"], entropy, rtol=0, atol=1e-6)
    torch.testing.assert_close(tokens["mutual_information"], mi, rtol=0, atol=1e-6)
    assert float(mi.max()) > 0.05


@pytest.mark.parametrize("seed", [0, 1])
def test_siglip_ensemble_sigmoid_logits_is_the_library_copy(seed: int) -> None:
    member_logits = _member_logits(seed, (6, 3, 5), scale=30.0).float()  # (B, M, N): sigmoids far below 1e-7
    library = uncertainty.ensemble_sigmoid_logits(member_logits)
    torch.testing.assert_close(modeling_hydra_siglip.ensemble_sigmoid_logits(member_logits), library, rtol=0, atol=0)
    torch.testing.assert_close(modeling_hydra_siglip.ensemble_sigmoid_logits(member_logits.transpose(0, 1), dim=0),
                               library, rtol=0, atol=0)
    reference = torch.logit(torch.sigmoid(member_logits.double()).mean(dim=1))  # exact in float64 here
    torch.testing.assert_close(library.double(), reference, rtol=1e-5, atol=1e-4)
    assert float(reference.min()) < math.log(1e-7)  # the range where a clamped copy is wrong


def test_the_classifier_head_copy_clamps_where_the_library_is_exact() -> None:
    moderate = _member_logits(3, (8, 3, 4), scale=2.0).float()  # sigmoids well inside (1e-7, 1 - 1e-7)
    torch.testing.assert_close(hydra_layers.ensemble_sigmoid_logits(moderate),
                               uncertainty.ensemble_sigmoid_logits(moderate), rtol=1e-5, atol=1e-5)
    extreme = torch.full((1, 2, 1), -40.0)  # sigmoid ~ 4e-18
    assert float(uncertainty.ensemble_sigmoid_logits(extreme)) == pytest.approx(-40.0, abs=1e-4)
    assert float(hydra_layers.ensemble_sigmoid_logits(extreme)) == pytest.approx(math.log(1e-7 / (1 - 1e-7)), abs=1e-3)
