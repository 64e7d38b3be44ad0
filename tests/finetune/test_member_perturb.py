"""``FinetuneConfig.member_perturb``: shrink and perturb each member before fine-tuning (Ash & Adams 2020).

Numbers checked: amount 0 leaves the weights bit for bit; amount a gives (1 - a) * w + a * w0 with w0 the
model class's own random initialisation under seed + PERTURB_SEED_OFFSET, for every parameter outside the
shared embeddings and for every registered classifier family; the embeddings never move; different member
seeds give different starting points; the global RNG stream is untouched (training draws the same batches
and dropout as without it); a fine-tuning run with it trains members that start apart; bad amounts are refused.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from _family_specs import SPECS

from hydra_hf.assemble import convert_checkpoint
from hydra_hf.families import get_family
from hydra_hf.finetune import FinetuneConfig
from hydra_hf.finetune.members import PERTURB_SEED_OFFSET, shrink_and_perturb_
from hydra_hf.masks import HeadMasks

KEPT = [[[0, 2], [1, 2, 3]]]  # one member, 2 layers of 4 heads
# every family fine-tuning supports: the encoder suite's and the decoders (classifier and causal LM)
DECODERS = [("llama", "ForSequenceClassification"), ("llama", "ForCausalLM"), ("gpt2", "ForSequenceClassification"),
            ("gpt2", "LMHeadModel")]
CASES = [(s.name, None) for s in SPECS] + DECODERS


@pytest.fixture(scope="module")
def members(tmp_path_factory):
    from _tiny_decoders import save_gpt2, save_llama

    root = tmp_path_factory.mktemp("perturb")
    out = {}
    for spec in SPECS:
        spec.stock().save_pretrained(root / spec.name)
        out[(spec.name, None)] = convert_checkpoint(HeadMasks(kept_heads=KEPT, num_heads=4), base=root / spec.name)
    for family, head in DECODERS:
        folder = root / f"{family}-{head}"
        (save_llama if family == "llama" else save_gpt2)(folder, head=head)
        out[(family, head)] = convert_checkpoint(HeadMasks(kept_heads=KEPT, num_heads=4), base=folder)
    return out


@pytest.mark.parametrize("case", CASES, ids=[f"{f}-{h}" if h else f for f, h in CASES])
def test_shrink_and_perturb_mixes_in_the_members_own_fresh_init(case, members):
    model = members[case]
    prefixes = tuple(get_family(case[0]).frozen_prefixes)
    before = copy.deepcopy(model.state_dict())
    assert shrink_and_perturb_(copy.deepcopy(model), 0.0, 5, prefixes).state_dict().keys() == before.keys()
    for name, value in shrink_and_perturb_(copy.deepcopy(model), 0.0, 5, prefixes).state_dict().items():
        assert torch.equal(value, before[name])

    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a = shrink_and_perturb_(copy.deepcopy(model), 0.4, 5, prefixes)
    assert torch.equal(torch.rand(3), expected_next)  # the global RNG stream is untouched
    torch.manual_seed(5 + PERTURB_SEED_OFFSET)
    fresh = type(model)(model.config).state_dict()
    moved = 0
    for name, param in a.named_parameters():
        if name.startswith(prefixes) or param.numel() == 0:
            torch.testing.assert_close(param, before[name], atol=0, rtol=0)
        else:
            torch.testing.assert_close(param, 0.6 * before[name] + 0.4 * fresh[name], atol=1e-6, rtol=0)
            moved += int(not torch.equal(param, before[name]))
    assert moved > 5
    assert any(n.startswith(prefixes) for n, _ in a.named_parameters())  # the embeddings are there, and kept
    b = shrink_and_perturb_(copy.deepcopy(model), 0.4, 6, prefixes)  # another member's seed: another start
    diff = max((p - q).abs().max().item() for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters())
               if not n.startswith(prefixes) and p.numel())
    assert diff > 1e-2


def test_member_perturb_is_validated():
    assert FinetuneConfig().member_perturb == 0.0
    with pytest.raises(ValueError, match="member_perturb=1.5 must be <= 1"):
        FinetuneConfig(member_perturb=1.5)
    with pytest.raises(ValueError, match="member_perturb=-0.1 must be >= 0"):
        FinetuneConfig(member_perturb=-0.1)


def test_finetune_members_start_apart(tmp_path):
    """Two members keeping the same heads: without perturbation they start equal (same base, same heads);
    with member_perturb they start apart, and after training stay further apart."""
    from conftest import tiny_bert_config, write_masks, write_tiny_tokenizer
    from transformers import BertForSequenceClassification

    from hydra_hf.finetune import finetune_members, text_recipe

    torch.manual_seed(0)
    base = tmp_path / "tiny-bert"
    BertForSequenceClassification(tiny_bert_config(num_labels=2)).save_pretrained(base)
    write_tiny_tokenizer(base)
    masks = write_masks(tmp_path / "twins.json", [[[0, 1], [2, 3], [1]]] * 2, 4)
    words = "the a movie film plot actor it was".split()
    rows = "\n".join(f"{w} {v} {'great fun' if i % 2 else 'awful boring'},{i % 2}"
                     for i, (w, v) in enumerate((w, v) for w in words for v in words[:2]))
    (tmp_path / "train.csv").write_text("text,label\n" + rows + "\n")
    spread = {}
    for amount in (0.0, 0.5):
        cfg = text_recipe(learning_rate=1e-4, batch_size=8, num_epochs=1, max_steps=1, log_every_steps=1,
                          member_perturb=amount, mlp_fusion="per_member")
        out = finetune_members(base, masks, str(tmp_path / "train.csv"), None, tmp_path / f"out{amount}", cfg)
        work = Path(str(out) + ".work")
        a, b = (BertForSequenceClassification.from_pretrained(work / f"member_{m}" / "model") for m in (0, 1))
        spread[amount] = (a.bert.encoder.layer[0].intermediate.dense.weight
                          - b.bert.encoder.layer[0].intermediate.dense.weight).abs().max().item()
        assert torch.equal(a.bert.embeddings.word_embeddings.weight, b.bert.embeddings.word_embeddings.weight)
    assert spread[0.5] > 10 * max(spread[0.0], 1e-4), spread
