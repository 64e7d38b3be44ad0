"""Predictors: every baseline of the paper wrapped alike, its predictions on a data set, and latency.

Every model is wrapped in a :class:`Predictor` that returns *member logits* ``(B, M, C)``: M = 1 for
a single model, M members for a Hydra Ensemble, M dropout samples for MC Dropout, M classifier heads
for Deep Ensembles (D). The ensemble prediction is always the mean of the members' softmaxes, so all
baselines go through the same metric code.

Baselines (paper, Section 5):
- **Single**: the fine-tuned base model (:class:`ModelPredictor`).
- **Deep Ensembles (D)**: the fine-tuned backbone shared by M classifier heads trained from
  different seeds on its frozen features — the paper's text variant (:func:`train_ensemble_heads`,
  :class:`HeadsEnsemblePredictor`).
- **Deep Ensembles** (the paper's downstream variant) and **LoRA-Ensembles**: M separate models
  fine-tuned from the same checkpoint with seeds ``seed + m`` (:mod:`hydra_hf.finetune.baselines`), run one
  after another (:class:`EnsemblePredictor`).
- **MC Dropout**: the single model with dropout on at test time, M samples (:class:`MCDropoutPredictor`).
- **Temperature scaling**: any predictor with its logits divided by a temperature fitted on a
  validation split (:func:`fit_temperature`, :class:`TemperatureScaledPredictor`).
- Single pruned models and Hydra Ensembles are model folders: :class:`ModelPredictor`.
"""
from __future__ import annotations

import abc
import contextlib
import contextvars
import functools
import hashlib
import logging
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from .. import distributed, metrics
from ..cost import relative_cost
from ..data import zero_shot_prompts
from ..modeling.hydra_formulas import log_mean_exp
from ..progress import progress_bars

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------ predictors
def _model_inputs(batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in batch.items() if k != "labels"}


class Predictor(nn.Module, metaclass=abc.ABCMeta):
    """A model seen as M members: ``forward(batch) -> member_logits (B, M, C)``."""

    @abc.abstractmethod
    def member_logits(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``(B, M, C)`` logits of every member for one batch of model inputs."""

    def forward(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return self.member_logits(batch)

    def begin_pass(self, first_batch: int, total_batches: int) -> None:
        """Called by :func:`predict` before a pass over a data set whose batches ``first_batch`` ... are
        the ones this process predicts (out of ``total_batches``); stochastic predictors seed from it."""

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def compute_ratio(self) -> float | None:
        """Multiply-adds of one prediction relative to the Single's (:mod:`hydra_hf.cost`), None if unknown."""
        return None


def model_compute_ratio(model: nn.Module) -> float:
    """A model's multiply-adds relative to its Single: 1 for a stock model, from the masks for a Hydra."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "num_members") or not hasattr(config, "_pruned_towers"):
        return 1.0
    return relative_cost(config)["macs_ratio"]


# (model, inputs) -> member logits, while :func:`reuse_forwards` is active; None otherwise
_FORWARDS: contextvars.ContextVar[dict | None] = contextvars.ContextVar("hydra_hf_forwards", default=None)


@contextlib.contextmanager
def reuse_forwards():
    """Within the block, a :class:`ModelPredictor` whose model (in eval mode) already ran on the same
    inputs returns the stored logits instead of running it again.

    Several rows of a report wrap the same model (Single, Single + temperature scaling, member 0 of
    the Deep Ensemble), so each of its forward passes over a data set runs once. The outputs are
    bit-identical to running it again (inference is deterministic); latency is measured outside.
    """
    token = _FORWARDS.set({})
    try:
        yield
    finally:
        _FORWARDS.reset(token)


def _inputs_key(model: nn.Module, inputs: Mapping[str, Any]) -> tuple | None:
    """``(id(model), digest of the inputs)``, or None for inputs that are not all tensors."""
    digest = hashlib.blake2b(digest_size=32)
    for k in sorted(inputs):
        v = inputs[k]
        if not isinstance(v, torch.Tensor):
            return None  # not a plain tensor batch: do not reuse
        t = v.detach().cpu().contiguous()
        digest.update(f"{k}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return (id(model), digest.digest())


class ModelPredictor(Predictor):
    """A classifier: its ``member_logits`` output when it has one (Hydra), else ``logits`` as M = 1."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model.eval()

    def member_logits(self, batch):
        inputs = _model_inputs(batch)
        store = _FORWARDS.get()
        key = _inputs_key(self.model, inputs) if store is not None and not self.model.training else None
        if key is not None and key in store:
            return store[key][1]
        out = self.model(**inputs)
        member = getattr(out, "member_logits", None)
        logits = member if member is not None else out.logits.unsqueeze(1)  # (B, M, C)
        if key is not None:
            store[key] = (self.model, logits.detach())  # the model is held, so its id stays unique
        return logits

    def compute_ratio(self) -> float | None:
        return model_compute_ratio(self.model)

    def num_parameters(self) -> int:
        count = super().num_parameters()
        if count == 0 and callable(getattr(self.model, "num_parameters", None)):
            return int(self.model.num_parameters())  # a runtime model (ONNX) holds no torch parameters
        return count


class MCDropoutPredictor(Predictor):
    """MC Dropout: ``samples`` forward passes with the model's dropout layers active.

    Only ``nn.Dropout`` modules are switched to training mode (LayerNorm/BatchNorm stay in eval), and
    the masks of a batch are drawn after seeding with ``seed`` + the batch's position in the sequence
    of all batches predicted so far, so a run is reproducible -- and the same when the data is split
    across processes (each process starts at its first batch's position, see :meth:`begin_pass`).
    """

    def __init__(self, model: nn.Module, samples: int = 10, seed: int = 0) -> None:
        super().__init__()
        if samples < 2:
            raise ValueError(f"MC Dropout needs at least 2 samples, got samples={samples}")
        self.model = model.eval()
        self.samples = samples
        self.seed = seed
        self._calls = 0  # position of the next batch among all batches predicted so far
        self._next_pass = 0  # where the next pass over a data set starts
        self._dropouts = [m for m in model.modules() if isinstance(m, nn.Dropout)]
        if not any(m.p > 0 for m in self._dropouts):
            raise ValueError("MC Dropout needs a model with dropout (p > 0); this model has none")

    def begin_pass(self, first_batch: int, total_batches: int) -> None:
        self._calls = self._next_pass + first_batch
        self._next_pass += total_batches

    def compute_ratio(self) -> float | None:
        return self.samples * model_compute_ratio(self.model)

    def member_logits(self, batch):
        for m in self._dropouts:
            m.train()
        state = torch.random.get_rng_state()
        try:
            torch.manual_seed(self.seed + self._calls)
            self._calls += 1
            outs = [self.model(**_model_inputs(batch)).logits for _ in range(self.samples)]
        finally:
            torch.random.set_rng_state(state)
            for m in self._dropouts:
                m.eval()
        return torch.stack(outs, dim=1)  # (B, samples, C)


def classifier_layer(model: nn.Module) -> nn.Linear:
    """The ``nn.Linear`` that gives a stock classifier its logits: its one linear layer with ``num_labels``
    outputs (BERT's ``classifier``, RoBERTa's ``classifier.out_proj``, Llama's ``score`` ...)."""
    num_labels = getattr(getattr(model, "config", None), "num_labels", None)
    found = [m for m in model.modules() if isinstance(m, nn.Linear) and m.out_features == num_labels]
    if len(found) != 1:
        raise ValueError(
            f"Deep Ensembles (D) trains new classifier heads on a stock classifier's features, but "
            f"{type(model).__name__} has {len(found)} linear layers with its {num_labels} classes; give a single "
            "fine-tuned classifier with one classification layer"
        )
    return found[0]


def pooled_features(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``(B, d)`` the features a stock classifier feeds its classification layer (:func:`classifier_layer`):
    BERT's pooled ``[CLS]`` output, ViT's ``[CLS]`` token after the final LayerNorm, RoBERTa's dense + tanh
    output ... A decoder (Llama, GPT-2) scores every token and keeps its last non-padding one: so are its
    features pooled."""
    layer = classifier_layer(model)
    captured: list[torch.Tensor] = []
    handle = layer.register_forward_hook(lambda module, args, output: captured.append(args[0]))
    try:
        model(**_model_inputs(batch))
    finally:
        handle.remove()
    features = captured[-1]
    if features.dim() == 3:  # (B, T, d): every token scored, the last non-padding one kept
        input_ids = batch["input_ids"]
        pad = model.config.pad_token_id
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        last = -1 if pad is None else ((input_ids != pad).long() * positions).argmax(-1)
        features = features[torch.arange(features.shape[0], device=features.device), last]
    return features


class HeadsEnsemblePredictor(Predictor):
    """Deep Ensembles (D): one shared backbone, M linear classifier heads ``(d -> C)``."""

    def __init__(self, model: nn.Module, heads: nn.ModuleList) -> None:
        super().__init__()
        self.model = model.eval()
        self.heads = heads.eval()

    def member_logits(self, batch):
        feats = pooled_features(self.model, batch)  # (B, d)
        return torch.stack([head(feats) for head in self.heads], dim=1)  # (B, M, C)


class EnsemblePredictor(Predictor):
    """An ensemble of separate models, deployed as such: every batch runs through the M models one
    after another, and their logits are stacked as the members of one prediction.

    This is how Deep Ensembles (M full models fine-tuned from the same checkpoint with different
    seeds) and LoRA-Ensembles are evaluated: the ensemble's probabilities are the mean of the members'
    softmaxes, mutual information and disagreement come from the members, as for a Hydra Ensemble.
    Parameters are the members' sum, and the latency measured on :meth:`member_logits` is the
    sequential run of all members.

    Args:
        members: models (wrapped in :class:`ModelPredictor`) or predictors; a predictor with several
            members (an MC Dropout model) contributes all of them.

    Shape:
        member_logits: ``(B, sum of the members' M, C)``; ``(B, M, C)`` for M single models.
    """

    def __init__(self, members: Sequence[nn.Module]) -> None:
        super().__init__()
        listed = isinstance(members, nn.ModuleList) or (isinstance(members, Sequence) and not isinstance(members, str))
        if not listed:
            raise TypeError(f"members must be a list of models or predictors, got {type(members).__name__}")
        members = list(members)
        if not members:
            raise ValueError("an ensemble needs at least one member model; got an empty list")
        bad = [type(m).__name__ for m in members if not isinstance(m, nn.Module)]
        if bad:
            raise TypeError(f"every member must be a torch model or a Predictor, got {bad[0]}")
        self.members = nn.ModuleList(m if isinstance(m, Predictor) else ModelPredictor(m) for m in members)

    def begin_pass(self, first_batch: int, total_batches: int) -> None:
        for member in self.members:
            member.begin_pass(first_batch, total_batches)

    def member_logits(self, batch):
        outs = [member.member_logits(batch) for member in self.members]  # M x (B, M_i, C), one model after another
        classes = {out.shape[-1] for out in outs}
        if len(classes) != 1:
            raise ValueError(f"the ensemble's members predict different numbers of classes {sorted(classes)}")
        return torch.cat(outs, dim=1)  # (B, M, C)

    def num_parameters(self) -> int:
        return sum(member.num_parameters() for member in self.members)

    def compute_ratio(self) -> float | None:
        ratios = [member.compute_ratio() for member in self.members]
        return None if any(r is None for r in ratios) else float(sum(ratios))


class TemperatureScaledPredictor(Predictor):
    """Member logits divided by a fitted temperature (ensembles: the same T for every member)."""

    def __init__(self, base: Predictor, temperature: float) -> None:
        super().__init__()
        if not temperature > 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        self.base = base
        self.temperature = float(temperature)

    def begin_pass(self, first_batch: int, total_batches: int) -> None:
        self.base.begin_pass(first_batch, total_batches)

    def member_logits(self, batch):
        return self.base.member_logits(batch) / self.temperature

    def compute_ratio(self) -> float | None:
        return self.base.compute_ratio()


def _as_member_features(features: Any) -> torch.Tensor:
    """``(N, P)`` (one model) or ``(N, M, P)`` (Hydra) projected features -> ``(N, M, P)``."""
    # transformers 5 CLIPModel: an output with the projection in pooler_output
    if not isinstance(features, torch.Tensor):
        features = features.pooler_output
    return features.unsqueeze(1) if features.dim() == 2 else features


class ZeroShotPredictor(Predictor):
    """A zero-shot CLIP classifier over fixed classes: ``member_logits[b, m, c]`` is member m's scaled
    cosine similarity (``logit_scale.exp() * cos``) of image b with the embedding of class c.

    The class embedding is CLIP's prompt ensemble: each of the K prompts of a class
    (:func:`zero_shot_prompts`) is embedded and L2-normalised, the K embeddings are averaged and the
    mean is L2-normalised again, per member. It is computed once, on first use, and cached
    (:meth:`class_embeddings`); a batch then runs only the image tower.

    Models:
        - a Hydra CLIP (``HydraEnsembleCLIPModel``, also loaded with ``trust_remote_code``): M members,
          the ensemble is the mean of their softmaxes (so mutual information and disagreement work);
        - a transformers ``CLIPModel`` (M = 1);
        - an open_clip ``CLIP`` (``encode_image`` / ``encode_text``; M = 1).

    Args:
        model: the CLIP model (its parameters stay where they are; batches are moved to its device).
        class_names: the C class names, in label order.
        templates: the K prompt templates, each with one ``{}`` for the class name.
        tokenizer: a transformers tokenizer (called with ``padding=True, return_tensors="pt"``), or
            any callable ``texts -> (N, T) ids`` such as an open_clip tokenizer (its ids are fed as
            ``input_ids`` to transformers models too). Default: ``open_clip.tokenize`` at the
            model's context length for open_clip models; transformers models need one.
        text_batch_size: prompts per text-tower call.

    Shape:
        batch["pixel_values"]: ``(B, 3, H, W)`` -> member logits ``(B, M, C)``.
    """

    def __init__(
        self,
        model: nn.Module,
        class_names: Sequence[str],
        templates: Sequence[str] = ("a photo of a {}.",),
        *,
        tokenizer: Any = None,
        text_batch_size: int = 256,
    ) -> None:
        super().__init__()
        self.prompts = zero_shot_prompts(class_names, templates)
        self.class_names = list(class_names)
        self.templates = list(templates)
        self.model = model.eval()
        self.open_clip = hasattr(model, "encode_image") and hasattr(model, "encode_text")
        if not self.open_clip and not (hasattr(model, "get_image_features") and hasattr(model, "get_text_features")):
            raise TypeError(
                f"ZeroShotPredictor needs a CLIP model (transformers CLIPModel, a Hydra CLIP or an open_clip CLIP), "
                f"got {type(model).__name__}"
            )
        if tokenizer is None:
            if not self.open_clip:
                raise ValueError(
                    "a transformers CLIP model needs its tokenizer: ZeroShotPredictor(model, names, templates, "
                    "tokenizer=AutoTokenizer.from_pretrained(folder))"
                )
            import open_clip  # heavy: imported only for open_clip models

            tokenizer = functools.partial(open_clip.tokenize, context_length=model.context_length)
        if text_batch_size < 1:
            raise ValueError(f"text_batch_size must be positive, got {text_batch_size}")
        self.tokenizer = tokenizer
        self.text_batch_size = text_batch_size
        self._class_embeds: torch.Tensor | None = None  # (C, M, P), unit norm

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _tokenize(self, texts: list[str]) -> dict[str, torch.Tensor]:
        if isinstance(self.tokenizer, PreTrainedTokenizerBase):
            enc = self.tokenizer(texts, padding=True, return_tensors="pt")
        else:  # open_clip tokenizers and plain callables: texts -> (N, T) ids (or a dict of tensors)
            enc = self.tokenizer(texts)
        if isinstance(enc, torch.Tensor):
            return {"input_ids": enc}
        return {k: enc[k] for k in ("input_ids", "attention_mask") if k in enc}

    def _encode_text(self, texts: list[str]) -> torch.Tensor:  # (N, M, P), not normalised
        inputs = {k: v.to(self._device()) for k, v in self._tokenize(texts).items()}
        if self.open_clip:
            return _as_member_features(self.model.encode_text(inputs["input_ids"]))
        return _as_member_features(self.model.get_text_features(**inputs))

    def class_embeddings(self) -> torch.Tensor:
        """``(C, M, P)`` unit-norm class embeddings: per member, the normalised mean over the K
        templates of the normalised prompt embeddings (computed once, then cached)."""
        if self._class_embeds is None:
            # outside inference mode: a cached inference tensor could not be used later where autograd records
            with torch.inference_mode(False), torch.no_grad():
                feats = torch.cat([
                    self._encode_text(self.prompts[i : i + self.text_batch_size])
                    for i in range(0, len(self.prompts), self.text_batch_size)
                ]).float()  # (C*K, M, P)
                C, K = len(self.class_names), len(self.templates)
                per_prompt = F.normalize(feats.view(C, K, *feats.shape[1:]), dim=-1)  # (C, K, M, P)
                self._class_embeds = F.normalize(per_prompt.mean(dim=1), dim=-1)  # (C, M, P)
        return self._class_embeds

    def member_logits(self, batch):
        text = self.class_embeddings()  # (C, M, P)
        pixels = batch["pixel_values"].to(self._device())
        if self.open_clip:
            image = _as_member_features(self.model.encode_image(pixels))  # (B, 1, P)
        else:
            image = _as_member_features(self.model.get_image_features(pixel_values=pixels))  # (B, M, P)
        image = F.normalize(image.float(), dim=-1)
        if image.shape[1] != text.shape[1]:
            raise ValueError(f"the image tower gives {image.shape[1]} members but the text tower {text.shape[1]}")
        scale = self.model.logit_scale.detach().float().exp()
        return scale * torch.einsum("bmp,cmp->bmc", image, text.to(image.device))  # (B, M, C)


# ------------------------------------------------------------------------------------ predicting
@dataclass
class Predictions:
    """Outputs of one predictor on one data set.

    Shape:
        member_logits: ``(N, M, C)``; labels: ``(N,)`` or None for unlabelled (OOD) data.
    """

    member_logits: torch.Tensor
    labels: torch.Tensor | None

    @property
    def member_probs(self) -> torch.Tensor:  # (N, M, C)
        return torch.softmax(self.member_logits.double(), dim=-1)

    @property
    def probs(self) -> torch.Tensor:  # (N, C): the ensemble's predictive distribution
        return self.member_probs.mean(dim=1)

    def ood_scores(self, score: str = "msp") -> torch.Tensor:
        """Per-sample OOD score, higher = more in-distribution (see ``metrics.ood_score``).

        ``energy`` uses the mean of the member logits (for M = 1, the logits).
        """
        # unknown: ood_score says so
        reads = metrics.OOD_SCORES[score].reads if score in metrics.OOD_SCORES else "probs"
        if reads == "logits":
            return metrics.ood_score(score, logits=self.member_logits.double().mean(dim=1))
        if reads == "member_probs":
            return metrics.ood_score(score, member_probs=self.member_probs)
        return metrics.ood_score(score, probs=self.probs)


@torch.inference_mode()
def predict(predictor: Predictor, loader: Iterable, desc: str = "predict") -> Predictions:
    """Run ``predictor`` over ``loader`` (batches of model inputs, optionally ``labels``)."""
    predictor.eval()
    part = getattr(loader, "hydra_batches", None)
    predictor.begin_pass(part.first_batch if part else 0, part.total_batches if part else len(loader))
    outs, labels = [], []
    shown = progress_bars() and distributed.process_info().is_main
    for batch in tqdm(loader, desc=desc, leave=False, disable=not shown):
        outs.append(predictor.member_logits(batch).float().cpu())
        if "labels" in batch:
            labels.append(batch["labels"].cpu())
    member_logits = torch.cat(outs) if outs else None
    label_tensor = torch.cat(labels) if labels else None
    if getattr(loader, "hydra_sharded", False):  # this process saw one shard: gather all, in order
        member_logits, label_tensor = distributed.gather_rows(member_logits), distributed.gather_rows(label_tensor)
    if member_logits is None:
        raise ValueError(f"{desc}: the data loader produced no batches (empty data?)")
    return Predictions(member_logits, label_tensor)


def fit_temperature(predictions: Predictions, max_iter: int = 100) -> float:
    """The temperature T > 0 that minimises the NLL of ``mean_m softmax(member_logits / T)`` on
    labelled validation predictions (Guo et al. 2017; for M = 1 the classic temperature scaling)."""
    if predictions.labels is None:
        raise ValueError("temperature scaling needs labelled validation data")
    logits = predictions.member_logits.double().clone()  # clone: predictions may be inference tensors
    labels = predictions.labels.clone()
    log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([log_t], lr=0.1, max_iter=max_iter, line_search_fn="strong_wolfe")

    def nll():
        opt.zero_grad()
        log_probs = torch.log_softmax(logits / log_t.exp(), dim=-1)  # (N, M, C)
        mixture = log_mean_exp(log_probs, dim=1)  # (N, C): log of the members' mean softmax
        loss = F.nll_loss(mixture, labels)
        loss.backward()
        return loss

    opt.step(nll)
    temperature = float(log_t.detach().exp())
    logger.info("fitted temperature %.3f on %d validation examples", temperature, len(labels))
    return temperature


def train_ensemble_heads(
    model: nn.Module,
    train_loader: Iterable,
    num_heads: int = 3,
    epochs: int = 20,
    lr: float = 1e-2,
    weight_decay: float = 0.01,
    seed: int = 0,
) -> nn.ModuleList:
    """Deep Ensembles (D): train ``num_heads`` linear heads on the frozen pooled features of a
    fine-tuned classifier, each from its own random initialisation and data order (``seed + i``).

    Head i starts from the model's own classifier plus noise of the same scale as a fresh
    initialisation, so the heads agree where the data is clear and diverge where it is not.
    """
    feats, labels = [], []
    with torch.inference_mode():
        model.eval()
        for batch in tqdm(train_loader, desc="features for ensemble heads", leave=False,
                          disable=not (progress_bars() and distributed.process_info().is_main)):
            feats.append(pooled_features(model, batch).float().cpu())
            labels.append(batch["labels"].cpu())
    x, y = (torch.cat(feats) if feats else None), (torch.cat(labels) if labels else None)
    if getattr(train_loader, "hydra_sharded", False):  # every process trains the same heads on all features
        x, y = distributed.gather_rows(x), distributed.gather_rows(y)
    if x is None:
        raise ValueError("the training data for the ensemble heads is empty")
    base = classifier_layer(model)
    heads = nn.ModuleList()
    for i in range(num_heads):
        g = torch.Generator().manual_seed(seed + i)
        head = nn.Linear(x.shape[1], base.out_features)
        with torch.no_grad():
            std = getattr(model.config, "initializer_range", 0.02)
            head.weight.copy_(base.weight.detach().float().cpu() + std * torch.randn(head.weight.shape, generator=g))
            head.bias.copy_(torch.zeros(base.out_features) if base.bias is None else base.bias.detach().float().cpu())
        opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
        for _ in range(epochs):
            order = torch.randperm(len(x), generator=g)
            for start in range(0, len(x), 64):
                idx = order[start : start + 64]
                loss = F.cross_entropy(head(x[idx]), y[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
        heads.append(head.eval())
    return heads


def interleaved_latency_ms(
    predictors: list[Predictor], batch: Mapping[str, torch.Tensor], rounds: int = 5
) -> list[float]:
    """Median wall time (ms) of one ``member_logits`` call on ``batch`` per predictor, measured
    round-robin (one call each per round, after a warm-up call) so that changes in machine load hit
    every predictor alike."""
    times: list[list[float]] = [[] for _ in predictors]
    with torch.inference_mode():
        for predictor in predictors:
            predictor.member_logits(batch)
        for _ in range(rounds):
            for i, predictor in enumerate(predictors):
                t0 = time.perf_counter()
                predictor.member_logits(batch)
                times[i].append((time.perf_counter() - t0) * 1e3)
    return [statistics.median(t) for t in times]
