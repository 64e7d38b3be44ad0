"""The shipped uncertainty pipelines (pipeline_hydra.py): numbers equal hydra_hf.metrics', flags,
thresholds chosen on validation data."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import tiny_bert_config, write_tiny_tokenizer
from transformers import AutoTokenizer, BertForSequenceClassification

from hydra_hf import metrics
from hydra_hf.assemble import convert_checkpoint
from hydra_hf.evaluation import fit_uncertainty_threshold
from hydra_hf.masks import HeadMasks
from hydra_hf.modeling.pipeline_hydra import (
    HydraTextClassificationPipeline,
    format_result,
    resolve_threshold,
    uncertainty_from_member_logits,
)
from hydra_hf.saving import save_hydra_model

KEPT = [[[0, 1], [2, 3], [1]], [[1, 2, 3], [0], []], [[0], [0, 1, 2, 3], [0, 2]]]
TEXTS = ["the movie was very good", "a boring plot and awful actor", "i was not fun", "great fun", "bad"]


@pytest.fixture(scope="module")
def hydra(tmp_path_factory):
    """A converted tiny Hydra classifier (M=3, 3 labels) with named labels and its folder."""
    root = tmp_path_factory.mktemp("pipe")
    torch.manual_seed(0)
    base = BertForSequenceClassification(
        tiny_bert_config(id2label={0: "neg", 1: "neu", 2: "pos"}, label2id={"neg": 0, "neu": 1, "pos": 2})
    ).eval()
    base.save_pretrained(root / "tiny")
    write_tiny_tokenizer(root / "tiny")
    model = convert_checkpoint(HeadMasks(kept_heads=KEPT, num_heads=4), base=root / "tiny", output_dir=root / "hydra")
    return model.eval(), AutoTokenizer.from_pretrained(root / "hydra"), root


def _reference_member_probs(model, tok, texts):
    enc = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        return torch.softmax(model(**enc).member_logits.double(), -1)  # (N, M, C)


def test_pipeline_numbers_equal_metrics_module(hydra):
    model, tok, _ = hydra
    pipe = HydraTextClassificationPipeline(model=model, tokenizer=tok)
    results = pipe(TEXTS)
    assert isinstance(results, list) and len(results) == len(TEXTS)
    assert isinstance(pipe(TEXTS[0]), dict)  # one text -> one dict (no legacy list wrapping)
    member_probs = torch.stack([_reference_member_probs(model, tok, [t])[0] for t in TEXTS])  # unpadded, as the pipe
    expected = {
        "predictive_entropy": metrics.predictive_entropy(member_probs),
        "expected_entropy": metrics.expected_entropy(member_probs),
        "mutual_information": metrics.mutual_information(member_probs),
    }
    labels = ["neg", "neu", "pos"]
    mean = member_probs.mean(1)
    for i, res in enumerate(results):
        for name, values in expected.items():
            assert res["uncertainty"][name] == pytest.approx(float(values[i]), abs=1e-6), name
        assert res["label"] == labels[int(mean[i].argmax())]
        assert res["score"] == pytest.approx(float(mean[i].max()), abs=1e-6)
        assert [s["score"] for s in res["scores"]] == sorted((s["score"] for s in res["scores"]), reverse=True)
        got_members = torch.tensor([[m[c] for c in labels] for m in res["member_scores"]], dtype=torch.float64)
        torch.testing.assert_close(got_members, member_probs[i], atol=1e-6, rtol=0)
        assert res["member_labels"] == [labels[int(p.argmax())] for p in member_probs[i]]
        assert res["flagged"] is None  # no threshold stored, none passed
    # the members really disagree, so the uncertainty is not trivially zero
    assert min(r["uncertainty"]["mutual_information"] for r in results) > 1e-4
    # batched (padded) inputs give the same numbers as the padded reference
    batched = pipe(TEXTS, batch_size=2)
    padded = _reference_member_probs(model, tok, TEXTS[:2])
    assert batched[0]["uncertainty"]["mutual_information"] == pytest.approx(
        float(metrics.mutual_information(padded)[0]), abs=1e-6)


def test_flags_and_threshold_options(hydra):
    model, tok, _ = hydra
    pipe = HydraTextClassificationPipeline(model=model, tokenizer=tok)
    mi = [r["uncertainty"]["mutual_information"] for r in pipe(TEXTS)]
    cut = sorted(mi)[2]
    flagged = [r["flagged"] for r in pipe(TEXTS, uncertainty_threshold=cut)]
    assert flagged == [m > cut for m in mi] and any(flagged) and not all(flagged)
    pe = [r["uncertainty"]["predictive_entropy"] for r in pipe(TEXTS)]
    res = pipe(TEXTS, uncertainty_threshold={"metric": "predictive_entropy", "value": sorted(pe)[1]})
    assert [r["flagged"] for r in res] == [p > sorted(pe)[1] for p in pe]
    assert len(pipe(TEXTS[0], top_k=2)["scores"]) == 2
    model.config.uncertainty_threshold = {"metric": "mutual_information", "value": cut}
    try:
        assert [r["flagged"] for r in pipe(TEXTS)] == [m > cut for m in mi]  # from the config
        assert pipe(TEXTS[0], uncertainty_threshold=False)["flagged"] is None
    finally:
        del model.config.uncertainty_threshold
    with pytest.raises(ValueError, match="metric 'entropy' is unknown"):
        pipe(TEXTS[0], uncertainty_threshold={"metric": "entropy", "value": 1.0})
    with pytest.raises(ValueError, match="function_to_apply"):
        pipe(TEXTS[0], function_to_apply="sigmoid")
    with pytest.raises(ValueError, match="finite number"):
        resolve_threshold({"metric": "mutual_information", "value": float("nan")}, model.config)


def test_format_result_handles_zero_probabilities():
    """Members sure of different classes: the entropies use 0 * log 0 = 0 and equal the metrics'."""
    member_logits = torch.tensor([[50.0, -50.0, -50.0], [-50.0, 50.0, -50.0]])  # (M=2, C=3)
    res = format_result(member_logits, ["a", "b", "c"], {"metric": "mutual_information", "value": 0.5}, None)
    probs = torch.softmax(member_logits.double(), -1)[None]
    assert res["uncertainty"]["expected_entropy"] == pytest.approx(float(metrics.expected_entropy(probs)[0]), abs=1e-9)
    assert res["uncertainty"]["mutual_information"] == pytest.approx(math.log(2), abs=1e-9)
    assert res["flagged"] is True and res["member_labels"] == ["a", "b"]
    u = uncertainty_from_member_logits(torch.zeros(4, 5, 3))  # identical members: no epistemic uncertainty
    assert torch.all(u["mutual_information"] == 0)


def test_fit_uncertainty_threshold_quantile_rule_is_saved_and_used(hydra, tmp_path):
    model, tok, root = hydra
    texts = TEXTS * 4  # 20 validation inputs
    threshold = fit_uncertainty_threshold(model, texts, tokenizer=tok, quantile=0.8, batch_size=8)
    try:
        u = metrics.mutual_information(_reference_member_probs(model, tok, texts))
        assert threshold["rule"] == "id_quantile" and threshold["num_samples"] == 20
        assert threshold["value"] in [pytest.approx(float(v), abs=1e-6) for v in u]  # padding differs by batch
        assert threshold["flagged_fraction"] <= 0.2 + 1e-9
        assert model.config.uncertainty_threshold == threshold
        out = save_hydra_model(model, tmp_path / "with-threshold", preprocessor_from=root / "hydra")
        saved = json.loads((out / "config.json").read_text())
        assert saved["uncertainty_threshold"]["value"] == pytest.approx(threshold["value"])
        assert saved["custom_pipelines"]["hydra-text-classification"]["impl"] == (
            "pipeline_hydra.HydraTextClassificationPipeline")
        res = HydraTextClassificationPipeline(model=model, tokenizer=tok)(TEXTS)
        assert [r["flagged"] for r in res] == [
            r["uncertainty"]["mutual_information"] > threshold["value"] for r in res
        ]
    finally:
        del model.config.uncertainty_threshold


def test_fit_uncertainty_threshold_youden_rule_separates_ood():
    """Given OOD validation data, the threshold maximizes Youden's J; here the sets separate."""

    class _Config:
        pass

    class _Model:  # only the config is used when member probabilities are given
        config = _Config()

    g = torch.Generator().manual_seed(0)
    agree = torch.softmax(torch.randn(30, 1, 4, generator=g).expand(30, 3, 4) * 3, -1)  # members agree: MI = 0
    disagree = torch.softmax(torch.randn(20, 3, 4, generator=g) * 3, -1)
    model = _Model()
    threshold = fit_uncertainty_threshold(model, agree, ood_data=disagree)
    assert threshold["rule"] == "youden" and threshold["youden_j"] == pytest.approx(1.0)
    assert threshold["flagged_fraction"] == 0 and threshold["flagged_ood_fraction"] == 1
    assert model.config.uncertainty_threshold is threshold
    with pytest.raises(ValueError, match="quantile"):
        fit_uncertainty_threshold(model, agree, quantile=0)
    with pytest.raises(ValueError, match="metric"):
        fit_uncertainty_threshold(model, agree, metric="variance")


# ------------------------------------------------------------------------------ image and zero-shot
HEADS = [[[0, 1], [2]], [[1, 2, 3], [0]], [[3], [1, 2]]]  # M=3 members, 2 layers x 4 heads


def _check_against_metrics(result, member_logits, labels):
    """One pipeline result against hydra_hf.metrics on the same member logits ``(M, C)``."""
    member_probs = torch.softmax(member_logits.double(), -1)[None]  # (1, M, C)
    for name in ("predictive_entropy", "expected_entropy", "mutual_information"):
        assert result["uncertainty"][name] == pytest.approx(float(getattr(metrics, name)(member_probs)[0]), abs=1e-6)
    got = torch.tensor([[m[c] for c in labels] for m in result["member_scores"]], dtype=torch.float64)
    torch.testing.assert_close(got, member_probs[0], atol=1e-6, rtol=0)
    assert result["uncertainty"]["mutual_information"] > 1e-6  # the members really differ


def test_image_pipeline_numbers_equal_metrics_module(tmp_path):
    from _tiny_models import tiny_vit
    from transformers import ViTImageProcessor

    from hydra_hf.modeling.pipeline_hydra import HydraImageClassificationPipeline

    tiny_vit().save_pretrained(tmp_path / "vit")
    model = convert_checkpoint(HeadMasks(kept_heads=HEADS, num_heads=4), base=tmp_path / "vit").eval()
    processor = ViTImageProcessor(size={"height": 16, "width": 16})
    pipe = HydraImageClassificationPipeline(model=model, image_processor=processor)
    g = torch.Generator().manual_seed(0)
    images = [torch.randint(0, 256, (3, 24, 24), generator=g, dtype=torch.uint8) for _ in range(3)]  # no PIL needed
    results = pipe(images)
    labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
    for image, result in zip(images, results):
        with torch.no_grad():
            member_logits = model(**processor(images=image, return_tensors="pt")).member_logits[0]  # (M, C)
        _check_against_metrics(result, member_logits, labels)


def test_zero_shot_pipeline_numbers_equal_metrics_module(tmp_path):
    from _tiny_models import tiny_hf_clip
    from conftest import write_tiny_tokenizer
    from transformers import CLIPImageProcessor

    from hydra_hf.modeling.pipeline_hydra import HydraZeroShotImageClassificationPipeline

    clip = tiny_hf_clip()
    clip.config.text_config.eos_token_id = 3  # the tiny tokenizer's [SEP]: the text tower pools there
    clip.save_pretrained(tmp_path / "clip")
    masks = HeadMasks(towers={"vision": HeadMasks(kept_heads=HEADS, num_heads=4),
                                   "text": HeadMasks(kept_heads=HEADS, num_heads=4)})
    model = convert_checkpoint(masks, base=tmp_path / "clip").eval()
    write_tiny_tokenizer(tmp_path / "clip", vocab_size=40)
    tok = AutoTokenizer.from_pretrained(tmp_path / "clip")
    processor = CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    pipe = HydraZeroShotImageClassificationPipeline(model=model, tokenizer=tok, image_processor=processor)
    candidates = ["good", "awful", "boring"]
    image = torch.randint(0, 256, (3, 20, 20), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
    # the pipeline's own preprocess opens images with PIL; build its model inputs the same way without it
    texts = tok([f"the {c} movie" for c in candidates], padding=True, return_tensors="pt")
    inputs = processor(images=[image], return_tensors="pt")
    inputs["candidate_labels"], inputs["text_inputs"] = candidates, [texts]
    result = pipe.postprocess(pipe.forward(inputs), uncertainty_threshold=0.0)
    with torch.no_grad():
        member_logits = model(**texts, pixel_values=inputs["pixel_values"]).member_logits_per_image[0]  # (M, N)
    _check_against_metrics(result, member_logits, candidates)
    assert result["flagged"] is True and result["label"] in candidates
    try:
        from PIL import Image
    except ImportError:
        return
    full = pipe(
        Image.fromarray(image.permute(1, 2, 0).numpy()),
        candidate_labels=candidates,
        hypothesis_template="the {} movie",
    )
    assert full["uncertainty"] == pytest.approx(result["uncertainty"], abs=1e-6)
