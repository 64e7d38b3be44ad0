"""Taylor importance: planted irrelevant heads rank lowest; the formula; prune-recompute; seeds."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _tiny_models import (
    SIGNAL_HEAD,
    image_batches,
    planted_bert,
    signal_batches,
    text_batches,
    tiny_bert,
    tiny_timm_vit,
    tiny_vit,
)

from hydra_hf.pruning import Budget, get_adapter, select_top, taylor_prune, taylor_scores
from hydra_hf.pruning.gates import zero_head_columns_
from hydra_hf.pruning.taylor import depth_groups


@pytest.mark.parametrize("criterion", ["weight", "gate"])
def test_planted_signal_head_ranks_first_and_irrelevant_heads_last(criterion):
    model = planted_bert()
    adapter = get_adapter(model)
    scores = taylor_scores(adapter, signal_batches(64, 3), criterion=criterion)
    assert scores[SIGNAL_HEAD] > 0
    others = torch.ones_like(scores, dtype=torch.bool)
    others[SIGNAL_HEAD] = False
    assert torch.all(scores[others] < scores[SIGNAL_HEAD] * 1e-3)
    result = taylor_prune(
        adapter, signal_batches(64, 3), Budget(heads_per_layer=1), criterion=criterion, progress=False
    )
    assert result.gates[SIGNAL_HEAD] == 1
    assert result.gates.sum() == 2


def test_zeroed_heads_score_zero_on_random_model():
    model = tiny_bert(layers=2)
    irrelevant = torch.ones(2, 4)
    irrelevant[0, 1] = irrelevant[1, 3] = 0
    zero_head_columns_(model, irrelevant)
    scores = taylor_scores(get_adapter(model), text_batches(32, 0))
    assert scores[0, 1] == 0 and scores[1, 3] == 0
    assert (scores[irrelevant.bool()] > 0).all()
    result = taylor_prune(get_adapter(model), text_batches(32, 0), Budget(heads_per_layer=3), progress=False)
    assert result.gates[0, 1] == 0 and result.gates[1, 3] == 0
    assert sorted(result.removal_order) == [(0, 1), (1, 3)]


def test_weight_scores_match_manual_formula():
    model = tiny_bert(layers=2)
    batch = text_batches(8, 4)[0]
    scores = taylor_scores(get_adapter(model), [batch])
    model.zero_grad()
    logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
    F.cross_entropy(logits, batch["labels"]).backward()
    att = model.bert.encoder.layer[1].attention.self
    h, dk = 2, 8
    manual = torch.stack(
        [(lin.weight * lin.weight.grad)[h * dk : (h + 1) * dk].abs().mean() for lin in (att.query, att.key, att.value)]
    ).mean()
    assert torch.allclose(scores[1, h], manual, rtol=1e-5)


def test_prune_recompute_uses_previous_layers_pruning():
    model = tiny_bert(layers=2)
    adapter = get_adapter(model)
    batches = text_batches(32, 1)
    result = taylor_prune(adapter, batches, Budget(heads_per_layer=2), progress=False)
    fresh = taylor_scores(adapter, batches)
    # layer-1 scores at pruning time were computed with layer 0 pruned, so they differ from fresh scores
    gates_l0 = torch.ones(2, 4)
    gates_l0[0] = result.gates[0]
    expected = taylor_scores(adapter, batches, gates=gates_l0)[1]
    assert torch.allclose(result.scores[1], expected)
    assert not torch.allclose(result.scores[1], fresh[1])
    assert (result.gates.sum(dim=1) == 2).all()


def test_per_layer_rounds_score_groups_of_layers_in_one_recompute():
    assert depth_groups(30, 3) == [list(range(0, 10)), list(range(10, 20)), list(range(20, 30))]
    assert depth_groups(5, 2) == [[0, 1, 2], [3, 4]] and depth_groups(3, 7) == [[0], [1], [2]]
    model = tiny_bert(layers=4)
    adapter = get_adapter(model)
    batches = text_batches(32, 1)
    two = taylor_prune(adapter, batches, Budget(heads_per_layer=2), rounds=2, progress=False)
    # layers 0-1 come from the unpruned model's scores, layers 2-3 from one recompute with layers 0-1 pruned
    fresh = taylor_scores(adapter, batches)
    assert torch.equal(two.scores[:2], fresh[:2])
    pruned_low = torch.ones(4, 4)
    pruned_low[:2] = two.gates[:2]
    assert torch.allclose(two.scores[2:], taylor_scores(adapter, batches, gates=pruned_low)[2:])
    assert not torch.allclose(two.scores[2:], fresh[2:])
    for layer in range(4):
        assert set(torch.nonzero(two.gates[layer]).flatten().tolist()) == set(
            torch.topk(two.scores[layer], 2).indices.tolist())
    assert two.metadata["rounds"] == 2
    # the default is the paper's layer-by-layer schedule, and R >= L rounds is the same schedule
    default = taylor_prune(adapter, batches, Budget(heads_per_layer=2), progress=False)
    assert torch.equal(default.gates, taylor_prune(adapter, batches, Budget(heads_per_layer=2), rounds=4,
                                                   progress=False).gates)
    assert "rounds" not in default.metadata
    with pytest.raises(ValueError, match="rounds must be a positive integer"):
        taylor_prune(adapter, batches, Budget(heads_per_layer=2), rounds=0, progress=False)


def test_global_budget_and_sampling_seeds():
    adapter = get_adapter(tiny_bert(layers=2))
    batches = text_batches(32, 2)
    det = taylor_prune(adapter, batches, Budget(remove=3), progress=False)
    assert det.gates.sum() == 5 and len(det.removal_order) == 3
    a = taylor_prune(adapter, batches, Budget(heads_per_layer=2), seed=0, temperature=1.0, progress=False)
    b = taylor_prune(adapter, batches, Budget(heads_per_layer=2), seed=0, temperature=1.0, progress=False)
    assert torch.equal(a.gates, b.gates)
    others = [
        taylor_prune(adapter, batches, Budget(heads_per_layer=2), seed=s, temperature=1.0, progress=False).gates
        for s in range(1, 6)
    ]
    assert any(not torch.equal(a.gates, g) for g in others)


def test_select_top_ties_and_temperature():
    assert select_top(torch.tensor([1.0, 3.0, 3.0, 0.5]), 2).tolist() == [1, 2]
    g = torch.Generator().manual_seed(0)
    picks = {
        tuple(sorted(select_top(torch.tensor([1.0, 1.0, 1.0, 1.0]), 2, temperature=1.0, generator=g).tolist()))
        for _ in range(20)
    }
    assert len(picks) > 1
    with pytest.raises(ValueError, match="temperature"):
        select_top(torch.ones(3), 1, temperature=-1)


@pytest.mark.parametrize("builder", [tiny_vit, tiny_timm_vit])
def test_taylor_on_vision_models(builder):
    adapter = get_adapter(builder())
    result = taylor_prune(adapter, image_batches(16, 0), Budget(heads_per_layer=2), criterion="weight", progress=False)
    assert (result.gates.sum(dim=1) == 2).all()
    assert (result.scores > 0).any()


def test_taylor_errors():
    adapter = get_adapter(tiny_bert(layers=2))
    with pytest.raises(ValueError, match="labelled"):
        taylor_scores(adapter, [{k: v for k, v in text_batches(8, 0)[0].items() if k != "labels"}])
    with pytest.raises(ValueError, match="larger than"):
        taylor_prune(adapter, text_batches(8, 0), Budget(heads_per_layer=5), progress=False)
    with pytest.raises(ValueError, match="criterion"):
        taylor_scores(adapter, text_batches(8, 0), criterion="nope")
