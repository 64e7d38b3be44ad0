"""`hydra-hf evaluate` on zero-shot folders (CLIP, SigLIP; open_clip as the Single): the report's numbers
equal ZeroShotPredictor's, recomputed here from the images' files, the models' own folders and the
prompts; bad input is one line and leaves no report."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image
from test_modeling_clip import save_open_clip, tiny_open_clip, two_tower_masks
from test_modeling_deit_beit_dinov2_siglip import UNEQUAL, masks_for, save_stock, stock
from test_prune_cli_vision import OC_CFG, _image_folder, save_hf_clip

from hydra_hf import evaluation as ev
from hydra_hf import metrics
from hydra_hf.assemble import convert_checkpoint
from hydra_hf.cli import main
from hydra_hf.cli.evaluate import TEMPLATE_SET_NAMES
from hydra_hf.data import TEMPLATE_SETS, read_templates
from hydra_hf.families import get_family
from hydra_hf.masks import HeadMasks

FOLDER_CLASSES = ["bird", "cat", "dog"]  # the image folder's sub-folders (sorted)
# hf CLIP: vision 2 layers x 4 heads, text 2 layers x 2 heads; member 1 keeps 0 in a layer
CLIP_MASKS = HeadMasks(towers={
    "vision": HeadMasks(kept_heads=[[[0, 1], [2, 3]], [[1, 2, 3], []], [[3], [0, 1, 2]]], num_heads=4),
    "text": HeadMasks(kept_heads=[[[0], [1]], [[1], [0, 1]], [[0, 1], [0]]], num_heads=2),
})


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    return _image_folder(root / "id", FOLDER_CLASSES, 4, 0), _image_folder(root / "ood", ["x", "y"], 3, 1)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """family -> (stock folder, Hydra folder of 3 members)."""
    root = tmp_path_factory.mktemp("zero-shot")
    clip = save_hf_clip(root / "clip")
    siglip = save_stock(stock("siglip"), root / "siglip", "siglip")
    out = {}
    for family, base, masks in (("clip", clip, CLIP_MASKS), ("siglip", siglip, masks_for("siglip", UNEQUAL))):
        convert_checkpoint(masks, base=base, output_dir=root / f"hydra-{family}")
        out[family] = (base, root / f"hydra-{family}")
    return out


def recompute(folder, family: str, names: list[str], templates: list[str], files: list, pixels_from=None):
    """``(N, M, C)`` member logits of the folder's model on the image files: ZeroShotPredictor with the
    family's prompt tokenization, the images preprocessed by ``pixels_from``'s processor (default: its own)."""
    from transformers import AutoImageProcessor, AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    kwargs = get_family(family).prompt_tokenizer_kwargs  # SigLIP pads to 64 tokens, as its pipeline does
    predictor = ev.ZeroShotPredictor(
        model, names, templates, tokenizer=lambda t: tokenizer(t, return_tensors="pt", **kwargs)
    )
    processor = AutoImageProcessor.from_pretrained(pixels_from or folder)
    # (N, 3, S, S)
    pixels = processor([Image.open(f).convert("RGB") for f in files], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        return predictor.member_logits({"pixel_values": pixels})


def files_and_labels(folder, names: list[str]):
    files = sorted(folder.rglob("*.png"))
    return files, torch.tensor([names.index(f.parent.name) for f in files])


def expected_row(member_logits: torch.Tensor, labels: torch.Tensor, ood_logits: torch.Tensor) -> dict[str, float]:
    probs = member_logits.double().softmax(-1).mean(1)  # (N, C): the members' mean softmax
    ood = ood_logits.double().softmax(-1).mean(1)
    return {"accuracy": float((probs.argmax(-1) == labels).double().mean()),
            "nll": float(-probs[torch.arange(len(labels)), labels].log().mean()),
            "auroc": metrics.ood_auroc(probs.max(-1).values, ood.max(-1).values)}


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_report_equals_zero_shot_predictor(folders, data, tmp_path, family):
    """Hydra and its stock Single, on the same images with the same prompts: accuracy, NLL and OOD AUROC
    of report.json are ZeroShotPredictor's. CLIP: class names given in another order than the folder's
    (matched by name) and a templates file; SigLIP: the folder's names and the `simple` template set."""
    base, hydra = folders[family]
    id_dir, ood_dir = data
    if family == "clip":
        names, templates = ["cat", "dog", "bird"], ["a photo of a {}.", "a blurry picture of the {}"]
        (tmp_path / "t.txt").write_text("\n".join(templates) + "\n")
        extra = ["--class-names", ",".join(names), "--templates", str(tmp_path / "t.txt")]
    else:
        names, templates = FOLDER_CLASSES, read_templates("simple")
        extra = ["--templates", "simple"]
    report = tmp_path / "report"
    rc = main(["evaluate", "--model", str(hydra), "--baseline", f"Single={base}", "--id-data", str(id_dir),
               "--ood-data", f"noise={ood_dir}", "--batch-size", "5", "--bootstrap", "0", "--report", str(report),
               *extra])
    assert rc == 0
    assert {"report.json", "report.md", "reliability.png", "ood_scores.png"} <= {p.name for p in report.iterdir()}
    got = {row["method"]: row for row in json.loads((report / "report.json").read_text())["rows"]}
    assert list(got) == ["Hydra", "Single"] and got["Hydra"]["members"] == 3 and got["Single"]["members"] == 1

    files, labels = files_and_labels(id_dir, names)
    ood_files = sorted(ood_dir.rglob("*.png"))
    for name, folder in (("Hydra", hydra), ("Single", base)):
        want = expected_row(recompute(folder, family, names, templates, files), labels,
                            recompute(folder, family, names, templates, ood_files))
        for key in ("accuracy", "nll"):
            assert got[name][key] == pytest.approx(want[key], abs=1e-5), (name, key)
        assert got[name]["noise"]["auroc"] == pytest.approx(want["auroc"], abs=1e-6), name
    assert abs(got["Hydra"]["nll"] - got["Single"]["nll"]) > 1e-4  # the members are not the stock model


def test_open_clip_single_beside_its_hydra(tmp_path, data):
    """A Hydra CLIP converted from an open_clip folder, against that folder as the Single: the Single's
    row is open_clip's own model and tokenizer on the Hydra folder's preprocessed images."""
    from hydra_hf.recipes.zero_shot import load_open_clip_folder

    base = save_open_clip(tiny_open_clip(cfg=OC_CFG), tmp_path / "oc", OC_CFG)
    hydra = tmp_path / "hydra"
    convert_checkpoint(two_tower_masks(), base=base, output_dir=hydra)  # 3 members
    id_dir, ood_dir = data
    report = tmp_path / "report"
    assert main(["evaluate", "--model", str(hydra), "--baseline", f"Single={base}", "--id-data", str(id_dir),
                 "--ood-data", str(ood_dir), "--bootstrap", "0", "--report", str(report)]) == 0
    got = {row["method"]: row for row in json.loads((report / "report.json").read_text())["rows"]}

    files, labels = files_and_labels(id_dir, FOLDER_CLASSES)
    model, _, tokenizer = load_open_clip_folder(base)
    single = ev.ZeroShotPredictor(model, FOLDER_CLASSES, ["a photo of a {}."], tokenizer=tokenizer)
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(hydra)
    pixels = processor([Image.open(f).convert("RGB") for f in files], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        probs = single.member_logits({"pixel_values": pixels}).double().softmax(-1).mean(1)  # (N, C)
    assert got["Single"]["nll"] == pytest.approx(
        float(-probs[torch.arange(len(labels)), labels].log().mean()), abs=1e-5
    )
    assert got["Single"]["accuracy"] == pytest.approx(float((probs.argmax(-1) == labels).double().mean()), abs=1e-9)
    assert got["Hydra"]["members"] == 3


def test_a_data_set_split_with_class_names(folders, data, tmp_path):
    """FOLDER:SPLIT of a save_to_disk data set (image paths; class names as labels, in --label-column)
    and --class-names: the labels are matched to the names, and the numbers are ZeroShotPredictor's."""
    import datasets

    base, hydra = folders["clip"]
    id_dir, ood_dir = data
    names = ["dog", "bird", "cat"]
    files, labels = files_and_labels(id_dir, names)
    rows = {"image": [str(f) for f in files], "class": [f.parent.name for f in files]}
    datasets.DatasetDict({"test": datasets.Dataset.from_dict(rows)}).save_to_disk(str(tmp_path / "ds"))
    report = tmp_path / "report"
    assert main(["evaluate", "--model", str(hydra), "--id-data", f"{tmp_path / 'ds'}:test", "--label-column", "class",
                 "--class-names", ",".join(names), "--ood-data", str(ood_dir), "--bootstrap", "0",
                 "--report", str(report)]) == 0
    (row,) = json.loads((report / "report.json").read_text())["rows"]
    templates = ["a photo of a {}."]
    want = expected_row(recompute(hydra, "clip", names, templates, files), labels,
                        recompute(hydra, "clip", names, templates, sorted(ood_dir.rglob("*.png"))))
    assert row["accuracy"] == pytest.approx(want["accuracy"], abs=1e-9)
    assert row["nll"] == pytest.approx(want["nll"], abs=1e-5)


@pytest.mark.parametrize(
    "case, message",
    [
        ("text-data", "gives texts (columns ['text', 'label']), but a zero-shot clip model classifies images"),
        ("count-mismatch", "has 3 classes ['bird', 'cat', 'dog'] but --class-names gives 2"),
        ("no-class-names", "give --class-names"),
        ("mc-dropout", "--mc-dropout does not apply to a zero-shot clip model"),
        ("templates", "--templates 'a photo' is not a template set"),
        ("classifier-baseline", "is not a CLIP, SigLIP or open_clip folder"),
        ("onnx", "is an ONNX export of a zero-shot clip model; hydra-hf evaluate runs zero-shot models from their "
                 "PyTorch folder"),
    ],
)
def test_bad_input_is_one_line(folders, data, tmp_path, capsys, case, message):
    _, hydra = folders["clip"]
    id_dir, ood_dir = data
    id_data, extra = str(id_dir), []
    if case == "text-data":
        (tmp_path / "id.csv").write_text("text,label\na cat,0\na dog,1\n")
        id_data, extra = str(tmp_path / "id.csv"), ["--class-names", "cat,dog"]
    elif case == "count-mismatch":
        extra = ["--class-names", "lion,tiger"]
    elif case == "no-class-names":  # labelled images that do not name their classes
        import datasets

        files, labels = files_and_labels(id_dir, FOLDER_CLASSES)
        datasets.Dataset.from_dict(
            {"image": [str(f) for f in files], "label": labels.tolist()},
            features=datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")}),
        ).save_to_disk(str(tmp_path / "ds"))
        id_data = str(tmp_path / "ds")
    elif case == "mc-dropout":
        extra = ["--mc-dropout", "Hydra"]
    elif case == "templates":
        extra = ["--templates", "a photo"]
    elif case == "classifier-baseline":
        (tmp_path / "bert").mkdir()
        (tmp_path / "bert" / "config.json").write_text('{"model_type": "bert"}')
        extra = ["--baseline", f"Single={tmp_path / 'bert'}"]
    elif case == "onnx":  # an export folder: its config and hydra_onnx.json (what makes it one) are enough
        (tmp_path / "onnx").mkdir()
        (tmp_path / "onnx" / "config.json").write_text((hydra / "config.json").read_text())
        (tmp_path / "onnx" / "hydra_onnx.json").write_text("{}")
        hydra = tmp_path / "onnx"
    report = tmp_path / "report"
    rc = main(["evaluate", "--model", str(hydra), "--id-data", id_data, "--ood-data", str(ood_dir), "--report",
               str(report), *extra])
    assert rc == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("hydra-hf evaluate: error: ") and message in last, last
    assert not report.exists()


def test_template_sets():
    """The CLI's --help names exactly the registered sets; each set is templates with one {} each."""
    assert tuple(TEMPLATE_SETS) == TEMPLATE_SET_NAMES
    assert len(read_templates("openai")) == 80 and "a bad photo of a {}." in read_templates("openai")
    assert read_templates(None) == ["a photo of a {}."] and read_templates("itap of a {}.") == ["itap of a {}."]
