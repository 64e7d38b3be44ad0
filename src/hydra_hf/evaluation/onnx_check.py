"""The quantisation report: the int8 graph against the fp32 graph on the user's labelled
in-distribution data and OOD sets, with hydra_hf's evaluation code and metrics (nothing re-implemented)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .. import metrics
from ..data import zero_shot_prompts
from ..errors import HydraInputError
from ..onnx.runtime import OnnxHydraModel
from .predictors import ModelPredictor, Predictor, predict

REPORT_JSON = "quantization_report.json"
REPORT_MD = "quantization_report.md"
ID_METRICS = ("accuracy", "ece", "nll", "brier")
INT8_SCORES = ("msp", "mutual_information")  # the OOD scores (of hydra_hf.metrics.OOD_SCORES) the check reports


def _numbers(predictions: Any, ood: Mapping[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {
        k: v
        for k, v in metrics.calibration_report(predictions.probs, predictions.labels, predictions.member_probs).items()
        if k in (*ID_METRICS, "mutual_information")
    }
    row["ood_auroc"] = {
        name: {score: metrics.ood_report(predictions.ood_scores(score), preds.ood_scores(score))["auroc"]
               for score in INT8_SCORES}
        for name, preds in ood.items()
    }
    return row


class OnnxZeroShotPredictor(Predictor):
    """Zero-shot classification with an exported two-tower graph (CLIP, SigLIP, open_clip): every image
    batch is run with the C x K class prompts as the texts; member m's logit for class c is the mean over
    the K templates of its ``member_logits_per_image`` for the prompts of c.

    With one template this is :class:`hydra_hf.evaluation.ZeroShotPredictor` (the scaled cosine of the
    image and the class prompt embedding); with several, the PyTorch predictor averages the normalised
    prompt embeddings before the cosine, this one the K logits (the graph returns logits, not embeddings).

    Shape:
        batch["pixel_values"]: ``(B, 3, H, W)`` -> member logits ``(B, M, C)``.
    """

    def __init__(
        self, model: OnnxHydraModel, class_names: Sequence[str], templates: Sequence[str], tokenizer: Any
    ) -> None:
        super().__init__()
        if not class_names:
            raise HydraInputError("zero-shot classification needs class names (the labelled data's classes)")
        self.model, self.num_classes, self.num_templates = model, len(class_names), len(templates)
        self.text = dict(tokenizer(zero_shot_prompts(class_names, templates), padding=True, return_tensors="pt"))

    def num_parameters(self) -> int:
        return self.model.num_parameters()

    def member_logits(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        out = self.model(**self.text, pixel_values=batch["pixel_values"]).member_logits_per_image  # (B, M, C*K)
        B, M, _ = out.shape
        return out.view(B, M, self.num_classes, self.num_templates).mean(dim=-1)


def quantization_report(
    fp32: OnnxHydraModel,
    int8: OnnxHydraModel,
    loaders: tuple[Iterable, Mapping[str, Iterable]],
    *,
    settings: Mapping[str, Any] | None = None,
    predictor: Callable[[OnnxHydraModel], Any] | None = None,
) -> dict[str, Any]:
    """Accuracy, ECE, NLL, Brier and the OOD AUROC (MSP and mutual information) of the int8 and the fp32
    graph, their differences (int8 − fp32), how often they agree on the label, and the largest change
    of a member logit.

    Args:
        loaders: ``(id_loader, {ood name: loader})`` as :func:`hydra_hf.evaluation.make_loader` makes them.
        predictor: wraps a graph into a predictor (default :class:`hydra_hf.evaluation.ModelPredictor`;
            two-tower graphs: an :class:`OnnxZeroShotPredictor`).
    """
    id_loader, ood_loaders = loaders
    make_predictor = predictor or ModelPredictor
    preds: dict[str, tuple[Any, dict[str, Any]]] = {}
    for name, model in (("fp32", fp32), ("int8", int8)):
        predictor_ = make_predictor(model)
        ident = predict(predictor_, id_loader, desc=f"ONNX {name}: calibration data")
        ood = {o: predict(predictor_, loader, desc=f"ONNX {name}: {o}") for o, loader in ood_loaders.items()}
        preds[name] = (ident, ood)
    rows = {name: _numbers(*p) for name, p in preds.items()}
    (a, a_ood), (b, b_ood) = preds["int8"], preds["fp32"]
    diff = {k: rows["int8"][k] - rows["fp32"][k] for k in ID_METRICS}
    diff["ood_auroc"] = {o: {s: rows["int8"]["ood_auroc"][o][s] - rows["fp32"]["ood_auroc"][o][s] for s in INT8_SCORES}
                         for o in ood_loaders}
    changes = [(a.member_logits - b.member_logits).abs().max()]
    changes += [(a_ood[o].member_logits - b_ood[o].member_logits).abs().max() for o in ood_loaders]
    return {
        "title": f"int8 (ONNX Runtime, recipe `{(settings or {}).get('int8_recipe', 'keep-fc2')}`) against fp32",
        "settings": dict(settings or {}),
        "num_examples": {
            "calibration": int(a.labels.numel()),
            **{o: int(p.member_logits.shape[0]) for o, p in a_ood.items()},
        },
        "models": {"fp32": {"file": fp32.file.name, **rows["fp32"]}, "int8": {"file": int8.file.name, **rows["int8"]}},
        "difference_int8_minus_fp32": diff,
        "label_agreement": float((a.probs.argmax(-1) == b.probs.argmax(-1)).double().mean()),
        "member_label_agreement": float((a.member_probs.argmax(-1) == b.member_probs.argmax(-1)).double().mean()),
        "max_abs_member_logit_change": float(torch.stack(changes).max()),
    }


def report_markdown(report: Mapping[str, Any]) -> str:
    """A short markdown summary of :func:`quantization_report`."""
    models = report["models"]
    oods = sorted(models["fp32"]["ood_auroc"])
    head = ["model", *ID_METRICS] + [f"{o} AUROC ({s})" for o in oods for s in INT8_SCORES]
    counts = report["num_examples"]
    ood_text = ", ".join(f"`{o}` ({counts[o]})" for o in oods) or "none"
    lines = [f"## Quantisation report: {report['title']}", "",
             f"Calibration data: `{report['settings'].get('calibration_data')}` ({counts['calibration']} "
             f"examples); OOD: {ood_text}."
             + (f" Zero-shot classes {report['settings']['class_names']} with the prompt templates "
                f"{report['settings']['templates']}." if report["settings"].get("templates") else ""), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in ("fp32", "int8"):
        row = models[name]
        cells = [f"{name} (`{row['file']}`)"] + [f"{row[k]:.4f}" for k in ID_METRICS]
        cells += [f"{row['ood_auroc'][o][s]:.4f}" for o in oods for s in INT8_SCORES]
        lines.append("| " + " | ".join(cells) + " |")
    d = report["difference_int8_minus_fp32"]
    cells = (
        ["int8 − fp32"]
        + [f"{d[k]:+.4f}" for k in ID_METRICS]
        + [f"{d['ood_auroc'][o][s]:+.4f}" for o in oods for s in INT8_SCORES]
    )
    lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Same ensemble label: {100 * report['label_agreement']:.1f} % of calibration examples; same member "
              f"labels: {100 * report['member_label_agreement']:.1f} %; largest change of a member logit: "
              f"{report['max_abs_member_logit_change']:.3g}."]
    return "\n".join(lines) + "\n"


def write_quantization_report(report: Mapping[str, Any], folder: str | os.PathLike) -> None:
    folder = Path(folder)
    (folder / REPORT_JSON).write_text(json.dumps(report, indent=2) + "\n")
    (folder / REPORT_MD).write_text(report_markdown(report))
