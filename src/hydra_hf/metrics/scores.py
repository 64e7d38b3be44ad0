"""The scores, ONE registry by level: ``example`` (a classifier's input), ``sequence`` (a causal LM's text)
and ``token`` (one next-token prediction). One vocabulary: ``evaluate --score``, ``calibrate --score``, the
reports, the study, the Single baselines and the docs name a score by its entry's ``name``; an older
spelling (``aliases``: ``mi``) is still read, with a one-line deprecation log (:func:`resolve_score`).

Each entry says its direction: a score is ``sign x`` a quantity (``sign`` +1: the quantity grows with
confidence, e.g. the maximum softmax probability; -1: it grows with uncertainty, e.g. the entropy), so that
every score is "higher = more in-distribution" (what the OOD AUROC ranks), and abstention thresholds the
quantity's uncertainty direction (``-score``; ``1 - msp``). ``stored`` is the spelling a folder's
``config.calibration`` holds for it, the one the shipped pipelines of every version read.

Adding a score is one function (for an example score) plus one :func:`register_ood_score` call; the
CLI (``evaluate --score``), the reports, the study and the Single baselines read the registry.

- An ``example`` score reads ``"probs"`` (the ensemble's mean softmax ``(N, C)``), ``"member_probs"``
  (``(N, M, C)``) or ``"logits"`` (``(N, C)``) and ``compute(input, temperature) -> (N,)``.
- A ``token`` score is ``sign x`` one per-token quantity of
  :func:`hydra_hf.metrics.causal_lm.next_token_uncertainty` (``reads``: one of :data:`TOKEN_QUANTITIES`).
- A ``sequence`` score is the mean of the token score of the same name over a sequence's valid tokens
  (:func:`hydra_hf.metrics.causal_lm.sequence_scores`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from ..errors import HydraInputError
from .classification import (
    ArrayLike,
    as_member_probs,
    energy_score,
    msp,
    negative_entropy,
    negative_mutual_information,
)

__all__ = [
    "OOD_SCORES",
    "OOD_SCORE_NAMES",
    "OODScore",
    "SCORE_LEVELS",
    "SCORES",
    "SEQUENCE_SCORES",
    "TOKEN_QUANTITIES",
    "TOKEN_SCORES",
    "level_scores",
    "ood_score",
    "canonical_score_name",
    "register_ood_score",
    "resolve_score",
    "stored_score",
]

logger = logging.getLogger(__name__)

SCORE_LEVELS: tuple[str, ...] = ("example", "sequence", "token")
"""What one score value describes: a classifier's input, a causal LM's sequence, one next token."""

TOKEN_QUANTITIES: tuple[str, ...] = (
    "nll", "msp", "predictive_entropy", "expected_entropy", "mutual_information", "disagreement",
)
"""The float per-token quantities of :func:`hydra_hf.metrics.causal_lm.next_token_uncertainty`, which
the token scores read and the sequence scores average."""

_EXAMPLE_INPUTS = ("probs", "member_probs", "logits")


@dataclass(frozen=True)
class OODScore:
    """An OOD score, registered by name and level (:data:`SCORES`); higher = more in-distribution.

    Attributes:
        name: the registry key within its level (``--score NAME``, report columns).
        reads: what it is computed from. ``example``: ``"probs"`` (the ensemble's mean softmax ``(N, C)``),
            ``"member_probs"`` (every member's softmax ``(N, M, C)``) or ``"logits"`` (``(N, C)``; the mean of
            the members' logits for an ensemble). ``token`` and ``sequence``: a per-token quantity
            (:data:`TOKEN_QUANTITIES`).
        compute: ``example``: ``(input, temperature) -> (N,)`` scores; None for ``token`` and ``sequence``
            scores (``sign x`` the quantity, or its mean over a sequence).
        single_model: whether one model (M = 1) has it (mutual information needs members).
        help: one line for ``--help`` and the docs.
        level: ``"example"``, ``"sequence"`` or ``"token"``.
        sign: the direction: +1 when the score's quantity grows with confidence (msp, likelihood, negative
            energy), -1 when it grows with uncertainty (entropy, mutual information); the score is ``sign x``
            the quantity (``token`` and ``sequence`` scores are computed so; an ``example`` score's ``compute``
            returns it), higher = more in-distribution.
        aliases: older spellings still read (with a deprecation log), e.g. ``mi``.
        stored: the spelling ``config.calibration["score"]`` holds when a folder abstains on this score (what the
            shipped pipelines read); None: ``calibrate`` cannot abstain on it.
    """

    name: str
    reads: str
    compute: Callable[[torch.Tensor, float], torch.Tensor] | None
    single_model: bool
    help: str
    level: Literal["example", "sequence", "token"] = "example"
    sign: float = 1.0
    aliases: tuple[str, ...] = ()
    stored: str | None = None


SCORES: dict[str, dict[str, OODScore]] = {level: {} for level in SCORE_LEVELS}
"""The registry: level -> name -> :class:`OODScore` (:func:`register_ood_score`)."""

OOD_SCORES: dict[str, OODScore] = SCORES["example"]
"""The example-level scores (a classifier's), by name; the CLI and the study read their choices from it."""

SEQUENCE_SCORES: dict[str, OODScore] = SCORES["sequence"]
"""The sequence-level scores of a causal LM, by name."""

TOKEN_SCORES: dict[str, OODScore] = SCORES["token"]
"""The token-level scores of a causal LM, by name."""


def register_ood_score(score: OODScore) -> OODScore:
    """Add ``score`` to :data:`SCORES` under its level (adding a score is one function plus this call)."""
    if score.level not in SCORES:
        raise ValueError(f"OOD score {score.name!r}: level must be one of {list(SCORE_LEVELS)}, got {score.level!r}")
    if score.level == "example" and score.reads not in _EXAMPLE_INPUTS:
        raise ValueError(
            f"OOD score {score.name!r}: reads must be 'probs', 'member_probs' or 'logits', got {score.reads!r}"
        )
    if score.level != "example" and score.reads not in TOKEN_QUANTITIES:
        raise ValueError(f"OOD score {score.name!r}: a {score.level} score reads one of {list(TOKEN_QUANTITIES)}, "
                         f"got {score.reads!r}")
    taken = {n for known in SCORES[score.level].values() for n in (known.name, *known.aliases)}
    clash = sorted(taken & {score.name, *score.aliases})
    if clash:
        raise ValueError(f"an OOD score named {clash[0]!r} is already registered at level {score.level!r}")
    SCORES[score.level][score.name] = score
    return score


def canonical_score_name(name: str, what: str = "--score") -> str:
    """The registry's name for ``name``: ``name`` itself, or the score it is an older spelling of (``aliases``;
    one deprecation line is logged, ``what`` naming the input). Any other name is returned as given."""
    for level in SCORE_LEVELS:
        for score in SCORES[level].values():
            if name in score.aliases:
                logger.warning("%s %s is the old spelling of %s; write %s (the old one is read for now)", what, name,
                               score.name, score.name)
                return score.name
    return name


def resolve_score(name: str, level: str = "example", *, what: str = "--score") -> OODScore:
    """The entry ``name`` names at ``level`` (its name or an older spelling, :func:`canonical_score_name`);
    ``HydraInputError`` (one line, the choices) for any other name."""
    scores = level_scores(level)
    canonical = canonical_score_name(name, what)
    if canonical not in scores:
        raise HydraInputError(f"{what} {name!r} is not a {level} score; use one of {', '.join(scores)}")
    return scores[canonical]


def stored_score(name: str, level: str = "example", *, what: str = "--score") -> str:
    """The spelling ``config.calibration["score"]`` holds for the score ``name`` names (:func:`resolve_score`);
    ``HydraInputError`` when abstention cannot use it."""
    score = resolve_score(name, level, what=what)
    if score.stored is None:
        usable = [s.name for s in level_scores(level).values() if s.stored]
        raise HydraInputError(f"{what} {score.name} cannot decide abstention; use one of {', '.join(usable)}")
    return score.stored


register_ood_score(OODScore("msp", "probs", lambda p, t: msp(p), True, "maximum softmax probability (the paper's)",
                            stored="msp"))
register_ood_score(OODScore("entropy", "probs", lambda p, t: negative_entropy(p), True, "negative predictive entropy",
                            sign=-1.0, stored="entropy"))
register_ood_score(OODScore("mutual_information", "member_probs", lambda p, t: negative_mutual_information(p), False,
                            "negative mutual information between the prediction and the members (their disagreement)",
                            sign=-1.0, aliases=("mi",), stored="mi"))
register_ood_score(OODScore("energy", "logits", energy_score, True, "negative energy of the logits (logsumexp)"))
OOD_SCORE_NAMES: tuple[str, ...] = tuple(OOD_SCORES)
"""Names accepted by :func:`ood_score` (the keys of :data:`OOD_SCORES`)."""

# a causal LM's scores: per token, and their mean over a sequence's valid tokens (mean MSP, negative mean
# predictive entropy, negative mean mutual information (members only, M > 1), and the mean token
# log-likelihood: the negative mean NLL, the log of one over the sequence's perplexity)
for _name, _quantity, _sign, _single, _help in (
    ("msp", "msp", 1.0, True, "the top next-token probability"),
    ("entropy", "predictive_entropy", -1.0, True, "negative predictive entropy"),
    (
        "mutual_information",
        "mutual_information",
        -1.0,
        False,
        "negative mutual information (the members' disagreement)",
    ),
    ("likelihood", "nll", -1.0, True, "the log-likelihood of the next token"),
):
    for _level in ("token", "sequence"):
        # a causal LM abstains (generate_with_uncertainty) on its tokens' entropy or mutual information
        _stored = {"entropy": "entropy", "mutual_information": "mi"}.get(_name)
        register_ood_score(OODScore(_name, _quantity, None, _single, _help, level=_level, sign=_sign,
                                    aliases=("mi",) if _name == "mutual_information" else (), stored=_stored))


def ood_score(
    name: str,
    *,
    probs: ArrayLike | None = None,
    member_probs: ArrayLike | None = None,
    logits: ArrayLike | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Per-sample (example-level) OOD score by name; higher = more in-distribution for every name.

    - ``"msp"``: :func:`~hydra_hf.metrics.msp` of ``probs`` (or of the mean of ``member_probs``).
    - ``"entropy"``: :func:`~hydra_hf.metrics.negative_entropy` of ``probs`` (or of the mean of ``member_probs``).
    - ``"mutual_information"``: :func:`~hydra_hf.metrics.negative_mutual_information`; needs ``member_probs``.
    - ``"energy"``: :func:`~hydra_hf.metrics.energy_score` of ``logits`` at ``temperature``.

    Shape:
        probs: (N, C); member_probs: (N, M, C); logits: (N, C) -> (N,)
    """
    score = OOD_SCORES.get(name)
    if score is None:
        raise ValueError(f"unknown OOD score {name!r}; choose one of {list(OOD_SCORES)}")
    if score.reads == "probs":
        if probs is None:
            if member_probs is None:
                raise ValueError(f"ood_score({name!r}) needs probs=(N, C) or member_probs=(N, M, C)")
            probs = as_member_probs(member_probs).mean(dim=1)
        return score.compute(probs, temperature)
    if score.reads == "member_probs":
        if member_probs is None:
            raise ValueError(f"ood_score({name!r}) needs member_probs=(N, M, C)")
        return score.compute(member_probs, temperature)
    if logits is None:
        raise ValueError(f"ood_score({name!r}) needs logits=(N, C)")
    return score.compute(logits, temperature)


def level_scores(level: str) -> dict[str, OODScore]:
    """The registered scores of ``level`` (``example``, ``sequence`` or ``token``), by name."""
    if level not in SCORES:
        raise ValueError(f"unknown OOD score level {level!r}; choose one of {list(SCORE_LEVELS)}")
    return SCORES[level]

