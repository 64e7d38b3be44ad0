"""When no abstention threshold certifies the risk, calibrate says what failed and what would certify (issue 49:
"the 45 surest already make 0 errors; 45 answers are needed" read as a contradiction)."""

from __future__ import annotations

import pytest
import torch

from hydra_hf.calibration import fit_selective
from hydra_hf.errors import HydraInputError


def _member_probs(confidence: torch.Tensor) -> torch.Tensor:
    """(n, 1, 2): one member, class 0 with probability ``confidence``."""
    return torch.stack([confidence, 1 - confidence], -1)[:, None, :]


def test_the_message_names_the_failed_test_and_a_risk_that_certifies():
    n = 400
    confidence = torch.linspace(0.999, 0.55, n, dtype=torch.float64)  # sorted surest first
    labels = torch.zeros(n, dtype=torch.long)
    labels[torch.arange(5, n, 8)] = 1  # one error every 8 answers from the 6th surest on: 12.4 %
    with pytest.raises(HydraInputError) as caught:
        fit_selective(_member_probs(confidence), labels, risk=0.05, delta=0.1)
    message = str(caught.value)
    assert "\n" not in message
    assert "already makes " in message and "p-value" in message and "> delta 0.1" in message
    assert "0 errors" not in message  # a test that fails has at least one error
    looser = message.split("raise --risk (")[1].split(" certifies")[0]
    fit = fit_selective(_member_probs(confidence), labels, risk=float(looser), delta=0.1)  # the hint holds
    assert fit.calibration_error <= float(looser)
