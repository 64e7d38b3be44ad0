"""The paper's trained baselines (Table 17): Deep Ensembles fine-tuned downstream, LoRA-Single and
LoRA-Ensemble.

- :func:`train_deep_ensemble`: M full models (all heads) fine-tuned from the same checkpoint, member
  m with seed ``config.seed + m``. It is :func:`hydra_hf.finetune.finetune_members` with M members
  that keep every head, so member 0 *is* the Single model of the same run (same seed, same recipe):
  a pipeline that has trained its Single passes it as ``reuse_member0`` and trains M-1 models.
- :func:`train_lora` / :func:`train_lora_ensemble`: LoRA adapters (``peft``) on the attention
  projections plus a trainable classifier, trained by the same loop as the members (optimizer,
  schedule, steps, batch, seeded data order, early stopping: ``finetune.MemberTrainer``), then merged into
  the weights and saved as a stock ``*ForSequenceClassification`` checkpoint, so that evaluation loads
  a plain model. The adapter itself is kept in ``adapter/``. LoRA-Single is member 0 of a
  LoRA-Ensemble (seed ``config.seed``).

Evaluate the ensembles with :class:`hydra_hf.evaluation.EnsemblePredictor` (the M models run one
after another, as a deep ensemble is deployed). ``peft`` is optional: ``pip install hydra-hf[peft]``.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from accelerate.utils import set_seed
from torch import nn
from transformers import AutoConfig, AutoModelForImageClassification, AutoModelForSequenceClassification

from ..convert import read_config
from ..convert.gguf import checkpoint_inputs
from ..data import data_spec_paths
from ..errors import HydraInputError
from ..families import resolve_checkpoint
from ..masks import HeadMasks
from ..outputs import prepare_owned_folder, write_output_folder
from ..saving import copy_preprocessor
from . import (
    COMMAND,
    RESUME_FREE,
    FinetuneConfig,
    MemberTrainer,
    claim_work_dir,
    default_recipe,
    finetune_members,
    make_accelerator,
    prepare_run,
)

logger = logging.getLogger(__name__)

PEFT_HINT = "pip install hydra-hf[peft]"
LORA_INFO = "lora_member.json"  # what a LoRA run records beside its merged checkpoint
ADAPTER_DIR = "adapter"


def require_peft() -> Any:
    """The ``peft`` module, or one :class:`HydraInputError` line saying how to install it."""
    try:
        import peft  # optional: pip install hydra-hf[peft]
    except ImportError:
        raise HydraInputError(
            f"LoRA baselines need the optional package peft, which is not installed; `{PEFT_HINT}`"
        ) from None
    return peft


def all_heads_masks(model_dir: str | os.PathLike, members: int = 1) -> HeadMasks:
    """``members`` members that each keep every head of ``model_dir`` (a folder or a GGUF checkpoint): M full
    models."""
    if isinstance(members, bool) or not isinstance(members, int) or members < 1:
        raise HydraInputError(f"members must be a positive integer, got {members!r}")
    # for_model knows every family's names for the sizes
    sizes = AutoConfig.for_model(**read_config(resolve_checkpoint(model_dir)))
    L, H = sizes.num_hidden_layers, sizes.num_attention_heads
    return HeadMasks(
        kept_heads=[[list(range(H)) for _ in range(L)] for _ in range(members)], num_heads=H,
        metadata={"method": "none (all heads: full models)"},
    )


# ------------------------------------------------------------------------------- deep ensembles
def _check_reusable(single: Path, config: FinetuneConfig) -> None:
    """``single`` must be member 0 of a run with this config: seed ``config.seed``, every head, and
    (when its run's ``finetune_config.json`` is beside it) the same training settings."""
    info_file, masks_file = single / "finetune_member.json", single / "masks.json"
    if not (single / "config.json").is_file() or not info_file.is_file():
        raise HydraInputError(
            f"reuse_member0={str(single)!r} is not a fine-tuned member folder (no config.json / "
            "finetune_member.json); pass the Single model's `<work_dir>/member_0/model`"
        )
    info = json.loads(info_file.read_text())
    if info.get("seed") != config.seed:
        raise HydraInputError(
            f"reuse_member0={str(single)!r} was trained with seed {info.get('seed')}, but member 0 of this deep "
            f"ensemble has seed config.seed={config.seed}; use the same seed or train every member"
        )
    if masks_file.is_file():
        masks = HeadMasks.load(masks_file)
        if any(len(heads) != masks.num_heads for heads in masks.kept_heads[0]):
            raise HydraInputError(
                f"reuse_member0={str(single)!r} is a pruned member; a deep ensemble member keeps every head"
            )
    saved_file = single.parent.parent / "finetune_config.json"
    if saved_file.is_file():
        saved, now = json.loads(saved_file.read_text()), config.to_dict()
        ignored = {*RESUME_FREE, "mlp_fusion"}  # they change nothing in a member's weights
        diff = {k: (saved.get(k), v) for k, v in now.items() if k not in ignored and saved.get(k) != v}
        if diff:
            raise HydraInputError(
                f"reuse_member0={str(single)!r} was trained with other settings {diff} (then, now); "
                "use the Single model's config or train every member"
            )


def train_deep_ensemble(
    base_model_dir: str | os.PathLike,
    train_data: Any,
    validation_data: Any | None,
    output_dir: str | os.PathLike,
    config: FinetuneConfig | None = None,
    members: int = 3,
    *,
    reuse_member0: str | os.PathLike | None = None,
    resume: bool = False,
    overwrite: bool = False,
    id2label: dict[int, str] | None = None,
) -> list[Path]:
    """Deep Ensembles as the paper trains them downstream: ``members`` full models fine-tuned from
    the same checkpoint, member m with seed ``config.seed + m`` (its own data order, dropout masks
    and, from a bare encoder, classifier initialisation).

    This is :func:`hydra_hf.finetune.finetune_members` with M members that keep every head and no
    fusion, so each member is trained exactly as the Single model is: with the recipe's frozen
    embeddings (``freeze_embeddings``, on in the text recipe; the paper's deep ensemble members
    fine-tune them too -- set ``freeze_embeddings=False`` for that, the Single then differs likewise).

    Args:
        base_model_dir: the pretrained checkpoint (a classifier or a bare encoder).
        train_data, validation_data: as in :func:`~hydra_hf.finetune.finetune_members`.
        output_dir: the ensemble's folder: ``member_<m>/model`` is member m's stock checkpoint (plus
            the run's checkpoints and ``log.jsonl``). The sibling ``<output_dir>.fused`` is never written.
        config: the fine-tuning settings (default: the paper's recipe for the base).
        members: M.
        reuse_member0: the Single model trained with the same ``config`` (``<its work_dir>/member_0/model``):
            it is member 0, and only members 1..M-1 are trained. Its seed, its heads and, when its
            run's ``finetune_config.json`` is beside it, its settings are checked.
        resume, overwrite, id2label: as in :func:`~hydra_hf.finetune.finetune_members`.

    Returns:
        The M member checkpoint folders, member 0 first.
    """
    config = config or default_recipe(base_model_dir)
    masks = all_heads_masks(base_model_dir, members)
    out = Path(output_dir)
    folders = [out / f"member_{m}" / "model" for m in range(members)]
    chosen = None
    if reuse_member0 is not None:
        single = Path(reuse_member0)
        _check_reusable(single, config)
        folders[0] = single
        chosen = list(range(1, members))
        if not chosen:
            return folders
    finetune_members(
        base_model_dir, masks, train_data, validation_data, out.with_name(out.name + ".fused"), config,
        members=chosen, work_dir=out, resume=resume, overwrite=overwrite, id2label=id2label, fuse=False,
    )
    return folders


# ------------------------------------------------------------------------------------------ LoRA
class _AsMember(nn.Module):
    """A stock classifier seen by the fine-tuning loop as a one-member model: ``member_logits (B, 1, C)``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, **inputs: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(member_logits=self.model(**inputs).logits.unsqueeze(1))  # (B, 1, C)


def _task_model(run: Any, seed: int) -> tuple[nn.Module, list[str]]:
    """The stock task model of the base (a new classifier, initialised from ``seed``, for a bare
    encoder) and the modules it trains in full: its task head (every child outside the backbone that
    has weights) and whatever the checkpoint lacks (a bare encoder without a pooler)."""
    auto = AutoModelForImageClassification if run.arch.modality == "image" else AutoModelForSequenceClassification
    kwargs: dict[str, Any] = {}
    if not run.base_has_classifier:
        kwargs["num_labels"] = run.num_labels
        if run.id2label:
            kwargs.update(id2label=dict(run.id2label), label2id={v: k for k, v in run.id2label.items()})
    torch.manual_seed(seed)  # the new classifier's initialisation
    model, info = auto.from_pretrained(str(run.model_dir), output_loading_info=True, **kwargs)
    model.config.problem_type = "single_label_classification"
    backbone = model.base_model_prefix
    head = [
        name for name, child in model.named_children() if name != backbone and any(True for _ in child.parameters())
    ]
    new = sorted({key.rsplit(".", 1)[0] for key in info.get("missing_keys", ()) if key.startswith(backbone + ".")})
    if new:
        logger.info("LoRA: %s are not in the checkpoint (newly initialised): trained in full", new)
    return model, head + new


def _check_lora_args(r: int, alpha: float, dropout: float, target_modules: Sequence[str]) -> None:
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise HydraInputError(f"LoRA rank r must be a positive integer, got {r!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha <= 0:
        raise HydraInputError(f"LoRA alpha must be a positive number, got {alpha!r}")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise HydraInputError(f"LoRA dropout must be in [0, 1), got {dropout!r}")
    if (
        isinstance(target_modules, str)
        or not target_modules
        or not all(isinstance(t, str) and t for t in target_modules)
    ):
        raise HydraInputError(f"target_modules must be a non-empty list of module names, got {target_modules!r}")


def train_lora(
    base_model_dir: str | os.PathLike,
    train_data: Any,
    validation_data: Any | None,
    output_dir: str | os.PathLike,
    config: FinetuneConfig | None = None,
    seed: int | None = None,
    r: int = 8,
    alpha: float = 16,
    dropout: float = 0.1,
    target_modules: Sequence[str] = ("query", "value"),
    *,
    modules_to_save: Sequence[str] | None = None,
    work_dir: str | os.PathLike | None = None,
    resume: bool = False,
    overwrite: bool = False,
    id2label: dict[int, str] | None = None,
) -> Path:
    """LoRA-Single: LoRA adapters on the attention projections and a trainable classifier, trained
    with the recipe of :func:`~hydra_hf.finetune.finetune_members`, merged and saved as a stock model.

    The training loop is the members' (``finetune.MemberTrainer``: the same optimizer and weight-decay
    groups, warm-up and schedule, gradient clipping, batch, data order seeded by ``seed``, early
    stopping on validation accuracy, checkpoint/resume); only the model differs: the pretrained
    weights stay frozen, and the LoRA matrices (``A`` random from ``seed``, ``B`` zero) plus the task
    head are trained. LoRA usually wants a larger learning rate than full fine-tuning (e.g. 10x):
    pass a config with it.

    Args:
        base_model_dir: the pretrained checkpoint (a classifier, or a bare encoder: a new classifier is
            initialised from ``seed``).
        train_data, validation_data: as in :func:`~hydra_hf.finetune.finetune_members`.
        output_dir: the merged stock checkpoint (+ tokenizer), with ``adapter/`` (the peft adapter
            and trained head, loadable with ``PeftModel.from_pretrained``) and ``lora_member.json``.
        config: the fine-tuning settings (default: the paper's recipe for the base).
        seed: the run's seed (default ``config.seed``).
        r, alpha, dropout, target_modules: the LoRA settings (``target_modules``: BERT/RoBERTa/ViT
            names of the query and value projections; DistilBERT's are ``q_lin``, ``v_lin``).
        modules_to_save: modules trained in full (default: the task head, plus anything the checkpoint
            lacks, e.g. a pooler).
        work_dir: checkpoints and log (default ``<output_dir>.work``).
        resume, overwrite, id2label: as in :func:`~hydra_hf.finetune.finetune_members`.

    Returns:
        ``output_dir``.
    """
    peft = require_peft()
    _check_lora_args(r, alpha, dropout, target_modules)
    config = config or default_recipe(base_model_dir)
    seed = config.seed if seed is None else seed
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise HydraInputError(f"seed must be a non-negative integer, got {seed!r}")
    if resume and overwrite:
        raise HydraInputError("resume continues the run in the work folder and overwrite starts it afresh; pass one")
    accelerator, config = make_accelerator(config)
    with accelerator.main_process_first():
        run = prepare_run(
            base_model_dir, all_heads_masks(base_model_dir), train_data, validation_data, output_dir, config, work_dir,
            overwrite, id2label,
        )
    claim_work_dir(accelerator, run, ["lora"], resume=resume, shared=False)

    model, head = _task_model(run, seed)
    lora_config = peft.LoraConfig(
        r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules),
        modules_to_save=list(modules_to_save) if modules_to_save is not None else head,
    )
    total = sum(p.numel() for p in model.parameters())  # the stock model's (= the merged model's)
    torch.manual_seed(seed)  # the LoRA A matrices
    peft_model = peft.get_peft_model(model, lora_config)
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    logger.info(
        "LoRA seed %d: %d trainable parameters (%.2f %% of %d)", seed, trainable, 100 * trainable / total, total
    )
    set_seed(seed)
    wrapper = _AsMember(peft_model)
    folder = run.work_dir / "lora"
    trainer = MemberTrainer(accelerator, run, wrapper, folder, seed, tag=f"LoRA seed {seed}")
    state = trainer.train(resume, None, False)
    if accelerator.is_main_process:
        wrapper.load_state_dict(trainer.final_state_dict(), strict=True)
        info = {
            "config": config.to_dict(),
            "seed": seed,
            "r": r,
            "alpha": alpha,
            "dropout": dropout,
            "target_modules": list(target_modules),
            "modules_to_save": list(lora_config.modules_to_save),
            "trainable_parameters": trainable,
            "base_parameters": total,
            "epochs": state["epoch"],
            "steps": state["global_step"],
            "best_eval_accuracy": state["best_metric"],
            "best_epoch": state["best_epoch"],
            "history": state["history"],
        }
        batch = next(iter(trainer.data_loader(run.eval if run.eval is not None else run.train, 8)))
        device = next(peft_model.parameters()).device
        _export_lora(run, peft_model.eval(), {k: v.to(device) for k, v in batch.items() if k != "labels"}, info)
        if not config.keep_checkpoints:
            shutil.rmtree(folder / "checkpoint", ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.free_memory()
    return run.output_dir


def _export_lora(run: Any, peft_model: nn.Module, batch: dict[str, torch.Tensor], info: dict[str, Any]) -> None:
    """Main process: write the adapter, merge it into the weights and write the stock checkpoint.
    The merged model's logits on ``batch`` (validation inputs) are recorded against the unmerged
    model's (``merge_max_abs_diff``)."""
    with torch.no_grad():
        before = peft_model(**batch).logits.float()  # (B, C)

    def write(tmp: Path) -> None:
        peft_model.save_pretrained(str(tmp / ADAPTER_DIR))
        merged = peft_model.merge_and_unload()  # the base model, with W + (alpha / r) B A and the trained head
        with torch.no_grad():
            after = merged.eval()(**batch).logits.float()  # (B, C)
        info["merge_max_abs_diff"] = float((after - before).abs().max())
        if info["merge_max_abs_diff"] > 1e-4:
            logger.warning("LoRA merge: the merged model's logits differ by %.2e", info["merge_max_abs_diff"])
        merged.save_pretrained(str(tmp), safe_serialization=True)
        copy_preprocessor(run.model_dir, tmp)
        (tmp / LORA_INFO).write_text(json.dumps(info, indent=1) + "\n")

    write_output_folder(run.output_dir, write, command=COMMAND, overwrite=True, inputs=run.inputs)
    logger.info("LoRA seed %d: merged model written to %s", info["seed"], run.output_dir)


def train_lora_ensemble(
    base_model_dir: str | os.PathLike,
    train_data: Any,
    validation_data: Any | None,
    output_dir: str | os.PathLike,
    config: FinetuneConfig | None = None,
    members: int = 3,
    *,
    overwrite: bool = False,
    id2label: dict[int, str] | None = None,
    **lora: Any,
) -> list[Path]:
    """LoRA-Ensemble: ``members`` :func:`train_lora` runs from the same checkpoint with seeds
    ``config.seed + m``; member 0 is the LoRA-Single of ``config``.

    Args:
        output_dir: ``member_<m>/`` is member m's merged checkpoint (``member_<m>.work/`` its run);
            members already written there are kept (a run continues member by member).
        lora: ``r``, ``alpha``, ``dropout``, ``target_modules``, ``modules_to_save`` of :func:`train_lora`.

    Returns:
        The M merged member folders, member 0 first.
    """
    if isinstance(members, bool) or not isinstance(members, int) or members < 1:
        raise HydraInputError(f"members must be a positive integer, got {members!r}")
    unknown = sorted(set(lora) - {"r", "alpha", "dropout", "target_modules", "modules_to_save"})
    if unknown:
        raise TypeError(f"train_lora_ensemble got unexpected arguments {unknown}")
    config = config or default_recipe(base_model_dir)
    out = Path(output_dir)
    # never deleted: the checkpoint (a GGUF's folder and cache too) and the data
    inputs = [*checkpoint_inputs(base_model_dir), *data_spec_paths(train_data), *data_spec_paths(validation_data)]
    prepare_owned_folder(out, command=COMMAND, overwrite=overwrite, inputs=inputs, keep=True)
    folders = []
    for m in range(members):
        folder = out / f"member_{m}"
        folders.append(folder)
        if _lora_done(folder, config, config.seed + m, lora):
            logger.info("LoRA member %d: already trained in %s", m, folder)
            continue
        train_lora(
            base_model_dir, train_data, validation_data, folder, config, seed=config.seed + m,
            work_dir=out / f"member_{m}.work", overwrite=True, id2label=id2label, **lora,
        )
    return folders


def _lora_done(folder: Path, config: FinetuneConfig, seed: int, lora: dict[str, Any]) -> bool:
    """Whether ``folder`` holds a finished LoRA run of these settings (then a LoRA-Ensemble keeps it)."""
    file = folder / LORA_INFO
    if not (folder / "config.json").is_file() or not file.is_file():
        return False
    try:
        info = json.loads(file.read_text())
    except ValueError:
        return False
    saved, now = info.get("config") or {}, config.to_dict()
    same_config = all(saved.get(k) == v for k, v in now.items() if k not in RESUME_FREE)
    params = inspect.signature(train_lora).parameters
    wanted = {k: lora.get(k, params[k].default) for k in ("r", "alpha", "dropout", "target_modules")}
    wanted["target_modules"] = list(wanted["target_modules"])
    if lora.get("modules_to_save") is not None:
        wanted["modules_to_save"] = list(lora["modules_to_save"])
    return same_config and info.get("seed") == seed and all(info.get(k) == v for k, v in wanted.items())
