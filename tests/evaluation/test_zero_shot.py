"""evaluation.ZeroShotPredictor against hand-written zero-shot CLIP (cosine similarity x logit_scale,
softmax over the classes) on tiny random models: transformers CLIP, open_clip and the Hydra CLIP,
whose ensemble must be the mean of its members computed one by one on stock models."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from _tiny_models import VOCAB, tiny_open_clip

from hydra_hf import evaluation as ev

ATOL = 1e-5
NAMES = ["cat", "dog", "small red car"]
TEMPLATES = ["a photo of a {}.", "a blurry picture of the {}", "{}"]
BOS, EOS = VOCAB - 2, VOCAB - 1  # the end-of-text token has the largest id: CLIP's argmax pooling


def word_ids(text: str) -> list[int]:
    return [BOS] + [5 + sum(map(ord, w)) % (VOCAB - 8) for w in text.split()] + [EOS]


def hf_tokenizer(texts: list[str]) -> dict[str, torch.Tensor]:
    """A stand-in tokenizer: one id per word, padded with 0 after the end-of-text token."""
    rows = [word_ids(t) for t in texts]
    T = max(map(len, rows))
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
    return {"input_ids": ids, "attention_mask": mask}


def open_clip_tokenizer(texts: list[str], context_length: int = 8) -> torch.Tensor:
    """As open_clip's tokenizers: a (N, context_length) tensor, zero-padded, end-of-text kept last."""
    ids = torch.zeros(len(texts), context_length, dtype=torch.long)
    for i, t in enumerate(texts):
        r = word_ids(t)
        r = r if len(r) <= context_length else r[: context_length - 1] + [EOS]
        ids[i, : len(r)] = torch.tensor(r)
    return ids


def tiny_hf_clip(seed: int = 0):
    """A tiny transformers CLIP that pools the first end-of-text token (``EOS``), as current CLIP configs do."""
    from transformers import CLIPConfig, CLIPModel

    torch.manual_seed(seed)
    cfg = CLIPConfig(
        text_config=dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=16, eos_token_id=EOS, bos_token_id=BOS,
                         pad_token_id=0),
        vision_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                           image_size=16, patch_size=8),
        projection_dim=16,
    )
    return CLIPModel(cfg).eval()


def perturb(model, scale: float = 0.1, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return model


def batches(n: int = 6, size: int = 16, seed: int = 1) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randn(n, 3, size, size, generator=g)
    labels = torch.randint(0, len(NAMES), (n,), generator=g)
    return [{"pixel_values": pixels[i : i + 4], "labels": labels[i : i + 4]} for i in range(0, n, 4)]


def reference_probs(image_feats, text_feats, logit_scale) -> torch.Tensor:
    """Zero-shot by hand: class embedding = normalised mean of the normalised template embeddings."""
    K = len(TEMPLATES)
    text = text_feats / text_feats.norm(dim=-1, keepdim=True)  # (C*K, P)
    classes = torch.stack([text[c * K : (c + 1) * K].mean(0) for c in range(len(NAMES))])  # (C, P)
    classes = classes / classes.norm(dim=-1, keepdim=True)
    image = image_feats / image_feats.norm(dim=-1, keepdim=True)  # (B, P)
    return torch.softmax(logit_scale.exp() * image @ classes.T, dim=-1)  # (B, C)


def prompts() -> list[str]:
    return [t.format(n) for n in NAMES for t in TEMPLATES]


def test_hf_clip_matches_hand_computation():
    model = perturb(tiny_hf_clip())
    predictor = ev.ZeroShotPredictor(model, NAMES, TEMPLATES, tokenizer=hf_tokenizer)
    preds = ev.predict(predictor, batches())
    assert preds.member_logits.shape == (6, 1, 3) and preds.labels.shape == (6,)
    with torch.no_grad():
        text = model.get_text_features(**hf_tokenizer(prompts())).pooler_output
        image = model.get_image_features(pixel_values=torch.cat([b["pixel_values"] for b in batches()])).pooler_output
        expected = reference_probs(image, text, model.logit_scale)
    torch.testing.assert_close(preds.probs.float(), expected, atol=ATOL, rtol=0)
    assert (expected.max(-1).values - expected.min(-1).values).min() > 1e-3  # not a uniform prediction


def test_single_template_equals_the_stock_forward():
    """With one template the predictor is the stock model's own zero-shot forward (logits_per_image)."""
    model = perturb(tiny_hf_clip())
    predictor = ev.ZeroShotPredictor(model, NAMES, ["a photo of a {}."], tokenizer=hf_tokenizer)
    pixels = batches()[0]["pixel_values"]
    with torch.no_grad():
        stock = model(pixel_values=pixels, **hf_tokenizer([f"a photo of a {n}." for n in NAMES])).logits_per_image
        got = predictor.member_logits({"pixel_values": pixels})
    torch.testing.assert_close(got[:, 0], stock, atol=ATOL, rtol=0)


def test_open_clip_matches_hand_computation():
    model = perturb(tiny_open_clip())
    predictor = ev.ZeroShotPredictor(model, NAMES, TEMPLATES, tokenizer=open_clip_tokenizer)
    preds = ev.predict(predictor, batches())
    with torch.no_grad():
        text = model.encode_text(open_clip_tokenizer(prompts()))
        image = model.encode_image(torch.cat([b["pixel_values"] for b in batches()]))
        expected = reference_probs(image, text, model.logit_scale)
        # one template: open_clip's own forward (normalised features and the exp'd logit scale)
        single = ev.ZeroShotPredictor(model, NAMES, ["{}"], tokenizer=open_clip_tokenizer)
        img, txt, scale = model(batches()[0]["pixel_values"], open_clip_tokenizer(NAMES))
        torch.testing.assert_close(single.member_logits(batches()[0])[:, 0], scale * img @ txt.T, atol=ATOL, rtol=0)
    torch.testing.assert_close(preds.probs.float(), expected, atol=ATOL, rtol=0)


def test_templates_average_normalised_embeddings():
    """class embedding = normalise(sum_k normalise(e_k)) = normalise(mean of the one-template embeddings)."""
    model = perturb(tiny_open_clip())
    per_template = [
        ev.ZeroShotPredictor(model, NAMES, [t], tokenizer=open_clip_tokenizer).class_embeddings() for t in TEMPLATES
    ]
    # (C, 1, P)
    averaged = ev.ZeroShotPredictor(model, NAMES, TEMPLATES, tokenizer=open_clip_tokenizer).class_embeddings()
    torch.testing.assert_close(averaged, F.normalize(sum(per_template), dim=-1), atol=ATOL, rtol=0)
    torch.testing.assert_close(averaged.norm(dim=-1), torch.ones(3, 1), atol=ATOL, rtol=0)
    assert (averaged - per_template[0]).abs().max() > 1e-3  # the templates really change the embedding
    assert ev.zero_shot_prompts(["a", "b"], ["x {}", "{} y"]) == ["x a", "a y", "x b", "b y"]  # class-major


def test_class_embeddings_are_cached():
    model = perturb(tiny_open_clip())
    calls = []

    def counting(texts):
        calls.append(len(texts))
        return open_clip_tokenizer(texts)

    predictor = ev.ZeroShotPredictor(model, NAMES, TEMPLATES, tokenizer=counting, text_batch_size=4)
    ev.predict(predictor, batches())
    ev.predict(predictor, batches(seed=2))
    assert calls == [4, 4, 1]  # 9 prompts in text batches of 4, once


def _zero_removed(model, vision_member, text_member, heads: int = 4):
    """Stock CLIP with the heads a member removed zeroed in out_proj (the per-member reference)."""
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for tower, kept in ((ref.vision_model, vision_member), (ref.text_model, text_member)):
            for layer, keep in zip(tower.encoder.layers, kept):
                w = layer.self_attn.out_proj.weight  # (d, H*dk)
                dk = w.shape[1] // heads
                for h in range(heads):
                    if h not in keep:
                        w[:, h * dk : (h + 1) * dk] = 0
    return ref.eval()


VISION_KEPT = [[[0, 1], [2, 3]], [[1, 2, 3], [0]], [[0], [0, 1, 2, 3]]]
TEXT_KEPT = [[[0, 1], [3]], [[3], [0, 1]], [[0, 2, 3], [1, 2, 3]]]


@pytest.fixture(scope="module")
def hydra_and_stock(tmp_path_factory):
    from hydra_hf.assemble import convert_checkpoint
    from hydra_hf.masks import HeadMasks

    stock = perturb(tiny_hf_clip())
    folder = tmp_path_factory.mktemp("clip") / "tiny-clip"
    stock.save_pretrained(folder)
    masks = HeadMasks(towers={"vision": HeadMasks(kept_heads=VISION_KEPT, num_heads=4),
                                   "text": HeadMasks(kept_heads=TEXT_KEPT, num_heads=4)})
    return convert_checkpoint(masks, base=folder), stock


def test_hydra_clip_is_the_mean_of_its_members(hydra_and_stock):
    hydra, stock = hydra_and_stock
    preds = ev.predict(ev.ZeroShotPredictor(hydra, NAMES, TEMPLATES, tokenizer=hf_tokenizer), batches())
    assert preds.member_logits.shape == (6, 3, 3)
    members = [
        ev.predict(
            ev.ZeroShotPredictor(_zero_removed(stock, v, t), NAMES, TEMPLATES, tokenizer=hf_tokenizer), batches()
        ).probs
        for v, t in zip(VISION_KEPT, TEXT_KEPT)
    ]  # each (N, C)
    for m, probs in enumerate(members):
        torch.testing.assert_close(preds.member_probs[:, m], probs, atol=ATOL, rtol=0)
    torch.testing.assert_close(preds.probs, torch.stack(members).mean(0), atol=ATOL, rtol=0)
    assert (members[0] - members[1]).abs().max() > 1e-3  # the members really differ
    from hydra_hf import metrics

    assert float(metrics.mutual_information(preds.member_probs).mean()) > 0


def test_temperature_scaling_on_top(hydra_and_stock):
    hydra, _ = hydra_and_stock
    base = ev.ZeroShotPredictor(hydra, NAMES, TEMPLATES, tokenizer=hf_tokenizer)
    val = ev.predict(base, batches())
    t = ev.fit_temperature(val)
    assert t > 0 and t != 1.0
    scaled = ev.predict(ev.TemperatureScaledPredictor(base, t), batches())
    torch.testing.assert_close(scaled.member_logits, val.member_logits / t, atol=ATOL, rtol=0)
    nll = lambda p: F.nll_loss(p.probs.log(), p.labels)  # noqa: E731
    assert nll(scaled) <= nll(val) + 1e-9  # the fitted temperature does not raise the validation NLL


def test_errors_name_the_problem():
    model = tiny_open_clip()
    with pytest.raises(ValueError, match="exactly one '\\{\\}'"):
        ev.ZeroShotPredictor(model, NAMES, ["a photo"])
    with pytest.raises(ValueError, match="class_names must be a non-empty list"):
        ev.ZeroShotPredictor(model, [], TEMPLATES)
    with pytest.raises(ValueError, match="needs its tokenizer"):
        ev.ZeroShotPredictor(tiny_hf_clip(), NAMES, TEMPLATES)
    with pytest.raises(TypeError, match="needs a CLIP model"):
        ev.ZeroShotPredictor(torch.nn.Linear(2, 2), NAMES, TEMPLATES)
