"""Temperature scaling of an ensemble (Guo et al. 2017): the one temperature ``T`` that divides every
member's logits, fitted on labelled validation outputs."""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from ..modeling.hydra_formulas import log_mean_exp

__all__ = ["fit_temperature"]

logger = logging.getLogger(__name__)


def fit_temperature(member_logits: torch.Tensor, labels: torch.Tensor, max_iter: int = 100) -> float:
    """The temperature T > 0 that minimises the NLL of ``mean_m softmax(member_logits / T)``.

    Args:
        member_logits: ``(N, M, C)`` the members' logits on labelled validation data (M = 1: the classic
            temperature scaling).
        labels: ``(N,)`` true classes.
        max_iter: L-BFGS iterations on ``log T`` (started at T = 1).
    """
    logits = member_logits.double().clone()  # clone: the outputs may be inference tensors
    labels = labels.clone()
    log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([log_t], lr=0.1, max_iter=max_iter, line_search_fn="strong_wolfe")

    def nll():
        opt.zero_grad()
        log_probs = torch.log_softmax(logits / log_t.exp(), dim=-1)  # (N, M, C)
        mixture = log_mean_exp(log_probs, dim=1)  # (N, C): log of the members' mean softmax
        loss = F.nll_loss(mixture, labels)
        loss.backward()
        return loss

    opt.step(nll)
    temperature = float(log_t.detach().exp())
    logger.info("fitted temperature %.3f on %d validation examples", temperature, len(labels))
    return temperature
