"""Fine-tuning the members and fusing them: :func:`finetune_members` (each member on its own, exported
as a stock checkpoint, then fused with the converter) and :func:`finetune_fused` (the fused model
trained as one)."""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import set_seed
from torch import nn

from ..assemble import convert_checkpoint
from ..errors import HydraInputError
from ..masks import HeadMasks
from ..outputs import write_output_folder
from ..saving import save_hydra_model
from .checkpoint import check_resume_flags, claim_work_dir
from .config import COMMAND, FinetuneConfig, default_recipe
from .run import FinetuneRun, make_accelerator, prepare_run
from .trainer import MemberTrainer

logger = logging.getLogger(__package__)  # "hydra_hf.finetune", as log lines named it before the split


def _build_hydra(run: FinetuneRun, masks: HeadMasks, mlp_fusion: str, seed: int) -> nn.Module:
    """A Hydra model of ``masks``' members from the base checkpoint (a bare encoder gets new
    per-member classifiers, initialised from ``seed``)."""
    model = convert_checkpoint(
        masks, base=run.model_dir, mlp_fusion=mlp_fusion, num_labels=run.num_labels, id2label=run.id2label, seed=seed
    )
    if not run.causal_lm:
        model.config.problem_type = "single_label_classification"
    if run.pad_token_id is not None:  # a decoder: the classifier pools the last token that is not padding
        model.config.pad_token_id = run.pad_token_id
    return model


PERTURB_SEED_OFFSET = 7919  # the fresh initialisation's seed: member seed + this (not the training stream's)


def shrink_and_perturb_(model: nn.Module, amount: float, seed: int, frozen_prefixes: tuple[str, ...]) -> nn.Module:
    """Shrink and perturb (Ash & Adams 2020) in place: every parameter whose name does not start with one of
    ``frozen_prefixes`` (the members' shared embeddings) becomes ``(1 - amount) * p + amount * p0``, ``p0``
    the same model class's random initialisation drawn with ``seed + PERTURB_SEED_OFFSET`` (LayerNorm
    weights initialise to 1 and biases to 0, so those shrink towards them). Members perturbed with different
    seeds start apart, as the members of a Deep Ensemble do; the global RNG is left as it was."""
    if not amount:
        return model
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + PERTURB_SEED_OFFSET)
        fresh = type(model)(model.config).state_dict()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not name.startswith(frozen_prefixes) and param.numel():
                param.mul_(1 - amount).add_(fresh[name].to(param), alpha=amount)
    return model


def _export_member(
    run: FinetuneRun,
    model: nn.Module,
    state: dict[str, torch.Tensor],
    folder: Path,
    member_masks: HeadMasks,
    info: dict,
) -> None:
    """Write a trained one-member Hydra model as a stock checkpoint folder (removed heads zeroed)."""
    stock_state = run.arch.unfuse(state, model.config)[0]
    cfg = {
        k: v for k, v in run.base_config.items() if k not in ("id2label", "label2id", "num_labels", "architectures")
    }
    if run.pad_token_id is not None:
        cfg["pad_token_id"] = run.pad_token_id  # a decoder's padding token (its tokenizer's pad, else its eos)
    if run.causal_lm:
        stock = run.arch.stock_causal_lm(cfg)
    else:
        cfg.update(
            id2label={int(k): v for k, v in model.config.id2label.items()}, problem_type="single_label_classification"
        )
        stock = run.arch.stock_model(cfg, model.config)
    stock.load_state_dict(stock_state, strict=not run.causal_lm)
    if run.causal_lm:  # a tied head is the embeddings' tensor: strict loading would name it missing
        missing = [k for k in stock.state_dict() if k not in stock_state]
        tied = stock.get_output_embeddings().weight is stock.get_input_embeddings().weight
        if missing and not (tied and missing == ["lm_head.weight"]):
            raise RuntimeError(f"the exported causal LM lacks {missing}")

    def write(tmp: Path) -> None:
        stock.save_pretrained(str(tmp), safe_serialization=True)
        run.save_processor(tmp)
        member_masks.save(tmp / "masks.json")
        (tmp / "finetune_member.json").write_text(json.dumps(info, indent=1) + "\n")

    # the same locked, atomic, marked writer as every output (its .model.tmp-PID-* leftovers of a
    # killed run are removed on the next run)
    write_output_folder(folder, write, command=COMMAND, overwrite=True, inputs=run.inputs)


def _best(run: FinetuneRun, state: dict[str, Any]) -> dict[str, float | None]:
    """The best validation score of a trained model: a classifier's accuracy, a causal LM's next-token NLL."""
    best = state["best_metric"]
    if run.causal_lm:
        return {"best_eval_nll": None if best is None else -best}
    return {"best_eval_accuracy": best}


def _summary_writer(summary: dict[str, Any], run: FinetuneRun | None = None) -> Callable[[Path], None]:
    """Writes the summary file (and, with ``run``, the run's preprocessor) into an output folder."""

    def write(tmp: Path) -> None:
        if run is not None:
            run.save_processor(tmp)
        (tmp / "finetune_summary.json").write_text(json.dumps(summary, indent=1) + "\n")

    return write


def finetune_members(
    model_dir: str | os.PathLike,
    masks: HeadMasks | str | os.PathLike,
    train_data: Any,
    eval_data: Any | None = None,
    output_dir: str | os.PathLike = "hydra-finetuned",
    config: FinetuneConfig | None = None,
    *,
    members: Sequence[int] | None = None,
    work_dir: str | os.PathLike | None = None,
    resume: bool = False,
    resume_partial: bool = False,
    overwrite: bool = False,
    id2label: dict[int, str] | None = None,
    step_callback: Callable[[dict[str, Any]], None] | None = None,
    fuse: bool = True,
    inputs: Sequence[str | os.PathLike] = (),
) -> Path | None:
    """Fine-tune every member (the base with that member's heads removed) on its own, then fuse.

    Run it in one process, or under ``accelerate launch`` (data parallel: every member is trained
    by all processes in turn). Only the main process writes files.

    Args:
        model_dir: the base checkpoint folder (a classifier of a registered family, whose trained head every
            member keeps, or a bare encoder: every member then gets a new classifier, initialised with its
            own seed; a decoder's causal LM trains on the next-token loss unless classes are asked for with
            ``config.num_labels`` or ``id2label``: then it is a last-token classifier with new heads), or a GGUF
            checkpoint (a ``.gguf`` file or a folder holding one: a causal LM, read through its cached plain
            folder, :func:`hydra_hf.families.resolve_checkpoint`).
        masks: the masks file (or ``HeadMasks``) for this base model.
        train_data, eval_data: dataset specs (``rotten_tomatoes:train``, a csv/jsonl/parquet file, a
            ``save_to_disk`` folder) or ``datasets.Dataset`` objects with the configured text and
            label columns. Without ``eval_data`` there is no early stopping and the last weights are kept.
        output_dir: the fused Hydra Ensemble folder, written atomically once every member is trained.
        config: the settings (default: the paper's recipe for the base, :func:`default_recipe`).
        members: train only these members (e.g. one launch per GPU, sharing ``work_dir``); the fused
            folder is written by the launch that finds every member trained.
        work_dir: checkpoints, logs and the per-member stock folders (default ``<output_dir>.work``).
        resume: continue the members' last checkpoints in ``work_dir`` (finished members are skipped),
            exactly: the result equals an uninterrupted run's.
        resume_partial: implies ``resume``; also go on (with a warning) when a member's checkpoint has
            no RNG states (it resumes, but dropout differs from an uninterrupted run) or no trainer state
            (that member is retrained from its first step). Without it both are errors.
        overwrite: replace ``output_dir`` and empty ``work_dir``, but only folders an earlier
            ``hydra-hf finetune`` wrote (they hold its ``.hydra_hf_output.json`` marker); any other
            non-empty folder is an error and is never deleted.
        id2label: class names for a bare encoder or a causal LM (the checkpoint's own labels win otherwise).
        step_callback: called after every optimizer step with ``{"tag", "epoch", "step", "loss"}``;
            raising :class:`TrainingInterrupted` there stops the run (resume later).
        fuse: ``False`` trains and exports the members (``work_dir/member_<m>/model``) but never writes
            ``output_dir``: models that are used as separate models, such as the members of a Deep
            Ensemble (:func:`hydra_hf.finetune.baselines.train_deep_ensemble`).
        inputs: other files the caller read for this run (e.g. a settings file): like the model, the masks
            and the data, never inside ``output_dir`` or ``work_dir``, which ``overwrite`` would delete.

    Returns:
        ``output_dir``, or ``None`` when other members remain to be trained or ``fuse`` is ``False``.
    """
    resume = check_resume_flags(resume, resume_partial, overwrite)
    accelerator, config = make_accelerator(config or default_recipe(model_dir))
    with accelerator.main_process_first():  # the main process fills the datasets cache first
        run = prepare_run(model_dir, masks, train_data, eval_data, output_dir, config, work_dir, overwrite, id2label,
                          inputs)
    M = run.masks.num_members
    chosen = list(range(M)) if members is None else sorted(set(members))
    bad = [m for m in chosen if isinstance(m, bool) or not isinstance(m, int) or not 0 <= m < M]
    if bad:
        raise HydraInputError(f"members {bad} are not members of the masks file (0..{M - 1})")
    claim_work_dir(accelerator, run, [f"member_{m}" for m in chosen], resume=resume, shared=members is not None)

    for m in chosen:
        folder = run.work_dir / f"member_{m}"
        if (folder / "model" / "config.json").is_file():
            if accelerator.is_main_process:
                logger.info("member %d: already fine-tuned in %s", m, folder / "model")
            continue
        seed = run.config.seed + m
        member_masks = run.masks.select_members([m])  # its heads (and, slim members, its MLP neurons)
        model = _build_hydra(run, member_masks, "average", seed)  # one member: a structurally pruned model
        shrink_and_perturb_(model, run.config.member_perturb, seed, run.arch.frozen_prefixes)
        set_seed(seed)
        trainer = MemberTrainer(accelerator, run, model, folder, seed, tag=f"member {m}")
        state = trainer.train(resume, step_callback, resume_partial)
        if accelerator.is_main_process:
            info = {
                "member": m, "seed": seed, "epochs": state["epoch"], "steps": state["global_step"],
                **_best(run, state), "best_epoch": state["best_epoch"], "history": state["history"],
                "loss_windows": state.get("loss_windows", []),  # [step, mean loss of the log_every_steps before]
            }
            _export_member(run, model, trainer.final_state_dict(), folder / "model", member_masks, info)
            if not run.config.keep_checkpoints:
                shutil.rmtree(folder / "checkpoint", ignore_errors=True)
        accelerator.wait_for_everyone()
        accelerator.free_memory()
        del trainer, model

    if not fuse:
        return None
    missing = [m for m in range(M) if not (run.work_dir / f"member_{m}" / "model" / "config.json").is_file()]
    if missing:
        if accelerator.is_main_process:
            logger.info("members %s are not fine-tuned yet; the fused model is written once they are", missing)
        return None
    if accelerator.is_main_process:
        _fuse_members(run)
    accelerator.wait_for_everyone()
    return run.output_dir


def _fuse_members(run: FinetuneRun) -> None:
    """Main process: fuse the fine-tuned members' stock folders into the Hydra Ensemble output folder."""
    folders = [run.work_dir / f"member_{m}" / "model" for m in range(run.masks.num_members)]
    infos = [json.loads((f / "finetune_member.json").read_text()) for f in folders]
    masks = run.masks.select_members(range(run.masks.num_members))  # a copy, slim neurons included
    masks.member_metadata = [
        {
            **meta,
            "finetune": {
                k: info[k] for k in ("seed", "epochs", "steps", *_best(run, {"best_metric": None}), "best_epoch")
            },
        }
        for meta, info in zip(run.masks.member_metadata, infos)
    ]
    shared = "error" if run.config.freeze_embeddings else "average"
    if shared == "average":
        logger.warning(
            "embeddings were fine-tuned per member: the fused model averages them (freeze_embeddings avoids this)"
        )
    model = convert_checkpoint(masks, members=folders, mlp_fusion=run.config.mlp_fusion, shared=shared)
    summary = {"mode": "members", "config": run.config.to_dict(), "members": infos}
    save_hydra_model(
        model, run.output_dir, preprocessor_from=folders[0], overwrite=run.overwrite, extra=_summary_writer(summary),
        command=COMMAND, inputs=[*run.inputs, run.work_dir],
    )
    logger.info("wrote the fused model of %d fine-tuned members to %s", len(folders), run.output_dir)


def finetune_fused(
    model_dir: str | os.PathLike,
    masks: HeadMasks | str | os.PathLike,
    train_data: Any,
    eval_data: Any | None = None,
    output_dir: str | os.PathLike = "hydra-finetuned",
    config: FinetuneConfig | None = None,
    *,
    work_dir: str | os.PathLike | None = None,
    resume: bool = False,
    resume_partial: bool = False,
    overwrite: bool = False,
    id2label: dict[int, str] | None = None,
    step_callback: Callable[[dict[str, Any]], None] | None = None,
    inputs: Sequence[str | os.PathLike] = (),
) -> Path:
    """Fuse first, then train the Hydra model as one (loss = mean member cross-entropy).

    All members see the same batches (seed ``config.seed``) and stop together, on the ensemble's
    validation accuracy. ``config.mlp_fusion`` is the fused MLP being trained: ``"per_member"`` keeps
    the members independent; ``"average"`` trains one MLP shared by all members. Arguments as in
    :func:`finetune_members`.

    Returns:
        ``output_dir``.
    """
    resume = check_resume_flags(resume, resume_partial, overwrite)
    accelerator, config = make_accelerator(config or default_recipe(model_dir))
    with accelerator.main_process_first():
        run = prepare_run(model_dir, masks, train_data, eval_data, output_dir, config, work_dir, overwrite, id2label,
                          inputs)
    claim_work_dir(accelerator, run, ["fused"], resume=resume, shared=False)
    model = _build_hydra(run, run.masks, run.config.mlp_fusion, run.config.seed)
    shrink_and_perturb_(model, run.config.member_perturb, run.config.seed, run.arch.frozen_prefixes)
    set_seed(run.config.seed)
    folder = run.work_dir / "fused"
    trainer = MemberTrainer(accelerator, run, model, folder, run.config.seed, tag="fused")
    state = trainer.train(resume, step_callback, resume_partial)
    if accelerator.is_main_process:
        model = accelerator.unwrap_model(trainer.model)
        model.load_state_dict(trainer.final_state_dict(), strict=True)
        summary = {
            "mode": "fused", "config": run.config.to_dict(), "epochs": state["epoch"], "steps": state["global_step"],
            **_best(run, state), "best_epoch": state["best_epoch"], "history": state["history"],
        }
        save_hydra_model(
            model.eval(), run.output_dir, overwrite=run.overwrite, extra=_summary_writer(summary, run),
            command=COMMAND, inputs=[*run.inputs, run.work_dir],
        )
        if not run.config.keep_checkpoints:
            shutil.rmtree(folder / "checkpoint", ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.free_memory()
    return run.output_dir
