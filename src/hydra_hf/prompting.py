"""Zero-shot classification with a causal LM: a prompt that asks for a class, the label words that answer it.

A :class:`ZeroShotPrompt` is a user message holding the text to classify (``{text}``), an optional system message,
an optional start of the answer, and per class the words that name it. Rendered through the tokenizer's chat
template (when it has one), the prompt is three runs of token ids: the **prefix** before the text, the text, and
the **suffix** after it (the end of the user turn, the assistant's header, the answer's start). The class
probabilities are read from the model's next-token distribution after the suffix: class ``c`` gets the summed
probability of the first tokens of its label words, and the classes' probabilities are renormalised over the
label words (:func:`label_word_logits`). The prefix is the same for every text, so a model can compute it once
(:class:`hydra_hf.evaluation.zero_shot_lm.ZeroShotLMPredictor` keeps its key/value cache).

The text's tokens are those of the text alone (with the spaces that end the prefix moved in front of it, as a
tokenizer would read them in the whole prompt), cut at ``max_text_tokens``; the prefix and suffix tokens are the
rendered prompt's. Pruning (:func:`hydra_hf.pruning.prompted.zero_shot_lm_target`) and evaluation read the same
ids (:meth:`ZeroShotPrompt.encode`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .errors import HydraInputError

TEXT_FIELD = "{text}"
_SENTINEL = "\u0001HYDRA_TEXT\u0001"  # stands for the text while the chat template renders the prompt


@dataclass(frozen=True)
class ZeroShotPrompt:
    """A zero-shot classification prompt for a causal LM.

    Attributes:
        template: the user message, holding ``{text}`` exactly once (where the text to classify goes).
        label_words: per class (in label order), the words that name it; the first token of each word (tokenized
            as written: ``" positive"`` after an answer prefix, ``"positive"`` at the start of an answer) is read.
        system: the system message (None: the chat template's default, if it has one).
        answer_prefix: the start of the assistant's answer, before the label word (e.g. ``"The review is"``).

    Without a chat template the prompt is ``system + "\\n\\n" + user + "\\n" + answer_prefix`` (the system part
    only when given), and the prefix is tokenized with the tokenizer's special tokens (its BOS).
    """

    template: str
    label_words: tuple[tuple[str, ...], ...]
    system: str | None = None
    answer_prefix: str = ""
    name: str = field(default="", compare=False)  # how reports call it (default: the template's start)

    def __post_init__(self) -> None:
        if not isinstance(self.template, str) or self.template.count(TEXT_FIELD) != 1:
            raise HydraInputError(f"the prompt template {self.template!r} must hold {TEXT_FIELD} exactly once (where "
                                  "the text goes), e.g. 'Is this movie review positive or negative?\\n{text}'")
        words = self.label_words
        if isinstance(words, str) or not isinstance(words, Sequence) or len(words) < 2:
            raise HydraInputError(f"label words {words!r}: give one word (or list of words) per class, 2 classes or "
                                  "more, e.g. ['negative', 'positive']")
        normal = tuple((w,) if isinstance(w, str) else tuple(w) for w in words)
        if any(not ws or any(not isinstance(w, str) or not w.strip() for w in ws) for ws in normal):
            raise HydraInputError(f"label words {words!r}: every class needs at least one non-empty word")
        object.__setattr__(self, "label_words", normal)
        for key in ("system", "answer_prefix"):
            value = getattr(self, key)
            if value is not None and not isinstance(value, str):
                raise HydraInputError(f"the prompt's {key} must be text, got {type(value).__name__} {value!r}")
        if not self.name:
            object.__setattr__(self, "name", " ".join(self.template.replace(TEXT_FIELD, "...").split())[:60])

    @property
    def num_classes(self) -> int:
        return len(self.label_words)

    def render(self, tokenizer: Any) -> tuple[str, str]:
        """``(before, after)``: the rendered prompt's text before and after the text to classify."""
        user = self.template.replace(TEXT_FIELD, _SENTINEL)
        if getattr(tokenizer, "chat_template", None):
            messages = ([{"role": "system", "content": self.system}] if self.system is not None else []) + [
                {"role": "user", "content": user}]
            rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            rendered = (f"{self.system}\n\n" if self.system else "") + user + "\n"
        before, found, after = (rendered + self.answer_prefix).partition(_SENTINEL)
        if not found or _SENTINEL in after:
            raise HydraInputError("the tokenizer's chat template does not keep the user message as written; give a "
                                  "tokenizer whose template renders the message's text unchanged")
        return before, after

    def parts(self, tokenizer: Any) -> tuple[list[int], str, list[int]]:
        """``(prefix_ids, lead, suffix_ids)``: the token ids before and after the text, and the spaces that end the
        prefix (they are tokenized with the text, as in the whole prompt)."""
        before, after = self.render(tokenizer)
        stripped = before.rstrip(" ")
        chat = bool(getattr(tokenizer, "chat_template", None))
        prefix = tokenizer(stripped, add_special_tokens=not chat)["input_ids"] if stripped else []
        suffix = tokenizer(after, add_special_tokens=False)["input_ids"] if after else []
        return list(prefix), before[len(stripped):], list(suffix)

    def encode(self, tokenizer: Any, text: str, max_text_tokens: int) -> tuple[list[int], list[int]]:
        """``(prefix_ids, rest_ids)``: the prompt for ``text`` as its shared prefix and the rest (the text's tokens,
        at most ``max_text_tokens``, then the suffix). ``prefix_ids + rest_ids`` is the whole prompt."""
        prefix, lead, suffix = self.parts(tokenizer)
        return prefix, text_ids(tokenizer, lead + text, max_text_tokens) + suffix

    def label_token_ids(self, tokenizer: Any) -> list[list[int]]:
        """Per class, the first token id of each of its label words; one line when a word has no token or two
        classes share a first token (their probabilities could not be told apart)."""
        out, owner = [], {}
        for c, words in enumerate(self.label_words):
            ids = []
            for word in words:
                tokens = tokenizer(word, add_special_tokens=False)["input_ids"]
                if not tokens:
                    raise HydraInputError(f"the label word {word!r} has no token in this tokenizer; give another word")
                if tokens[0] in owner and owner[tokens[0]] != c:
                    raise HydraInputError(
                        f"the label words {word!r} (class {c}) and {self.label_words[owner[tokens[0]]]} (class "
                        f"{owner[tokens[0]]}) start with the same token {tokens[0]}: give words that differ in their "
                        "first token")
                owner[tokens[0]] = c
                if tokens[0] not in ids:
                    ids.append(tokens[0])
            out.append(ids)
        return out


def text_ids(tokenizer: Any, text: str, max_tokens: int) -> list[int]:
    """``text``'s token ids without special tokens, the first ``max_tokens`` of them."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise HydraInputError(f"max_text_tokens must be a positive integer, got {max_tokens!r}")
    return list(tokenizer(text, add_special_tokens=False)["input_ids"][:max_tokens])


def label_word_logits(next_token_logits: torch.Tensor, label_ids: Sequence[Sequence[int]]) -> torch.Tensor:
    """Class log-probabilities, up to one constant per row, from next-token logits: class ``c`` gets
    ``log sum_{w in label_ids[c]} p(w)`` with ``p`` the softmax over the vocabulary; a softmax over the classes
    renormalises them over the label words.

    Shape:
        next_token_logits: ``(..., V)``; returns ``(..., C)`` float32.
    """
    log_probs = torch.log_softmax(next_token_logits.float(), dim=-1)  # (..., V)
    return torch.stack([torch.logsumexp(log_probs[..., list(ids)], dim=-1) for ids in label_ids], dim=-1)


def left_padded(rows: Sequence[Sequence[int]], pad_token_id: int, offset: int = 0) -> dict[str, torch.Tensor]:
    """``rows`` of token ids left-padded into one batch: ``input_ids``, ``attention_mask`` and ``position_ids``
    (each row's real tokens numbered ``offset, offset + 1, ...``: the positions of the unpadded sequence after
    ``offset`` cached tokens; padding takes position ``offset``).

    Shape: ``(B, T)`` each, ``T`` the longest row.
    """
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for b, row in enumerate(rows):
        if row:
            input_ids[b, width - len(row):] = torch.tensor(list(row), dtype=torch.long)
            mask[b, width - len(row):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0) + offset
    return {"input_ids": input_ids, "attention_mask": mask, "position_ids": positions}


def prompt_from_dict(data: Any, default_label_words: Sequence[Sequence[str]] | None, source: str) -> ZeroShotPrompt:
    """A prompt from a JSON object ``{"template", "label_words"?, "system"?, "answer_prefix"?, "name"?}``."""
    if not isinstance(data, dict) or "template" not in data:
        raise HydraInputError(f"{source}: a prompt is an object with a 'template' (and optionally 'label_words', "
                              f"'system', 'answer_prefix', 'name'), got {data!r}"[:300])
    unknown = sorted(set(data) - {"template", "label_words", "system", "answer_prefix", "name"})
    if unknown:
        raise HydraInputError(f"{source}: unknown prompt keys {unknown}; use template, label_words, system, "
                              "answer_prefix, name")
    words = data.get("label_words", default_label_words)
    if words is None:
        raise HydraInputError(f"{source}: the prompt has no label_words; add them or pass --label-words")
    return ZeroShotPrompt(template=data["template"], label_words=words, system=data.get("system"),
                          answer_prefix=data.get("answer_prefix", ""), name=data.get("name", ""))


def read_zero_shot_prompts(specs: Sequence[str], label_words: Sequence[Sequence[str]] | None) -> list[ZeroShotPrompt]:
    """The prompts ``hydra-hf evaluate --prompt SPEC ...`` names: each SPEC a template holding ``{text}``, or a
    JSON file of one prompt object or a list of them (:func:`prompt_from_dict`); ``label_words`` (per class) for
    templates and for prompts that give none. Several prompts are a prompt ensemble."""
    prompts: list[ZeroShotPrompt] = []
    for spec in specs:
        path = Path(spec)
        if TEXT_FIELD not in spec and (path.suffix == ".json" or os.path.exists(spec)):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except FileNotFoundError:
                raise HydraInputError(f"--prompt {spec!r}: no such file; give a template holding {TEXT_FIELD} or a "
                                      "JSON file of prompts") from None
            except (OSError, ValueError) as exc:
                raise HydraInputError(f"--prompt {spec!r} is not a readable JSON file of prompts: {exc}") from None
            items = data if isinstance(data, list) else [data]
            if not items:
                raise HydraInputError(f"--prompt {spec!r} holds no prompt")
            prompts += [prompt_from_dict(item, label_words, f"--prompt {spec!r}") for item in items]
        else:
            if label_words is None:
                raise HydraInputError(f"--prompt {spec!r} is a template: give the classes' label words "
                                      "(--label-words, or --class-names)")
            prompts.append(ZeroShotPrompt(template=spec.replace("\\n", "\n"), label_words=label_words))
    if not prompts:
        raise HydraInputError("no prompt given; pass --prompt TEMPLATE (holding {text}) or a JSON file of prompts")
    classes = {p.num_classes for p in prompts}
    if len(classes) != 1:
        raise HydraInputError(f"the prompts name different numbers of classes {sorted(classes)}; every prompt of one "
                              "evaluation classifies the same classes")
    return prompts


def parse_label_words(spec: str | None) -> list[list[str]] | None:
    """``--label-words "negative|bad,positive|good"``: per class (comma-separated, in label order) its words
    (``|``-separated); None for None."""
    if spec is None:
        return None
    classes = [[w for w in part.split("|") if w.strip()] for part in spec.split(",")]
    if len(classes) < 2 or any(not words for words in classes):
        raise HydraInputError(f"--label-words {spec!r}: give one word per class, comma-separated (alternatives "
                              "with |), e.g. 'negative,positive'")
    return classes
