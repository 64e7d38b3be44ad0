"""The fused CLIP Hydra model against its references: stock transformers CLIP and stock open_clip
where each member's removed heads are zeroed in ``out_proj``, per tower. Numbers, not shapes."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from transformers import CLIPConfig, CLIPModel

from hydra_hf.assemble import convert_checkpoint
from hydra_hf.convert import unfuse_clip
from hydra_hf.masks import HeadMasks, load_masks

ATOL = 1e-5
H, DK = 4, 8
VOCAB, EOS, BOS = 60, 59, 58
VISION_KEPT = [[[0, 1], [2, 3], [1]], [[1, 2, 3], [0], []], [[0], [0, 1, 2, 3], [0, 2]]]  # 3 layers, a 0-head layer
TEXT_KEPT = [[[0, 1], []], [[3], [0, 1]], [[0, 2], [1, 2, 3]]]  # 2 layers
OPEN_CLIP_CFG = {
    "embed_dim": 24,
    "vision_cfg": {"image_size": 16, "layers": 3, "width": 32, "patch_size": 8, "head_width": DK},
    "text_cfg": {"context_length": 12, "vocab_size": VOCAB, "width": 32, "heads": H, "layers": 2},
}


def two_tower_masks(vision=VISION_KEPT, text=TEXT_KEPT) -> HeadMasks:
    towers = {}
    if vision is not None:
        towers["vision"] = HeadMasks(kept_heads=vision, num_heads=H)
    if text is not None:
        towers["text"] = HeadMasks(kept_heads=text, num_heads=H)
    return HeadMasks(towers=towers)


def tiny_clip_config(eos_token_id: int = EOS) -> CLIPConfig:
    return CLIPConfig(
        text_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=H, intermediate_size=64,
                         vocab_size=VOCAB, max_position_embeddings=12, eos_token_id=eos_token_id, bos_token_id=BOS,
                         pad_token_id=EOS),
        vision_config=dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=H, intermediate_size=64,
                           image_size=16, patch_size=8),
        projection_dim=24,
    )


def perturb(model, scale: float = 0.1, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return model


@pytest.fixture
def hf_clip_dir(tmp_path):
    torch.manual_seed(0)
    folder = tmp_path / "tiny-clip"
    perturb(CLIPModel(tiny_clip_config()).eval()).save_pretrained(folder)
    return folder


def tiny_open_clip(seed: int = 0, cfg: dict | None = None):
    import open_clip

    torch.manual_seed(seed)
    return perturb(open_clip.CLIP(**(cfg or OPEN_CLIP_CFG)).eval(), seed=seed)


def save_open_clip(model, folder, cfg: dict | None = None):
    """An open_clip Hub-style folder: open_clip_config.json + open_clip_model.safetensors."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "open_clip_model.safetensors"))
    (folder / "open_clip_config.json").write_text(json.dumps({
        "model_cfg": cfg or OPEN_CLIP_CFG,
        "preprocess_cfg": {"mean": [0.48145466, 0.4578275, 0.40821073], "std": [0.26862954, 0.26130258, 0.27577711]},
    }))
    return folder


@pytest.fixture
def open_clip_dir(tmp_path):
    return save_open_clip(tiny_open_clip(), tmp_path / "tiny-open-clip")


def text_batch(eos: int = EOS, length: int = 12):
    """Three texts with padding after the end-of-text token (padded with ``eos``, as CLIP tokenizers do),
    plus the 1/0 attention mask. The largest id is the end-of-text token (legacy argmax pooling)."""
    rows = [[BOS, 5, 6, 7, eos], [BOS, 9, eos], [BOS, 3, 4, 5, 6, 7, 8, 9, 10, eos]]
    ids = torch.full((3, length), eos, dtype=torch.long)
    mask = torch.zeros(3, length, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    return ids, mask


def pixels(batch: int = 2, size: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


def _zero(blocks, kept_member, out_proj):
    with torch.no_grad():
        for layer, heads in enumerate(kept_member):
            w = out_proj(blocks[layer]).weight  # (d, H*dk)
            for h in range(H):
                if h not in heads:
                    w[:, h * DK : (h + 1) * DK] = 0


def zero_removed_clip(model, vision_member, text_member):
    ref = copy.deepcopy(model)
    _zero(ref.vision_model.encoder.layers, vision_member, lambda b: b.self_attn.out_proj)
    _zero(ref.text_model.encoder.layers, text_member, lambda b: b.self_attn.out_proj)
    return ref.eval()


def zero_removed_open_clip(model, vision_member, text_member):
    ref = copy.deepcopy(model)
    _zero(ref.visual.transformer.resblocks, vision_member, lambda b: b.attn.out_proj)
    _zero(ref.transformer.resblocks, text_member, lambda b: b.attn.out_proj)
    return ref.eval()


def _check_zero_shot(out, ref_logits_per_image):
    """``ref_logits_per_image (B, M, N)``: member m's stock logits."""
    torch.testing.assert_close(out.member_logits_per_image, ref_logits_per_image, atol=ATOL, rtol=0)
    expected = torch.log(torch.softmax(ref_logits_per_image, -1).mean(1))  # (B, N)
    torch.testing.assert_close(out.logits_per_image, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("eos_token_id, eot", [(50, 50), (2, EOS)], ids=["first-eos", "legacy-argmax"])
def test_hf_clip_matches_reference(tmp_path, attn, eos_token_id, eot):
    """Both pooling rules of transformers' CLIP: the first ``eos_token_id`` (here 50, smaller than the
    BOS id, so an argmax would pick another token), and the legacy argmax (``eos_token_id == 2``)."""
    torch.manual_seed(0)
    stock = perturb(CLIPModel(tiny_clip_config(eos_token_id)).eval())
    stock.save_pretrained(tmp_path / "clip")
    stock.set_attn_implementation("eager")
    model = convert_checkpoint(two_tower_masks(), base=tmp_path / "clip")
    model.set_attn_implementation(attn)
    ids, mask = text_batch(eos=eot)
    x = pixels(2)
    with torch.no_grad():
        refs = [zero_removed_clip(stock, v, t)(input_ids=ids, pixel_values=x, attention_mask=mask)
                for v, t in zip(VISION_KEPT, TEXT_KEPT)]
        out = model(input_ids=ids, pixel_values=x, attention_mask=mask)
        _check_zero_shot(out, torch.stack([r.logits_per_image for r in refs], dim=1))
        for m, r in enumerate(refs):
            torch.testing.assert_close(out.member_image_embeds[:, m], r.image_embeds, atol=ATOL, rtol=0)
            torch.testing.assert_close(out.member_text_embeds[:, m], r.text_embeds, atol=ATOL, rtol=0)
        features = model.get_image_features(x), model.get_text_features(ids, mask)
    assert features[0].shape == (2, 3, 24) and features[1].shape == (3, 3, 24)
    normalized = torch.nn.functional.normalize(features[1], dim=-1)
    torch.testing.assert_close(normalized, out.member_text_embeds, atol=ATOL, rtol=0)
    # the standard fields keep the stock shapes: the members' mean, a unit vector
    for name in ("image_embeds", "text_embeds"):
        refs_embeds = [getattr(r, name) for r in refs]
        mean = torch.stack(refs_embeds).mean(0)  # (N, P)
        torch.testing.assert_close(getattr(out, name), mean / mean.norm(dim=-1, keepdim=True), atol=ATOL, rtol=0)
        assert getattr(out, name).shape == refs_embeds[0].shape


def test_hf_clip_equal_widths_eager_without_padding(hf_clip_dir):
    """Equal widths fold the members into the attention batch; the causal mask ``(1, 1, T, T)`` used to be
    repeated M times only (not M x B), which broke eager attention for more than one text."""
    vision = [[[0, 1], [2, 3], [1, 2]], [[1, 3], [0, 1], [0, 3]]]
    text = [[[0, 1], [2, 3]], [[1, 2], [0, 3]]]
    stock = CLIPModel.from_pretrained(hf_clip_dir, attn_implementation="eager").eval()
    model = convert_checkpoint(two_tower_masks(vision, text), base=hf_clip_dir)
    model.set_attn_implementation("eager")
    ids, _ = text_batch()
    x = pixels(2)
    with torch.no_grad():
        ref = torch.stack([zero_removed_clip(stock, v, t)(input_ids=ids, pixel_values=x).logits_per_image
                           for v, t in zip(vision, text)], dim=1)
        _check_zero_shot(model(input_ids=ids, pixel_values=x), ref)


def test_text_tower_is_causal_and_pools_the_end_of_text_token(hf_clip_dir):
    model = convert_checkpoint(two_tower_masks(), base=hf_clip_dir)
    ids, mask = text_batch()
    with torch.no_grad():
        base = model.get_text_features(ids, mask)
        after = ids.clone()
        after[0, 6] = 11  # a token after the end-of-text token of text 0: the causal mask hides it
        torch.testing.assert_close(model.get_text_features(after, mask), base, atol=1e-6, rtol=0)
        before = ids.clone()
        before[0, 2] = 11  # a token before it changes text 0 only
        changed = model.get_text_features(before, mask)
        assert (changed[0] - base[0]).abs().max() > 1e-3
        torch.testing.assert_close(changed[1:], base[1:], atol=1e-6, rtol=0)
        # the padding mask does not change the pooled token (it is after it), with or without SDPA
        torch.testing.assert_close(model.get_text_features(ids), base, atol=ATOL, rtol=0)
        model.set_attn_implementation("eager")
        torch.testing.assert_close(model.get_text_features(ids), base, atol=ATOL, rtol=0)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_open_clip_matches_reference(open_clip_dir, attn):
    stock = tiny_open_clip()
    model = convert_checkpoint(two_tower_masks(), base=open_clip_dir)
    model.set_attn_implementation(attn)
    ids, _ = text_batch(eos=EOS)
    ids[ids == EOS] = 0  # open_clip pads with 0 and pools the largest id (argmax)
    ids[torch.arange(3), torch.tensor([4, 2, 9])] = EOS
    x = pixels(2)
    with torch.no_grad():
        ref = torch.stack([zero_removed_open_clip(stock, v, t).get_logits(x, ids)[0]
                           for v, t in zip(VISION_KEPT, TEXT_KEPT)], dim=1)
        _check_zero_shot(model(input_ids=ids, pixel_values=x), ref)


def test_open_clip_quick_gelu_and_one_tower(tmp_path):
    """An OpenAI-style open_clip model (QuickGELU), only its vision tower pruned: the text tower keeps all
    heads, so every member's text embedding is the stock one."""
    cfg = {**OPEN_CLIP_CFG, "quick_gelu": True}
    stock = tiny_open_clip(cfg=cfg)
    folder = save_open_clip(stock, tmp_path / "oc-quick", cfg)
    model = convert_checkpoint(two_tower_masks(text=None), base=folder, towers=["vision"])
    assert model.config.base_config["text_config"]["hidden_act"] == "quick_gelu"
    assert model.config.text_kept_heads == [[[0, 1, 2, 3]] * 2] * 3
    ids = torch.tensor([[BOS, 5, EOS] + [0] * 9])
    x = pixels(1)
    with torch.no_grad():
        out = model(input_ids=ids, pixel_values=x)
        for m in range(3):
            ref = zero_removed_open_clip(stock, VISION_KEPT[m], [[0, 1, 2, 3]] * 2)
            image = ref.encode_image(x, normalize=True)
            torch.testing.assert_close(out.member_image_embeds[:, m], image, atol=ATOL, rtol=0)
            torch.testing.assert_close(
                out.member_text_embeds[:, m], stock.encode_text(ids, normalize=True), atol=ATOL, rtol=0
            )
        torch.testing.assert_close(out.text_embeds, stock.encode_text(ids, normalize=True), atol=ATOL, rtol=0)


def test_masks_are_not_ignored(hf_clip_dir):
    stock = CLIPModel.from_pretrained(hf_clip_dir).eval()
    ids, mask = text_batch()
    x = pixels(2)
    full = two_tower_masks(vision=[[[0, 1, 2, 3]] * 3] * 3, text=[[[0, 1, 2, 3]] * 2] * 3)
    with torch.no_grad():
        expected = stock(input_ids=ids, pixel_values=x, attention_mask=mask).logits_per_image
        full_out = convert_checkpoint(full, base=hf_clip_dir)(input_ids=ids, pixel_values=x, attention_mask=mask)
        pruned = convert_checkpoint(two_tower_masks(), base=hf_clip_dir)(
            input_ids=ids, pixel_values=x, attention_mask=mask
        )
    for m in range(3):
        torch.testing.assert_close(full_out.member_logits_per_image[:, m], expected, atol=ATOL, rtol=0)
        assert (pruned.member_logits_per_image[:, m] - expected).abs().max() > 1e-3
    assert (pruned.member_logits_per_image[:, 0] - pruned.member_logits_per_image[:, 1]).abs().max() > 1e-3


def test_unfuse_clip_and_contrastive_loss(hf_clip_dir):
    model = convert_checkpoint(two_tower_masks(), base=hf_clip_dir, mlp_fusion="per_member")
    ids, mask = text_batch()
    x = pixels(3)
    with torch.no_grad():
        out = model(input_ids=ids, pixel_values=x, attention_mask=mask, return_loss=True)
        for m, sd in enumerate(unfuse_clip(model.state_dict(), model.config)):
            stock = CLIPModel(tiny_clip_config()).eval()
            stock.load_state_dict(sd, strict=True)
            ref = stock(input_ids=ids, pixel_values=x, attention_mask=mask)
            torch.testing.assert_close(ref.logits_per_image, out.member_logits_per_image[:, m], atol=ATOL, rtol=0)
    losses = []
    for m in range(3):
        logits = out.member_logits_per_image[:, m]  # (B, N)
        target = torch.arange(3)
        losses.append(
            (torch.nn.functional.cross_entropy(logits, target) + torch.nn.functional.cross_entropy(logits.T, target))
            / 2
        )
    torch.testing.assert_close(out.loss, sum(losses) / 3)


def test_bad_masks_and_inputs(hf_clip_dir, tmp_path):
    # a masks file without the text tower, when the text tower is asked for
    with pytest.raises(ValueError, match="no 'text' tower"):
        convert_checkpoint(two_tower_masks(text=None), base=hf_clip_dir, towers=["vision", "text"])
    # a member that misses a tower the file lists; an unknown tower name
    data = two_tower_masks().to_dict()
    del data["members"][1]["kept_heads"]["text"]
    (tmp_path / "miss.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"members\[1\].kept_heads misses the 'text' tower"):
        load_masks(tmp_path / "miss.json")
    data = two_tower_masks().to_dict()
    data["towers"]["audio"] = {"num_layers": 1, "num_heads": 4}
    (tmp_path / "audio.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="unknown tower 'audio'"):
        load_masks(tmp_path / "audio.json")
    # single-tower masks for CLIP, and masks for the wrong shape
    with pytest.raises(ValueError, match="two-tower masks file"):
        convert_checkpoint(HeadMasks(kept_heads=VISION_KEPT, num_heads=H), base=hf_clip_dir)
    wrong = two_tower_masks(text=[[[0]] * 3] * 3)
    with pytest.raises(ValueError, match="3 layers x 4 heads but the text tower"):
        convert_checkpoint(wrong, base=hf_clip_dir)
    model = convert_checkpoint(two_tower_masks(), base=hf_clip_dir)
    ids, _ = text_batch()
    with pytest.raises(ValueError, match="has 4 channels but the model takes 3"):
        model(input_ids=ids, pixel_values=torch.randn(1, 4, 16, 16))
    with pytest.raises(ValueError, match="are 32x32 but the model takes 16x16"):
        model(input_ids=ids, pixel_values=torch.randn(1, 3, 32, 32))


def test_unknown_open_clip_layouts_are_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = save_open_clip(tiny_open_clip(), tmp_path / "oc")
    state = load_file(str(folder / "open_clip_model.safetensors"))
    save_file({**state, "logit_bias": torch.zeros(())}, str(folder / "open_clip_model.safetensors"))
    with pytest.raises(ValueError, match="unknown open_clip layout: tensors logit_bias"):
        convert_checkpoint(two_tower_masks(), base=folder)
    cfg = {**OPEN_CLIP_CFG, "text_cfg": {**OPEN_CLIP_CFG["text_cfg"], "no_causal_mask": True}}
    folder = save_open_clip(tiny_open_clip(), tmp_path / "oc2", cfg)
    with pytest.raises(ValueError, match="no_causal_mask"):
        convert_checkpoint(two_tower_masks(), base=folder)


# ------------------------------------------------------------------------------------ slim members
VISION_NEURONS = [[list(range(0, 64, 2)), [], list(range(10))], [list(range(1, 64, 3)), list(range(64)), [63]],
                  [[5], list(range(32, 64)), list(range(0, 64, 4))]]
TEXT_NEURONS = [[list(range(20)), [0, 63]], [[], list(range(1, 64, 2))], [list(range(40, 64)), list(range(64))]]


def slim_two_tower_masks(text: bool = True, width: int = 64) -> HeadMasks:
    """Slim members of a model whose MLPs have ``width`` neurons per layer (hf CLIP 64, open_clip 4 x 32)."""
    towers = {
        "vision": HeadMasks(kept_heads=VISION_KEPT, num_heads=H, kept_neurons=VISION_NEURONS, intermediate_size=width)
    }
    towers["text"] = (HeadMasks(kept_heads=TEXT_KEPT, num_heads=H, kept_neurons=TEXT_NEURONS, intermediate_size=width)
                      if text else HeadMasks(kept_heads=TEXT_KEPT, num_heads=H))
    return HeadMasks(towers=towers)


@pytest.mark.parametrize("text_slim", [True, False], ids=["both-towers", "vision-only"])
@pytest.mark.parametrize("source", ["hf_clip", "open_clip"])
def test_slim_two_tower_members_match_their_references(hf_clip_dir, open_clip_dir, source, text_slim, tmp_path):
    """Slim members in each tower (unequal widths, a 0-neuron layer) == the stock model with each member's
    removed heads and removed MLP neurons zeroed, tower by tower; the masks file round-trips through convert."""
    from hydra_hf.families import get_family
    from hydra_hf.pruning.neurons import zero_removed_neurons_

    masks = slim_two_tower_masks(text_slim, width=64 if source == "hf_clip" else 128)
    masks.save(tmp_path / "masks.json")
    folder = hf_clip_dir if source == "hf_clip" else open_clip_dir
    model = convert_checkpoint(tmp_path / "masks.json", base=folder)
    assert model.config.vision_kept_neurons == VISION_NEURONS
    assert model.config.text_kept_neurons == (TEXT_NEURONS if text_slim else [])
    family = get_family("clip" if source == "hf_clip" else source)
    ids, mask = text_batch()
    x = pixels(2)
    if source == "open_clip":
        ids[ids == EOS] = 0
        ids[torch.arange(3), torch.tensor([4, 2, 9])] = EOS
    refs = []
    with torch.no_grad():
        for m, (v, t) in enumerate(zip(VISION_KEPT, TEXT_KEPT)):
            if source == "hf_clip":
                ref = zero_removed_clip(CLIPModel.from_pretrained(folder).eval(), v, t)
            else:
                ref = zero_removed_open_clip(tiny_open_clip(), v, t)
            kept = {"vision": VISION_NEURONS[m], **({"text": TEXT_NEURONS[m]} if text_slim else {})}
            zero_removed_neurons_(ref, family, kept)
            refs.append(ref(input_ids=ids, pixel_values=x).logits_per_image if source == "hf_clip"
                        else ref.get_logits(x, ids)[0])
        _check_zero_shot(model(input_ids=ids, pixel_values=x), torch.stack(refs, dim=1))
