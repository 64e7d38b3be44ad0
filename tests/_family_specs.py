"""One line per family: how to build its tiny stock model and tokenizer (for tests/families/test_every_family.py).

Adding a family to the shared equivalence suite is adding its line to ``SPECS``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import transformers

WORDS = "the a movie film good bad great awful plot actor fun boring i it was is and not very".split()
LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
VOCAB = 99
SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=VOCAB,
             max_position_embeddings=64, initializer_range=0.2)


# ----------------------------------------------------------------------------------- tokenizers
def wordpiece(cls: str) -> Callable[[], Any]:
    """A WordPiece tokenizer of class ``cls`` ([PAD] = 0) over a tiny vocabulary."""

    def make() -> Any:
        vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *LETTERS, *(f"##{c}" for c in LETTERS)]
        return getattr(transformers, cls)(vocab={t: i for i, t in enumerate(vocab)})

    return make


def byte_bpe() -> Any:
    """A byte-level BPE RoBERTa tokenizer (<s> 0, <pad> 1, </s> 2: RoBERTa's ids) without merges."""
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "<mask>": 4}
    for token in ["Ġ", *LETTERS, *(f"Ġ{c}" for c in LETTERS)]:
        vocab.setdefault(token, len(vocab))
    return transformers.RobertaTokenizer(vocab=vocab, merges=[])


def unigram(cls: str, specials: tuple[str, ...] = ("<s>", "<pad>", "</s>", "<unk>")) -> Callable[[], Any]:
    """A SentencePiece-style Unigram tokenizer of class ``cls`` (specials first, in ``specials`` order)."""

    def make() -> Any:
        pieces = [(s, 0.0) for s in specials] + [(f"▁{w}", -1.0) for w in WORDS] + [(c, -2.0) for c in LETTERS]
        return getattr(transformers, cls)(
            vocab=[*pieces, ("▁", -3.0), ("<mask>" if "<s>" in specials else "[MASK]", 0.0)]
        )

    return make


# DeBERTa-v3's layout: log-bucketed relative positions (8 buckets), the table's LayerNorm, position
# projections shared with Q/K, no absolute positions, no token types
DEBERTA_V3 = dict(relative_attention=True, position_buckets=8, norm_rel_ebd="layer_norm", share_att_key=True,
                  pos_att_type="p2c|c2p", position_biased_input=False, type_vocab_size=0)
# ModernBERT: layer 1 attends within a 4-token window (+-2 tokens); [PAD] = 0 as the WordPiece vocabulary
MODERNBERT = dict(local_attention=4, global_attn_every_n_layers=2, pad_token_id=0, bos_token_id=2, eos_token_id=3,
                  cls_token_id=2, sep_token_id=3)


# ---------------------------------------------------------------------------------------- specs
@dataclass(frozen=True)
class FamilySpec:
    """A family in the shared suite.

    Attributes:
        name: the registry name.
        prefix: its transformers class prefix (``f"{prefix}Config"``, ``f"{prefix}ForSequenceClassification"``).
        tokenizer: builds its tiny tokenizer (None: an image family).
        pretraining: a class suffix with another head that converts as a bare encoder (e.g. ``"ForMaskedLM"``).
        refused: a task-head class suffix the converter must refuse (written into config.json's architectures).
        config: size overrides (DistilBERT's names, ``embedding_size`` ...).
    """

    name: str
    prefix: str
    tokenizer: Callable[[], Any] | None
    pretraining: str
    refused: str
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> bool:
        return self.tokenizer is not None

    def stock_config(self, num_labels: int = 3) -> Any:
        sizes = dict(SIZES)
        if self.name == "distilbert":  # DistilBERT names its sizes differently
            sizes = dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64, vocab_size=VOCAB, max_position_embeddings=64,
                         initializer_range=0.2)
        if not self.text:
            sizes = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                         image_size=16, patch_size=8, initializer_range=0.2)
        return getattr(transformers, f"{self.prefix}Config")(**sizes, **self.config, num_labels=num_labels)

    def stock(self, seed: int = 0, head: str | None = None) -> torch.nn.Module:
        """A tiny stock model with random weights (default: the family's classifier)."""
        torch.manual_seed(seed)
        task = head or ("ForSequenceClassification" if self.text else "ForImageClassification")
        return getattr(transformers, f"{self.prefix}{task}")(self.stock_config()).eval()


SPECS = [
    FamilySpec("bert", "Bert", wordpiece("BertTokenizer"), "ForPreTraining", "ForTokenClassification"),
    FamilySpec("roberta", "Roberta", byte_bpe, "ForMaskedLM", "ForQuestionAnswering"),
    FamilySpec("xlm_roberta", "XLMRoberta", unigram("XLMRobertaTokenizer"), "ForMaskedLM", "ForMultipleChoice"),
    FamilySpec("camembert", "Camembert", unigram("CamembertTokenizer"), "ForMaskedLM", "ForTokenClassification"),
    FamilySpec(
        "electra",
        "Electra",
        wordpiece("ElectraTokenizer"),
        "ForPreTraining",
        "ForTokenClassification",
        {"embedding_size": 16},
    ),
    FamilySpec("distilbert", "DistilBert", wordpiece("DistilBertTokenizer"), "ForMaskedLM", "ForQuestionAnswering"),
    FamilySpec(
        "albert",
        "Albert",
        unigram("AlbertTokenizer", ("<pad>", "<unk>", "[CLS]", "[SEP]")),
        "ForPreTraining",
        "ForTokenClassification",
        {"embedding_size": 16},
    ),
    FamilySpec(
        "deberta_v2",
        "DebertaV2",
        unigram("DebertaV2Tokenizer", ("[PAD]", "[CLS]", "[SEP]", "[UNK]")),
        "ForMaskedLM",
        "ForTokenClassification",
        DEBERTA_V3,
    ),
    FamilySpec(
        "modernbert", "ModernBert", wordpiece("BertTokenizer"), "ForMaskedLM", "ForTokenClassification", MODERNBERT
    ),
    FamilySpec("vit", "ViT", None, "Model", "ForDepthEstimation"),
    FamilySpec("deit", "DeiT", None, "Model", "ForMaskedImageModeling"),
    FamilySpec(
        "beit",
        "Beit",
        None,
        "Model",
        "ForSemanticSegmentation",
        {"use_relative_position_bias": True, "layer_scale_init_value": 0.5},
    ),
    FamilySpec("dinov2", "Dinov2", None, "Model", "Backbone"),
]
TEXT_SPECS = [s for s in SPECS if s.text]


# --------------------------------------------------------------------------------------- helpers
def inputs(
    spec: FamilySpec, model: torch.nn.Module, batch: int = 3, seq: int = 9, seed: int = 7
) -> dict[str, torch.Tensor]:
    """A padded batch (rows of different lengths, padded with the model's pad token: a Hydra model's is its
    base's, RoBERTa's is 1) for a text model, or images for a vision model."""
    g = torch.Generator().manual_seed(seed)
    if not spec.text:
        return {"pixel_values": torch.randn(batch, 3, 16, 16, generator=g)}
    input_ids = torch.randint(5, 60, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    for i in range(1, batch):
        mask[i, seq - 3 * i :] = 0
    base = getattr(model.config, "base_config", None)
    pad = (base.get("pad_token_id") if isinstance(base, dict) else model.config.pad_token_id) or 0
    return {"input_ids": input_ids * mask + pad * (1 - mask), "attention_mask": mask}


def perturbed(model: torch.nn.Module, seed: int, scale: float = 0.05) -> torch.nn.Module:
    """A copy of ``model`` 'fine-tuned' differently: every weight but the shared embeddings perturbed."""
    g = torch.Generator().manual_seed(seed)
    out = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in out.named_parameters():
            if "embed" not in name:
                p.add_(scale * torch.randn(p.shape, generator=g))
    return out
