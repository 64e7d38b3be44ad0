"""The training loop shared by every fine-tuning path (members, the fused model, the LoRA
baselines): :class:`MemberTrainer` trains one model whose outputs are ``member_logits (B, M, C)``,
with the run's optimizer, schedule, seeded data order, early stopping and checkpoint/resume."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from safetensors.torch import load_file
from torch import nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm
from transformers import get_scheduler

from ..data import make_image_loader, make_text_loader
from ..metrics.chance import chance_levels, near_chance
from ..modeling.hydra_attention import HydraSelfAttention
from ..modeling.hydra_formulas import ensemble_log_probs, log_mean_exp
from ..modeling.hydra_layers import HydraLayerNorm
from ..modeling.modeling_hydra_llama import HydraRMSNorm
from ..progress import progress_bars
from ..reproducibility import seed_worker
from .checkpoint import Checkpoints
from .run import FinetuneRun

logger = logging.getLogger(__package__)  # "hydra_hf.finetune", as log lines named it before the split


MIN_CHECKED_STEPS = 8
"""Runs shorter than this (or with fewer than two loss windows) get no learning check: too few batches to tell."""


class TrainingInterrupted(RuntimeError):
    """Raised by a ``step_callback`` to stop training (the last checkpoint stays for ``resume``)."""


def _decay_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Trainable parameters, split into those with weight decay and biases/LayerNorms without."""
    no_decay: set[int] = set()
    for module in model.modules():
        if isinstance(module, (nn.LayerNorm, HydraLayerNorm, HydraRMSNorm)):
            no_decay.update(id(p) for p in module.parameters(recurse=False))
    decay, plain = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (plain if id(param) in no_decay or name.endswith("bias") else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0}]


def member_cross_entropy(
    member_logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0
) -> torch.Tensor:
    """Mean over members of each member's mean cross-entropy.

    Shape: ``member_logits (B, M, C)``, ``labels (B,)``.
    """
    B, M, C = member_logits.shape
    return F.cross_entropy(
        member_logits.float().reshape(B * M, C), labels.repeat_interleave(M), label_smoothing=label_smoothing
    )


class _NextTokenCollator:
    """A causal LM's batch: the tokenized texts (dynamic padding, at most ``max_length`` tokens) and
    ``labels`` = the input ids with -100 at the padding, which the model shifts into next-token targets
    (picklable)."""

    def __init__(self, tokenizer: Any, max_length: int) -> None:
        self.tokenizer = tokenizer
        limit = getattr(tokenizer, "model_max_length", None)  # never longer than the model can take
        self.max_length = min(max_length, limit) if isinstance(limit, int) and limit > 0 else max_length

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        enc = self.tokenizer(
            [row["text"] for row in rows], truncation=True, max_length=self.max_length, padding="longest",
            return_tensors="pt",
        )
        batch = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
        batch["labels"] = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
        return batch


def member_next_token_nll(member_logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The members' mean next-token NLL summed over the batch's targets, and the number of targets
    (``labels`` -100 are not targets); their ratio is the Hydra causal LM's own ``loss``.

    Shape: ``member_logits (B, M, T, V)``, ``labels (B, T)`` -> two scalars.
    """
    M, V = member_logits.shape[1], member_logits.shape[-1]
    target = labels[:, 1:]  # (B, T-1)
    nll = F.cross_entropy(
        member_logits[:, :, :-1].float().reshape(-1, V), target[:, None].expand(-1, M, -1).reshape(-1),
        ignore_index=-100, reduction="sum",
    )
    return nll / M, (target != -100).sum()


def next_token_sums(
    member_logits: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per example: the members' mean next-token NLL summed over the targets, the ensemble's (log of the mean
    softmax) summed NLL, and the number of targets; ``labels`` -100 are not targets.

    Shape: ``member_logits (B, M, T, V)``, ``labels (B, T)`` -> three ``(B,)``.
    """
    logits = member_logits[:, :, :-1].float()  # (B, M, T-1, V)
    target = labels[:, 1:]  # (B, T-1)
    valid = target != -100
    safe = target.masked_fill(~valid, 0)
    log_p = F.log_softmax(logits, dim=-1)  # (B, M, T-1, V)
    member_nll = -log_p.gather(-1, safe[:, None, :, None].expand(-1, log_p.shape[1], -1, 1)).squeeze(-1)  # (B, M, T-1)
    mean_log_p = log_mean_exp(log_p, dim=1)  # (B, T-1, V): log of the members' mean softmax
    ensemble_nll = -mean_log_p.gather(-1, safe[..., None]).squeeze(-1)  # (B, T-1)
    mask = valid.float()
    return (member_nll.mean(1) * mask).sum(-1), (ensemble_nll * mask).sum(-1), mask.sum(-1)


class _ImageTransform:
    """PIL image -> ``(3, H, W)`` pixel values with a Hugging Face image processor (picklable)."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor

    def __call__(self, image) -> torch.Tensor:
        return self.processor(image, return_tensors="pt")["pixel_values"][0]


class _EpochOrder(torch.utils.data.Sampler):
    """Example order of epoch ``epoch``: a permutation seeded by ``(seed, epoch)``, cut to whole
    batches. Set ``epoch`` before iterating."""

    def __init__(self, num_examples: int, batch_size: int, seed: int) -> None:
        self.num_examples, self.seed, self.epoch = num_examples, seed, 0
        self.length = (num_examples // batch_size) * batch_size

    def __iter__(self):
        order = np.random.default_rng([self.seed, self.epoch]).permutation(self.num_examples)[: self.length]
        return iter(order.tolist())

    def __len__(self) -> int:
        return self.length


def _drop_key_bias_gradients(model: nn.Module) -> None:
    """Zero the gradient of every key bias (a hook on each ``qkv_bias``).

    A key bias adds ``q . b_k`` to all of a query's attention scores alike, which softmax ignores: its
    gradient is exactly zero, and what backpropagation returns is float noise. AdamW divides that noise
    by its own running magnitude and turns it into learning-rate-sized random steps, which differ with
    the summation order (one process vs several). Dropping it changes no output and makes N-process
    runs match one process on every weight.
    """
    for module in model.modules():
        if not isinstance(module, HydraSelfAttention) or not module.packed_qkv or module.qkv_bias.numel() == 0:
            continue
        if not module.qkv_bias.requires_grad:  # a family without biases (ModernBERT: zero buffers) or frozen
            continue
        dk = module.spec.head_dim
        keep = torch.ones(module.qkv_bias.shape, dtype=torch.bool)  # (3*K*dk,)
        start = 0
        for width in module.spec.widths:  # member-major blocks of [Q rows; K rows; V rows]
            keep[start + width * dk : start + 2 * width * dk] = False
            start += 3 * width * dk
        module.qkv_bias.register_hook(lambda grad, keep=keep: grad * keep.to(grad.device, grad.dtype))


class MemberTrainer:
    """Trains one Hydra model (one member or the fused M members) with early stopping and
    checkpoint/resume. The model's member-wise outputs define the loss and the metrics.

    Args:
        accelerator: the run's Accelerator (:func:`~hydra_hf.finetune.make_accelerator`).
        run: the prepared run (:func:`~hydra_hf.finetune.prepare_run`): settings, data, preprocessor.
        model: a model whose output has ``member_logits (B, M, C)``.
        folder: the model's folder in the work folder (its checkpoint and best weights).
        seed: the seed of the data order.
        tag: the model's name in the progress bar, the log and messages (``member 0``, ``fused``).
    """

    def __init__(
        self, accelerator: Accelerator, run: FinetuneRun, model: nn.Module, folder: Path, seed: int, tag: str
    ) -> None:
        self.accelerator = accelerator
        self.run = run
        self.config = run.config
        self.model = model
        self.folder = folder
        self.checkpoints = Checkpoints(accelerator, folder, tag, run.work_dir / "log.jsonl")
        self.seed = seed
        self.tag = tag
        world = accelerator.num_processes
        batches = len(run.train) // self.config.batch_size  # the last incomplete batch is dropped
        self.batches_per_epoch = batches
        self.steps_per_epoch = math.ceil(batches / self.config.gradient_accumulation_steps)
        total = self.config.num_epochs * self.steps_per_epoch
        self.total_steps = min(total, self.config.max_steps) if self.config.max_steps else total
        self.eval_batch_size = world * math.ceil(self.config.eval_batch_size / world)
        self.state: dict[str, Any] = {
            "epoch": 0, "batches_in_epoch": 0, "global_step": 0, "best_metric": None, "best_epoch": None,
            "bad_evaluations": 0, "done": False, "history": [],
            "epoch_loss": None,  # per process [sum of batch losses, batches] of the unfinished epoch
            # [step, mean batch loss of the log_every_steps steps up to it] of this process (the learning check);
            # a resumed run starts its current window afresh
            "loss_windows": [],
        }
        self.loss_sum = torch.zeros(2)  # this process's [sum of batch losses, batches] in this epoch
        self.window_sum = torch.zeros(2)  # the same since the last loss window

    # ------------------------------------------------------------------------------- loaders
    def data_loader(self, dataset, batch_size: int) -> DataLoader:
        """Batches of ``dataset`` in order, preprocessed for the run's model (tokenized text or pixel values)."""
        if self.run.arch.modality == "image":
            processor = self.run.processor
            return make_image_loader(dataset, _ImageTransform(processor), batch_size=batch_size)
        if self.run.causal_lm:
            collate = _NextTokenCollator(self.run.processor, self.config.max_length)
            return DataLoader(dataset, batch_size=batch_size, collate_fn=collate, worker_init_fn=seed_worker)
        return make_text_loader(dataset, self.run.processor, batch_size=batch_size, max_length=self.config.max_length)

    def _train_loader(self):
        """The training batches, prepared once: the order of epoch e is a permutation seeded by
        (seed, e) (``_EpochOrder``), whole batches only, so it is the same for any number of
        processes and after a resume."""
        text = self.data_loader(self.run.train, self.config.batch_size)  # data.py's tokenizing collator
        self.order = _EpochOrder(len(self.run.train), self.config.batch_size, self.seed)
        # Its own generator: a DataLoader without one draws its base seed from the global torch RNG
        # each time it is iterated, i.e. at the start of an epoch in a run but right after the RNG
        # restore in a resumed one, which would shift every later dropout mask by one draw.
        loader = DataLoader(
            self.run.train, batch_size=self.config.batch_size, sampler=self.order,
            drop_last=True, collate_fn=text.collate_fn, generator=torch.Generator().manual_seed(self.seed),
            worker_init_fn=seed_worker,
        )
        return self.accelerator.prepare(loader)

    # ---------------------------------------------------------------------------- optimizer
    def _optimizer(self) -> torch.optim.Optimizer:
        groups = _decay_groups(self.model, self.config.weight_decay)
        c = self.config
        if c.optimizer == "sgd":
            cls, kwargs = torch.optim.SGD, dict(lr=c.learning_rate, momentum=c.momentum)
        else:
            cls, kwargs = (
                torch.optim.AdamW,
                dict(lr=c.learning_rate, betas=(c.adam_beta1, c.adam_beta2), eps=c.adam_epsilon),
            )
        # the fused kernels make one pass over the weights instead of ~10 (3-4x faster steps on CPU)
        fused = self.accelerator.device.type in ("cpu", "cuda") and self.accelerator.mixed_precision != "fp16"
        return cls(groups, fused=fused or None, **kwargs)

    def _scheduler(self, optimizer):
        warmup = round(self.config.warmup_ratio * self.total_steps)
        name = {"linear": "linear", "cosine": "cosine", "constant": "constant_with_warmup"}[self.config.scheduler]
        return get_scheduler(name, optimizer, num_warmup_steps=warmup, num_training_steps=self.total_steps)

    # ---------------------------------------------------------------------------- evaluation
    def score(self, metrics: dict[str, Any]) -> float:
        """The early-stopping score of an evaluation (higher is better): a classifier's ensemble accuracy, a
        causal LM's negative ensemble next-token NLL."""
        return -metrics["nll"] if self.run.causal_lm else metrics["accuracy"]

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The training loss of a batch: the mean over members of each member's cross-entropy (a causal LM's:
        next-token, over the non-padding targets, which the model computes from ``labels``)."""
        if self.run.causal_lm:
            labels = batch.pop("labels")
            with self.accelerator.autocast():
                member_logits = self.model(**batch).member_logits  # (b, M, T, V)
            nll_sum, tokens = member_next_token_nll(member_logits, labels)
            # the mean over the global batch's target tokens: each process's sum over the tokens of all
            # processes (times the processes, as DDP averages the gradients), so N processes take the
            # steps of one even when their halves hold different numbers of tokens
            world = self.accelerator.num_processes
            total = self.accelerator.gather(tokens.reshape(1)).sum() if world > 1 else tokens
            return nll_sum * world / total.clamp(min=1)
        labels = batch.pop("labels")
        with self.accelerator.autocast():
            member_logits = self.model(**batch).member_logits  # (b, M, C)
        return member_cross_entropy(member_logits, labels, self.config.label_smoothing)

    @torch.no_grad()
    def evaluate_lm(self, loader) -> dict[str, Any]:
        """A causal LM: the ensemble's and the members' mean next-token NLL per target token, and the
        ensemble's perplexity, over the whole evaluation set."""
        self.model.eval()
        sums = []
        for batch in loader:
            labels = batch.pop("labels")
            with self.accelerator.autocast():
                member_logits = self.model(**batch).member_logits  # (b, M, T, V)
            per_example = torch.stack(next_token_sums(member_logits, labels), dim=-1)  # (b, 3)
            sums.append(self.accelerator.gather_for_metrics(per_example).cpu())
        self.model.train()
        member_nll, nll, tokens = torch.cat(sums).double().sum(0)
        return {
            "nll": float(nll / tokens),
            "member_nll": float(member_nll / tokens),
            "perplexity": float(torch.exp(nll / tokens)),
            "tokens": int(tokens),
            "examples": int(torch.cat(sums).shape[0]),
        }

    @torch.no_grad()
    def evaluate(self, loader) -> dict[str, Any]:
        """Ensemble and per-member accuracy and the ensemble NLL over the whole evaluation set."""
        if self.run.causal_lm:
            return self.evaluate_lm(loader)
        self.model.eval()
        all_logits, all_labels = [], []
        for batch in loader:
            labels = batch.pop("labels")
            with self.accelerator.autocast():
                member_logits = self.model(**batch).member_logits  # (b, M, C)
            member_logits, labels = self.accelerator.gather_for_metrics((member_logits.float(), labels))
            all_logits.append(member_logits.cpu())
            all_labels.append(labels.cpu())
        self.model.train()
        member_logits, labels = torch.cat(all_logits), torch.cat(all_labels)  # (N, M, C), (N,)
        log_probs = ensemble_log_probs(member_logits, dim=1)  # (N, C)
        member_acc = (member_logits.argmax(-1) == labels[:, None]).float().mean(0)  # (M,)
        return {
            "accuracy": float((log_probs.argmax(-1) == labels).float().mean()),
            "member_accuracy": [round(float(a), 6) for a in member_acc],
            "nll": float(F.nll_loss(log_probs, labels)),
            "examples": int(labels.numel()),
        }

    # ------------------------------------------------------------------------------- train
    def train(
        self, resume: bool, step_callback: Callable[[dict[str, Any]], None] | None, resume_partial: bool = False
    ) -> dict[str, Any]:
        acc, c = self.accelerator, self.config
        for name, param in self.model.named_parameters():
            if c.freeze_embeddings and name.startswith(self.run.arch.frozen_prefixes):
                param.requires_grad_(False)
            elif param.numel() == 0:
                # A layer where the model keeps no head has empty Q/K/V/O projections (0 rows) that the
                # forward pass skips. They hold nothing to train, and DDP would wait for their gradients
                # forever ("Parameter indices which did not receive grad"): not trainable, at no cost.
                param.requires_grad_(False)
        _drop_key_bias_gradients(self.model)
        optimizer = self._optimizer()
        scheduler = self._scheduler(optimizer)
        self.model, optimizer, scheduler = acc.prepare(self.model, optimizer, scheduler)
        eval_loader = (
            acc.prepare(self.data_loader(self.run.eval, self.eval_batch_size)) if self.run.eval is not None else None
        )
        if resume:
            state = self.checkpoints.resume(self.model, resume_partial)
            if state is not None:
                self.state = state
        if acc.is_main_process:
            self.folder.mkdir(parents=True, exist_ok=True)
        s = self.state
        s.setdefault("loss_windows", [])  # a checkpoint written before the learning check had none
        self.window_sum = torch.zeros(2, device=acc.device)
        progress = tqdm(
            total=self.total_steps, initial=s["global_step"], desc=self.tag,
            disable=not (progress_bars() and acc.is_local_main_process),
            dynamic_ncols=True,
        )
        train_loader = self._train_loader()
        self.model.train()
        with logging_redirect_tqdm():  # epoch log lines go above the progress bar
            while not s["done"]:
                self.order.epoch = s["epoch"]
                skip = s["batches_in_epoch"]
                loader = acc.skip_first_batches(train_loader, skip) if skip else train_loader
                # (sum of batch losses, batches) of this process in this epoch, as far as the checkpoint got
                self.loss_sum = (self.checkpoints.resumed_loss_sum(self.state) if skip else torch.zeros(2)).to(
                    acc.device
                )
                hit_max = False
                for batch in loader:
                    with acc.accumulate(self.model):
                        loss = self.loss(batch)
                        acc.backward(loss)
                        if acc.sync_gradients and c.max_grad_norm is not None:
                            acc.clip_grad_norm_(self.model.parameters(), c.max_grad_norm)
                        optimizer.step()
                        scheduler.step()
                        optimizer.zero_grad()
                    s["batches_in_epoch"] += 1
                    batch_loss = torch.stack([loss.detach().float(), torch.ones((), device=acc.device)])
                    self.loss_sum += batch_loss
                    self.window_sum += batch_loss
                    if not acc.sync_gradients:
                        continue
                    s["global_step"] += 1
                    progress.update(1)
                    if s["global_step"] % c.log_every_steps == 0:
                        mean = float(self.loss_sum[0] / self.loss_sum[1])
                        progress.set_postfix(loss=f"{mean:.4f}", lr=f"{scheduler.get_last_lr()[0]:.2e}")
                        window = float(self.window_sum[0] / self.window_sum[1])
                        s["loss_windows"].append([s["global_step"], round(window, 6)])
                        self.window_sum.zero_()
                    hit_max = c.max_steps is not None and s["global_step"] >= c.max_steps
                    mid_epoch = s["batches_in_epoch"] < self.batches_per_epoch  # an epoch end saves anyway
                    if c.save_every_steps and s["global_step"] % c.save_every_steps == 0 and mid_epoch and not hit_max:
                        self.checkpoints.save(self.state, self.loss_sum)
                    if step_callback is not None:
                        step_callback(
                            {
                                "tag": self.tag,
                                "epoch": s["epoch"],
                                "step": s["global_step"],
                                "loss": float(loss.detach()),
                            }
                        )
                    if hit_max:
                        break
                self._end_epoch(eval_loader, hit_max)
        progress.close()
        if acc.is_main_process:
            problem = self.learning_problem()
            if problem:
                logger.warning("%s", problem)
        return s

    def learning_problem(self) -> str | None:
        """One line when this classifier barely learned, with the likely cause; None when it learned (or is a
        causal LM, or the run is too short to tell).

        It barely learned when its last loss window (``log_every_steps`` steps) stays near the loss of
        predicting the training data's class frequencies, or its best validation accuracy stays near the
        validation data's majority rate (:func:`hydra_hf.metrics.near_chance`). The likely cause: a loss that
        rose more than 4 % above its first window on the way (a step too large), a loss that fell less than 5 %
        (a step too small for so few steps), else the labels or the data.
        """
        windows = self.state.get("loss_windows") or []
        if self.run.causal_lm or len(windows) < 2 or self.state["global_step"] < MIN_CHECKED_STEPS:
            return None  # a causal LM has no classes; a handful of batches is too noisy to tell
        c, s = self.config, self.state
        train_levels = chance_levels(self.run.train["label"], self.run.num_labels)
        first, last = windows[0][1], windows[-1][1]
        problems = []
        stuck = near_chance(train_levels, nll=last)
        if stuck:
            problems.append(f"training loss {last:.4f} after {windows[-1][0]} steps (first {windows[0][0]}: "
                            f"{first:.4f}) stayed near {train_levels['chance_nll']:.4f}, the loss of predicting the "
                            "class frequencies")
        if self.run.eval is not None and s.get("best_metric") is not None:
            eval_levels = chance_levels(self.run.eval["label"], self.run.num_labels)
            weak = near_chance(eval_levels, accuracy=s["best_metric"])
            if weak:
                problems.append(f"best validation {weak}")
        if not problems:
            return None
        steps = f"{s['global_step']} steps"
        peak = max(loss for _, loss in windows)
        if peak > first * 1.04:  # the loss rose above where it started: steps too large for the model
            cause = (f"the learning rate {c.learning_rate:g} is likely too large (the loss rose to {peak:.4f} from "
                     f"{first:.4f}): lower --learning-rate")
        elif last > first * 0.95:
            cause = (f"the learning rate {c.learning_rate:g} is likely too small for {steps}: raise --learning-rate, "
                     "train longer, or start from a recipe made for short runs (--recipe demo-single trains the "
                     "README's Single at 1e-4 for 180 steps)")
        else:
            cause = "the loss fell but not far: check the labels (--label-column) and the data, then the learning rate"
        return f"{self.tag} barely learned: {'; '.join(problems)}; {cause}"

    def _end_epoch(self, eval_loader, hit_max: bool) -> None:
        acc, c, s = self.accelerator, self.config, self.state
        total = acc.gather(self.loss_sum.unsqueeze(0)).sum(0)  # over processes
        self.loss_sum = torch.zeros(2, device=acc.device)
        record: dict[str, Any] = {
            "tag": self.tag, "epoch": s["epoch"] + 1, "step": s["global_step"],
            "train_loss": round(float(total[0] / total[1]), 6) if total[1] > 0 else None,
        }
        if eval_loader is not None:
            metrics = self.evaluate(eval_loader)
            record.update({f"eval_{k}": v for k, v in metrics.items()})
            score = self.score(metrics)
            if s["best_metric"] is None or score > s["best_metric"]:
                s["best_metric"], s["best_epoch"], s["bad_evaluations"] = score, s["epoch"] + 1, 0
                self.checkpoints.save_best(self.model, s["best_epoch"])
            else:
                s["bad_evaluations"] += 1
        s["history"].append(record)
        s["epoch"] += 1
        s["batches_in_epoch"] = 0
        stop = (
            c.early_stopping_patience is not None
            and eval_loader is not None
            and s["bad_evaluations"] >= c.early_stopping_patience
        )
        s["done"] = bool(hit_max or stop or s["epoch"] >= c.num_epochs)
        if acc.is_main_process:
            line = (
                f"{self.tag} epoch {record['epoch']}/{c.num_epochs} step {record['step']}: "
                f"train loss {record['train_loss']}"
            )
            best, best_epoch = s["best_metric"], s["best_epoch"]
            if "eval_accuracy" in record:
                line += f", eval accuracy {record['eval_accuracy']:.4f} (best {best:.4f} at epoch {best_epoch})"
            elif "eval_nll" in record:
                line += f", eval next-token NLL {record['eval_nll']:.4f} (best {-best:.4f} at epoch {best_epoch})"
            if stop:
                line += f"; early stop ({s['bad_evaluations']} evaluations without improvement)"
            logger.info(line)
            with open(self.run.work_dir / "log.jsonl", "a") as f:  # a resume drops lines after its checkpoint
                f.write(json.dumps(record) + "\n")
        self.checkpoints.save(self.state, self.loss_sum)

    def final_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights to export: the best evaluated ones, or the last ones without evaluation data."""
        if self.checkpoints.best_file.is_file():
            return load_file(str(self.checkpoints.best_file))
        return {k: v.detach().float().cpu() for k, v in self.accelerator.unwrap_model(self.model).state_dict().items()}
