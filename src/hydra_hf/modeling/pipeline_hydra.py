# Shipped with every Hydra Ensemble model folder (remote code): imports only the standard library,
# torch, transformers and sibling files.
"""Pipelines that return the Hydra Ensemble's prediction *and* its uncertainty.

The stock pipelines already give the ensemble mean (a Hydra model's ``logits`` are the log of the
mean of its members' softmaxes). These subclasses read ``member_logits`` as well and add, per input:

- ``label``, ``score``: the ensemble's top class and its mean probability;
- ``scores``: every class (sorted, best first; ``top_k`` keeps the first k);
- ``uncertainty``: ``predictive_entropy`` (total), ``expected_entropy`` (aleatoric) and
  ``mutual_information`` (epistemic: the members' disagreement), in nats;
- ``member_scores``: one ``{label: probability}`` dict per member, and ``member_labels``: each
  member's top class;
- ``flagged``: ``True`` when the chosen uncertainty is above the threshold (the call's
  ``uncertainty_threshold=``, else ``config.uncertainty_threshold`` chosen on validation data),
  ``None`` when there is no threshold;
- when ``config.calibration`` holds a calibration (``hydra-hf calibrate``): ``prediction_set``, the
  labels of the split-conformal set at level 1 - alpha (best first; it may be empty), ``abstain``
  (``True`` when the selective score is above the risk-controlling threshold, ``None`` without one) and
  ``abstain_score`` (``{"score", "value", "threshold"}``). :func:`calibrated_decisions` computes them;
  ``hydra_hf.calibration`` fits them and calls the same function. Randomised APS / RAPS sets draw an
  input's U from the input itself (:func:`conformal_noise`): the same input always gets the same set.

The folder's ``config.json`` names the pipeline in ``custom_pipelines``, so that
``pipeline(model=folder_or_repo, trust_remote_code=True)`` builds it. The entropies are computed in
float64 with the formulas of ``hydra_formulas.py``, the ones ``hydra_hf.metrics`` computes with.
"""

from __future__ import annotations

import math
from collections import UserDict
from typing import Any

import torch
from transformers import (
    ImageClassificationPipeline,
    TextClassificationPipeline,
    TextGenerationPipeline,
    ZeroShotImageClassificationPipeline,
)

from .configuration_hydra import (
    CONFORMAL_METHODS,
    RANDOMIZED_METHODS,
    SELECTIVE_SCORES,
    check_calibration,
)
from .hydra_formulas import ensemble_mutual_information, entropy, mutual_information_from_entropies

UNCERTAINTY_METRICS = ("predictive_entropy", "expected_entropy", "mutual_information")
# ZeroShotImageClassificationPipeline's default hypothesis template (transformers 5)
ZERO_SHOT_TEMPLATE = "This is a photo of {}."
DEFAULT_METRIC = "mutual_information"


# ------------------------------------------------------------------------------------- maths
def uncertainty_from_member_logits(member_logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """Ensemble probabilities and the three uncertainties, in float64.

    Shape:
        member_logits: ``(..., M, C)`` -> ``probs (..., C)``, ``member_probs (..., M, C)`` and one
        ``(...)`` tensor per name of ``UNCERTAINTY_METRICS``.
    """
    member_probs = torch.softmax(member_logits.detach().to("cpu", torch.float64), dim=-1)  # (..., M, C)
    probs = member_probs.mean(dim=-2)  # (..., C)
    total = entropy(probs)
    aleatoric = entropy(member_probs).mean(dim=-1)
    return {
        "probs": probs,
        "member_probs": member_probs,
        "predictive_entropy": total,
        "expected_entropy": aleatoric,
        "mutual_information": mutual_information_from_entropies(total, aleatoric),
    }


def resolve_threshold(threshold: Any, config: Any) -> dict[str, Any] | None:
    """``{"metric": name, "value": float}`` from a call argument or the config, or None.

    ``threshold`` may be a number (uses the config's metric, else mutual information), a dict with
    ``metric`` and ``value``, ``False`` (no flagging) or ``None`` (the config's threshold, if any).
    """
    if threshold is False:
        return None
    stored = getattr(config, "uncertainty_threshold", None)
    if threshold is None:
        threshold = stored
        if threshold is None:
            return None
    if isinstance(threshold, (int, float)) and not isinstance(threshold, bool):
        metric = stored.get("metric", DEFAULT_METRIC) if isinstance(stored, dict) else DEFAULT_METRIC
        threshold = {"metric": metric, "value": float(threshold)}
    if not isinstance(threshold, dict) or "value" not in threshold:
        raise ValueError(
            f"uncertainty_threshold={threshold!r} is not understood; pass a number, "
            f'{{"metric": one of {list(UNCERTAINTY_METRICS)}, "value": number}} or False'
        )
    metric = threshold.get("metric", DEFAULT_METRIC)
    if metric not in UNCERTAINTY_METRICS:
        raise ValueError(f"uncertainty threshold metric {metric!r} is unknown; use one of {list(UNCERTAINTY_METRICS)}")
    value = threshold["value"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"uncertainty threshold value must be a finite number, got {value!r}")
    return {"metric": metric, "value": float(value)}


def _check_single_label(config: Any) -> None:
    problem = getattr(config, "problem_type", None)
    if problem in ("regression", "multi_label_classification") or getattr(config, "num_labels", 2) < 2:
        raise ValueError(
            f"the Hydra uncertainty pipelines need a single-label classifier (softmax over >= 2 classes), "
            f"but this model has problem_type={problem!r}; use the stock pipeline instead"
        )


def _member_logits(model_outputs: Any, key: str = "member_logits") -> torch.Tensor:
    try:
        member_logits = model_outputs[key]
    except (KeyError, TypeError):
        member_logits = None
    if member_logits is None:
        raise ValueError(
            f"the model returned no {key!r}; the Hydra pipelines need a Hydra Ensemble model "
            "(HydraEnsembleFor... loaded with trust_remote_code=True)"
        )
    return member_logits


def format_result(
    member_logits: torch.Tensor, labels: list[str], threshold: dict[str, Any] | None, top_k: int | None
) -> dict[str, Any]:
    """The pipeline's result for one input.

    Shape:
        member_logits: ``(M, C)``; ``labels``: the C class names in class order.
    """
    if member_logits.dim() != 2 or member_logits.shape[-1] != len(labels):
        raise ValueError(
            f"member_logits has shape {tuple(member_logits.shape)}; expected (M, C) with C = {len(labels)} labels"
        )
    u = uncertainty_from_member_logits(member_logits)
    probs, member_probs = u["probs"], u["member_probs"]  # (C,), (M, C)
    order = sorted(range(len(labels)), key=lambda c: -float(probs[c]))
    if top_k is not None:
        order = order[: max(int(top_k), 1)]
    uncertainty = {name: float(u[name]) for name in UNCERTAINTY_METRICS}
    flagged = None if threshold is None else bool(uncertainty[threshold["metric"]] > threshold["value"])
    return {
        "label": labels[order[0]],
        "score": float(probs[order[0]]),
        "scores": [{"label": labels[c], "score": float(probs[c])} for c in order],
        "uncertainty": uncertainty,
        "flagged": flagged,
        "member_labels": [labels[int(p.argmax())] for p in member_probs],
        "member_scores": [{labels[c]: float(p[c]) for c in range(len(labels))} for p in member_probs],
    }


# ------------------------------------------------------------------------- calibrated decisions
# Split conformal sets and selective answers, fitted by ``hydra_hf.calibration`` and stored in
# ``config.calibration``. By default the sets are deterministic (no random tie-breaking): APS / RAPS
# use the full cumulative mass up to and including a class, so coverage is at least 1 - alpha, possibly
# above it. ``randomized`` APS / RAPS subtract ``U * p_c`` (Romano et al. 2020), with one U per input
# drawn by :func:`conformal_noise`: a hash of the input's probabilities and the stored seed.
NOISE_DECIMALS = 4  # the probabilities are rounded to this many decimals before they are hashed
_MASK64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """splitmix64's finaliser (Steele, Lea & Flood 2014): a 64-bit integer to a well-mixed one."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def conformal_noise(probs: torch.Tensor, seed: int) -> torch.Tensor:
    """The uniform ``U`` of randomised APS / RAPS, one per input, deterministic from the input.

    ``U`` = a 64-bit hash (splitmix64, chained) of the seed and the input's probabilities rounded to
    ``NOISE_DECIMALS`` decimals, its top 53 bits over 2^53: in [0, 1), uniform over inputs. The same
    input (the same probabilities) gets the same ``U`` at fit time, in every pipeline call, alone or in
    a batch, and in the ONNX predictor; outputs that differ in the rounded decimals (another device,
    int8) may draw another ``U``. Pure Python integers: the same on every platform.

    Shape:
        probs: ``(..., C)`` -> ``(...)`` float64.
    """
    steps = (probs.detach().to("cpu", torch.float64) * 10**NOISE_DECIMALS).round().long()  # (..., C)
    noise = []
    for row in steps.reshape(-1, probs.shape[-1]).tolist():
        state = _mix64(int(seed) & _MASK64)
        for step in row:
            state = _mix64(state ^ step)
        noise.append((state >> 11) / 2.0**53)  # the top 53 bits: exactly representable, < 1
    return torch.tensor(noise, dtype=torch.float64).reshape(probs.shape[:-1])


def conformal_scores(probs: torch.Tensor, method: str, penalty: float = 0.0, regularization_rank: int = 1,
                     noise: torch.Tensor | None = None) -> torch.Tensor:
    """The non-conformity score of every class (higher = stranger).

    ``lac``: ``1 - p_c``; ``aps``: the probability mass of the classes ranked at or above ``c``, minus
    ``noise * p_c`` when ``noise`` (randomised APS); ``raps``: APS plus
    ``penalty * max(rank(c) - regularization_rank, 0)`` (ranks from 1).

    Shape:
        probs: ``(..., C)``, noise: ``(...)`` (one U per input) -> ``(..., C)``.
    """
    if method == "lac":
        if noise is not None:
            raise ValueError("lac has no randomised score; randomise aps or raps")
        return 1.0 - probs
    if method not in RANDOMIZED_METHODS:
        raise ValueError(f"conformal method {method!r} is unknown; use one of {list(CONFORMAL_METHODS)}")
    ordered, order = probs.sort(dim=-1, descending=True, stable=True)  # (..., C)
    mass = ordered.cumsum(dim=-1)  # (..., C): mass of the classes ranked 1..k
    if noise is not None:
        mass = mass - noise.to(ordered.dtype)[..., None] * ordered  # one U per input: the sets stay nested
    if method == "raps":
        rank = torch.arange(1, probs.shape[-1] + 1, dtype=probs.dtype, device=probs.device)  # (C,)
        mass = mass + penalty * (rank - regularization_rank).clamp(min=0)
    return torch.empty_like(mass).scatter_(-1, order, mass)


def selective_uncertainty(member_probs: torch.Tensor, score: str) -> torch.Tensor:
    """The score that decides abstention (higher = less sure): ``msp`` is ``1 - max_c p_c``,
    ``entropy`` the predictive entropy, ``mi`` the mutual information (nats).

    Shape:
        member_probs: ``(..., M, C)`` -> ``(...)``.
    """
    probs = member_probs.mean(dim=-2)  # (..., C)
    if score == "msp":
        return 1.0 - probs.max(dim=-1).values
    if score == "entropy":
        return entropy(probs)
    if score == "mi":
        return ensemble_mutual_information(member_probs, dim=-2)
    raise ValueError(f"selective score {score!r} is unknown; use one of {list(SELECTIVE_SCORES)}")


def calibrated_member_probs(member_logits: torch.Tensor, calibration: dict[str, Any]) -> torch.Tensor:
    """The members' probabilities the calibration was fitted on: ``softmax(member_logits / T)`` in
    float64 (``T = calibration["temperature"]``, 1 when none was fitted).

    Shape:
        member_logits: ``(..., M, C)`` -> ``(..., M, C)``.
    """
    temperature = float(calibration.get("temperature") or 1.0)
    return torch.softmax(member_logits.detach().to("cpu", torch.float64) / temperature, dim=-1)


def calibrated_decisions(member_logits: torch.Tensor, calibration: dict[str, Any]) -> dict[str, torch.Tensor | None]:
    """The stored calibration applied to a batch: ``prediction_set`` ``(N, C)`` bool, ``abstain`` ``(N,)``
    bool (None without a selective threshold) and ``abstain_value`` ``(N,)``, the selective score.

    Shape:
        member_logits: ``(N, M, C)``.
    """
    member_probs = calibrated_member_probs(member_logits, calibration)  # (N, M, C)
    probs = member_probs.mean(dim=-2)  # (N, C)
    noise = conformal_noise(probs, int(calibration["seed"])) if calibration.get("randomized") else None  # (N,)
    scores = conformal_scores(probs, calibration["method"], float(calibration.get("penalty", 0.0)),
                              int(calibration.get("regularization_rank", 1)), noise)  # (N, C)
    value = selective_uncertainty(member_probs, calibration.get("score", "msp"))  # (N,)
    threshold = calibration.get("threshold")
    return {
        "prediction_set": scores <= float(calibration["q_hat"]),
        "abstain": None if threshold is None else value > float(threshold),
        "abstain_value": value,
    }


def resolve_calibration(config: Any) -> dict[str, Any] | None:
    """A classifier's ``config.calibration`` checked (:func:`check_calibration`: every field finite and in its
    range), or None when it has none."""
    calibration = check_calibration(getattr(config, "calibration", None), getattr(config, "num_labels", None))
    if calibration is not None and calibration.get("task") is not None:
        raise ValueError(f"config.calibration is a {calibration['task']} calibration, not a classifier's; calibrate "
                         "the folder again (hydra-hf calibrate ... --overwrite) or remove the key")
    return calibration


def add_calibrated_decision(
    result: dict[str, Any], member_logits: torch.Tensor, labels: list[str], calibration: dict[str, Any] | None
) -> dict[str, Any]:
    """``result`` with ``prediction_set``, ``abstain`` and ``abstain_score`` (nothing without a calibration).

    Shape:
        member_logits: ``(M, C)``.
    """
    if calibration is None:
        return result
    decided = calibrated_decisions(member_logits[None], calibration)
    in_set = decided["prediction_set"][0]  # (C,)
    probs = calibrated_member_probs(member_logits, calibration).mean(dim=0)  # (C,)
    members = sorted((c for c in range(len(labels)) if bool(in_set[c])), key=lambda c: -float(probs[c]))
    result["prediction_set"] = [labels[c] for c in members]
    result["abstain"] = None if decided["abstain"] is None else bool(decided["abstain"][0])
    result["abstain_score"] = {"score": calibration.get("score", "msp"), "value": float(decided["abstain_value"][0]),
                               "threshold": calibration.get("threshold")}
    return result


def _config_labels(config: Any) -> list[str]:
    id2label = config.id2label
    return [str(id2label[i]) for i in range(len(id2label))]


class _HydraUncertaintyMixin:
    """Shared parameter handling: ``uncertainty_threshold`` and ``top_k`` go to ``postprocess``."""

    def _hydra_postprocess_params(self, uncertainty_threshold: Any, top_k: Any) -> dict[str, Any]:
        params: dict[str, Any] = {}
        if uncertainty_threshold is not None:
            resolve_threshold(uncertainty_threshold, self.model.config)  # fail at call time, not per input
            params["uncertainty_threshold"] = uncertainty_threshold
        if top_k is not None and top_k != "":
            if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
                raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}")
            params["top_k"] = top_k
        return params


class _HydraClassificationMixin(_HydraUncertaintyMixin):
    """What the text and image classification pipelines share: every member's logits from the model, and the
    result (classes over the config's labels, uncertainty, the calibrated decision) from them."""

    def _forward(self, model_inputs):
        outputs = self.model(**model_inputs)
        return {"logits": outputs["logits"], "member_logits": _member_logits(outputs)}

    def postprocess(self, model_outputs, uncertainty_threshold=None, top_k=None):
        _check_single_label(self.model.config)
        threshold = resolve_threshold(uncertainty_threshold, self.model.config)
        labels = _config_labels(self.model.config)
        member_logits = model_outputs["member_logits"][0]  # (M, C)
        result = format_result(member_logits, labels, threshold, top_k)
        return add_calibrated_decision(result, member_logits, labels, resolve_calibration(self.model.config))


class HydraTextClassificationPipeline(_HydraClassificationMixin, TextClassificationPipeline):
    """Text classification with the ensemble's uncertainty (see the module docstring for the result).

    Example::

        pipe = pipeline("hydra-text-classification", model="org/hydra-bert-sst2", trust_remote_code=True,
                        revision="<commit>")
        pipe("a gripping film")  # {"label": ..., "score": ..., "uncertainty": {...}, "flagged": ..., ...}

    The task name builds this pipeline; the stock ``pipeline("text-classification", ...)`` loads the same model
    and returns only ``label`` and ``score`` (the ensemble mean), without the uncertainty.

    Which score to use (measured on hydra_hf's MiniLM / Rotten Tomatoes testbed, README "Which uncertainty to
    use"): to flag out-of-distribution text, ``score`` (low = unsure; MSP) or the energy ``logits.logsumexp(-1)``;
    on two classes ``predictive_entropy`` ranks inputs as ``score`` does. ``mutual_information`` (the members'
    disagreement) ranked OOD text as *more* in-distribution there: it ranks the model's likely mistakes on
    in-distribution text, not distribution shift; measure it on your own shift before flagging with it.

    Call options: ``uncertainty_threshold`` (number, ``{"metric", "value"}`` or ``False``), ``top_k``
    (classes kept in ``scores``), and the tokenizer's keyword arguments (``truncation=True``, ...).
    """

    def _sanitize_parameters(self, uncertainty_threshold=None, top_k=None, function_to_apply=None, **tokenizer_kwargs):
        if function_to_apply is not None and str(function_to_apply).lower() != "softmax":
            raise ValueError(
                f"function_to_apply={function_to_apply!r}: a Hydra Ensemble's prediction is the mean of its "
                "members' softmaxes; use the stock text-classification pipeline for raw scores"
            )
        preprocess_params, forward_params, _ = super()._sanitize_parameters(**tokenizer_kwargs)
        return preprocess_params, forward_params, self._hydra_postprocess_params(uncertainty_threshold, top_k)

    def __call__(self, inputs, **kwargs):
        """One result dict per input: a dict for one text (or text pair), a list for a list."""
        # skip TextClassificationPipeline.__call__, whose legacy mode wraps a single result in a list
        return super(TextClassificationPipeline, self).__call__(inputs, **kwargs)


class HydraImageClassificationPipeline(_HydraClassificationMixin, ImageClassificationPipeline):
    """Image classification with the ensemble's uncertainty (see the module docstring for the result).

    Call options: ``uncertainty_threshold``, ``top_k`` (classes kept in ``scores``; default all) and
    ``timeout`` (for image URLs).
    """

    def _sanitize_parameters(self, uncertainty_threshold=None, top_k=None, function_to_apply=None, timeout=None):
        if function_to_apply is not None and str(function_to_apply).lower() != "softmax":
            raise ValueError(
                f"function_to_apply={function_to_apply!r}: a Hydra Ensemble's prediction is the mean of its "
                "members' softmaxes; use the stock image-classification pipeline for raw scores"
            )
        preprocess_params, forward_params, _ = super()._sanitize_parameters(timeout=timeout)
        return preprocess_params, forward_params, self._hydra_postprocess_params(uncertainty_threshold, top_k)


class HydraZeroShotImageClassificationPipeline(_HydraUncertaintyMixin, ZeroShotImageClassificationPipeline):
    """Zero-shot image classification with the ensemble's uncertainty.

    Each member scores the image against the candidate labels' prompts (a softmax over the labels);
    the prediction is the members' mean. The result has the keys listed in the module docstring,
    with the candidate labels as classes.

    Call options: ``candidate_labels`` (required), ``hypothesis_template``, ``uncertainty_threshold``,
    ``top_k``, ``timeout``. A calibration (``config.calibration``) was fitted for its ``class_names`` and
    ``templates``: its ``prediction_set`` and ``abstain`` are added only when the candidate labels are those
    classes, in that order, and the hypothesis template is its one template.
    """

    def _sanitize_parameters(self, uncertainty_threshold=None, top_k=None, **kwargs):
        preprocess_params, forward_params, _ = super()._sanitize_parameters(**kwargs)
        postprocess_params = self._hydra_postprocess_params(uncertainty_threshold, top_k)
        if "hypothesis_template" in kwargs:
            postprocess_params["hypothesis_template"] = kwargs["hypothesis_template"]
        return preprocess_params, forward_params, postprocess_params

    def _forward(self, model_inputs):
        candidate_labels = model_inputs.pop("candidate_labels")
        text_inputs = model_inputs.pop("text_inputs")
        if isinstance(text_inputs[0], UserDict):
            text_inputs = text_inputs[0]
        else:  # batched by the pipeline's loader
            text_inputs = text_inputs[0][0]
        outputs = self.model(**text_inputs, **model_inputs)
        return {
            "candidate_labels": candidate_labels,
            "logits": outputs["logits_per_image"],
            "member_logits": _member_logits(outputs, "member_logits_per_image"),  # (1, M, N)
        }

    def postprocess(
        self, model_outputs, uncertainty_threshold=None, top_k=None, hypothesis_template=ZERO_SHOT_TEMPLATE
    ):
        threshold = resolve_threshold(uncertainty_threshold, self.model.config)
        labels = [str(label) for label in model_outputs["candidate_labels"]]
        member_logits = model_outputs["member_logits"][0]  # (M, N)
        result = format_result(member_logits, labels, threshold, top_k)
        calibration = resolve_calibration(self.model.config)
        if calibration is not None and (calibration.get("class_names") != labels
                                        or calibration.get("templates") != [hypothesis_template]):
            calibration = None  # fitted for other classes or prompts: its guarantee does not hold here
        return add_calibrated_decision(result, member_logits, labels, calibration)


class HydraTextGenerationPipeline(TextGenerationPipeline):
    """Text generation from a Hydra causal LM (decoding from the mean of the members' next-token
    distributions), with the uncertainty of every generated token and of the whole continuation.

    Each result is the stock pipeline's record (``generated_text``) plus ``token_entropy`` (predictive
    entropy of the distribution each generated token was drawn from, nats), ``token_mutual_information``
    (the members' disagreement), ``token_probability`` (the ensemble's probability of the token),
    ``member_top_tokens`` (every member's most likely token id at that step), ``generated_token_ids`` and
    ``sequence_entropy`` / ``sequence_mutual_information`` (means over the generated tokens; tokens after
    the end of sequence are left out). Computed by the model's ``score_generated`` (one forward pass over
    the generated sequences), so every decoding mode (greedy, sampling, beam search) gets them.

    Example::

        pipe = pipeline("hydra-text-generation", model="org/hydra-llama", trust_remote_code=True)
        pipe("The movie was", max_new_tokens=20)[0]["sequence_mutual_information"]
    """

    # the per-sequence values _forward adds to the stock outputs: top-level tensors, batch first, so that
    # transformers' batching (``batch_size=``) splits them per input as it splits ``generated_sequence``
    UNCERTAINTY_KEYS = (
        "token_entropy", "token_mutual_information", "token_probability", "member_top_tokens", "generated_mask",
        "sequence_entropy", "sequence_mutual_information", "generated_token_ids",
    )

    def _forward(self, model_inputs, **generate_kwargs):
        attention_mask = model_inputs.get("attention_mask")
        eos = generate_kwargs.get("eos_token_id")
        empty_prompt = model_inputs["input_ids"].shape[1] == 0
        out = super()._forward(model_inputs, **generate_kwargs)
        sequences = out["generated_sequence"]  # (B, n, P + N)
        # an empty prompt: generate() started from the start-of-sequence token, the prompt it scored
        prompt = 1 if empty_prompt else out["input_ids"].shape[1]
        if empty_prompt:
            attention_mask = None
        B, n = sequences.shape[0], sequences.shape[1]
        flat = sequences.reshape(B * n, -1)
        mask = None if attention_mask is None else attention_mask.repeat_interleave(n, dim=0)
        scored = self.model.score_generated(flat, prompt, mask, eos_token_id=eos)
        values = {
            "token_entropy": scored.token_entropy, "token_mutual_information": scored.token_mutual_information,
            "token_probability": scored.token_probability, "member_top_tokens": scored.member_top_tokens,
            "generated_mask": scored.generated_mask, "sequence_entropy": scored.sequence_entropy,
            "sequence_mutual_information": scored.sequence_mutual_information,
            "generated_token_ids": flat[:, prompt:],
        }
        out.update({f"hydra_{k}": v.reshape(B, n, *v.shape[1:]) for k, v in values.items()})
        return out

    def postprocess(self, model_outputs, *args, **kwargs):
        stock = {k: v for k, v in model_outputs.items() if not k.startswith("hydra_")}
        records = super().postprocess(stock, *args, **kwargs)
        u = {k: model_outputs[f"hydra_{k}"][0] for k in self.UNCERTAINTY_KEYS}  # this input's n sequences
        for i, record in enumerate(records):
            keep = u["generated_mask"][i].bool()
            for key in ("generated_token_ids", "token_entropy", "token_mutual_information", "token_probability",
                        "member_top_tokens"):
                record[key] = u[key][i][keep].tolist()
            record["sequence_entropy"] = float(u["sequence_entropy"][i])
            record["sequence_mutual_information"] = float(u["sequence_mutual_information"][i])
        return records
