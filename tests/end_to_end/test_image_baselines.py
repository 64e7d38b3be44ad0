"""The image testbed's baselines (examples/ceiling_image.py --baselines): the Packed-Ensembles ViT's estimators are
independent sub-networks of one model, its prediction is the mean of their softmaxes, and its multiply-adds are
about one Single's by the same FLOP counter that agrees with hydra_hf.cost on a Hydra."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from transformers import ViTConfig

from hydra_hf import convert_checkpoint
from hydra_hf.evaluation import ModelPredictor, Predictions, predict
from hydra_hf.finetune.trainer import _decay_groups
from hydra_hf.masks import HeadMasks

pytest.importorskip("torch_uncertainty")  # PackedLinear: the dev extra installs it

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ceiling_image.py"
M, ALPHA, GAMMA, CLASSES = 3, 1.5, 2, 4


@pytest.fixture(scope="module")
def ci():
    spec = importlib.util.spec_from_file_location("ceiling_image", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tiny() -> ViTConfig:
    # packed width 32 * 1.5 = 48: 3 estimators of 16 channels, 2 heads each, linear layers in 2 groups per estimator
    return ViTConfig(image_size=8, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=2, intermediate_size=64, hidden_dropout_prob=0.1, num_labels=CLASSES)


def _packed(ci, seed: int = 0):
    torch.manual_seed(seed)
    return ci.PackedViT(_tiny(), num_estimators=M, alpha=ALPHA, gamma=GAMMA).eval()


def _estimator_part(name: str, param: torch.Tensor, m: int) -> tuple[slice, ...]:
    """The index of estimator ``m``'s share of a parameter of the packed model."""
    if param.dim() == 3 and name.endswith("weight"):  # PackedLinear (groups, out, in): estimator-major groups
        return (slice(m * param.shape[0] // M, (m + 1) * param.shape[0] // M),)
    if ".norm" in f".{name}":  # EstimatorLayerNorm (M, width)
        return (m,)
    if name in ("cls_token", "position_embeddings"):  # (1, T, M*width)
        w = param.shape[-1] // M
        return (..., slice(m * w, (m + 1) * w))
    w = param.shape[0] // M  # the patch embedding's output channels, every bias: estimator-major blocks
    return (slice(m * w, (m + 1) * w),)


def test_forward_gives_one_row_of_logits_per_estimator(ci):
    model = _packed(ci)
    pixels = torch.randn(5, 3, 8, 8)
    with torch.no_grad():
        out = model(pixel_values=pixels).member_logits
        again = model(pixel_values=pixels).member_logits
        one = model(pixel_values=pixels[:1]).member_logits
    assert out.shape == (5, M, CLASSES)
    assert torch.equal(out, again)  # eval: dropout off
    torch.testing.assert_close(one, out[:1], atol=1e-5, rtol=0)  # images do not see each other
    assert (out[:, 0] - out[:, 1]).abs().max() > 1e-3  # the estimators start apart (their own initialisations)
    model.train()
    with torch.no_grad():
        assert not torch.equal(model(pixel_values=pixels).member_logits, out)  # dropout on in training


def test_estimators_are_independent_sub_networks(ci):
    """Every parameter element belongs to exactly one estimator, and changing one estimator's elements changes
    that estimator's logits and no other's (bit for bit)."""
    model = _packed(ci)
    owners = {n: torch.zeros_like(p, dtype=torch.long) for n, p in model.named_parameters()}
    for m in range(M):
        for n, p in model.named_parameters():
            owners[n][_estimator_part(n, p, m)] += 1
    assert all(bool((o == 1).all()) for o in owners.values())  # a partition: nothing shared, nothing left out
    pixels = torch.randn(4, 3, 8, 8)
    with torch.no_grad():
        before = model(pixel_values=pixels).member_logits
    g = torch.Generator().manual_seed(1)
    for m in range(M):
        changed = _packed(ci)
        with torch.no_grad():
            for n, p in changed.named_parameters():
                part = p[_estimator_part(n, p, m)]
                part += 0.1 * torch.randn(part.shape, generator=g)
                p[_estimator_part(n, p, m)] = part
            after = changed(pixel_values=pixels).member_logits
        others = [k for k in range(M) if k != m]
        assert torch.equal(after[:, others], before[:, others])
        assert (after[:, m] - before[:, m]).abs().max() > 1e-3


def test_prediction_is_the_mean_of_the_estimators_softmaxes(ci):
    model = _packed(ci)
    g = torch.Generator().manual_seed(2)
    batches = [
        {"pixel_values": torch.randn(6, 3, 8, 8, generator=g), "labels": torch.randint(0, CLASSES, (6,), generator=g)}
        for _ in range(2)
    ]
    preds = predict(ModelPredictor(model), batches)
    with torch.no_grad():
        # (N, M, C)
        logits = torch.cat([model(pixel_values=b["pixel_values"]).member_logits for b in batches]).double()
    labels = torch.cat([b["labels"] for b in batches])
    mean_softmax = logits.softmax(-1).mean(1)  # (N, C)
    torch.testing.assert_close(preds.probs, mean_softmax, atol=1e-6, rtol=0)
    assert not torch.allclose(mean_softmax, logits.mean(1).softmax(-1), atol=1e-4)  # not the softmax of mean logits
    ood = Predictions(preds.member_logits, None)
    numbers = ci.numbers_of({"id": preds, **{k: ood for k in ci.KINDS}})
    nll = -mean_softmax[torch.arange(len(labels)), labels].log().mean()
    assert numbers["nll"] == pytest.approx(float(nll), abs=1e-5)
    assert numbers["accuracy"] == pytest.approx(float((mean_softmax.argmax(-1) == labels).double().mean()))


def test_counted_compute_packed_about_one_single_mc_dropout_t_singles_hydra_as_its_masks(ci, tmp_path):
    """On the testbed's ViT (one 28x28 image): Packed-Ensembles (M = 3, alpha 2.25, gamma 2) 1.05-1.15x a Single's
    multiply-adds (1.096 counted), MC Dropout T passes T x; and the same counter on a fused Hydra (3 members
    keeping 4 of 8 heads per layer) within 5 % of hydra_hf.cost's ratio from its masks (the counter also sees the
    patch embedding, once for all members, and the members' classifiers)."""
    base = ci.base_model(tmp_path / "init", 0)
    kept = [[list(range(4 * (m % 2), 4 * (m % 2) + 4)) if layer % 2 else [m, m + 1, m + 3, 7] for layer in range(4)]
            for m in range(3)]
    hydra = convert_checkpoint(HeadMasks(kept_heads=kept, num_heads=8), base=base).eval()
    attention = hydra.config._attn_implementation
    compute = ci.baseline_compute(ci.testbed_config(), {"hydra": hydra}, mc_samples=2)
    assert 1.05 <= compute["packed"]["counted_x"] <= 1.15
    assert compute["mc_dropout"]["counted_x"] == pytest.approx(2.0, abs=1e-9)  # T passes: T Singles
    counted, masks = compute["hydra"]["counted_x"], compute["hydra"]["masks_x"]
    assert masks > 2.0  # three whole MLPs: the paper's Hydra, far from one Single
    assert counted == pytest.approx(masks, rel=0.05)
    assert hydra.config._attn_implementation == attention  # left as it was found


def test_packed_layer_norms_and_biases_take_no_weight_decay_as_the_singles(ci):
    model = _packed(ci)
    decay, plain = _decay_groups(model, 0.05)
    plain_ids = {id(p) for p in plain["params"]}
    for name, param in model.named_parameters():
        exempt = name.endswith("bias") or ".norm" in f".{name}"
        assert (id(param) in plain_ids) == exempt, name
    assert decay["weight_decay"] == 0.05 and plain["weight_decay"] == 0.0
