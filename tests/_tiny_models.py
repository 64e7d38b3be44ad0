"""Tiny models and data for the pruning tests (built locally, no downloads)."""

from __future__ import annotations

import functools

import torch
from torch import nn

VOCAB = 40
SEQ = 8


def tiny_bert(num_labels: int = 3, layers: int = 2, heads: int = 4, seed: int = 0) -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=64,
        max_position_embeddings=32, num_labels=num_labels, initializer_range=0.2,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    return BertForSequenceClassification(cfg).eval()


def tiny_vit(num_labels: int = 3, seed: int = 0) -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(seed)
    cfg = ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=16,
        patch_size=8, num_labels=num_labels, initializer_range=0.2,
    )
    return ViTForImageClassification(cfg).eval()


def tiny_hf_clip(seed: int = 0) -> nn.Module:
    from transformers import CLIPConfig, CLIPModel

    torch.manual_seed(seed)
    cfg = CLIPConfig(
        text_config=dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=16),
        vision_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                           image_size=16, patch_size=8),
        projection_dim=16,
    )
    return CLIPModel(cfg).eval()


def tiny_timm_vit(num_labels: int = 3, seed: int = 0) -> nn.Module:
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(seed)
    return VisionTransformer(
        img_size=16, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=num_labels
    ).eval()


def tiny_open_clip(seed: int = 0) -> nn.Module:
    import open_clip
    from open_clip.model import CLIPTextCfg, CLIPVisionCfg

    torch.manual_seed(seed)
    return open_clip.CLIP(
        embed_dim=16,
        vision_cfg=CLIPVisionCfg(layers=2, width=32, head_width=8, patch_size=8, image_size=16),
        text_cfg=CLIPTextCfg(context_length=8, vocab_size=VOCAB, width=32, heads=4, layers=2),
    ).eval()


def text_batches(
    n: int, seed: int, *, num_labels: int = 3, batch_size: int = 8, first_token: int | None = None
) -> list[dict[str, torch.Tensor]]:
    """Random token batches with ragged lengths (padding) and random labels."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (n, SEQ), generator=g)
    if first_token is not None:
        ids[:, 1] = first_token
    mask = torch.ones(n, SEQ, dtype=torch.long)
    for i in range(n):
        mask[i, int(torch.randint(3, SEQ + 1, (1,), generator=g)) :] = 0
    ids = ids * mask
    labels = torch.randint(0, num_labels, (n,), generator=g)
    return [
        {
            "input_ids": ids[i : i + batch_size],
            "attention_mask": mask[i : i + batch_size],
            "token_type_ids": torch.zeros_like(ids[i : i + batch_size]),
            "labels": labels[i : i + batch_size],
        }
        for i in range(0, n, batch_size)
    ]


def image_batches(n: int, seed: int, *, num_labels: int = 3, batch_size: int = 8) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randn(n, 3, 16, 16, generator=g)
    labels = torch.randint(0, num_labels, (n,), generator=g)
    return [
        {"pixel_values": pixels[i : i + batch_size], "labels": labels[i : i + batch_size]}
        for i in range(0, n, batch_size)
    ]


# ----------------------------------------------------------------------------- planted structure
SIGNAL_HEAD = (0, 2)
TOKEN_A, TOKEN_B = 3, 4  # the ID signal tokens at position 1


def signal_batches(n: int, seed: int, *, ood: bool = False, batch_size: int = 16) -> list[dict[str, torch.Tensor]]:
    """ID: position 1 holds token A (label 0) or B (label 1), the rest is noise.

    OOD: position 1 holds a noise token instead (the label is meaningless; kept only for the shape).
    """
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (n, SEQ), generator=g)
    labels = torch.randint(0, 2, (n,), generator=g)
    ids[:, 0] = 1  # a [CLS]-like token
    if not ood:
        ids[:, 1] = torch.where(labels == 0, TOKEN_A, TOKEN_B)
    mask = torch.ones(n, SEQ, dtype=torch.long)
    out = []
    for i in range(0, n, batch_size):
        batch = {"input_ids": ids[i : i + batch_size], "attention_mask": mask[i : i + batch_size],
                 "token_type_ids": torch.zeros_like(ids[i : i + batch_size])}
        if not ood:
            batch["labels"] = labels[i : i + batch_size]
        out.append(batch)
    return out


@functools.lru_cache(maxsize=1)
def _planted_state() -> dict[str, torch.Tensor]:
    from hydra_hf.pruning.gates import HeadGates, zero_head_columns_

    model = tiny_bert(num_labels=2, layers=2, heads=4, seed=1)
    only = torch.zeros(2, 4)
    only[SIGNAL_HEAD] = 1.0
    # every head but the signal head is irrelevant: its W_O block is zero (set before and after training)
    zero_head_columns_(model, only)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    batches = signal_batches(512, seed=123, batch_size=64)
    with HeadGates(model) as hg:
        hg.set(only)
        for _ in range(12):
            for b in batches:
                loss = nn.functional.cross_entropy(
                    model(**{k: v for k, v in b.items() if k != "labels"}).logits, b["labels"]
                )
                opt.zero_grad()
                loss.backward()
                opt.step()
    zero_head_columns_(model, only)
    model.eval()
    return {k: v.clone() for k, v in model.state_dict().items()}


def planted_bert() -> nn.Module:
    """A 2x4 BERT whose only relevant head is ``SIGNAL_HEAD``: trained to read the token at position 1.

    All other heads have an all-zero W_O block. Trained once per session (~seconds), then cached.
    """
    model = tiny_bert(num_labels=2, layers=2, heads=4, seed=1)
    model.load_state_dict(_planted_state())
    return model.eval()
