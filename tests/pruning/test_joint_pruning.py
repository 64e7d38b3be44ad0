"""Joint two-tower member selection on CLIP (``tower="joint"``): the greedy equals a plain joint greedy,
the budget is spread over both towers, Taylor's cross-tower comparison is scale-free, seeds, and the
masks convert into a Hydra CLIP that matches the stock model with the removed heads switched off."""

from __future__ import annotations

import math

import datasets
import pytest
import torch
from _tiny_models import text_batches, tiny_bert, tiny_open_clip
from sklearn.metrics import roc_auc_score
from transformers import CLIPConfig, CLIPModel

from hydra_hf.masks import HeadMasks
from hydra_hf.pruning import Budget, HeadGates, circuit_prune, get_adapter, prune_members, taylor_prune
from hydra_hf.pruning import taylor as taylor_module

C = 3  # classes
VOCAB = 50


def clip_config() -> CLIPConfig:
    """Vision 2 layers x 4 heads, text 2 layers x 2 heads: the towers differ in heads per layer."""
    return CLIPConfig(
        text_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                         vocab_size=VOCAB, max_position_embeddings=8, eos_token_id=VOCAB - 1, bos_token_id=VOCAB - 2,
                         pad_token_id=VOCAB - 1),
        vision_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                           image_size=16, patch_size=8),
        projection_dim=16,
    )


def clip_model(seed: int = 0) -> CLIPModel:
    torch.manual_seed(seed)
    model = CLIPModel(clip_config()).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # away from the near-uniform default init, so heads matter
        for p in model.parameters():
            p.add_(0.15 * torch.randn(p.shape, generator=g))
    return model


def prompts() -> dict[str, torch.Tensor]:
    """C tokenized class prompts ``(C, T)``, each ending with the end-of-text token."""
    ids = torch.tensor(
        [
            [VOCAB - 2, 5, 6, VOCAB - 1, VOCAB - 1],
            [VOCAB - 2, 7, 8, 9, VOCAB - 1],
            [VOCAB - 2, 10, VOCAB - 1, VOCAB - 1, VOCAB - 1],
        ]
    )
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    return {"input_ids": ids, "attention_mask": mask}


def clip_adapter(seed: int = 0):
    return get_adapter(clip_model(seed), class_text_inputs=prompts())


def images(n: int, seed: int, batch_size: int = 12) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randn(n, 3, 16, 16, generator=g)
    labels = torch.randint(0, C, (n,), generator=g)
    return [
        {"pixel_values": pixels[i : i + batch_size], "labels": labels[i : i + batch_size]}
        for i in range(0, n, batch_size)
    ]


def image_dataset(n: int, seed: int) -> datasets.Dataset:
    g = torch.Generator().manual_seed(seed)
    return datasets.Dataset.from_dict({"pixels": torch.randn(n, 3, 16, 16, generator=g).tolist(),
                                       "label": torch.randint(0, C, (n,), generator=g).tolist()})


def make_batches(dataset: datasets.Dataset, seed: int) -> list[dict[str, torch.Tensor]]:
    rows = dataset.with_format("torch")
    out = []
    for i in range(0, len(rows), 12):
        chunk = rows[i : i + 12]
        batch = {"pixel_values": chunk["pixels"].float()}
        if "label" in chunk:
            batch["labels"] = chunk["label"]
        out.append(batch)
    return out


# ------------------------------------------------------------------------------ plain reference
def plain_joint_greedy(model, id_batches, ood_batches, n_remove: int, score: str) -> list[tuple[str, int, int]]:
    """Algorithm 1 over both towers, written plainly: try every remaining (tower, layer, head) in
    order (vision first), keep the first best; sklearn AUROC."""
    adapter = get_adapter(model, class_text_inputs=prompts())
    labels = torch.cat([b["labels"] for b in id_batches])
    gates = {t: torch.ones(*adapter.shape(t)) for t in ("vision", "text")}
    removed = []
    with HeadGates(model, adapter=adapter) as hg, torch.no_grad():

        def s_of(g):
            hg.set(g)
            id_logits = torch.cat([adapter.logits(b) for b in id_batches])
            acc = float((id_logits.argmax(-1) == labels).float().mean())
            ood_logits = torch.cat([adapter.logits(b) for b in ood_batches])
            msp = torch.cat([id_logits.softmax(-1).amax(-1), ood_logits.softmax(-1).amax(-1)]).double().numpy()
            ood = float(roc_auc_score([1] * len(id_logits) + [0] * len(ood_logits), msp))
            return {"acc": acc, "ood": ood, "avg": (acc + ood) / 2}[score]

        for _ in range(n_remove):
            best, best_s = None, -math.inf
            for tower in ("vision", "text"):
                L, H = gates[tower].shape
                for layer in range(L):
                    for h in range(H):
                        if gates[tower][layer, h] == 0:
                            continue
                        trial = {t: g.clone() for t, g in gates.items()}
                        trial[tower][layer, h] = 0
                        value = s_of(trial)
                        if value > best_s + 1e-12:
                            best, best_s = (tower, layer, h), value
            gates[best[0]][best[1], best[2]] = 0
            removed.append(best)
    return removed


def test_joint_circuits_equal_a_plain_joint_greedy():
    model = clip_model()
    id_b, ood_b = images(16, 1, batch_size=16), images(16, 2, batch_size=16)
    reference = plain_joint_greedy(model, id_b, ood_b, n_remove=2, score="avg")
    adapter = get_adapter(model, class_text_inputs=prompts())
    result = circuit_prune(adapter, id_b, ood_b, Budget(remove=2), score="avg", tower="joint", progress=False)
    assert result.removal_order == reference
    assert set(result.gates) == {"vision", "text"}
    assert result.gates["vision"].shape == (2, 4) and result.gates["text"].shape == (2, 2)
    removed = {t: int((g == 0).sum()) for t, g in result.gates.items()}
    assert sum(removed.values()) == 2
    for tower, layer, h in result.removal_order:
        assert result.gates[tower][layer, h] == 0 and not math.isnan(result.scores[tower][layer, h])
    assert result.metadata["tower"] == "joint" and len(result.metadata["score_history"]) == 3


def test_joint_budgets_cover_both_towers():
    adapter = clip_adapter()
    id_b, ood_b = images(12, 3), images(12, 4)
    # K per layer applies to every layer of each tower (vision keeps 1 of 4, text 1 of 2)
    res = circuit_prune(
        adapter, id_b, ood_b, Budget(heads_per_layer=1), score="acc", tower="joint", heads_per_step=4, progress=False
    )
    assert (res.gates["vision"].sum(dim=1) == 1).all() and (res.gates["text"].sum(dim=1) == 1).all()
    assert len(res.removal_order) == 2 * 3 + 2 * 1
    # more heads than the vision tower has: the text tower must give some
    res = taylor_prune(adapter, id_b, Budget(remove=10), tower="joint", progress=False)
    kept = {t: int(g.sum()) for t, g in res.gates.items()}
    assert kept["vision"] + kept["text"] == 12 - 10 and kept["text"] < 4
    per_layer = taylor_prune(adapter, id_b, Budget(heads_per_layer=2), tower="joint", progress=False)
    assert (per_layer.gates["vision"].sum(dim=1) == 2).all() and (per_layer.gates["text"].sum(dim=1) == 2).all()
    assert {t for t, _, _ in per_layer.removal_order} == {"vision"}  # text layers have only 2 heads


def test_open_clip_joint_circuits():
    model = tiny_open_clip()
    adapter = get_adapter(
        model, class_text_inputs=torch.randint(5, 40, (C, 8), generator=torch.Generator().manual_seed(0))
    )
    res = circuit_prune(
        adapter, images(12, 5), None, Budget(remove=2), score="acc", tower="joint", heads_per_step=2, progress=False
    )
    assert sum(int((g == 0).sum()) for g in res.gates.values()) == 2
    assert all(len(p) == 3 and p[0] in ("vision", "text") for p in res.removal_order)


# --------------------------------------------------------------------------- Taylor across towers
def test_taylor_cross_tower_ranking_is_per_layer_normalised(monkeypatch):
    """Raw scores of the text tower 1e6 times those of the vision tower: the joint ranking equals a plain
    per-layer RMS normalisation, does not change when the text scale changes, and prunes both towers
    (a raw ranking would prune only vision heads)."""
    adapter = clip_adapter()
    raw_v = torch.tensor([[0.4, 1.0, 0.1, 0.7], [0.9, 0.2, 0.5, 0.3]])  # (2, 4)
    raw_t = torch.tensor([[0.3, 1.0], [1.0, 0.8]])  # (2, 2)

    def prune_with(text_scale: float):
        def fake(adapter_, batches, towers, gates, criterion, progress, desc):
            scores = {"vision": raw_v.clone(), "text": raw_t * text_scale}
            return {t: scores[t] * (gates[t] > 0.5) for t in towers}

        monkeypatch.setattr(taylor_module, "_tower_scores", fake)
        return taylor_prune(adapter, images(12, 0), Budget(remove=3), tower="joint", progress=False)

    def rms(x):
        return x / x.pow(2).mean(dim=1, keepdim=True).sqrt()

    flat = [
        (float(v), ("vision", l, h))
        for (l, h), v in zip([(l, h) for l in range(2) for h in range(4)], rms(raw_v).flatten())
    ]
    flat += [
        (float(v), ("text", l, h))
        for (l, h), v in zip([(l, h) for l in range(2) for h in range(2)], rms(raw_t).flatten())
    ]
    expected = {name for _, name in sorted(flat)[:3]}
    big, small = prune_with(1e6), prune_with(1e-6)
    assert set(big.removal_order) == expected == set(small.removal_order)
    assert {t for t, _, _ in big.removal_order} == {"vision", "text"}
    assert sorted(big.removal_order) == sorted(small.removal_order)
    assert big.metadata["tower"] == "joint"


def test_taylor_joint_scores_match_single_tower_scores():
    """One backward pass per batch scores both towers; each equals the single-tower scores."""
    adapter = clip_adapter()
    batches = images(12, 6)
    joint = taylor_module.taylor_scores(adapter, batches, tower="joint")
    for tower in ("vision", "text"):
        torch.testing.assert_close(joint[tower], taylor_module.taylor_scores(adapter, batches, tower=tower))
    assert (joint["text"] > 0).all() and (joint["vision"] > 0).all()


# ------------------------------------------------------------------------------- members and seeds
def test_joint_members_seeds_metadata_and_jaccard():
    adapter = clip_adapter()
    kwargs = dict(
        methods="taylor,random",
        budget=Budget(remove=4),
        make_batches=make_batches,
        id_data=image_dataset(24, 0),
        members=3,
        seed=7,
        tower="joint",
        progress=False,
    )
    masks = prune_members(adapter, **kwargs)
    assert masks.named and set(masks.towers) == {"vision", "text"}
    assert masks.towers["vision"].num_heads == 4 and masks.towers["text"].num_heads == 2
    for m in range(3):
        kept = masks.towers["vision"].num_kept(m) + masks.towers["text"].num_kept(m)
        assert kept == 12 - 4
    meta = masks.member_metadata[0]
    assert meta["method"] == "taylor" and meta["seed"] == 7 and meta["tower"] == "joint"
    assert set(meta["scores"]) == {"vision", "text"} and len(meta["scores"]["text"][0]) == 2
    assert len(meta["ranking"]) == 4 and all(len(p) == 3 and p[0] in ("vision", "text") for p in meta["ranking"])
    assert masks.member_metadata[1]["method"] == "random" and masks.member_metadata[1]["seed"] == 8
    # Jaccard over the union of the kept (tower, layer, head) of both towers
    sets = [
        {(t, l, h) for t in ("vision", "text") for l, heads in enumerate(masks.towers[t].kept_heads[m]) for h in heads}
        for m in range(3)
    ]
    expected = len(sets[0] & sets[2]) / len(sets[0] | sets[2])
    assert masks.metadata["pairwise_jaccard"][0][2] == pytest.approx(expected, abs=1e-4)
    assert masks.metadata["tower"] == "joint" and masks.metadata["budget"] == {"heads_per_layer": None, "remove": 4}
    as_list = [{t: masks.towers[t].kept_heads[m] for t in masks.towers} for m in range(3)]
    assert len({repr(k) for k in as_list}) == 3, "seeds must give different members"
    again = prune_members(adapter, **kwargs)
    assert [{t: again.towers[t].kept_heads[m] for t in again.towers} for m in range(3)] == as_list


def test_joint_masks_convert_into_a_matching_hydra_clip(tmp_path):
    from hydra_hf.assemble import convert_checkpoint

    stock = clip_model()
    stock.save_pretrained(tmp_path / "clip")
    adapter = get_adapter(stock, class_text_inputs=prompts())
    masks = prune_members(adapter, methods="taylor-gate,random", budget=Budget(remove=5), make_batches=make_batches,
                          id_data=image_dataset(12, 1), members=2, seed=0, tower="joint", progress=False)
    masks.save(tmp_path / "masks.json")
    hydra = convert_checkpoint(tmp_path / "masks.json", base=tmp_path / "clip", towers=["vision", "text"]).eval()
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(9))
    text = prompts()
    with torch.no_grad():
        out = hydra(pixel_values=x, **text)
        with HeadGates(stock) as hg:
            for m in range(2):
                hg.set({t: masks.towers[t].gates(m) for t in ("vision", "text")})
                ref = stock(pixel_values=x, **text).logits_per_image  # (B, C)
                torch.testing.assert_close(out.member_logits_per_image[:, m], ref, atol=1e-5, rtol=0)
        full = stock(pixel_values=x, **text).logits_per_image
    assert not torch.allclose(out.member_logits_per_image[:, 0], out.member_logits_per_image[:, 1], atol=1e-4)
    assert not torch.allclose(out.member_logits_per_image[:, 0], full, atol=1e-4), "the masks must mask something"


# -------------------------------------------------------------------------------------- errors
def test_joint_errors():
    adapter = clip_adapter()
    bert = get_adapter(tiny_bert(layers=2))
    with pytest.raises(ValueError, match=r"tower='joint'.*only \['text'\].*drop tower="):
        circuit_prune(bert, text_batches(8, 0), None, Budget(remove=1), score="acc", tower="joint", progress=False)
    with pytest.raises(ValueError, match="larger than the 12 heads of both towers"):
        taylor_prune(adapter, images(4, 0), Budget(remove=13), tower="joint", progress=False)
    with pytest.raises(ValueError, match="K <= 2"):
        circuit_prune(
            adapter, images(4, 0), None, Budget(heads_per_layer=3), score="acc", tower="joint", progress=False
        )
    with pytest.raises(ValueError, match="unknown tower 'audio'"):
        taylor_prune(adapter, images(4, 0), Budget(remove=1), tower="audio", progress=False)
    single = HeadMasks(kept_heads=[[[0], [1]]], num_heads=4)
    with pytest.raises(ValueError, match="two-tower masks"):
        prune_members(adapter, methods="random", budget=Budget(remove=1), make_batches=make_batches,
                      id_data=image_dataset(4, 0), members=1, tower="joint", include=single)
