"""HeadGates: gating == zeroing W_O column blocks, all heads of a layer off, gradients, exact restore."""

from __future__ import annotations

import copy

import pytest
import torch
from _tiny_models import image_batches, text_batches, tiny_bert, tiny_hf_clip, tiny_open_clip, tiny_timm_vit, tiny_vit

from hydra_hf.families import get_adapter
from hydra_hf.pruning.gates import HeadGates, zero_head_columns_


def _clip_text(model):
    return {"input_ids": torch.randint(1, 40, (3, 6), generator=torch.Generator().manual_seed(0)),
            "attention_mask": torch.ones(3, 6, dtype=torch.long)}


def _outputs(kind, model):
    """A deterministic output tensor of each architecture (all towers involved)."""
    if kind == "bert":
        b = text_batches(6, 0)[0]
        return model(**{k: v for k, v in b.items() if k != "labels"}).logits
    pixels = image_batches(4, 0)[0]["pixel_values"]
    if kind == "vit":
        return model(pixel_values=pixels).logits
    if kind == "timm":
        return model(pixels)
    if kind == "hf_clip":
        return model(pixel_values=pixels, **_clip_text(model)).logits_per_image
    if kind == "open_clip":
        tokens = torch.randint(1, 40, (3, 8), generator=torch.Generator().manual_seed(0))
        return model.encode_image(pixels) @ model.encode_text(tokens).T


BUILDERS = {
    "bert": tiny_bert,
    "vit": tiny_vit,
    "timm": tiny_timm_vit,
    "hf_clip": tiny_hf_clip,
    "open_clip": tiny_open_clip,
}


def _random_mask(adapter, seed=0):
    g = torch.Generator().manual_seed(seed)
    masks = {}
    for tower, layers in adapter.towers.items():
        m = (torch.rand(len(layers), layers[0].num_heads, generator=g) > 0.5).float()
        m[0] = 0.0  # all heads of layer 0 off
        m[-1, 0] = 1.0
        masks[tower] = m
    return masks


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_gating_equals_zeroed_columns_and_restores(kind):
    model = BUILDERS[kind]()
    adapter = get_adapter(model)
    masks = _random_mask(adapter)
    state_before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        base = _outputs(kind, model)
        with HeadGates(model) as hg:
            hg.set(masks)
            gated = _outputs(kind, model)
        ref_model = zero_head_columns_(copy.deepcopy(model), masks)
        ref = _outputs(kind, ref_model)
        restored = _outputs(kind, model)
    assert torch.allclose(gated, ref, atol=1e-6), (gated - ref).abs().max()
    assert not torch.allclose(gated, base, atol=1e-4), "the mask must change the output"
    assert torch.equal(restored, base)
    state_after = model.state_dict()
    assert list(state_after) == list(state_before)
    assert all(torch.equal(state_after[k], state_before[k]) for k in state_before)


def test_all_heads_off_keeps_bias_only():
    model = tiny_bert()
    layer0 = get_adapter(model).towers["text"][0]
    x = torch.randn(2, 5, 32)
    with HeadGates(model) as hg:
        off = torch.ones(2, 4)
        off[0] = 0
        hg.set(off)
        out = layer0.out_proj(x)
    assert torch.allclose(out, layer0.out_proj.bias.expand_as(out))
    b = text_batches(4, 1)[0]
    with HeadGates(model) as hg, torch.no_grad():
        hg.set(torch.zeros(2, 4))
        logits = model(**{k: v for k, v in b.items() if k != "labels"}).logits
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("kind", ["bert", "timm", "open_clip"])
def test_gate_gradient_matches_finite_difference(kind):
    torch.set_default_dtype(torch.float64)
    try:
        model = BUILDERS[kind]().double()
        with HeadGates(model, requires_grad=True) as hg:
            tower = next(iter(hg.tower_gates))
            gates = hg.tower_gates[tower]
            with torch.no_grad():
                gates.mul_(0.7)  # a soft point, away from 1
            out = _outputs(kind, model).double().square().sum()
            out.backward()
            grad = gates.grad.clone()
            eps = 1e-6
            for layer, head in [(0, 1), (1, 3)]:
                with torch.no_grad():
                    gates[layer, head] += eps
                    up = _outputs(kind, model).square().sum()
                    gates[layer, head] -= 2 * eps
                    down = _outputs(kind, model).square().sum()
                    gates[layer, head] += eps
                fd = (up - down) / (2 * eps)
                assert torch.allclose(grad[layer, head], fd, rtol=1e-5, atol=1e-8), (grad[layer, head], fd)
            assert grad.abs().sum() > 0
    finally:
        torch.set_default_dtype(torch.float32)


def test_double_gates_and_bad_shapes_raise():
    model = tiny_bert()
    hg = HeadGates(model)
    with pytest.raises(ValueError, match="already has head gates"):
        HeadGates(model)
    with pytest.raises(ValueError, match=r"shape \(2, 4\)"):
        hg.set(torch.ones(3, 4))
    hg.remove()
    HeadGates(model).remove()  # gates can be added again after remove()


def test_clip_towers_and_adapter_errors():
    model = tiny_hf_clip()
    with HeadGates(model) as hg:
        assert set(hg.tower_gates) == {"vision", "text"}
        with pytest.raises(ValueError, match="towers"):
            _ = hg.gates
    with pytest.raises(TypeError, match="does not support"):
        get_adapter(torch.nn.Linear(2, 2))
