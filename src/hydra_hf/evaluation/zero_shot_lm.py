"""A causal LM as a zero-shot classifier, the way ``hydra-hf evaluate --prompt`` runs it.

:class:`ZeroShotLMPredictor` reads every text inside each prompt of a :class:`~hydra_hf.prompting.ZeroShotPrompt`
list (a prompt ensemble when there are several) and returns, per prompt and member, the classes' label-word
log-probabilities after the prompt (:func:`~hydra_hf.prompting.label_word_logits`): member logits
``(B, K * M, C)`` for K prompts and M members (M = 1 for a stock LM, a Hydra LM's members otherwise). The ensemble
is the mean of those softmaxes, i.e. of the members' (and prompts') label-word distributions renormalised over the
classes; the metrics and the report are the classifier path's.

The prompt's prefix (the system message and the instruction before the text) is the same for every text: its
key/value cache is computed once per prompt and model and every batch runs only the text and the suffix after it
(``prefix_cache=True``; the same numbers as the whole prompt, to float error, as the tests check).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from .. import distributed
from ..lazy import lazy_module
from ..prompting import ZeroShotPrompt, label_word_logits, left_padded, text_ids
from ..pruning.zero_shot_lm import pad_id
from .predictors import Predictor, model_compute_ratio

# heavy (datasets, pandas, pyarrow: ~2 s): imported on first use, so that `import hydra_hf` stays light (lazy.py)
datasets = lazy_module("datasets")

logger = logging.getLogger(__name__)

DEFAULT_TEXT_TOKENS = 64


class ZeroShotLMPredictor(Predictor):
    """A causal LM (stock or Hydra) classifying texts zero-shot with one prompt or a prompt ensemble.

    Args:
        model: a causal LM (``...ForCausalLM``, a Hydra causal LM), in eval mode.
        tokenizer: its tokenizer (its chat template renders the prompts when it has one).
        prompts: one :class:`~hydra_hf.prompting.ZeroShotPrompt` or several of the same classes (a prompt ensemble:
            their probabilities are averaged like members').
        max_text_tokens: each text's tokens inside the prompt (the first ones).
        prefix_cache: compute each prompt's shared prefix once and run only the rest per batch.

    Shape:
        batch: ``{"text": list of B str, "labels": (B,) optional}`` (:func:`make_text_batches`) -> member logits
        ``(B, K * M, C)``, prompt-major (prompt k's members at ``k * M ... k * M + M - 1``).
    """

    def __init__(self, model: nn.Module, tokenizer: Any, prompts: ZeroShotPrompt | Sequence[ZeroShotPrompt], *,
                 max_text_tokens: int = DEFAULT_TEXT_TOKENS, prefix_cache: bool = True) -> None:
        super().__init__()
        prompts = [prompts] if isinstance(prompts, ZeroShotPrompt) else list(prompts)
        if not prompts or not all(isinstance(p, ZeroShotPrompt) for p in prompts):
            raise TypeError("prompts must be a ZeroShotPrompt or a non-empty list of them")
        if len({p.num_classes for p in prompts}) != 1:
            raise ValueError(f"the prompts classify different numbers of classes {[p.num_classes for p in prompts]}")
        if not hasattr(model, "lm_head"):
            raise TypeError(f"{type(model).__name__} is not a causal LM (no lm_head); give a ...ForCausalLM model")
        text_ids(tokenizer, "", max_text_tokens)  # checks max_text_tokens
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.prompts = prompts
        self.max_text_tokens = max_text_tokens
        self.prefix_cache = prefix_cache
        self.pad_token_id = pad_id(tokenizer)
        self._parts = [(*p.parts(tokenizer), p.label_token_ids(tokenizer)) for p in prompts]
        self._caches: dict[tuple, Any] = {}  # (prompt, autocast dtype) -> the prefix's key/value cache, batch 1

    @property
    def num_classes(self) -> int:
        return self.prompts[0].num_classes

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def compute_ratio(self) -> float | None:
        """Multiply-adds per text relative to the stock model with one prompt: the model's ratio times K prompts."""
        return len(self.prompts) * model_compute_ratio(self.model)

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _run(self, inputs: Mapping[str, torch.Tensor], cache: Any = None) -> Any:
        extra = {} if cache is None else {"cache": cache, "use_cache": True}
        return self.model(**inputs, logits_to_keep=1, **extra)

    def _prefix(self, k: int, prefix: list[int]) -> Any:
        """Prompt ``k``'s prefix cache (batch 1), computed on first use under the autocast now in effect."""
        key = (k, torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu"))
        if key not in self._caches:
            # outside inference mode: the cache is copied into every batch's (inference tensors would refuse it)
            with torch.inference_mode(False), torch.no_grad():
                ids = torch.tensor([prefix], device=self._device())
                out = self.model(input_ids=ids, attention_mask=torch.ones_like(ids), logits_to_keep=1, use_cache=True)
                self._caches[key] = out.cache
        return self._caches[key]

    def member_logits(self, batch):
        texts = list(batch["text"])
        device = self._device()
        outs = []
        for k, (prefix, lead, suffix, label_ids) in enumerate(self._parts):
            rests = [text_ids(self.tokenizer, lead + t, self.max_text_tokens) + suffix for t in texts]
            if self.prefix_cache and prefix:
                inputs = left_padded(rests, self.pad_token_id, offset=len(prefix))
                inputs["attention_mask"] = torch.cat(
                    [torch.ones(len(texts), len(prefix), dtype=torch.long), inputs["attention_mask"]], dim=1)
                cache = copy.deepcopy(self._prefix(k, prefix))
                cache.batch_repeat_interleave(len(texts))
                out = self._run({key: v.to(device) for key, v in inputs.items()}, cache)
            else:
                inputs = left_padded([prefix + r for r in rests], self.pad_token_id)
                out = self._run({key: v.to(device) for key, v in inputs.items()})
            member = getattr(out, "member_logits", None)
            last = member[:, :, -1] if member is not None else out.logits[:, -1].unsqueeze(1)  # (B, M, V)
            outs.append(label_word_logits(last, label_ids))  # (B, M, C)
        return torch.cat(outs, dim=1)  # (B, K * M, C)


class _TextCollator:
    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        batch: dict[str, Any] = {"text": [row["text"] for row in rows]}
        if rows and "label" in rows[0]:
            batch["labels"] = torch.tensor([int(row["label"]) for row in rows], dtype=torch.long)
        return batch


def make_text_batches(dataset: datasets.Dataset, batch_size: int = 16, *, shard: bool = False) -> DataLoader:
    """A loader of ``{"text": [B texts], "labels": (B,)}`` batches (labels when the dataset has a ``label``
    column), in the dataset's order: the input of :class:`ZeroShotLMPredictor`. With ``shard`` and several
    launched processes, this process's contiguous shard (as :func:`hydra_hf.evaluation.make_loader`)."""
    if "text" not in dataset.column_names:
        raise ValueError(f"zero-shot prompts need a 'text' column; the data has {dataset.column_names}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    sharded = shard and distributed.process_info().distributed
    part = distributed.batch_shard(len(dataset), batch_size, distributed.ProcessInfo())
    if sharded:
        dataset, part = distributed.shard(dataset, batch_size)
    columns = [c for c in ("text", "label") if c in dataset.column_names]
    loader = DataLoader(dataset.select_columns(columns), batch_size=batch_size, shuffle=False,
                        collate_fn=_TextCollator())
    loader.hydra_sharded = sharded
    loader.hydra_batches = part
    return loader
