"""Circuit search: planted heads survive, the cached/batched greedy equals plain Algorithm 1."""

from __future__ import annotations

import pytest
import torch
from _tiny_models import SIGNAL_HEAD, image_batches, planted_bert, signal_batches, text_batches, tiny_bert, tiny_vit

from hydra_hf.pruning import (
    Budget,
    CachedBertEvaluator,
    GatedEvaluator,
    circuit_prune,
    get_adapter,
    reference_circuit_ranking,
)


@pytest.mark.parametrize("score", ["acc", "ood", "avg"])
def test_planted_signal_head_is_kept(score):
    model = planted_bert()
    result = circuit_prune(
        get_adapter(model),
        signal_batches(96, 5),
        signal_batches(96, 6, ood=True),
        Budget(remove=7),
        score=score,
        progress=False,
    )
    assert result.gates.nonzero().tolist() == [list(SIGNAL_HEAD)]
    assert SIGNAL_HEAD not in result.removal_order


def test_circuit_ood_prefers_the_separating_head():
    model = planted_bert()
    adapter = get_adapter(model)
    id_b, ood_b = signal_batches(96, 5), signal_batches(96, 6, ood=True)
    ev = GatedEvaluator(adapter, id_b, ood_b)
    # the signal head separates the planted OOD set; without it MSP is the same for every input
    with_head = ev.score_of(torch.ones(2, 4), "ood")
    without = torch.ones(2, 4)
    without[SIGNAL_HEAD] = 0
    assert with_head > 0.75 and ev.score_of(without, "ood") == pytest.approx(0.5)
    result = circuit_prune(adapter, id_b, ood_b, Budget(heads_per_layer=1), score="ood", progress=False)
    assert result.gates[SIGNAL_HEAD] == 1 and (result.gates.sum(dim=1) == 1).all()


def test_cached_evaluator_matches_plain_scores():
    model = tiny_bert(layers=3, seed=3)
    adapter = get_adapter(model)
    id_b, ood_b = text_batches(40, 1, batch_size=20), text_batches(40, 2, batch_size=20)
    gates = torch.ones(3, 4)
    gates[1, 2] = gates[0, 0] = 0
    candidates = [(l, h) for l in range(3) for h in range(4) if gates[l, h] > 0]
    plain, cached = (
        GatedEvaluator(adapter, id_b, ood_b),
        CachedBertEvaluator(adapter, id_b, ood_b, bucket_size=16, max_rows=1000),
    )
    for score in ("acc", "ood", "avg"):
        assert torch.allclose(
            plain.evaluate(gates, candidates, score), cached.evaluate(gates, candidates, score), atol=1e-12
        )
    assert cached.score_of(gates, "avg") == pytest.approx(plain.score_of(gates, "avg"))


@pytest.mark.parametrize("score", ["ood", "avg"])
def test_fast_greedy_equals_plain_algorithm_1(score):
    model = tiny_bert(layers=3, seed=4)
    id_b, ood_b = text_batches(32, 11, batch_size=16), text_batches(32, 12, batch_size=16)
    reference = reference_circuit_ranking(model, id_b, ood_b, n_remove=4, score=score)
    fast = circuit_prune(get_adapter(model), id_b, ood_b, Budget(remove=4), score=score, progress=False)
    assert fast.removal_order == reference
    plain = circuit_prune(get_adapter(model), id_b, ood_b, Budget(remove=4), score=score, fast=False, progress=False)
    assert plain.removal_order == reference


def test_per_layer_budget_k_heads_per_step_and_vit():
    model = tiny_bert(layers=3, seed=5)
    adapter = get_adapter(model)
    id_b, ood_b = text_batches(32, 1), text_batches(32, 2)
    res = circuit_prune(adapter, id_b, ood_b, Budget(heads_per_layer=2), score="avg", heads_per_step=3, progress=False)
    assert (res.gates.sum(dim=1) == 2).all() and len(res.removal_order) == 6
    assert len(res.metadata["score_history"]) == 3  # unpruned + 2 steps of 3 heads
    vit = get_adapter(tiny_vit())
    res = circuit_prune(vit, image_batches(16, 0), image_batches(16, 1), Budget(remove=3), score="avg", progress=False)
    assert res.gates.sum() == 5


def test_circuit_errors():
    adapter = get_adapter(tiny_bert(layers=2))
    with pytest.raises(ValueError, match="ood-data"):
        circuit_prune(adapter, text_batches(8, 0), None, Budget(remove=1), score="avg", progress=False)
    with pytest.raises(ValueError, match="larger than"):
        circuit_prune(adapter, text_batches(8, 0), text_batches(8, 1), Budget(remove=9), progress=False)
    with pytest.raises(ValueError, match="exactly one budget"):
        Budget(heads_per_layer=1, remove=2)


# ------------------------------------------------------------------ screened (bf16 -> fp32) scoring
def _evaluators(model, **kwargs):
    adapter = get_adapter(model)
    id_b, ood_b = text_batches(48, 21, batch_size=16), text_batches(48, 22, batch_size=16)
    fp32 = CachedBertEvaluator(adapter, id_b, ood_b, precision="fp32")
    return (
        adapter,
        id_b,
        ood_b,
        fp32,
        {p: CachedBertEvaluator(adapter, id_b, ood_b, precision=p, **kwargs) for p in ("bf16", "screened")},
    )


def test_screened_scores_are_float32_where_it_matters():
    model = tiny_bert(layers=3, seed=7)
    _, _, _, fp32, ev = _evaluators(model)
    gates = torch.ones(3, 4)
    gates[1, 1] = 0
    candidates = [(l, h) for l in range(3) for h in range(4) if gates[l, h] > 0]
    exact = fp32.evaluate(gates, candidates, "avg")
    low = ev["bf16"].evaluate(gates, candidates, "avg")
    screened = ev["screened"].evaluate(gates, candidates, "avg")
    assert not torch.equal(low, exact)  # bf16 really rounds differently...
    assert (low - exact).abs().max() < 0.1  # ...but stays close
    confirmed = screened == exact
    # the best candidate is chosen on float32 scores; every unconfirmed one is more than the margin below it
    assert int(screened.argmax()) == int(exact.argmax()) and confirmed[int(exact.argmax())]
    margin = max(ev["screened"].margin, ev["screened"].safety * ev["screened"].max_error)
    assert (screened[~confirmed] < float(screened.max()) - margin).all()
    assert ev["screened"].stats["screened"] == len(candidates)
    assert ev["screened"].stats["confirmed"] == int(confirmed.sum())


def test_screening_margins_bound_the_float32_work():
    model = tiny_bert(layers=3, seed=8)
    adapter, id_b, ood_b, fp32, _ = _evaluators(model)
    candidates = [(l, h) for l in range(3) for h in range(4)]
    gates = torch.ones(3, 4)
    exact = fp32.evaluate(gates, candidates, "ood")
    everything = CachedBertEvaluator(adapter, id_b, ood_b, precision="screened", margin=10.0)
    assert torch.equal(everything.evaluate(gates, candidates, "ood"), exact)  # a huge margin confirms all
    least = CachedBertEvaluator(adapter, id_b, ood_b, precision="screened", margin=0.0, safety=1.0)
    s = least.evaluate(gates, candidates, "ood")
    assert 1 <= least.stats["confirmed"] < len(candidates) or torch.equal(s, exact)
    with pytest.raises(ValueError, match="precision"):
        CachedBertEvaluator(adapter, id_b, ood_b, precision="fp16")
    with pytest.raises(ValueError, match="margin"):
        CachedBertEvaluator(adapter, id_b, ood_b, precision="screened", margin=-1.0)


@pytest.mark.parametrize("score", ["acc", "avg"])
def test_screened_greedy_equals_plain_algorithm_1(score):
    model = tiny_bert(layers=3, seed=4)
    id_b, ood_b = text_batches(32, 11, batch_size=16), text_batches(32, 12, batch_size=16)
    reference = reference_circuit_ranking(model, id_b, ood_b, n_remove=5, score=score)
    screened = circuit_prune(
        get_adapter(model), id_b, ood_b, Budget(remove=5), score=score, precision="screened", progress=False
    )
    assert screened.removal_order == reference
    with pytest.raises(ValueError, match="circuit precision"):
        circuit_prune(get_adapter(model), id_b, ood_b, Budget(remove=1), precision="double", progress=False)


def test_screened_confirms_the_k_best_for_heads_per_step():
    model = tiny_bert(layers=3, seed=9)
    adapter, id_b, ood_b, fp32, ev = _evaluators(model)
    candidates = [(l, h) for l in range(3) for h in range(4)]
    gates = torch.ones(3, 4)
    exact = fp32.evaluate(gates, candidates, "avg")
    screened = ev["screened"].evaluate(gates, candidates, "avg", top=4)
    best4 = torch.sort(-exact, stable=True).indices[:4]
    assert torch.equal(screened[best4], exact[best4])  # the 4 best are float32 scores
    assert set(torch.sort(-screened, stable=True).indices[:4].tolist()) == set(best4.tolist())
    kwargs = dict(score="avg", heads_per_step=3, progress=False)
    a = circuit_prune(adapter, id_b, ood_b, Budget(remove=6), precision="screened", **kwargs)
    b = circuit_prune(adapter, id_b, ood_b, Budget(remove=6), precision="fp32", **kwargs)
    assert a.removal_order == b.removal_order


@pytest.mark.parametrize("fast", [True, False])
def test_criteria_in_lockstep_equal_separate_searches_and_share_work(fast):
    """Hydra (Circ): the lockstep search gives each criterion exactly circuit_prune's member, with a
    per-layer budget, and pays once for the steps the searches share (all of the first step)."""
    from hydra_hf.pruning import circuit_prune_criteria

    model = tiny_bert(layers=3, seed=4)
    adapter = get_adapter(model)
    id_b, ood_b = text_batches(32, 11, batch_size=16), text_batches(32, 12, batch_size=16)
    budget = Budget(heads_per_layer=2)
    together = circuit_prune_criteria(adapter, id_b, ood_b, budget, fast=fast, progress=False)
    assert [r.metadata["method"] for r in together] == ["circuit-acc", "circuit-ood", "circuit-avg"]
    for result, score in zip(together, ("acc", "ood", "avg")):
        alone = circuit_prune(adapter, id_b, ood_b, budget, score=score, fast=fast, progress=False)
        assert result.removal_order == alone.removal_order, score
        assert torch.equal(result.gates, alone.gates) and (result.gates.sum(dim=1) == 2).all()
        assert result.metadata["score_history"] == pytest.approx(alone.metadata["score_history"], abs=1e-12)
        assert result.metadata["evaluations"] == alone.metadata["evaluations"]
    shared = [r.metadata["shared_evaluations"] for r in together]
    assert shared[0] == 0 and all(s >= 12 for s in shared[1:])  # the first step (12 candidates) is paid once
    assert len({tuple(map(tuple, r.removal_order)) for r in together}) > 1  # the criteria do choose differently


def test_prune_members_runs_hydra_circ_in_lockstep(monkeypatch):
    """prune_members with one criterion per member and the whole selection set uses the lockstep
    search; the masks equal member-by-member searches."""
    import datasets

    from hydra_hf.pruning import circuits, prune_members

    model = tiny_bert(layers=2, seed=7)
    adapter = get_adapter(model)
    id_b, ood_b = text_batches(24, 3, batch_size=12), text_batches(24, 4, batch_size=12)
    id_data = datasets.Dataset.from_dict(
        {"text": ["x"] * 24, "label": torch.cat([b["labels"] for b in id_b]).tolist()}
    )
    ood_data = datasets.Dataset.from_dict({"text": ["y"] * 24})
    batches = {id(id_data): id_b, id(ood_data): ood_b}
    calls = []
    real = circuits.circuit_prune_criteria
    monkeypatch.setattr("hydra_hf.pruning.diversity.circuit_prune_criteria",
                        lambda *a, **k: calls.append(k["scores"]) or real(*a, **k))
    masks = prune_members(adapter, methods="circuit-acc,circuit-ood,circuit-avg", budget=Budget(heads_per_layer=2),
                          make_batches=lambda ds, seed: batches[id(ds)], id_data=id_data, ood_data=ood_data, members=3,
                          data_fraction=1.0, progress=False)
    assert calls == [["acc", "ood", "avg"]]
    for m, score in enumerate(("acc", "ood", "avg")):
        alone = circuit_prune(adapter, id_b, ood_b, Budget(heads_per_layer=2), score=score, seed=m, random_ties=True,
                              progress=False)
        assert masks.kept_heads[m] == [torch.nonzero(r).flatten().tolist() for r in alone.gates]
        assert masks.member_metadata[m]["method"] == f"circuit-{score}"


def test_pruning_methods_are_a_registry(monkeypatch):
    """Issue 27 item 4: a pruning method is an object registered by name; adding one is a function and a
    registration, and prune_members, parse_methods, the OOD check and `prune --help` pick it up."""
    import argparse

    import datasets

    from hydra_hf.cli import prune as cli_prune
    from hydra_hf.pruning import PRUNING_METHODS, PruningMethod, prune_members, register_pruning_method, uses_ood
    from hydra_hf.pruning.diversity import parse_methods
    from hydra_hf.pruning.taylor import PruneResult

    assert list(PRUNING_METHODS) == ["taylor", "taylor-gate", "circuit-acc", "circuit-ood", "circuit-avg", "random"]
    assert uses_ood("taylor,circuit-avg") and not uses_ood("circuit-acc,random")

    def keep_first_heads(ctx, member_seed):  # keeps heads 0..K-1 of every layer
        gates = torch.zeros(2, 4)
        gates[:, : ctx.budget.heads_per_layer] = 1
        return PruneResult(gates=gates, scores=torch.zeros(2, 4), removal_order=[], metadata={"seed": member_seed})

    monkeypatch.setitem(
        PRUNING_METHODS, "first", PruningMethod("first", keep_first_heads, needs_labels=False, help="x")
    )
    assert parse_methods("first,taylor") == ["first", "taylor"]
    parser = argparse.ArgumentParser()
    cli_prune.add_parser(parser.add_subparsers())
    assert "first: x" in " ".join(parser._subparsers._group_actions[0].choices["prune"].format_help().split())
    ids = datasets.Dataset.from_dict({"text": ["a"] * 4})
    masks = prune_members(get_adapter(tiny_bert(layers=2)), methods="first", budget=Budget(heads_per_layer=3),
                          make_batches=lambda ds, seed: [], id_data=ids, members=2, progress=False)
    assert masks.kept_heads == [[[0, 1, 2], [0, 1, 2]]] * 2 and masks.member_metadata[1]["method"] == "first"
    with pytest.raises(ValueError, match="already registered"):
        register_pruning_method(PRUNING_METHODS["taylor"])
    with pytest.raises(ValueError, match="circuit-ood need OOD validation data"):
        prune_members(get_adapter(tiny_bert(layers=2)), methods="circuit-ood", budget=Budget(remove=1),
                      make_batches=lambda ds, seed: [], id_data=ids, members=1, progress=False)
