"""`hydra-hf prune` on HF CLIP (zero-shot), open_clip and timm ViT models, end to end into `hydra-hf convert`;
errors leave no output."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from PIL import Image
from test_modeling_clip import OPEN_CLIP_CFG, perturb, save_open_clip, tiny_open_clip

from hydra_hf.cli import main
from hydra_hf.masks import HeadMasks, load_masks

CLASSES = ["cat", "dog", "bird"]
OC_CFG = {**OPEN_CLIP_CFG, "text_cfg": {**OPEN_CLIP_CFG["text_cfg"], "vocab_size": 49408, "context_length": 16}}


def _image_folder(root, classes, per_class: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            array = (torch.rand(20, 20, 3, generator=g) * 255).to(torch.uint8).numpy()
            Image.fromarray(array).save(root / c / f"{i}.png")
    return root


@pytest.fixture
def images(tmp_path):
    """ID: an image folder with the classes in another order than CLASSES (matched by name); OOD: two folders."""
    return (_image_folder(tmp_path / "id", ["bird", "cat", "dog"], 4, 0),
            _image_folder(tmp_path / "ood", ["x", "y"], 6, 1))


@pytest.fixture
def hf_clip_dir(tmp_path):
    return save_hf_clip(tmp_path / "hf-clip")


def save_hf_clip(folder):
    """A stock CLIPModel (open_clip's 49,408-token vocabulary) with an HF tokenizer and image processor."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    from hydra_hf.convert.open_clip import clip_tokenizer_from_open_clip

    tokenizer = clip_tokenizer_from_open_clip(16)
    torch.manual_seed(0)
    config = CLIPConfig(
        text_config=dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            vocab_size=49408,
            max_position_embeddings=16,
            eos_token_id=49407,
            bos_token_id=49406,
            pad_token_id=49407,
        ),
        vision_config=dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            image_size=16,
            patch_size=8,
        ),
        projection_dim=16,
    )
    perturb(CLIPModel(config).eval(), scale=0.15).save_pretrained(folder)
    image_processor = CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(folder)
    return folder


@pytest.fixture
def open_clip_dir(tmp_path):
    return save_open_clip(tiny_open_clip(cfg=OC_CFG), tmp_path / "oc", OC_CFG)


@pytest.fixture
def timm_dir(tmp_path):
    import timm
    from timm.models import save_for_hf

    torch.manual_seed(0)
    args = {"img_size": 16, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 4}
    model = perturb(timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=3, **args).eval())
    folder = tmp_path / "timm"
    save_for_hf(model, str(folder), model_args=args, safe_serialization=True)
    return folder


def _prune(out, *args):
    return main(["prune", *args, "--output", str(out), "--no-progress", "--batch-size", "8"])


def test_hf_clip_joint_circuits_end_to_end(hf_clip_dir, images, tmp_path, capsys):
    id_dir, ood_dir = images
    out = tmp_path / "masks.json"
    rc = _prune(out, "--model", str(hf_clip_dir), "--class-names", ",".join(CLASSES), "--id-data", str(id_dir),
                "--ood-data", str(ood_dir), "--method", "circuit-avg,random", "--members", "2", "--remove", "3",
                "--heads-per-step", "3")
    assert rc == 0, capsys.readouterr().err
    masks = load_masks(out)
    assert masks.named and set(masks.towers) == {"vision", "text"}
    for m in range(2):
        assert masks.towers["vision"].num_kept(m) + masks.towers["text"].num_kept(m) == 8 + 4 - 3
    meta = masks.member_metadata[0]
    assert meta["method"] == "circuit-avg" and meta["tower"] == "joint" and all(len(p) == 3 for p in meta["ranking"])
    assert masks.metadata["class_names"] == CLASSES and masks.metadata["prompt_template"] == "a photo of a {}."
    assert "all towers" in capsys.readouterr().out
    converted = tmp_path / "hydra-clip"
    assert main(["convert", "--base", str(hf_clip_dir), "--masks", str(out), "--towers", "vision", "text",
                 "--output", str(converted)]) == 0
    config = json.loads((converted / "config.json").read_text())
    assert config["vision_kept_heads"] == masks.towers["vision"].kept_heads


def test_hf_clip_class_names_from_the_image_folder(hf_clip_dir, images, tmp_path, capsys, caplog):
    """Without --class-names, an image folder's sub-folders are the class names (issue 24 item 8), logged."""
    caplog.set_level(logging.INFO, logger="hydra_hf.workflows.prune")
    id_dir, _ = images
    out = tmp_path / "masks.json"
    rc = _prune(out, "--model", str(hf_clip_dir), "--id-data", str(id_dir), "--method", "taylor", "--remove", "2")
    assert rc == 0, capsys.readouterr().err
    assert load_masks(out).metadata["class_names"] == ["bird", "cat", "dog"]
    assert f"class names from the image folder {str(id_dir)!r}: bird, cat, dog" in caplog.text


def test_hf_clip_one_tower_and_class_names_file(hf_clip_dir, images, tmp_path):
    id_dir, _ = images
    names = tmp_path / "classes.txt"
    names.write_text("\n".join(CLASSES) + "\n")
    out = tmp_path / "text.json"
    rc = _prune(
        out,
        "--model",
        str(hf_clip_dir),
        "--class-names",
        str(names),
        "--prompt-template",
        "an image of {}",
        "--id-data",
        str(id_dir),
        "--method",
        "taylor",
        "--members",
        "2",
        "--heads-per-layer",
        "1",
        "--tower",
        "text",
    )
    assert rc == 0
    masks = load_masks(out)
    assert list(masks.towers) == ["text"] and all(len(h) == 1 for m in masks.towers["text"].kept_heads for h in m)
    assert masks.metadata["prompt_template"] == "an image of {}"


def test_open_clip_end_to_end(open_clip_dir, images, tmp_path):
    id_dir, _ = images
    out = tmp_path / "oc.json"
    rc = _prune(out, "--open-clip", str(open_clip_dir / "open_clip_config.json"), "--checkpoint", str(open_clip_dir),
                "--class-names", ",".join(CLASSES), "--id-data", str(id_dir), "--method", "taylor",
                "--members", "2", "--remove", "5")
    assert rc == 0
    masks = load_masks(out)
    assert masks.named and set(masks.towers) == {"vision", "text"}
    assert masks.towers["vision"].num_kept(0) + masks.towers["text"].num_kept(0) == 12 + 8 - 5
    assert masks.metadata["architecture"] == {"open_clip": str(open_clip_dir / "open_clip_config.json")}
    assert main(["convert", "--base", str(open_clip_dir), "--masks", str(out), "--output", str(tmp_path / "h")]) == 0


def test_timm_end_to_end(timm_dir, images, tmp_path):
    id_dir, _ = images
    out = tmp_path / "timm.json"
    rc = _prune(out, "--timm", "vit_tiny_patch16_224", "--checkpoint", str(timm_dir), "--id-data", str(id_dir),
                "--method", "taylor,random", "--members", "2", "--heads-per-layer", "2")
    assert rc == 0
    masks = HeadMasks.load(out)
    assert masks.num_layers == 2 and all(len(h) == 2 for m in masks.kept_heads for h in m)
    assert masks.metadata["architecture"] == {"timm": "vit_tiny_patch16_224"}
    assert main(["convert", "--base", str(timm_dir), "--masks", str(out), "--output", str(tmp_path / "h")]) == 0


@pytest.mark.parametrize(
    "case, message",
    [
        ("no-class-names", "give --class-names"),
        ("count-mismatch", "has 3 classes ['bird', 'cat', 'dog'] but --class-names gives 2"),
        ("unknown-tower", "unknown --tower 'audio'; choose one of vision, text, joint"),
        ("budget", "larger than the 12 heads of both towers"),
        ("template", "must contain '{}' exactly once"),
    ],
)
def test_hf_clip_errors_leave_no_output(hf_clip_dir, images, tmp_path, capsys, case, message):
    id_dir, _ = images
    args = {"class-names": ",".join(CLASSES), "remove": "2"}
    extra: list[str] = []
    if case == "no-class-names":  # and ID data that does not name its classes (an image folder does)
        args.pop("class-names")
        id_dir = tmp_path / "id.csv"
        id_dir.write_text(
            "image,label\n" + "".join(f"{p},{i % 3}\n" for i, p in enumerate(sorted(images[0].rglob("*.png"))))
        )
    elif case == "count-mismatch":
        args["class-names"] = "lion,tiger"
    elif case == "unknown-tower":
        extra = ["--tower", "audio"]
    elif case == "budget":
        args["remove"] = "13"
    elif case == "template":
        extra = ["--prompt-template", "a photo"]
    flags = [x for k, v in args.items() for x in (f"--{k}", v)]
    out = tmp_path / "m.json"
    assert (
        _prune(out, "--model", str(hf_clip_dir), "--id-data", str(id_dir), "--method", "taylor", *flags, *extra) == 2
    )
    last = capsys.readouterr().err.strip().splitlines()[-1]  # (transformers may print a loading bar first)
    assert last.startswith("hydra-hf prune: error: ") and message in last, last
    assert not out.exists() and not (tmp_path / "m.json.tmp").exists()


def test_label_values_outside_the_class_names(hf_clip_dir, tmp_path, capsys):
    import datasets

    g = torch.Generator().manual_seed(0)
    pics = [Image.fromarray((torch.rand(16, 16, 3, generator=g) * 255).to(torch.uint8).numpy()) for _ in range(4)]
    datasets.Dataset.from_dict({"img": pics, "y": [0, 1, 2, 3]}, features=datasets.Features(
        {"img": datasets.Image(), "y": datasets.Value("int64")})).save_to_disk(str(tmp_path / "data"))
    out = tmp_path / "m.json"
    rc = _prune(out, "--model", str(hf_clip_dir), "--id-data", str(tmp_path / "data"), "--image-column", "img",
                "--label-column", "y", "--class-names", ",".join(CLASSES), "--method", "taylor", "--remove", "1")
    assert rc == 2 and "label values [3] but --class-names gives 3 classes" in capsys.readouterr().err
    assert not out.exists()


def test_open_clip_and_timm_errors(open_clip_dir, timm_dir, images, tmp_path, capsys):
    id_dir, _ = images
    out = tmp_path / "m.json"
    cases = [
        (
            ["--open-clip", "ViT-B-32", "--checkpoint", str(tmp_path / "nope.safetensors"), "--class-names", "a,b"],
            "does not exist",
        ),
        (["--open-clip", "ViT-B-32"], "needs --checkpoint"),
        (["--timm", "vit_tiny_patch16_224", "--checkpoint", str(timm_dir), "--tower", "joint"], "only ['vision']"),
        (["--timm", "vit_tiny_patch16_224", "--checkpoint", str(open_clip_dir)], "no classifier"),
        (
            ["--open-clip", "not-a-model", "--checkpoint", str(open_clip_dir), "--class-names", "a,b"],
            "not an open_clip model name",
        ),
        (
            ["--open-clip", "ViT-B-16", "--checkpoint", str(open_clip_dir), "--class-names", "a,b"],
            "does not fit the model: missing",
        ),
    ]
    for extra, message in cases:
        rc = _prune(out, *extra, "--id-data", str(id_dir), "--method", "random", "--remove", "1")
        err = capsys.readouterr().err
        assert rc == 2 and message in err, (extra, err)
        assert not out.exists()


def test_read_class_names_formats(tmp_path):
    from hydra_hf.data import read_class_names
    from hydra_hf.pruning.loading import class_prompts

    lines, js = tmp_path / "names.txt", tmp_path / "names.json"
    lines.write_text("cat\n\ndog\n")
    js.write_text('["cat", "dog"]')
    assert read_class_names(lines) == read_class_names(js) == read_class_names("cat, dog") == ["cat", "dog"]
    assert class_prompts(["cat"], "a {} photo") == ["a cat photo"]
    with pytest.raises(ValueError, match="more than once"):
        read_class_names("cat,cat")
    with pytest.raises(ValueError, match="no class names"):
        read_class_names(" , ")
