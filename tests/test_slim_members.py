"""Slim members (members that keep subsets of the MLP neurons too), numbers not shapes, for every family of
the shared suite (``_family_specs.SPECS``):

- every slim member == the stock model with its removed heads' W_O column blocks and its removed neurons'
  down-projection input columns zeroed (fp32, eager and sdpa, padded batches), unequal widths with a
  0-head and a 0-neuron layer, per-member MLPs (3 checkpoints) and the averaged MLP (equal widths: the
  batched path); the neurons really matter (the heads-only reference differs);
- unfuse -> the family's stock model reproduces each slim member;
- parameters follow the kept sizes.
"""

from __future__ import annotations

import copy

import pytest
import torch
from _family_specs import SPECS, FamilySpec, inputs, perturbed

from hydra_hf.assemble import convert_checkpoint
from hydra_hf.families import get_family
from hydra_hf.masks import HeadMasks
from hydra_hf.pruning.gates import zero_head_columns_
from hydra_hf.pruning.neurons import mlp_shapes, zero_removed_neurons_

ATOL = 1e-5
H = 4
UNEQUAL = [[[0, 1], [2, 3]], [[1, 2, 3], []], [[0], [0, 1, 2, 3]]]  # member 1 keeps no head in layer 1
ids = [s.name for s in SPECS]


def slim_neurons(inner: int) -> list[list[list[int]]]:
    """Three members over 2 layers of ``inner`` neurons: unequal widths, member 2 keeps no neuron in layer 0."""
    return [
        [list(range(0, inner, 2)), list(range(inner // 3))],
        [list(range(1, inner, 3)), list(range(inner // 2, inner))],
        [[], [0, inner - 1]],
    ]


def split_neurons(inner: int, members: int = 3, layers: int = 2) -> list[list[list[int]]]:
    """Members splitting every layer's neurons (equal widths: the batched path)."""
    return [[list(range(m, inner, members))[: inner // members] for _ in range(layers)] for m in range(members)]


def reference(spec: FamilySpec, model: torch.nn.Module, heads: list[list[int]], neurons: list[list[int]]) -> torch.nn.Module:
    """A copy of a stock model with the removed heads' W_O column blocks and removed neurons' columns zeroed."""
    ref = copy.deepcopy(model)
    family = get_family(spec.name)
    adapter = family.adapter(ref)  # ALBERT: unties its shared layers first
    gates = torch.zeros(len(heads), H)
    for layer, kept in enumerate(heads):
        gates[layer, kept] = 1.0
    zero_head_columns_(ref, gates, adapter=adapter)
    zero_removed_neurons_(ref, family, {family.towers[0]: neurons})
    return ref.eval()


def _logits(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch).logits


def _inner(spec: FamilySpec, model: torch.nn.Module) -> int:
    family = get_family(spec.name)
    probe = copy.deepcopy(model)
    if spec.name == "albert":
        family.adapter(probe)
    return mlp_shapes(probe, family)[family.towers[0]][1]


@pytest.mark.parametrize("spec", SPECS, ids=ids)
def test_slim_members_equal_the_zeroed_references(spec, tmp_path):
    base = spec.stock()
    inner = _inner(spec, base)
    neurons = slim_neurons(inner)
    members = [perturbed(base, seed) for seed in (1, 2, 3)]
    folders = []
    for i, member in enumerate(members):
        member.save_pretrained(tmp_path / f"m{i}")
        folders.append(tmp_path / f"m{i}")
    masks = HeadMasks(kept_heads=UNEQUAL, num_heads=H, kept_neurons=neurons, intermediate_size=inner)
    model = convert_checkpoint(masks, members=folders, mlp_fusion="per_member")
    assert model.config.slim and model.config.kept_neurons == neurons
    batch = inputs(spec, base)
    refs = [reference(spec, member, UNEQUAL[m], neurons[m]) for m, member in enumerate(members)]
    heads_only = [reference(spec, member, UNEQUAL[m], [list(range(inner))] * 2) for m, member in enumerate(members)]
    for attn in ("sdpa", "eager"):
        model.set_attn_implementation(attn)
        with torch.no_grad():
            got = model(**batch).member_logits  # (B, M, C)
        for m, ref in enumerate(refs):
            ref.set_attn_implementation(attn)
            heads_only[m].set_attn_implementation(attn)
            expected = _logits(ref, batch)
            torch.testing.assert_close(got[:, m], expected, atol=ATOL, rtol=0)
            assert (expected - _logits(heads_only[m], batch)).abs().max() > 1e-3  # the neurons matter
    # parameters follow the kept sizes: the slim MLPs hold exactly the kept neurons' weights
    full = convert_checkpoint(HeadMasks(kept_heads=UNEQUAL, num_heads=H), members=folders, mlp_fusion="per_member")
    kept = sum(len(n) for member in neurons for n in member)
    saved = sum(p.numel() for p in full.parameters()) - sum(p.numel() for p in model.parameters())
    per_neuron = saved / (3 * 2 * inner - kept)
    assert per_neuron == pytest.approx(round(per_neuron)) and round(per_neuron) in (2 * 32 + 1, 3 * 32 + 2, 3 * 32)


@pytest.mark.parametrize("spec", SPECS, ids=ids)
def test_slim_members_of_the_averaged_mlp_and_unfuse(spec, tmp_path):
    """One checkpoint, averaged MLP, members splitting every layer's neurons (equal widths); unfuse gives stock
    members that reproduce them."""
    base = spec.stock()
    base.save_pretrained(tmp_path / "base")
    inner = _inner(spec, base)
    neurons = split_neurons(inner)
    masks = HeadMasks(kept_heads=UNEQUAL, num_heads=H, kept_neurons=neurons, intermediate_size=inner)
    model = convert_checkpoint(masks, base=tmp_path / "base")
    batch = inputs(spec, base)
    for attn in ("sdpa", "eager"):
        model.set_attn_implementation(attn)
        with torch.no_grad():
            got = model(**batch).member_logits
        for m in range(3):
            ref = reference(spec, base, UNEQUAL[m], neurons[m])
            ref.set_attn_implementation(attn)
            torch.testing.assert_close(got[:, m], _logits(ref, batch), atol=ATOL, rtol=0)
    family = get_family(spec.name)
    for m, state in enumerate(family.unfuse(model.state_dict(), model.config)):
        stock = family.stock_model(model.config.base_config, num_labels=3).eval()
        missing, unexpected = stock.load_state_dict(state, strict=False)
        assert not unexpected and all("position_ids" in k or "pooler" in k for k in missing), (missing, unexpected)
        torch.testing.assert_close(_logits(stock, batch), got[:, m], atol=ATOL, rtol=0)
