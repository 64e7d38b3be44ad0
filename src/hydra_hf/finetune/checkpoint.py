"""Checkpoint and resume: the work folder a run claims (:func:`claim_work_dir`) and, per trained model,
its ``checkpoint/`` and best weights (:class:`Checkpoints`), saved so that a kill at any moment
leaves a complete checkpoint and a resumed run ends as an uninterrupted one would."""

from __future__ import annotations

import json
import logging
import os
import shutil
import zipfile
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import load as accelerate_load
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

from ..errors import HydraInputError, HydraOutputError, one_line
from ..outputs import prepare_owned_folder, remove_stale_temporaries, write_output_file
from .config import COMMAND, RESUME_FREE
from .run import FinetuneRun

logger = logging.getLogger(__package__)  # "hydra_hf.finetune", as log lines named it before the split

CONFIG_FILE = "finetune_config.json"
STATE_FILE = "trainer_state.json"
RNG_FILE = "random_states_{rank}.pkl"  # accelerate's per-process RNG states in a checkpoint


# ------------------------------------------------------------------------------------ work folder
def _prepare_work_dir(run: FinetuneRun, *, keep: bool) -> None:
    """Main process, before any training: claim the work folder (see :func:`outputs.prepare_owned_folder`)
    and remove what killed runs left in it and beside the output.

    ``keep`` (``--resume``, or launches sharing the folder with ``members``) continues a folder an earlier
    ``hydra-hf finetune`` created; ``run.overwrite`` empties such a folder. A non-empty folder without
    our marker (an unrelated folder, the base model, ...) is never used, let alone deleted.
    """
    prepare_owned_folder(
        run.work_dir, command=COMMAND, overwrite=run.overwrite, inputs=[*run.inputs, run.output_dir], keep=keep
    )
    remove_stale_temporaries(run.output_dir)
    for folder in sorted(run.work_dir.glob("member_*")) + [run.work_dir / "fused"]:
        if folder.is_dir() and not folder.is_symlink():
            remove_stale_temporaries(folder / "model")


def _check_work_dir(run: FinetuneRun, names: list[str], resume: bool, is_main: bool) -> None:
    """The work folder may be shared by several launches (``members=``) and by ``--resume``; starting
    a member that already has state there without ``resume`` is an error, as is a changed config."""
    saved_file = run.work_dir / CONFIG_FILE
    if saved_file.is_file():
        try:
            saved = json.loads(saved_file.read_text())
            if not isinstance(saved, dict):
                raise ValueError("not a mapping")
        except ValueError as exc:
            raise HydraInputError(
                f"{str(saved_file)!r} is damaged ({exc}); start over with --overwrite or use another --work-dir"
            ) from None
        now = run.config.to_dict()
        diff = {k: (saved.get(k), v) for k, v in now.items() if k not in RESUME_FREE and saved.get(k) != v}
        if diff:
            raise HydraInputError(
                f"the work folder {str(run.work_dir)!r} holds a run with other settings {diff} (saved, now); "
                "use the same settings, another --work-dir, or --overwrite"
            )
    if not resume:
        started = [n for n in names if (run.work_dir / n).exists()]
        if started:
            raise HydraOutputError(
                f"the work folder {str(run.work_dir)!r} already holds {started}; pass --resume to continue that run, "
                "or --overwrite / another --work-dir to start over"
            )
    if is_main and not saved_file.is_file():
        write_output_file(saved_file, json.dumps(run.config.to_dict(), indent=2, sort_keys=True) + "\n")


def check_resume_flags(resume: bool, resume_partial: bool, overwrite: bool) -> bool:
    """``resume`` as meant by the flags (``resume_partial`` implies it); contradictions are errors."""
    resume = bool(resume or resume_partial)
    if resume and overwrite:
        raise HydraInputError(
            "--resume continues the run in the work folder and --overwrite starts it afresh; pass one"
        )
    return resume


def claim_work_dir(
    accelerator: Accelerator, run: FinetuneRun, names: list[str], *, resume: bool, shared: bool
) -> None:
    """Claim and check the work folder on every process (the main process writes).

    Args:
        names: the folders this launch trains in ``run.work_dir`` (``member_<m>``, ``fused``, ...).
        resume: continue what those folders hold; without it, a folder that exists is an error.
        shared: other launches train other members in the same work folder (``members=``).
    """
    if accelerator.is_main_process:
        _prepare_work_dir(run, keep=resume or (shared and not run.overwrite))
    accelerator.wait_for_everyone()
    _check_work_dir(run, names, resume, accelerator.is_main_process)
    accelerator.wait_for_everyone()


# ------------------------------------------------------------------------------------ checkpoints
def _best_epoch(file: Path) -> int | None:
    """The epoch recorded in a ``best*.safetensors`` file (None if unreadable)."""
    try:
        with safe_open(str(file), framework="pt") as f:
            return int((f.metadata() or {})["best_epoch"])
    except Exception:  # noqa: BLE001 - unreadable, or written by an older version: not a usable best
        return None


def _damaged_file(folder: Path) -> Path | None:
    """The first file of an accelerate checkpoint that does not parse (safetensors header and size,
    or the zip directory and CRCs of a ``torch.save`` file); None if all do."""
    for file in sorted(folder.iterdir()):
        try:
            if file.suffix == ".safetensors":
                with safe_open(str(file), framework="pt") as f:
                    list(f.keys())
            elif file.suffix in (".bin", ".pkl"):
                with zipfile.ZipFile(file) as archive:
                    if archive.testzip() is not None:
                        return file
        except Exception:  # noqa: BLE001 - any parse failure marks the file
            return file
    return None


class Checkpoints:
    """The checkpoint and the best weights of one trained model, in its ``folder`` of the work folder
    (``member_<m>/``, ``fused/``): ``checkpoint/`` (accelerate state + ``trainer_state.json``),
    ``best.safetensors``, and ``best.next.safetensors`` (a new best, committed with the next checkpoint).

    Args:
        accelerator: the run's Accelerator (every process calls every method; the main process writes).
        folder: the model's folder in the work folder.
        tag: the model's name in messages and in ``log.jsonl`` (``member 0``, ``fused``).
        log_file: the run's ``log.jsonl``.
    """

    def __init__(self, accelerator: Accelerator, folder: Path, tag: str, log_file: Path) -> None:
        self.accelerator = accelerator
        self.folder = folder
        self.tag = tag
        self.log_file = log_file
        self.checkpoint = folder / "checkpoint"
        self.best_file = folder / "best.safetensors"
        self.best_next = folder / "best.next.safetensors"  # a new best, committed with the next checkpoint

    def save(self, state: dict[str, Any], loss_sum: torch.Tensor) -> None:
        """Accelerate state + trainer state into ``checkpoint/``, replacing the previous one only once
        the new one is complete (a kill while saving keeps the previous checkpoint, or the new complete
        one: :meth:`recover` finishes the swap). A new best (``best.next``) is committed with it.

        ``state`` is the trainer state; its ``epoch_loss`` is set here from every process's
        ``loss_sum`` (this process's ``[sum of batch losses, batches]`` in the unfinished epoch).
        """
        acc = self.accelerator
        tmp, old = self.folder / "checkpoint.tmp", self.folder / "checkpoint.old"
        per_process = acc.gather(loss_sum.to(acc.device).unsqueeze(0)).cpu()  # (processes, 2)
        state["epoch_loss"] = per_process.tolist() if state["batches_in_epoch"] else None
        if acc.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        acc.wait_for_everyone()
        acc.save_state(str(tmp))
        acc.wait_for_everyone()
        if acc.is_main_process:
            # written last and atomically: a checkpoint folder holding it is complete
            write_output_file(tmp / STATE_FILE, json.dumps(state, indent=1) + "\n")
            shutil.rmtree(old, ignore_errors=True)
            if self.checkpoint.exists():
                os.replace(self.checkpoint, old)
            os.replace(tmp, self.checkpoint)
            shutil.rmtree(old, ignore_errors=True)
            if self.best_next.is_file():
                os.replace(self.best_next, self.best_file)
        acc.wait_for_everyone()

    def recover(self) -> None:
        """Main process: undo what a kill during :meth:`save` or :meth:`save_best` left."""
        tmp, old = self.folder / "checkpoint.tmp", self.folder / "checkpoint.old"
        if not self.checkpoint.exists():  # killed between the two renames: the newest complete one wins
            for candidate in (tmp, old):
                if (candidate / STATE_FILE).is_file():
                    os.replace(candidate, self.checkpoint)
                    break
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
        self.best_next.with_name(self.best_next.name + ".tmp").unlink(missing_ok=True)
        if self.best_next.is_file():  # the best of an epoch whose checkpoint was, or was not, written
            saved = self.read_state() if (self.checkpoint / STATE_FILE).is_file() else {}
            if saved.get("best_epoch") is not None and saved.get("best_epoch") == _best_epoch(self.best_next):
                os.replace(self.best_next, self.best_file)
            else:
                self.best_next.unlink()

    def read_state(self) -> dict[str, Any]:
        """The trainer state of ``checkpoint/`` (a damaged or incomplete one is an error)."""
        file = self.checkpoint / STATE_FILE
        try:
            state = json.loads(file.read_text())
            if not isinstance(state, dict) or not {"epoch", "batches_in_epoch", "global_step"} <= set(state):
                raise ValueError("not a trainer state")
        except (OSError, ValueError) as exc:
            raise self.damaged(file, exc) from None
        return state

    def damaged(self, file: Path, exc: BaseException) -> HydraInputError:
        """The error for a checkpoint ``file`` that ``exc`` showed damaged, saying how to go on."""
        return HydraInputError(
            f"{self.tag}: the resume checkpoint file {str(file)!r} is damaged "
            f"({type(exc).__name__}: {one_line(exc)}); "
            f"delete {str(self.checkpoint)!r} and pass --resume-partial to retrain this member from its first step, "
            "or start the run over with --overwrite"
        )

    def resume(self, model: nn.Module, partial: bool) -> dict[str, Any] | None:
        """Continue from ``checkpoint/`` exactly: weights, optimizer, scheduler, trainer state and each
        process's RNG states of that step. A checkpoint without RNG states (or a member whose progress
        has no trainer state) is an error unless ``partial``; see ``docs/finetune.md``.

        Args:
            model: the prepared model whose weights (with its optimizer and scheduler) are restored.

        Returns:
            The trainer state of the checkpoint, or ``None`` when training starts from its first step.
        """
        acc = self.accelerator
        if acc.is_main_process:
            self.recover()
        acc.wait_for_everyone()
        state_file = self.checkpoint / STATE_FILE
        if not state_file.is_file():
            if not (self.checkpoint.exists() or self.best_file.is_file()):
                return None  # killed before its first checkpoint: nothing was saved, start from step 0
            if not partial:
                raise HydraInputError(
                    f"{self.tag}: {str(state_file)!r} is missing, so this member's progress cannot be resumed; "
                    "pass --resume-partial to retrain it from its first step, or --overwrite to start the run over"
                )
            logger.warning(
                "%s: %s is missing; --resume-partial: retraining this member from its first step", self.tag, state_file
            )
            if acc.is_main_process:
                shutil.rmtree(self.checkpoint, ignore_errors=True)
                self.best_file.unlink(missing_ok=True)
                self.trim_log(finished_epochs=0)
            acc.wait_for_everyone()
            return None
        state = self.read_state()
        rng_files = [self.checkpoint / RNG_FILE.format(rank=r) for r in range(acc.num_processes)]
        missing = [f.name for f in rng_files if not f.is_file()]
        if missing and not partial:
            raise HydraInputError(
                f"{self.tag}: the checkpoint {str(self.checkpoint)!r} has no {missing[0]} (random states), so the "
                "dropout masks after it would differ from the interrupted run; pass --resume-partial to go on "
                "without them (the result then differs from an uninterrupted run), or --overwrite to start over"
            )
        rng = None
        if not missing:
            try:  # accelerate's load_state skips unreadable RNG states silently: read them here first
                rng = accelerate_load(rng_files[acc.process_index])
            except Exception as exc:  # noqa: BLE001 - any failure to unpickle means a damaged file
                raise self.damaged(rng_files[acc.process_index], exc) from None
        self.check_weights(model)
        try:
            # strict=False: accelerate's safetensors writer keeps only one of several empty tensors (a
            # layer without heads has three), so the others are absent from the file; that nothing else
            # is missing or unexpected was checked above
            acc.load_state(str(self.checkpoint), strict=False)
        except (SafetensorError, OSError, RuntimeError, ValueError, KeyError, EOFError) as exc:
            raise self.damaged(_damaged_file(self.checkpoint) or self.checkpoint, exc) from None
        if rng is not None and not torch.equal(torch.get_rng_state(), rng["torch_manual_seed"]):
            raise self.damaged(rng_files[acc.process_index], RuntimeError("the RNG state was not restored"))
        if missing:
            logger.warning(
                "%s: --resume-partial: resuming at step %d without %s; dropout masks from here on differ from an "
                "uninterrupted run", self.tag, state["global_step"], ", ".join(missing),
            )
        if acc.is_main_process:
            self.trim_log(finished_epochs=state["epoch"])
            logger.info(
                "%s: resuming after epoch %d, %d batches into the next (step %d)",
                self.tag, state["epoch"], state["batches_in_epoch"], state["global_step"],
            )
        return state

    def check_weights(self, model: nn.Module) -> None:
        """The checkpoint's weights are ``model``'s: every non-empty tensor present, nothing unknown."""
        file = self.checkpoint / "model.safetensors"
        try:
            with safe_open(str(file), framework="pt") as f:
                saved = set(f.keys())
        except Exception as exc:  # noqa: BLE001 - a missing or unparsable file: damaged
            raise self.damaged(file, exc) from None
        expected = self.accelerator.unwrap_model(model).state_dict()
        wrong = sorted(k for k, v in expected.items() if v.numel() and k not in saved) + sorted(saved - set(expected))
        if wrong:
            raise self.damaged(file, KeyError(f"{len(wrong)} tensors missing or unexpected, e.g. {wrong[0]!r}"))

    def trim_log(self, finished_epochs: int) -> None:
        """Drop this model's ``log.jsonl`` lines of epochs after the checkpoint (and a line a kill cut
        short): the resumed run writes them again."""
        log = self.log_file
        if not log.is_file():
            return
        kept = []
        for line in log.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("tag") == self.tag and record.get("epoch", 0) > finished_epochs:
                continue
            kept.append(line)
        write_output_file(log, "".join(x + "\n" for x in kept))

    def resumed_loss_sum(self, state: dict[str, Any]) -> torch.Tensor:
        """This process's loss sums of the epoch the checkpoint of ``state`` interrupted (as the
        interrupted run had them)."""
        saved = state.get("epoch_loss")
        acc = self.accelerator
        if not saved or not state["batches_in_epoch"]:
            return torch.zeros(2)
        if len(saved) == acc.num_processes:
            return torch.tensor(saved[acc.process_index], dtype=torch.float32)
        total = torch.tensor(saved, dtype=torch.float32).sum(0)  # another number of processes: one holds it all
        return total if acc.is_main_process else torch.zeros(2)

    def save_best(self, model: nn.Module, best_epoch: int) -> None:
        """Write ``model``'s current weights as the new best (of epoch ``best_epoch``); :meth:`save`
        commits them."""
        if self.accelerator.is_main_process:
            state = self.accelerator.unwrap_model(model).state_dict()
            tmp = self.best_next.with_name(self.best_next.name + ".tmp")
            tensors, seen = {}, set()
            for k, v in state.items():  # a tied head (a causal LM's lm_head = its embeddings) is saved as a copy
                t = v.detach().float().cpu().contiguous()
                tensors[k] = t.clone() if t.data_ptr() in seen else t
                seen.add(t.data_ptr())
            save_file(
                tensors, str(tmp),
                metadata={"best_epoch": str(best_epoch)},
            )
            os.replace(tmp, self.best_next)
        self.accelerator.wait_for_everyone()
