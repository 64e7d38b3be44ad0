"""The fused ViT Hydra model against its references: stock transformers ViT and stock timm ViT where
each member's removed heads are zeroed in W_O. Numbers, not shapes."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import write_masks
from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

from hydra_hf.assemble import convert_checkpoint
from hydra_hf.convert import unfuse_vit
from hydra_hf.masks import HeadMasks

ATOL = 1e-5
H, DK = 4, 8
UNEQUAL = [  # 3 members x 3 layers, unequal widths, member 1 keeps 0 heads in layer 2
    [[0, 1], [2, 3], [1]],
    [[1, 2, 3], [0], []],
    [[0], [0, 1, 2, 3], [0, 2]],
]
UNIFORM = [[[0, 1], [2, 3], [1, 2]], [[1, 3], [0, 1], [0, 3]], [[2, 3], [1, 2], [0, 1]]]


def tiny_vit_config(**overrides) -> ViTConfig:
    kwargs = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=H, intermediate_size=64, image_size=16,
                  patch_size=8, num_labels=3, initializer_range=0.2, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0)
    kwargs.update(overrides)
    return ViTConfig(**kwargs)


def tiny_timm_vit(seed: int = 0, **overrides):
    import timm

    torch.manual_seed(seed)
    kwargs = dict(num_classes=3, img_size=16, patch_size=8, embed_dim=32, depth=3, num_heads=H)
    kwargs.update(overrides)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, **kwargs).eval()
    with torch.no_grad():  # timm initialises biases and the class token to zero: make them matter
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def save_timm(model, folder):
    from timm.models import save_for_hf

    save_for_hf(model, str(folder), safe_serialization=True)
    return folder


@pytest.fixture
def hf_vit_dir(tmp_path):
    """A saved stock ViTForImageClassification (3 labels) with its image processor."""
    torch.manual_seed(0)
    model = ViTForImageClassification(tiny_vit_config(id2label={0: "cat", 1: "dog", 2: "bird"})).eval()
    folder = tmp_path / "tiny-vit"
    model.save_pretrained(folder)
    ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(folder)
    return folder


@pytest.fixture
def timm_vit_dir(tmp_path):
    return save_timm(tiny_timm_vit(), tmp_path / "tiny-timm-vit")


def pixels(batch: int = 2, size: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


def zero_removed_vit(model, kept_member, dk: int = DK):
    """Reference: a stock HF ViT (transformers 5 modules) with each removed head's W_O columns zeroed."""
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for layer, heads in enumerate(kept_member):
            w = ref.vit.layers[layer].attention.o_proj.weight  # (d, H*dk)
            for h in range(w.shape[1] // dk):
                if h not in heads:
                    w[:, h * dk : (h + 1) * dk] = 0
    return ref.eval()


def zero_removed_timm(model, kept_member, dk: int = DK):
    """Reference: a stock timm ViT with each removed head's ``attn.proj`` columns zeroed."""
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for layer, heads in enumerate(kept_member):
            w = ref.blocks[layer].attn.proj.weight  # (d, H*dk)
            for h in range(w.shape[1] // dk):
                if h not in heads:
                    w[:, h * dk : (h + 1) * dk] = 0
    return ref.eval()


def _check_ensemble(out, ref_member_logits):
    torch.testing.assert_close(out.member_logits, ref_member_logits, atol=ATOL, rtol=0)
    expected = torch.log(torch.softmax(ref_member_logits, -1).mean(1))
    torch.testing.assert_close(out.logits, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("kept", [UNIFORM, UNEQUAL], ids=["uniform", "unequal"])
def test_hf_vit_matches_reference(hf_vit_dir, attn, kept):
    base = ViTForImageClassification.from_pretrained(hf_vit_dir, attn_implementation="eager").eval()
    model = convert_checkpoint(HeadMasks(kept_heads=kept, num_heads=H), base=hf_vit_dir)
    model.set_attn_implementation(attn)
    x = pixels(3)
    with torch.no_grad():
        ref = torch.stack([zero_removed_vit(base, k)(x).logits for k in kept], dim=1)  # (B, M, C)
        out = model(x)
    _check_ensemble(out, ref)
    assert model.config.id2label == {0: "cat", 1: "dog", 2: "bird"}


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_timm_vit_matches_reference(timm_vit_dir, attn):
    stock = tiny_timm_vit()
    model = convert_checkpoint(HeadMasks(kept_heads=UNEQUAL, num_heads=H), base=timm_vit_dir)
    assert model.config.base_config["layer_norm_eps"] == 1e-6 and model.config.base_model_type == "vit"
    model.set_attn_implementation(attn)
    x = pixels(2)
    with torch.no_grad():
        ref = torch.stack([zero_removed_timm(stock, k)(x) for k in UNEQUAL], dim=1)
        out = model(x)
    _check_ensemble(out, ref)


def test_timm_mid_size_members(tmp_path):
    """A mid-size timm ViT (d=192, 4 layers x 6 heads, 64px / 8px patches = 65 tokens), three members
    fine-tuned differently, 4 of 6 heads each, one MLP per member: exact per member."""
    members = [
        tiny_timm_vit(seed, img_size=64, embed_dim=192, depth=4, num_heads=6, num_classes=10) for seed in (0, 1, 2)
    ]
    with torch.no_grad():  # members share the embeddings (a Hydra shares them)
        for m in members[1:]:
            for name in ("cls_token", "pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias"):
                m.get_parameter(name).copy_(members[0].get_parameter(name))
    dirs = [save_timm(m, tmp_path / f"m{i}") for i, m in enumerate(members)]
    g = torch.Generator().manual_seed(0)
    kept = [[sorted(torch.randperm(6, generator=g)[:4].tolist()) for _ in range(4)] for _ in range(3)]
    model = convert_checkpoint(HeadMasks(kept_heads=kept, num_heads=6), members=dirs, mlp_fusion="per_member")
    x = pixels(2, size=64)
    with torch.no_grad():
        ref = torch.stack([zero_removed_timm(m, k, dk=32)(x) for m, k in zip(members, kept)], dim=1)
        out = model(x)
    _check_ensemble(out, ref)
    assert (ref[:, 0] - ref[:, 1]).abs().max() > 1e-3  # the members really differ


def test_distinct_members_average_mlp(hf_vit_dir, tmp_path):
    """Members fine-tuned separately, MLPs averaged: each member equals the stock model with the
    averaged MLP (and differs from the exact member, so the averaging is real)."""
    base = ViTForImageClassification.from_pretrained(hf_vit_dir).eval()
    members, dirs = [], []
    for seed in (1, 2, 3):
        m = copy.deepcopy(base)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in m.named_parameters():
                if "embeddings" not in name:
                    p.add_(0.05 * torch.randn(p.shape, generator=g))
        m.save_pretrained(tmp_path / f"member{seed}")
        members.append(m)
        dirs.append(tmp_path / f"member{seed}")
    model = convert_checkpoint(HeadMasks(kept_heads=UNEQUAL, num_heads=H), members=dirs, mlp_fusion="average")
    averaged = [copy.deepcopy(m) for m in members]
    with torch.no_grad():
        for i in range(3):
            for name in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"):
                mean = torch.stack([m.vit.layers[i].mlp.get_parameter(name) for m in members]).double().mean(0).float()
                for a in averaged:
                    a.vit.layers[i].mlp.get_parameter(name).copy_(mean)
    x = pixels(2)
    with torch.no_grad():
        ref = torch.stack([zero_removed_vit(a, k)(x).logits for a, k in zip(averaged, UNEQUAL)], dim=1)
        exact = torch.stack([zero_removed_vit(m, k)(x).logits for m, k in zip(members, UNEQUAL)], dim=1)
        out = model(x)
    _check_ensemble(out, ref)
    assert (exact - ref).abs().max() > 1e-3


def test_masks_are_not_ignored(hf_vit_dir):
    base = ViTForImageClassification.from_pretrained(hf_vit_dir).eval()
    x = pixels(2)
    full = HeadMasks(kept_heads=[[list(range(H))] * 3] * 3, num_heads=H)
    with torch.no_grad():
        stock = base(x).logits
        full_out = convert_checkpoint(full, base=hf_vit_dir)(x).member_logits
        pruned_out = convert_checkpoint(HeadMasks(kept_heads=UNIFORM, num_heads=H), base=hf_vit_dir)(x).member_logits
    for m in range(3):
        torch.testing.assert_close(full_out[:, m], stock, atol=ATOL, rtol=0)
        assert (pruned_out[:, m] - stock).abs().max() > 1e-3
    assert (pruned_out[:, 0] - pruned_out[:, 1]).abs().max() > 1e-3


def test_outputs_loss_and_attentions(hf_vit_dir):
    model = convert_checkpoint(HeadMasks(kept_heads=UNEQUAL, num_heads=H), base=hf_vit_dir)
    model.set_attn_implementation("eager")
    x, labels = pixels(4), torch.tensor([0, 1, 2, 1])
    out = model(x, labels=labels, output_attentions=True, output_hidden_states=True, output_member_hidden_states=True)
    expected = sum(torch.nn.functional.cross_entropy(out.member_logits[:, m], labels) for m in range(3)) / 3
    torch.testing.assert_close(out.loss, expected)
    assert out.member_logits.shape == (4, 3, 3) and out.logits.shape == (4, 3)
    assert [a.shape[1] for a in out.attentions] == [6, 7, 3]  # all members' kept heads per layer
    assert len(out.hidden_states) == 4 and out.hidden_states[-1].shape == (4, 5, 32)  # the members' mean
    assert len(out.member_hidden_states) == 4 and out.member_hidden_states[-1].shape == (4, 3, 5, 32)
    out.loss.backward()
    for name in ("hydra.layers.0.attention.qkv_weight", "hydra.layers.0.norm1.weight", "hydra.layernorm.weight",
                 "hydra.embeddings.cls_token", "classifier.weight"):
        grad = model.get_parameter(name).grad
        assert grad is not None and grad.abs().sum() > 0, name


@pytest.mark.parametrize("names", ["checkpoint", "module"])
def test_unfuse_vit_gives_stock_members(hf_vit_dir, tmp_path, names):
    from safetensors.torch import save_file

    model = convert_checkpoint(HeadMasks(kept_heads=UNEQUAL, num_heads=H), base=hf_vit_dir, mlp_fusion="per_member")
    x = pixels(2)
    with torch.no_grad():
        fused = model(x).member_logits
    for m, sd in enumerate(unfuse_vit(model.state_dict(), model.config, names=names)):
        if names == "module":
            stock = ViTForImageClassification(tiny_vit_config()).eval()
            stock.load_state_dict(sd, strict=True)
        else:  # written as a stock checkpoint folder, loaded by from_pretrained
            folder = tmp_path / f"member{m}"
            ViTForImageClassification(tiny_vit_config()).save_pretrained(folder)
            save_file(
                {k: v.contiguous() for k, v in sd.items()},
                str(folder / "model.safetensors"),
                metadata={"format": "pt"},
            )
            stock = ViTForImageClassification.from_pretrained(folder).eval()
        with torch.no_grad():
            torch.testing.assert_close(stock(x).logits, fused[:, m], atol=ATOL, rtol=0)


def test_bad_pixel_values(hf_vit_dir):
    model = convert_checkpoint(HeadMasks(kept_heads=UNIFORM, num_heads=H), base=hf_vit_dir)
    with pytest.raises(ValueError, match="has 1 channels but the model takes 3"):
        model(torch.randn(1, 1, 16, 16))
    with pytest.raises(ValueError, match=r"are 24x24 but the model takes 16x16.*interpolate_pos_encoding=True"):
        model(torch.randn(1, 3, 24, 24))
    with pytest.raises(ValueError, match="add the batch dimension"):
        model(torch.randn(3, 16, 16))
    # interpolation is opt-in, as in the stock model, and gives the stock model's numbers
    base = ViTForImageClassification.from_pretrained(hf_vit_dir).eval()
    full = convert_checkpoint(HeadMasks(kept_heads=[[list(range(H))] * 3], num_heads=H), base=hf_vit_dir)
    x = pixels(1, size=32)
    with torch.no_grad():
        torch.testing.assert_close(
            full(x, interpolate_pos_encoding=True).logits.exp(),
            base(x, interpolate_pos_encoding=True).logits.softmax(-1), atol=ATOL, rtol=0,
        )


def test_unknown_timm_layouts_are_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = save_timm(tiny_timm_vit(), tmp_path / "timm")
    masks = write_masks(tmp_path / "m.json", UNIFORM, H)
    state = load_file(str(folder / "model.safetensors"))
    save_file({**state, "blocks.0.ls1.gamma": torch.ones(32)}, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=r"unknown timm ViT layout: tensors blocks\.0\.ls1\.gamma"):
        convert_checkpoint(masks, base=folder)
    avg = save_timm(tiny_timm_vit(global_pool="avg"), tmp_path / "timm-avg")
    with pytest.raises(ValueError, match="global_pool"):
        convert_checkpoint(masks, base=avg)
