"""ViT and CLIP Hydra folders loaded as a Hub user would (fresh process, hydra_hf not importable,
``trust_remote_code=True``) with the stock pipelines, and ``hydra-hf convert`` on every source layout."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import run_fresh_python, write_masks
from PIL import Image
from test_modeling_clip import OPEN_CLIP_CFG, TEXT_KEPT, VISION_KEPT, save_open_clip, tiny_open_clip, two_tower_masks
from test_modeling_vit import UNEQUAL, hf_vit_dir, save_timm, tiny_timm_vit  # noqa: F401  (hf_vit_dir: fixture)

from hydra_hf.assemble import convert_checkpoint, detect_arch
from hydra_hf.cli import main as cli_main
from hydra_hf.masks import HeadMasks

LABELS = ["a cat", "a dog", "a diagram"]


def _image(path) -> str:
    g = torch.Generator().manual_seed(3)
    array = (torch.rand(20, 24, 3, generator=g) * 255).to(torch.uint8).numpy()
    Image.fromarray(array).save(path)
    return str(path)


def test_vit_fresh_process_remote_code_and_pipeline(hf_vit_dir, tmp_path):  # noqa: F811
    from transformers import AutoImageProcessor

    out = tmp_path / "vit-hydra"
    model = convert_checkpoint(HeadMasks(kept_heads=UNEQUAL, num_heads=4), base=hf_vit_dir, output_dir=out)
    files = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "configuration_hydra.py", "configuration_hydra_vit.py",
            "hydra_attention.py", "hydra_layers.py", "hydra_skeletons.py",
            "modeling_hydra_vit.py", "preprocessor_config.json"} <= files
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "hydra_ensemble_vit"
    assert (
        config["auto_map"]["AutoModelForImageClassification"]
        == "modeling_hydra_vit.HydraEnsembleForImageClassification"
    )
    image = _image(tmp_path / "img.png")
    inputs = AutoImageProcessor.from_pretrained(out)(Image.open(image), return_tensors="pt")
    with torch.no_grad():
        expected = model(**inputs).logits  # (1, C)
    code = f"""
        import json, sys, torch
        from PIL import Image
        from transformers import AutoImageProcessor, AutoModel, AutoModelForImageClassification, pipeline
        out = {str(out)!r}
        model = AutoModelForImageClassification.from_pretrained(out, trust_remote_code=True).eval()
        processor = AutoImageProcessor.from_pretrained(out, trust_remote_code=True)
        inputs = processor(Image.open({image!r}), return_tensors="pt")
        with torch.no_grad():
            res = model(**inputs)
        encoder = AutoModel.from_pretrained(out, trust_remote_code=True)
        preds = pipeline("image-classification", model=out, trust_remote_code=True)(Image.open({image!r}))
        assert sys.modules.get("hydra_hf") is None
        print(json.dumps({{"logits": res.logits.tolist(), "members": list(res.member_logits.shape),
                          "module": type(model).__module__, "encoder": type(encoder).__name__,
                          "pipe": {{p["label"]: p["score"] for p in preds}}}}))
    """
    stdout = run_fresh_python(code, env={"HF_MODULES_CACHE": str(tmp_path / "modules")})
    assert "Do you wish to run the custom code" not in stdout
    result = json.loads(stdout.splitlines()[-1])
    assert result["module"].startswith("transformers_modules") and result["encoder"] == "HydraEnsembleViTModel"
    assert result["members"] == [1, 3, 3]
    torch.testing.assert_close(torch.tensor(result["logits"]), expected, atol=1e-5, rtol=0)
    probs = expected.softmax(-1)[0]
    got = torch.tensor([result["pipe"][model.config.id2label[c]] for c in range(3)])
    torch.testing.assert_close(got, probs, atol=1e-5, rtol=0)


def test_clip_fresh_process_remote_code_and_zero_shot_pipeline(tmp_path):
    """An open_clip model with open_clip's own 49,408-token vocabulary: the converter writes an HF
    CLIPTokenizer (generated offline from open_clip's BPE file) and image processor, and the
    zero-shot pipeline returns the ensemble mean."""
    import open_clip
    from transformers import AutoProcessor

    cfg = {**OPEN_CLIP_CFG, "text_cfg": {**OPEN_CLIP_CFG["text_cfg"], "vocab_size": 49408, "context_length": 16}}
    folder = save_open_clip(tiny_open_clip(cfg=cfg), tmp_path / "oc", cfg)
    out = tmp_path / "clip-hydra"
    model = convert_checkpoint(two_tower_masks(), base=folder, output_dir=out)
    config = json.loads((out / "config.json").read_text())
    assert (
        config["auto_map"]["AutoModelForZeroShotImageClassification"] == "modeling_hydra_clip.HydraEnsembleCLIPModel"
    )
    processor = AutoProcessor.from_pretrained(out)
    texts = [f"This is a photo of {c}." for c in LABELS]  # the pipeline's default hypothesis template
    assert processor.tokenizer(texts[0])["input_ids"] == [t for t in open_clip.tokenize(texts[0], 16)[0].tolist() if t]
    image = _image(tmp_path / "img.png")
    inputs = processor(text=texts, images=Image.open(image), return_tensors="pt", padding=True)
    with torch.no_grad():
        expected = model(**inputs).logits_per_image  # (1, N)
    code = f"""
        import json, sys, torch
        from PIL import Image
        from transformers import AutoModel, AutoProcessor, pipeline
        out = {str(out)!r}
        model = AutoModel.from_pretrained(out, trust_remote_code=True).eval()
        processor = AutoProcessor.from_pretrained(out, trust_remote_code=True)
        inputs = processor(text={texts!r}, images=Image.open({image!r}), return_tensors="pt", padding=True)
        with torch.no_grad():
            res = model(**inputs)
        pipe = pipeline("zero-shot-image-classification", model=out, trust_remote_code=True)
        preds = pipe(Image.open({image!r}), candidate_labels={LABELS!r})
        assert sys.modules.get("hydra_hf") is None
        print(json.dumps({{"logits": res.logits_per_image.tolist(), "members": list(res.member_logits_per_image.shape),
                          "cls": type(model).__name__, "pipe": {{p["label"]: p["score"] for p in preds}}}}))
    """
    stdout = run_fresh_python(code, env={"HF_MODULES_CACHE": str(tmp_path / "modules")})
    assert "Do you wish to run the custom code" not in stdout
    result = json.loads(stdout.splitlines()[-1])
    assert result["cls"] == "HydraEnsembleCLIPModel" and result["members"] == [1, 3, 3]
    torch.testing.assert_close(torch.tensor(result["logits"]), expected, atol=1e-5, rtol=0)
    got = torch.tensor([result["pipe"][c] for c in LABELS])
    torch.testing.assert_close(got, expected.softmax(-1)[0], atol=1e-5, rtol=0)


def test_local_registration_loads_without_remote_code(hf_vit_dir, tmp_path):  # noqa: F811
    from transformers import AutoModel, AutoModelForImageClassification, AutoModelForZeroShotImageClassification

    import hydra_hf  # noqa: F401  (registers the Auto classes)

    out = tmp_path / "vit"
    model = convert_checkpoint(HeadMasks(kept_heads=UNEQUAL, num_heads=4), base=hf_vit_dir, output_dir=out)
    loaded = AutoModelForImageClassification.from_pretrained(out).eval()
    assert type(loaded) is type(model)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x).logits, model(x).logits)
    folder = save_open_clip(tiny_open_clip(), tmp_path / "oc")
    clip = convert_checkpoint(two_tower_masks(), base=folder, output_dir=tmp_path / "clip")
    assert type(AutoModel.from_pretrained(tmp_path / "clip")) is type(clip)
    assert type(AutoModelForZeroShotImageClassification.from_pretrained(tmp_path / "clip")) is type(clip)


# ----------------------------------------------------------------------------------------- CLI
def _cli_error(args, capsys) -> str:
    code = cli_main(args)
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert len(err.splitlines()) == 1, err
    return err


def test_cli_converts_every_layout(hf_vit_dir, tmp_path, capsys):  # noqa: F811
    vit_masks = write_masks(tmp_path / "vit.json", UNEQUAL, 4)
    clip_masks = tmp_path / "clip.json"
    two_tower_masks().save(clip_masks)
    timm_dir = save_timm(tiny_timm_vit(), tmp_path / "timm")
    oc_dir = save_open_clip(tiny_open_clip(), tmp_path / "oc")
    from test_modeling_clip import tiny_clip_config
    from transformers import CLIPModel

    CLIPModel(tiny_clip_config()).save_pretrained(tmp_path / "hf-clip")
    cases = [
        (hf_vit_dir, vit_masks, "vit"),
        (timm_dir, vit_masks, "timm_vit"),
        (tmp_path / "hf-clip", clip_masks, "clip"),
        (oc_dir, clip_masks, "open_clip"),
    ]
    for folder, masks, arch in cases:
        assert detect_arch(folder) == arch
        out = tmp_path / f"out-{arch}"
        assert cli_main(["convert", "--base", str(folder), "--masks", str(masks), "--output", str(out)]) == 0
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert summary["members"] == 3 and (out / "model.safetensors").is_file()
    # timm folders get a ViT image processor with timm's preprocessing
    pre = json.loads((tmp_path / "out-timm_vit" / "preprocessor_config.json").read_text())
    assert pre["size"] == {"height": 16, "width": 16} and pre["image_mean"] == [0.5, 0.5, 0.5]
    # --arch forces the layout; --towers names the towers to prune
    assert cli_main(["convert", "--members", *[str(oc_dir)] * 3, "--masks", str(clip_masks), "--output",
                     str(tmp_path / "oc-members"), "--arch", "open-clip", "--towers", "vision", "text"]) == 0


def test_cli_bad_inputs_leave_no_output(hf_vit_dir, tmp_path, capsys):  # noqa: F811
    vit_masks = write_masks(tmp_path / "vit.json", UNEQUAL, 4)
    vision_only = tmp_path / "vision-only.json"
    two_tower_masks(text=None).save(vision_only)
    oc_dir = save_open_clip(tiny_open_clip(), tmp_path / "oc")
    out = tmp_path / "out"

    err = _cli_error(["convert", "--base", str(oc_dir), "--masks", str(vision_only), "--output", str(out),
                      "--towers", "vision", "text"], capsys)
    assert "no 'text' tower" in err
    err = _cli_error(["convert", "--base", str(oc_dir), "--masks", str(vit_masks), "--output", str(out)], capsys)
    assert "two-tower masks file" in err
    clip_masks = tmp_path / "clip.json"
    two_tower_masks().save(clip_masks)
    err = _cli_error(["convert", "--base", str(hf_vit_dir), "--masks", str(clip_masks), "--output", str(out)], capsys)
    assert "single-tower masks file" in err
    resnet = tmp_path / "resnet"
    resnet.mkdir()
    (resnet / "config.json").write_text(json.dumps({"architecture": "resnet50", "num_classes": 10}))
    err = _cli_error(["convert", "--base", str(resnet), "--masks", str(vit_masks), "--output", str(out)], capsys)
    assert "architecture='resnet50'" in err and "unknown checkpoint layout" in err
    weird = tmp_path / "weird"
    save_timm(tiny_timm_vit(), weird)
    from safetensors.torch import load_file, save_file

    state = load_file(str(weird / "model.safetensors"))
    save_file({k.replace("blocks.", "layers."): v for k, v in state.items()}, str(weird / "model.safetensors"))
    err = _cli_error(["convert", "--base", str(weird), "--masks", str(vit_masks), "--output", str(out)], capsys)
    assert "missing" in err or "unknown" in err
    assert not out.exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("tower", ["vision", "text"])
def test_masks_that_prune_one_tower_load(tmp_path, tower):
    masks = two_tower_masks(
        vision=VISION_KEPT if tower == "vision" else None, text=TEXT_KEPT if tower == "text" else None
    )
    masks.save(tmp_path / "m.json")
    from hydra_hf.masks import load_masks

    back = load_masks(tmp_path / "m.json")
    assert list(back.towers) == [tower] and back.num_members == 3
