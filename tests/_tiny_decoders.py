"""Tiny decoder checkpoints with a tokenizer that has no pad token (as most decoder tokenizers), and keyword
data, for the decoder fine-tuning and ONNX tests."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pandas as pd
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers

WORDS = "the a it was plot actor movie film good great fun bad awful boring".split()
EOS = 1  # "<eos>": the tokenizer's end-of-sequence token and, for want of a pad token, its padding
# member 0 keeps 2 then 3 of 4 query heads, member 1 keeps 2 then 1 (GQA: 2 key/value heads for Llama)
MASKS = [[[0, 1], [1, 2, 3]], [[2, 3], [0]]]


def tokenizer(padding_side: str = "right", pad: bool = False) -> transformers.PreTrainedTokenizerFast:
    """A word-level tokenizer: ``<unk>`` 0, ``<eos>`` 1, then :data:`WORDS`; no pad token (``pad``: ``<eos>``)."""
    vocab = {"<unk>": 0, "<eos>": EOS}
    for w in WORDS:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>", padding_side=padding_side,
        **({"pad_token": "<eos>"} if pad else {}),
    )


def write_data(folder: Path, n_train: int = 24, n_eval: int = 9) -> tuple[str, str]:
    """Keyword sentiment with 3 classes (positive / negative / neutral) as csv files."""
    rng = random.Random(0)
    words = {0: ["good", "great", "fun"], 1: ["bad", "awful", "boring"], 2: ["plot", "actor", "movie"]}
    filler = ["the", "a", "it", "was", "plot", "actor", "movie", "film"]
    rows, seen = [], set()
    while len(rows) < n_train + n_eval:
        label = len(rows) % 3
        tokens = [rng.choice(words[label])] + rng.sample(filler, rng.randint(2, 5))
        rng.shuffle(tokens)
        text = " ".join(tokens)
        if text not in seen:
            seen.add(text)
            rows.append({"text": text, "label": label})
    pd.DataFrame(rows[:n_train]).to_csv(folder / "train.csv", index=False)
    pd.DataFrame(rows[n_train:]).to_csv(folder / "eval.csv", index=False)
    return str(folder / "train.csv"), str(folder / "eval.csv")


def save_llama(
    folder: Path,
    head: str = "ForSequenceClassification",
    padding_side: str = "right",
    seed: int = 0,
    pad: bool = False,
) -> Path:
    """A tiny Llama (4 query heads, 2 key/value heads) with no pad token in its config or tokenizer."""
    tok = tokenizer(padding_side, pad)
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=48, max_position_embeddings=64, num_labels=3, eos_token_id=EOS, bos_token_id=None,
        pad_token_id=EOS if pad else None, initializer_range=0.1, tie_word_embeddings=False,
    )
    getattr(transformers, f"Llama{head}")(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def save_gpt2(
    folder: Path,
    head: str = "ForSequenceClassification",
    padding_side: str = "right",
    seed: int = 0,
    pad: bool = False,
) -> Path:
    """A tiny GPT-2 (4 heads, dropout off) with no pad token; ``head="LMHeadModel"``: the causal LM (tied head)."""
    tok = tokenizer(padding_side, pad)
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        vocab_size=len(tok), n_embd=32, n_layer=2, n_head=4, n_positions=64, num_labels=3, eos_token_id=EOS,
        bos_token_id=EOS, pad_token_id=EOS if pad else None, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )
    getattr(transformers, f"GPT2{head}")(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def write_masks(path: Path, kept=MASKS, num_heads: int = 4) -> Path:
    path.write_text(json.dumps({
        "format": "hydra-head-masks", "version": 1, "num_layers": len(kept[0]), "num_heads": num_heads,
        "members": [{"kept_heads": k} for k in kept],
    }))
    return path
