"""What every recipe pipeline shares: stages, resume, timings, the Hub stage and the result.

A pipeline is a sequence of :class:`Stage` objects run by one :class:`StageRunner`: each stage has a
name (its log line and its key in ``timings.json``), the files or folders it produces under the
output folder, and a body. With ``resume=True`` a stage whose outputs all exist is kept (its
``load`` gives the value the body would have returned); a stage with ``resumable=False`` always
runs, on a fresh output (the report, which depends on every stage before it). The runner works only
in a folder of its own (the ``hydra-hf recipe`` marker), so replacing a stage's output never touches
a user's files.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from .. import evaluation as ev
from .. import hub
from ..evaluation.report import render_markdown_table
from ..finetune import finetune_members
from ..finetune.baselines import all_heads_masks
from ..masks import HeadMasks
from ..outputs import prepare_owned_folder

logger = logging.getLogger(__name__)

HUB_STAGE = "5. Hub-ready folder and fresh-process check"


@dataclass
class PipelineResult:
    output_dir: Path
    report: dict[str, Any]
    table: str
    timings_s: dict[str, float]
    hub_check: dict[str, Any]

    @classmethod
    def finish(
        cls, out: Path, report: dict[str, Any], timings: dict[str, float], hub_check: dict[str, Any]
    ) -> PipelineResult:
        """The last step every pipeline shares: the result table, ``timings.json``, the result."""
        (out / "timings.json").write_text(json.dumps(timings, indent=2) + "\n")
        return cls(output_dir=out, report=report, table=render_markdown_table(report["rows"], bold_best=False),
                   timings_s=timings, hub_check=hub_check)

    def summary(self, total_s: float) -> str:
        """The result table, the time of every stage and the total, for a script to print."""
        stages = "\n".join(f"  {stage}: {seconds:.0f} s" for stage, seconds in self.timings_s.items())
        report = self.output_dir / "report" / "report.md"
        return f"\n{self.table}\n\n{stages}\ntotal: {total_s / 60:.1f} min; report: {report}"


def timed_stage(timings: dict[str, float], name: str, fn: Callable[[], Any]) -> Any:
    """Run ``fn()`` as the pipeline stage ``name``: log it and record its wall time in ``timings`` (s)."""
    t0 = time.perf_counter()
    logger.info("=== %s", name)
    value = fn()
    timings[name] = time.perf_counter() - t0
    logger.info("=== %s done in %.0f s", name, timings[name])
    return value


@dataclass
class Stage:
    """One step of a pipeline.

    Attributes:
        name: the log line and the key of its wall time in ``timings.json``.
        outputs: what the stage writes (files or folders); with resume, a stage whose outputs all
            exist is kept. None: the stage always runs.
        body: runs the stage; its value is what :meth:`StageRunner.run` returns.
        load: the value of a kept stage (e.g. the masks read back from ``masks.json``).
        resumable: False: never kept; its outputs are removed before it runs.
    """

    name: str
    outputs: Path | Sequence[Path] | None
    body: Callable[[], Any]
    load: Callable[[], Any] | None = None
    resumable: bool = True

    @property
    def paths(self) -> list[Path]:
        if self.outputs is None:
            return []
        return [self.outputs] if isinstance(self.outputs, Path) else list(self.outputs)


@dataclass
class StageRunner:
    """Runs the stages of one pipeline in ``output_dir`` (made absolute: the fresh-process checks run
    from another directory), records their wall times and writes ``timings.json`` at the end.

    Creating it claims the folder: a new one, or one an earlier run created (the marker); any other
    existing folder is refused before anything is written.
    """

    output_dir: Path
    resume: bool = False
    timings: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.output_dir = Path(self.output_dir).resolve()
        # a folder of our own (marker): the stages replace their sub-folders, never a user's folder
        prepare_owned_folder(self.output_dir, command="recipe", overwrite=False, keep=True)

    def done(self, stage: Stage) -> bool:
        """Whether ``stage`` is kept: resuming, resumable, and every output exists."""
        paths = stage.paths
        if not (self.resume and stage.resumable and paths and all(p.exists() for p in paths)):
            return False
        logger.info("resume: keeping %s", ", ".join(str(p) for p in paths))
        return True

    def run(self, stage: Stage) -> Any:
        """Run ``stage`` (or keep it, see :meth:`done`) and return its value."""
        if self.done(stage):
            return stage.load() if stage.load is not None else None
        if not stage.resumable:
            for path in stage.paths:
                if path.is_dir():
                    shutil.rmtree(path)
                elif path.exists():
                    path.unlink()
        return timed_stage(self.timings, stage.name, stage.body)

    def finish(self, report: dict[str, Any], hub_check: dict[str, Any]) -> PipelineResult:
        """Write ``timings.json`` and return the pipeline's result."""
        return PipelineResult.finish(self.output_dir, report, self.timings, hub_check)


def single_model_stage(base: Path, out: Path, *, train_data: str, validation_data: str, config: Any,
                       id2label: dict[int, str] | None = None) -> Stage:
    """Stage 1 of the trained settings: fine-tune ``base`` with all its heads (the **Single**
    baseline) into ``out / "single"``; its stock checkpoint is :func:`single_model_dir` ``(out)``."""
    single_out = out / "single"
    return Stage("1. fine-tune the single model", single_out, lambda: finetune_members(
        base, all_heads_masks(base), train_data, validation_data, single_out, config, work_dir=out / "single.work",
        overwrite=True, id2label=id2label))


def single_model_dir(out: Path) -> Path:
    """The stock checkpoint of the fine-tuned Single model of a pipeline in ``out``."""
    return out / "single.work" / "member_0" / "model"


def finetune_members_stage(single_dir: Path, masks: HeadMasks, out: Path, *, train_data: str, validation_data: str,
                           config: Any) -> Stage:
    """Stage 3 of the trained settings: fine-tune every member from the Single model (its own seed)
    and fuse them into ``out / "hydra"``; member 0 alone is ``out / "hydra.work/member_0/model"``."""
    hydra_dir = out / "hydra"
    return Stage("3. fine-tune and fuse the members", hydra_dir, lambda: finetune_members(
        single_dir, masks, train_data, validation_data, hydra_dir, config, work_dir=out / "hydra.work",
        overwrite=True))


def members_stage(masks_file: Path, build: Callable[[], HeadMasks], *, towers: Sequence[str] | None = None) -> Stage:
    """Stage 2 of every pipeline: ``build()`` the members' masks and save them to ``masks_file``; a
    kept file is read back (and, given ``towers``, checked to name them)."""
    def body():
        masks = build()
        masks.save(masks_file)
        logger.info("members:\n%s", masks.summary())
        return masks

    def load():
        masks = HeadMasks.load(masks_file)
        if towers is not None:
            masks.check_towers(tuple(towers), model=f"the CLIP model of {str(masks_file)!r}")
        return masks

    return Stage("2. build the members", masks_file, body, load=load)


@dataclass
class EvaluationData:
    """The loaders of a trained setting's evaluation stage: the labelled ID test and validation splits,
    every OOD test set and the training data (for the Deep Ensembles (D) heads)."""

    test: Any
    validation: Any
    oods: dict[str, Any]
    train: Any


def evaluate_against_baselines(
    data: EvaluationData,
    report_dir: Path,
    *,
    hydra_row: str,
    hydra: Any,
    single: Any,
    pruned: Any | None,
    mc_samples: int,
    ensemble_heads: int,
    seed: int,
    title: str,
    settings: dict[str, Any],
    unit: str,
    extra: dict[str, Any] | None = None,
    scores: dict[str, str] | None = None,
    compare_to: Sequence[str] = (),
    bootstrap: int = 0,
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """Stage 4 of a trained setting: Hydra against the paper's baselines, one report.

    Rows, in order: ``hydra_row``, Single, Single pruned (member 0) when ``pruned`` is given, MC
    Dropout (left out, with a note, when the Single has no dropout), Deep Ensembles (D), the ``extra``
    predictors (Deep Ensemble, LoRA, ONNX rows) and Single + TS (temperature fitted on the validation
    split). ``scores`` sets a row's OOD score; with ``bootstrap`` > 0, the report carries paired
    bootstrap intervals of Hydra minus each row of ``compare_to``. ``unit`` names the inputs in the
    latency note (``"texts"``, ``"images"``). Returns the written ``report.json``.
    """
    notes = list(notes)
    predictors: dict[str, ev.Predictor] = {hydra_row: ev.ModelPredictor(hydra), "Single": ev.ModelPredictor(single)}
    if pruned is not None:
        predictors["Single pruned (member 0)"] = ev.ModelPredictor(pruned)
    if any(isinstance(m, nn.Dropout) and m.p > 0 for m in single.modules()):
        predictors["MC Dropout"] = ev.MCDropoutPredictor(single, samples=mc_samples, seed=seed)
    else:
        notes.append("MC Dropout is left out: the single model has no dropout (p = 0 in its config).")
    predictors[f"Deep Ensembles (D, M={ensemble_heads})"] = ev.HeadsEnsemblePredictor(
        single, ev.train_ensemble_heads(single, data.train, num_heads=ensemble_heads, seed=seed))
    predictors.update(extra or {})
    t_single = ev.fit_temperature(ev.predict(predictors["Single"], data.validation, desc="Single: validation"))
    predictors["Single + TS"] = ev.TemperatureScaledPredictor(predictors["Single"], t_single)
    latency_batch = {k: v for k, v in next(iter(data.test)).items() if k != "labels"}
    result = ev.evaluate_predictors(
        predictors, data.test, data.oods, score="msp", scores=scores, latency_batch=latency_batch
    )
    comparisons = {f"{hydra_row} − {ref}": ev.compare_predictions(result, hydra_row, ref, n_boot=bootstrap, seed=seed)
                   for ref in compare_to if bootstrap}
    size = len(next(iter(latency_batch.values())))
    notes.insert(0, f"Latency: median ms for one batch of {size} test {unit} on this machine.")
    ev.write_evaluation_report(result, report_dir, title=title, comparisons=comparisons or None, settings=settings,
                               extra={"model_row": 0, "temperature_single": t_single}, notes=" ".join(notes))
    return json.loads((report_dir / "report.json").read_text())


def hub_stage(hydra_dir: Path, hub_dir: Path, *, repo_id: str, report: Path, base_model: str | None, training: str,
              check: Callable[[dict[str, Any]], Any] | None = None) -> Stage:
    """The last stage of every pipeline: stage the Hub repository of ``hydra_dir`` in ``hub_dir``
    (card, shipped code, weights, report; it replaces ``hub_dir`` only if an earlier run staged it),
    validate it in a fresh process where hydra_hf cannot be imported
    (:func:`hydra_hf.hub.validate_staged`), then run ``check(validated)``, the setting's own
    fresh-process comparison of predictions. The stage's value is ``check``'s, or the validation
    summary without one."""

    def body():
        hub.stage_repository(hydra_dir, hub_dir, repo_id=repo_id, report=report, base_model=base_model,
                             overwrite=True, training=training)
        validated = hub.validate_staged(hub_dir)
        return check(validated) if check is not None else validated

    return Stage(HUB_STAGE, None, body)  # always runs; stage_repository guards hub_dir itself
