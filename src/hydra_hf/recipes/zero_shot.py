"""The paper's zero-shot setting (OpenCLIP, both towers pruned, no training), as one function: the
OpenCLIP recipe runs it.

The stages mirror :mod:`hydra_hf.recipes.text` (each writes one file or folder under ``output_dir``; with
``resume=True`` a finished stage is kept). The base model is an open_clip checkpoint folder
(``open_clip_config.json`` + ``open_clip_model.safetensors``, :func:`save_open_clip_folder`), read
with ``open_clip.create_model_and_transforms("local-dir:FOLDER")``:

1. ``single.json``  the **Single** zero-shot model (class prompts: class names x templates, CLIP's
                    prompt ensemble, :class:`~hydra_hf.evaluation.ZeroShotPredictor`) on the ID
                    validation split: accuracy, NLL, ECE and its fitted temperature.
2. ``masks.json``   M members chosen on the ID validation split (default: Taylor importance,
                    seeds ``seed, seed+1, ...``; ``tower="joint"`` removes ``remove`` heads over both
                    towers, ``"vision"`` / ``"text"`` only in that tower). Selection scores each image
                    against one prompt per class (``prune_template``).
3. ``hydra/``       the members fused into one Hydra CLIP (``convert_checkpoint``; no fine-tuning:
                    zero-shot) and ``member_0/``, member 0 alone (the *single pruned* baseline).
4. ``report/``      Hydra against Single, Single + temperature scaling, Hydra + temperature scaling and
                    the single pruned member on the ID test split and every OOD set.
5. ``hub/``         the Hub-ready repository, validated in a fresh process (``hub.validate_staged``),
                    and the fresh process's zero-shot member probabilities (the folder's own tokenizer,
                    the same prompts and images) compared with the in-process model's.

Deep Ensembles and MC Dropout are not run here: a zero-shot model is not trained, so there are no
independently trained copies to ensemble (Deep Ensembles would mean pretraining M CLIPs) and
OpenCLIP ViT-B/32 is trained without dropout (switching dropout on at test time in a model never
trained with it is not MC Dropout). Temperature scaling needs only labelled validation data and is run.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from .. import evaluation as ev
from .. import metrics
from ..assemble import convert_checkpoint
from ..convert.open_clip import CONFIG_NAME as OPEN_CLIP_CONFIG
from ..data import make_image_loader, resolve_dataset
from ..evaluation import zero_shot_prompts
from ..hub import fresh_check
from ..masks import HeadMasks
from ..modeling.modeling_hydra_clip import HydraEnsembleCLIPModel
from ..pruning import PruningTarget, get_adapter
from ..pruning.budget import Budget
from ..pruning.loading import load_open_clip_folder
from ..workflows.prune import build_members
from .runner import PipelineResult, Stage, StageRunner, hub_stage, members_stage

logger = logging.getLogger(__name__)

OPEN_CLIP_WEIGHTS = "open_clip_model.safetensors"
TOWER_CHOICES = ("joint", "vision", "text")


@dataclass
class ZeroShotPipeline:
    """Every choice of a zero-shot run. The defaults are the paper's OpenCLIP setting: 3 members,
    24 heads removed from each over both towers, Taylor importance."""

    base_model: str  # an open_clip checkpoint folder (save_open_clip_folder)
    test_data: str  # ID data spec: an image folder (one sub-folder per class) or FOLDER:SPLIT
    class_names: tuple[str, ...]  # in label order (image folders: the sorted sub-folder names)
    templates: tuple[str, ...] = ("a photo of a {}.",)
    validation_data: str | None = None  # None: ``validation_size`` images carved from test_data (seeded)
    validation_size: int = 5000
    ood_test_data: dict[str, str] = field(default_factory=dict)
    ood_validation_data: str | None = None  # only for circuit-ood / circuit-avg members
    image_column: str = "image"
    label_column: str = "label"
    # members
    members: int = 3
    method: str = "taylor"
    # heads removed per member (over both towers with tower="joint"); None with heads_per_layer
    remove: int | None = 24
    heads_per_layer: int | None = None  # or: keep K heads in every layer of each pruned tower (set remove=None)
    tower: str = "joint"
    prune_template: str | None = None  # the one prompt per class used for selection (None: templates[0])
    prune_samples: int = 1024  # ID validation images for member selection
    prune_data_fraction: float = 0.8  # the seed draws this fraction of them per member
    heads_per_step: int = 1  # circuit methods only
    # evaluation
    max_test_samples: int | None = None  # a seeded random subset (image folders are sorted by class)
    max_validation_samples: int | None = None
    max_ood_samples: int | None = None
    eval_batch_size: int = 128
    device: str | None = None  # None: cuda when available
    seed: int = 0
    # report and Hub folder
    report_title: str = "Hydra Ensembles of OpenCLIP, zero-shot"
    report_notes: str = ""
    hub_base_model: str | None = None

    def __post_init__(self) -> None:
        self.class_names = tuple(self.class_names)
        self.templates = tuple(self.templates)
        zero_shot_prompts(self.class_names, self.templates + ((self.prune_template,) if self.prune_template else ()))
        if self.tower not in TOWER_CHOICES:
            raise ValueError(f"tower={self.tower!r} is unknown; use one of {list(TOWER_CHOICES)}")
        if self.validation_data is None and self.validation_size < 1:
            raise ValueError(
                f"validation_size must be positive when no validation_data is given, got {self.validation_size}"
            )
        self.budget()  # exactly one of remove / heads_per_layer

    def budget(self) -> Budget:
        """The members' pruning budget (exactly one of ``remove`` / ``heads_per_layer``)."""
        return Budget.of(self)

    def describe(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["class_names"] = f"{len(self.class_names)} classes: {', '.join(self.class_names[:5])}" + (
            ", ..." if len(self.class_names) > 5 else "")
        out["templates"] = f"{len(self.templates)} templates: {', '.join(self.templates[:3])}" + (
            ", ..." if len(self.templates) > 3 else "")
        return out


# ------------------------------------------------------------------------------- open_clip folders
def save_open_clip_folder(model: torch.nn.Module, model_cfg: dict[str, Any], folder: str | os.PathLike,
                          preprocess_cfg: dict[str, Any] | None = None) -> Path:
    """Write an open_clip checkpoint folder as open_clip's Hub export does: ``open_clip_config.json``
    (``{"model_cfg", "preprocess_cfg"}``) and ``open_clip_model.safetensors``.

    ``model_cfg`` is the model's open_clip config (``open_clip.get_model_config(name)``); a model built
    with QuickGELU (e.g. ``pretrained="openai"``) is recorded with ``quick_gelu: true`` so that the
    folder rebuilds the same computation.
    """
    import open_clip  # heavy: imported only for open_clip models
    from open_clip.transformer import QuickGELU  # heavy: imported only for open_clip models

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = dict(model_cfg)
    if any(isinstance(m, QuickGELU) for m in model.modules()):
        cfg["quick_gelu"] = True
    pre = {k: v for k, v in (preprocess_cfg or open_clip.get_model_preprocess_cfg(model)).items() if k != "size"}
    save_file(
        {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}, str(folder / OPEN_CLIP_WEIGHTS)
    )
    (folder / OPEN_CLIP_CONFIG).write_text(json.dumps({"model_cfg": cfg, "preprocess_cfg": pre}, indent=2) + "\n")
    return folder


# ------------------------------------------------------------------------------------------ data
def _seeded_subset(dataset, n: int | None, seed: int):
    """``n`` examples drawn at random (seeded), in their original order; all when ``n`` is None."""
    if n is None or n >= len(dataset):
        return dataset
    idx = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))[:n].sort().values.tolist()
    return dataset.select(idx)


def _load(p: ZeroShotPipeline, spec: str, labelled: bool):
    ds = resolve_dataset(spec, text_column=None, image_column=p.image_column,
                         label_column=p.label_column if labelled else None, require_labels=labelled,
                         num_labels=len(p.class_names) if labelled else None)
    if len(ds) == 0:
        raise ValueError(f"data {spec!r} is empty")
    return ds


def load_splits(p: ZeroShotPipeline):
    """``(validation, test)`` ID datasets: ``p.validation_data``, or ``p.validation_size`` images drawn
    (seeded) from ``p.test_data`` and removed from the test split."""
    test = _load(p, p.test_data, True)
    if p.validation_data is not None:
        validation = _load(p, p.validation_data, True)
    else:
        if p.validation_size >= len(test):
            raise ValueError(
                f"validation_size={p.validation_size} leaves no test images of {len(test)} in {p.test_data!r}; "
                "lower it or give validation_data"
            )
        order = torch.randperm(len(test), generator=torch.Generator().manual_seed(p.seed + 1)).tolist()
        validation = test.select(sorted(order[: p.validation_size]))
        test = test.select(sorted(order[p.validation_size :]))
    return (_seeded_subset(validation, p.max_validation_samples, p.seed + 2),
            _seeded_subset(test, p.max_test_samples, p.seed + 3))


def _device(p: ZeroShotPipeline) -> str:
    return p.device or ("cuda" if torch.cuda.is_available() else "cpu")


def _loader(dataset, preprocess, batch_size: int):
    return make_image_loader(dataset, preprocess, batch_size=batch_size)


# ---------------------------------------------------------------------------------------- stages
def evaluate_single_validation(p: ZeroShotPipeline, validation, out_file: Path) -> dict[str, Any]:
    """Stage 1: the Single zero-shot model on the ID validation split, and its fitted temperature."""
    model, preprocess, tokenizer = load_open_clip_folder(p.base_model, _device(p))
    preds = ev.predict(ev.ZeroShotPredictor(model, p.class_names, p.templates, tokenizer=tokenizer),
                       _loader(validation, preprocess, p.eval_batch_size), desc="Single: validation")
    summary = {"validation_images": len(validation), **metrics.calibration_report(preds.probs, preds.labels),
               "temperature": ev.fit_temperature(preds)}
    out_file.write_text(json.dumps(summary, indent=2) + "\n")
    logger.info("Single zero-shot on validation: accuracy %.4f, NLL %.4f, temperature %.3f",
                summary["accuracy"], summary["nll"], summary["temperature"])
    return summary


def build_zero_shot_members(p: ZeroShotPipeline, validation) -> HeadMasks:
    """Stage 2: M members on the ID validation split (masks with named towers: the pruned ones)."""
    device = _device(p)
    model, preprocess, tokenizer = load_open_clip_folder(p.base_model, device)
    template = p.prune_template or p.templates[0]
    class_tokens = tokenizer([template.format(name) for name in p.class_names])  # (C, T)
    target = PruningTarget(get_adapter(model, class_text_inputs=class_tokens), preprocess, None, len(p.class_names),
                           {name: i for i, name in enumerate(p.class_names)}, zero_shot=True)
    ood = (
        _seeded_subset(_load(p, p.ood_validation_data, False), p.prune_samples, p.seed)
        if p.ood_validation_data
        else None
    )
    # datasets, not specs: the validation images may be carved from the test data, and both are seeded subsets
    return build_members(
        target,
        method=p.method,
        budget=p.budget(),
        id_data=_seeded_subset(validation, p.prune_samples, p.seed),
        ood_data=ood,
        members=p.members,
        seed=p.seed,
        tower=p.tower,
        data_fraction=p.prune_data_fraction,
        heads_per_step=p.heads_per_step,
        batch_size=32,
        device=device,
        metadata={
            "base_model": str(p.base_model),
            "id_validation": p.validation_data or f"{p.validation_size} images of {p.test_data}",
            "prune_template": template,
        },
    )


def member_masks(masks, m: int):
    """The masks of member ``m`` alone (a one-member ensemble: the single pruned model)."""
    one = masks.select_members([m])
    one.metadata = {}  # the member's own metadata stays with it; the run's top-level metadata does not
    return one


def evaluate_zero_shot(p: ZeroShotPipeline, hydra_dir: Path, member_dir: Path, validation, test,
                       single_summary: dict[str, Any], report_dir: Path, settings: dict[str, Any]) -> dict[str, Any]:
    """Stage 4: Hydra against Single, both with and without temperature scaling, and the single pruned
    member, on the ID test split and every OOD set."""
    device = _device(p)
    single, preprocess, tokenizer = load_open_clip_folder(p.base_model, device)
    hydra = HydraEnsembleCLIPModel.from_pretrained(str(hydra_dir)).to(device).eval()
    pruned = HydraEnsembleCLIPModel.from_pretrained(str(member_dir)).to(device).eval()

    def zero_shot(model):
        return ev.ZeroShotPredictor(model, p.class_names, p.templates, tokenizer=tokenizer)

    test_loader = _loader(test, preprocess, p.eval_batch_size)
    oods = {
        name: _loader(
            _seeded_subset(_load(p, spec, False), p.max_ood_samples, p.seed + 4), preprocess, p.eval_batch_size
        )
        for name, spec in p.ood_test_data.items()
    }
    hydra_name = f"Hydra ({p.method}, M={p.members}, {p.tower})"
    predictors: dict[str, ev.Predictor] = {
        hydra_name: zero_shot(hydra),
        "Single": zero_shot(single),
        "Single pruned (member 0)": zero_shot(pruned),
    }
    t_single = float(single_summary["temperature"])
    t_hydra = ev.fit_temperature(ev.predict(predictors[hydra_name], _loader(validation, preprocess, p.eval_batch_size),
                                            desc="Hydra: validation"))
    predictors["Single + TS"] = ev.TemperatureScaledPredictor(predictors["Single"], t_single)
    predictors["Hydra + TS"] = ev.TemperatureScaledPredictor(predictors[hydra_name], t_hydra)
    latency_batch = {k: v for k, v in next(iter(test_loader)).items() if k != "labels"}
    result = ev.evaluate_predictors(predictors, test_loader, oods, score="msp", latency_batch=latency_batch)
    notes = [
        f"Latency: median ms for one batch of {len(latency_batch['pixel_values'])} test images on {device}, the class "
        "embeddings cached (the image tower only); parameters count both towers.",
        f"Zero-shot: {len(p.class_names)} classes x {len(p.templates)} prompt templates (CLIP's prompt ensemble); no "
        "model was trained. Members were selected, and temperatures fitted, on the ID validation split only.",
        "Deep Ensembles and MC Dropout are not applicable zero-shot (no trained copies "
        "to ensemble; the model has no dropout).",
    ]
    if p.report_notes:
        notes.append(p.report_notes)
    ev.write_evaluation_report(result, report_dir, title=p.report_title, settings=settings, notes=" ".join(notes),
                               extra={"model_row": 0, "temperature_single": t_single, "temperature_hydra": t_hydra,
                                      "single_validation": single_summary, "test_images": len(test)})
    return json.loads((report_dir / "report.json").read_text())


def check_zero_shot_hub_folder(
    hub_dir: Path, predictor, pixel_values: torch.Tensor, timeout: float = 300
) -> dict[str, Any]:
    """Load the staged folder in a fresh process where hydra_hf cannot be imported, compute the
    members' zero-shot probabilities there (the folder's tokenizer, the predictor's prompts, the same
    images) and compare them with ``predictor`` (a ZeroShotPredictor of the in-process Hydra model)."""
    if not any((hub_dir / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json")):
        raise RuntimeError(f"{hub_dir} has no tokenizer: zero-shot prompts cannot be tokenized by a Hub user")
    with torch.inference_mode():
        # (B, M, C)
        expected = torch.softmax(predictor.member_logits({"pixel_values": pixel_values}).double().cpu(), -1)
    got = fresh_check(hub_dir, task="zero-shot-member-probs", timeout=timeout,
                      inputs={"class_names": predictor.class_names, "templates": predictor.templates},
                      tensors={"pixel_values": pixel_values})
    fresh = torch.tensor(got, dtype=torch.float64)  # (B, M, C)
    diff = float((fresh - expected).abs().max())
    if fresh.shape != expected.shape or diff > 1e-4:
        raise RuntimeError(
            f"fresh-process member probabilities {tuple(fresh.shape)} differ from the in-process model's "
            f"{tuple(expected.shape)} by {diff:.2e}"
        )
    labels = [predictor.class_names[int(i)] for i in fresh.mean(1).argmax(-1)]
    return {
        "images": int(pixel_values.shape[0]),
        "members": int(fresh.shape[1]),
        "max_abs_prob_diff": diff,
        "labels": labels,
    }


def run_zero_shot_pipeline(p: ZeroShotPipeline, output_dir: str | os.PathLike, *, resume: bool = False,
                           repo_id: str = "your-org/hydra-openclip-zero-shot") -> PipelineResult:
    """Run all stages (see the module docstring) and return the report and timings.

    ``PipelineResult.hub_check`` holds ``validate_staged``'s summary under ``"validate"`` and the
    fresh-process prediction comparison under ``"predictions"``.
    """
    runner = StageRunner(output_dir, resume=resume)  # first: refuses a folder it did not create
    out = runner.output_dir
    validation, test = load_splits(p)
    logger.info(
        "ID data: %d validation and %d test images, %d classes", len(validation), len(test), len(p.class_names)
    )

    single_file = out / "single.json"
    single_summary = runner.run(Stage("1. zero-shot single model (validation)", single_file,
                                      lambda: evaluate_single_validation(p, validation, single_file),
                                      load=lambda: json.loads(single_file.read_text())))

    masks = runner.run(members_stage(out / "masks.json", lambda: build_zero_shot_members(p, validation),
                                     towers=("vision", "text")))

    hydra_dir, member_dir = out / "hydra", out / "member_0"

    def fuse():
        convert_checkpoint(masks, base=p.base_model, output_dir=hydra_dir, overwrite=True)
        convert_checkpoint(member_masks(masks, 0), base=p.base_model, output_dir=member_dir, overwrite=True)

    runner.run(Stage("3. fuse the members", (hydra_dir, member_dir), fuse))

    settings = {**p.describe(), "jaccard": masks.metadata.get("pairwise_jaccard")}
    report_dir = out / "report"
    report = runner.run(Stage("4. evaluate", report_dir, lambda: evaluate_zero_shot(
        p, hydra_dir, member_dir, validation, test, single_summary, report_dir, settings), resumable=False))

    def check(validated: dict[str, Any]) -> dict[str, Any]:
        _, preprocess, tokenizer = load_open_clip_folder(p.base_model)
        hydra = HydraEnsembleCLIPModel.from_pretrained(str(hydra_dir)).eval()
        predictor = ev.ZeroShotPredictor(hydra, p.class_names, p.templates, tokenizer=tokenizer)
        pixels = next(iter(_loader(test, preprocess, 8)))["pixel_values"]
        return {
            "validate": validated["load"],
            "predictions": check_zero_shot_hub_folder(out / "hub", predictor, pixels),
        }

    hub_check = runner.run(hub_stage(
        hydra_dir, out / "hub", repo_id=repo_id, report=report_dir / "report.json", base_model=p.hub_base_model,
        training=f"no training (zero-shot): {p.method} members (seeds {p.seed}..{p.seed + p.members - 1}, "
                 f"{p.budget().describe()}, tower {p.tower}) selected on {len(validation)} validation images",
        check=check))
    return runner.finish(report, hub_check)
