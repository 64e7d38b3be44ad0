"""ONNX deployment (`hydra-hf export --format onnx`, `hydra_hf.onnx`): the exported graph equals PyTorch
at other batch sizes and sequence lengths with padding (dynamic axes), int8 quantisation and its report,
`hydra-hf evaluate` and the uncertainty pipeline on the ONNX folder, and one-line refusals.

Tiny models (hidden 32, 2 layers, 4 heads) whose members keep unequal numbers of heads, one of them
none in a layer; each family is exported once per module (the dynamo exporter takes a few seconds)."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import run_fresh_python, tiny_bert_config
from test_transformers_workflows import _perturb, save_preprocessor
from transformers import CLIPConfig, ViTConfig

from hydra_hf.cli import main
from hydra_hf.hub.audit import PACKAGED_CODE_DIR, check_shipped_code
from hydra_hf.modeling.configuration_hydra import HydraEnsembleConfig
from hydra_hf.modeling.configuration_hydra_clip import HydraEnsembleCLIPConfig
from hydra_hf.modeling.configuration_hydra_vit import HydraEnsembleViTConfig
from hydra_hf.modeling.modeling_hydra_bert import HydraEnsembleForSequenceClassification
from hydra_hf.modeling.modeling_hydra_clip import HydraEnsembleCLIPModel
from hydra_hf.modeling.modeling_hydra_vit import HydraEnsembleForImageClassification
from hydra_hf.saving import save_hydra_model

pytest.importorskip("onnxruntime")  # a guard only: tools/bootstrap.sh installs the onnx extra
pytest.importorskip("onnxscript")

from hydra_hf.onnx import OnnxHydraModel, pipeline
from hydra_hf.onnx.export import (
    export_onnx,
    load_hydra_folder,
)

ATOL = 1e-4
FAMILIES = ("bert", "vit", "clip")
KEPT = [[[0, 1], [2, 3]], [[1, 2, 3], []], [[0], [0, 1, 2, 3]]]  # unequal widths, a member with 0 heads in layer 1
TEXT_KEPT = [[[0, 1], []], [[3], [0, 1]], [[0, 2], [1, 2, 3]]]
WORDS = "the a movie film good bad great awful plot actor fun boring i it was is and not very".split()
KEYS = {"bert": ("logits", "member_logits"), "vit": ("logits", "member_logits"),
        "clip": ("logits_per_image", "member_logits_per_image")}


def tiny_hydra(family: str, seed: int = 0):
    torch.manual_seed(seed)
    if family == "bert":
        config = HydraEnsembleConfig(base_config=tiny_bert_config(num_hidden_layers=2).to_dict(), kept_heads=KEPT,
                                     num_labels=3)
        model = HydraEnsembleForSequenceClassification(config)
    elif family == "vit":
        base = ViTConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            image_size=16,
            patch_size=8,
            initializer_range=0.2,
        )
        config = HydraEnsembleViTConfig(base_config=base.to_dict(), kept_heads=KEPT, num_labels=3,
                                        id2label={0: "cat", 1: "dog", 2: "bird"})
        model = HydraEnsembleForImageClassification(config)
    else:
        base = CLIPConfig(
            text_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                             vocab_size=514, max_position_embeddings=32, bos_token_id=512, eos_token_id=513,
                             pad_token_id=513),
            vision_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                               image_size=16, patch_size=8),
            projection_dim=24,
        )
        config = HydraEnsembleCLIPConfig(base_config=base.to_dict(), vision_kept_heads=KEPT, text_kept_heads=TEXT_KEPT)
        model = HydraEnsembleCLIPModel(config)
    return _perturb(model, seed).eval()


def _texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9))) for _ in range(n)]


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, Path]:
    """Per family a Hydra folder ``hydra-<family>`` and its export ``onnx-<family>``; BERT is exported
    through the CLI with ``--quantize int8`` and a report on csv data (ID + one OOD set)."""
    root = tmp_path_factory.mktemp("onnx")
    for family in FAMILIES:
        save_preprocessor(family, root / f"prep-{family}")
        save_hydra_model(tiny_hydra(family), root / f"hydra-{family}", preprocessor_from=root / f"prep-{family}")
    # the export never runs a folder's shipped code (it loads with hydra_hf's classes): break it
    (root / "hydra-bert" / "modeling_hydra_bert.py").write_text("raise RuntimeError('the shipped code ran')\n")
    texts = _texts(60, seed=0)
    pd.DataFrame({"text": texts, "label": [i % 3 for i in range(60)]}).to_csv(root / "id.csv", index=False)
    pd.DataFrame({"text": [t[::-1] for t in _texts(30, seed=1)]}).to_csv(root / "ood.csv", index=False)
    rc = main(
        [
            "export",
            str(root / "hydra-bert"),
            "--format",
            "onnx",
            "--output",
            str(root / "onnx-bert"),
            "--quantize",
            "int8",
            "--calibration-data",
            str(root / "id.csv"),
            "--ood-data",
            f"rev={root / 'ood.csv'}",
            "--batch-size",
            "16",
        ]
    )
    assert rc == 0
    for family in ("vit", "clip"):
        export_onnx(root / f"hydra-{family}", root / f"onnx-{family}")
    return {"root": root, **{f: root / f"onnx-{f}" for f in FAMILIES}}


def _inputs(family: str, batch: int, seq: int, images: int, seed: int) -> dict[str, torch.Tensor]:
    """Random inputs; text rows 0 and 2 padded (the masks mask something)."""
    g = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    if family in ("bert", "clip"):
        ids = torch.randint(5, 99 if family == "bert" else 512, (batch, seq), generator=g)
        mask = torch.ones_like(ids)
        mask[0, seq // 2 :] = 0
        mask[min(2, batch - 1), seq - 2 :] = 0
        if family == "clip":  # the end-of-text token (CLIP pools there) ends every text, then pads it
            for row in range(batch):
                length = int(mask[row].sum())
                ids[row, length - 1 :] = 513
        out = {"input_ids": ids, "attention_mask": mask}
        if family == "bert":
            out["token_type_ids"] = torch.zeros_like(ids)
    if family in ("vit", "clip"):
        out["pixel_values"] = torch.randn(images, 3, 16, 16, generator=g)
    return out


# ------------------------------------------------------------------------------ fp32 graph
@pytest.mark.parametrize("family", FAMILIES)
def test_fp32_graph_equals_pytorch_at_other_batch_sizes_and_lengths(family, exported):
    """Two batch sizes and two sequence lengths (both unlike the export's example), padded rows, a
    member with no head in a layer: ONNX Runtime == PyTorch eager within 1e-4; the graph's axes are
    symbolic, and the padding changes the result (the mask is in the graph)."""
    folder = exported[family]
    model, _, _ = load_hydra_folder(exported["root"] / f"hydra-{family}")
    onnx_model = OnnxHydraModel.from_pretrained(folder, file_name="model.onnx")
    axes = {i.name: i.shape for i in onnx_model.session.get_inputs()}
    assert all(
        isinstance(d, str) for name, shape in axes.items() for d in shape[: 1 if name == "pixel_values" else 2]
    ), axes
    logits_key, member_key = KEYS[family]
    for batch, seq, images, seed in ((3, 9, 1, 1), (6, 17, 4, 2)):
        inputs = _inputs(family, batch, seq, images, seed)
        with torch.no_grad():
            expected = model(**inputs)
        got = onnx_model(**inputs)
        assert got[member_key].shape == expected[member_key].shape
        assert got[member_key].shape[1] == 3
        for key in (logits_key, member_key):
            torch.testing.assert_close(got[key], expected[key], atol=ATOL, rtol=0, msg=key)
        assert not torch.allclose(expected[member_key][:, 0], expected[member_key][:, 1], atol=1e-3)  # members differ
        if family == "bert":  # (CLIP pools at the end-of-text token, which a causal mask keeps from the padding)
            unpadded = onnx_model(**{**inputs, "attention_mask": torch.ones_like(inputs["attention_mask"])})
            assert (unpadded[logits_key] - got[logits_key]).abs().max() > 1e-3


def test_export_folder_has_config_preprocessor_card_and_no_code(exported):
    """The folder ships its config's code (hydra_hf's own files, verbatim) and no modeling code or weights."""
    folder = exported["bert"]
    names = {p.name for p in folder.iterdir()}
    assert {"model.onnx", "model_int8.onnx", "config.json", "hydra_onnx.json", "README.md", "tokenizer_config.json",
            "quantization_report.json", "quantization_report.md"} <= names
    assert not [n for n in names if n.endswith(".safetensors") or n.startswith("modeling_")]
    code = ["configuration_hydra.py", "hydra_formulas.py", "pipeline_hydra.py"]  # the pipeline's formulas too
    assert sorted(n for n in names if n.endswith(".py")) == code
    for name in code:  # the source folder's modeling file was broken
        assert (folder / name).read_bytes() == (PACKAGED_CODE_DIR / name).read_bytes(), name
    assert check_shipped_code(folder) == code  # the audit's allow-list
    config = json.loads((folder / "config.json").read_text())
    assert config["auto_map"] == {"AutoConfig": "configuration_hydra.HydraEnsembleConfig"}
    assert "custom_pipelines" not in config and config["model_type"].startswith("hydra_ensemble")
    metadata = json.loads((folder / "hydra_onnx.json").read_text())
    assert metadata["opset"] == 18 and metadata["default_file"] == "model_int8.onnx"
    assert metadata["inputs"]["input_ids"]["shape"] == ["batch", "sequence"]
    assert metadata["outputs"]["member_logits"]["shape"] == ["batch", "members", "labels"]
    assert metadata["verification"]["max_abs_diff_fp32"] < ATOL
    card = (folder / "README.md").read_text()
    for needle in ("opset 18", "`input_ids`", "`member_logits`", "QInt8", "Quantisation report"):
        assert needle in card, needle
    clip = json.loads((exported["clip"] / "hydra_onnx.json").read_text())
    assert set(clip["outputs"]) == {"logits_per_image", "member_logits_per_image"}
    assert clip["inputs"]["pixel_values"]["shape"][0] == "images" and clip["inputs"]["input_ids"]["shape"] == [
        "texts",
        "sequence",
    ]


def test_export_folder_opens_with_autoconfig_in_a_fresh_process_without_hydra_hf(exported):
    """`AutoConfig.from_pretrained(folder, trust_remote_code=True)` (how loaders start) reads the export's
    Hydra config where hydra_hf is not installed: labels, members, the base model's settings."""
    folders = {family: str(exported[family]) for family in FAMILIES}
    out = run_fresh_python(f"""
        import json
        from transformers import AutoConfig
        for family, folder in {folders!r}.items():
            config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
            base = config.base_config["text_config"]["vocab_size"] if family == "clip" else config.hidden_size
            print(json.dumps([family, type(config).__name__, config.num_members, config.id2label.get(0), base]))
    """)
    rows = {row[0]: row[1:] for row in map(json.loads, out.splitlines())}
    assert rows == {"bert": ["HydraEnsembleConfig", 3, "LABEL_0", 32], "vit": ["HydraEnsembleViTConfig", 3, "cat", 32],
                    "clip": ["HydraEnsembleCLIPConfig", 3, "LABEL_0", 514]}, rows


def test_export_logs_name_the_output_not_its_temporary_folder(exported, tmp_path, caplog):
    """Issue 24 item 9: the export's own check logged `loaded OUT_PARENT/.OUT.tmp-PID-.../model.onnx`."""
    caplog.set_level(logging.INFO)
    out = export_onnx(exported["root"] / "hydra-vit", tmp_path / "again")
    assert f"wrote {out}" in caplog.text and ".tmp-" not in caplog.text, caplog.text

# ------------------------------------------------------------------------------ int8
def test_two_tower_int8_export_uses_the_smoothquant_recipe_and_reports_zero_shot(exported, tmp_path):
    """Issue 26 item 2: a CLIP Hydra's int8 graph (both towers) is built by the default recipe, stays
    close to fp32, and its report scores zero-shot classes named by the calibration folder."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for cls in ("cat", "dog"):
        (tmp_path / "id" / cls).mkdir(parents=True)
        for i in range(12):
            Image.fromarray((rng.random((32, 32, 3)) * 255).astype("uint8")).save(tmp_path / "id" / cls / f"{i}.png")
    (tmp_path / "ood" / "x").mkdir(parents=True)
    for i in range(10):
        Image.fromarray((rng.random((32, 32, 3)) * 90).astype("uint8")).save(tmp_path / "ood" / "x" / f"{i}.png")
    out = tmp_path / "onnx-clip-int8"
    export_onnx(exported["root"] / "hydra-clip", out, quantize="int8", calibration_data=str(tmp_path / "id"),
                ood_data=[f"dark={tmp_path / 'ood'}"], data_options={"image_column": "image"})
    report = json.loads((out / "quantization_report.json").read_text())
    assert report["settings"]["int8_recipe"] == "smoothquant" and report["settings"]["class_names"] == ["cat", "dog"]
    assert report["num_examples"] == {"calibration": 24, "dark": 10}
    assert report["label_agreement"] >= 0.9 and 0 < report["max_abs_member_logit_change"] < 0.5
    int8, fp32 = OnnxHydraModel.from_pretrained(out), OnnxHydraModel.from_pretrained(out, file_name="model.onnx")
    assert int8.precision == "int8" and fp32.precision == "fp32"
    inputs = _inputs("clip", batch=2, seq=7, images=3, seed=5)
    a, b = int8(**inputs), fp32(**inputs)
    assert a.logits_per_image.shape == b.logits_per_image.shape
    assert 0 < (a.logits_per_image - b.logits_per_image).abs().max() < 0.5


def test_int8_graph_is_close_but_not_equal_and_its_report_has_the_metrics(exported):
    folder = exported["bert"]
    int8 = OnnxHydraModel.from_pretrained(folder)  # the default graph of a quantised export
    fp32 = OnnxHydraModel.from_pretrained(folder / "model.onnx")
    assert int8.precision == "int8" and fp32.precision == "fp32"
    inputs = _inputs("bert", 6, 17, 0, seed=3)
    a, b = int8(**inputs), fp32(**inputs)
    change = float((a.member_logits - b.member_logits).abs().max())
    assert 1e-5 < change < 0.3, change  # quantised (it differs), and close
    assert float((a.logits.exp() - b.logits.exp()).abs().max()) < 0.05
    report = json.loads((folder / "quantization_report.json").read_text())
    for name in ("fp32", "int8"):
        row = report["models"][name]
        for key in ("accuracy", "ece", "nll", "brier"):
            assert 0 <= row[key] < 5, (name, key)
        assert set(row["ood_auroc"]["rev"]) == {"msp", "mutual_information"}
    assert report["num_examples"] == {"calibration": 60, "rev": 30}
    diff = report["difference_int8_minus_fp32"]
    assert diff["nll"] == pytest.approx(report["models"]["int8"]["nll"] - report["models"]["fp32"]["nll"])
    assert 0.8 <= report["label_agreement"] <= 1 and report["max_abs_member_logit_change"] > 1e-5
    # the report's fp32 numbers are hydra_hf.metrics on PyTorch's predictions (same data, same order)
    from hydra_hf import evaluation as ev
    from hydra_hf import metrics
    from hydra_hf.data import resolve_dataset

    model, _, _ = load_hydra_folder(exported["root"] / "hydra-bert")
    tokenizer = ev.load_classifier(folder)[1]
    loader = ev.make_loader(resolve_dataset(str(exported["root"] / "id.csv"), require_labels=True, num_labels=3),
                            tokenizer, "text", batch_size=16)
    preds = ev.predict(ev.ModelPredictor(model), loader)
    assert report["models"]["fp32"]["nll"] == pytest.approx(metrics.nll(preds.probs, preds.labels), abs=ATOL)
    assert report["models"]["fp32"]["ece"] == pytest.approx(metrics.ece(preds.probs, preds.labels), abs=ATOL)


# ------------------------------------------------------------------------------ evaluate, pipeline
def _numbers(row: dict, prefix: str = "") -> dict[str, float]:
    out = {}
    for key, value in row.items():
        if key in ("latency_ms", "params_m"):
            continue
        if isinstance(value, dict):
            out.update(_numbers(value, f"{prefix}{key}."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[prefix + key] = float(value)
    return out


def test_evaluate_reports_onnx_fp32_as_pytorch_and_int8_beside_them(exported, tmp_path):
    root = exported["root"]
    rc = main(["evaluate", "--model", str(exported["bert"] / "model.onnx"), "--name", "ONNX fp32",
               "--baseline", f"PyTorch={root / 'hydra-bert'}", "--baseline", f"ONNX int8={exported['bert']}",
               "--id-data", str(root / "id.csv"), "--ood-data", f"rev={root / 'ood.csv'}", "--batch-size", "16",
               "--bootstrap", "0", "--report", str(tmp_path / "report")])
    assert rc == 0
    rows = {row["method"]: row for row in json.loads((tmp_path / "report" / "report.json").read_text())["rows"]}
    onnx, torch_row, int8 = _numbers(rows["ONNX fp32"]), _numbers(rows["PyTorch"]), _numbers(rows["ONNX int8"])
    assert onnx.keys() == torch_row.keys() and "rev.auroc" in onnx and "mutual_information" in onnx
    bad = {k: (onnx[k], torch_row[k]) for k in onnx if abs(onnx[k] - torch_row[k]) > ATOL}
    assert not bad, bad
    assert any(abs(int8[k] - onnx[k]) > 1e-7 for k in ("nll", "brier", "mutual_information"))
    assert all(rows[name]["latency_ms"] > 0 for name in rows)
    assert rows["ONNX fp32"]["params_m"] == pytest.approx(rows["PyTorch"]["params_m"], rel=0.05)


def _pytorch_pipeline(family: str, root: Path):
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer
    from transformers import pipeline as hf_pipeline

    model, _, _ = load_hydra_folder(root / f"hydra-{family}")
    folder = root / f"prep-{family}"
    if family == "bert":
        return hf_pipeline("hydra-text-classification", model=model, tokenizer=AutoTokenizer.from_pretrained(folder))
    if family == "vit":
        return hf_pipeline(
            "hydra-image-classification", model=model, image_processor=AutoImageProcessor.from_pretrained(folder)
        )
    processor = AutoProcessor.from_pretrained(folder)
    return hf_pipeline("hydra-zero-shot-image-classification", model=model, tokenizer=processor.tokenizer,
                       image_processor=processor.image_processor)


@pytest.mark.parametrize("family", FAMILIES)
def test_pipeline_on_onnx_gives_pytorch_labels_and_uncertainty(family, exported):
    import numpy as np
    from PIL import Image

    import hydra_hf  # noqa: F401  (registers the hydra-* pipeline tasks)

    onnx_pipe = pipeline(exported[family], file_name="model.onnx")
    torch_pipe = _pytorch_pipeline(family, exported["root"])
    rng = np.random.default_rng(0)
    images = [Image.fromarray((rng.random((20, 24, 3)) * 255).astype("uint8")) for _ in range(3)]
    inputs = {"bert": _texts(4, seed=5), "vit": images, "clip": images}[family]
    kwargs = {"candidate_labels": ["cat", "dog", "bird"]} if family == "clip" else {}
    got, expected = onnx_pipe(inputs, **kwargs), torch_pipe(inputs, **kwargs)
    assert len(got) == len(expected) == len(inputs)
    for g, e in zip(got, expected):
        assert g["label"] == e["label"] and g["member_labels"] == e["member_labels"]
        assert g["score"] == pytest.approx(e["score"], abs=ATOL)
        for name, value in e["uncertainty"].items():
            assert g["uncertainty"][name] == pytest.approx(value, abs=ATOL), name
    assert any(e["uncertainty"]["mutual_information"] > 1e-4 for e in expected)  # the members disagree


# ------------------------------------------------------------------------------ refusals
def _fails(capsys, argv: list[str], needle: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()  # log lines (INFO) may come first; the error is the last line
    last = err.splitlines()[-1]
    assert last.startswith(f"hydra-hf {argv[0]}: error:") and "Traceback" not in err, err
    assert needle in last, err


def test_bad_inputs_are_one_line_errors_without_output(exported, tiny_bert_dir, tmp_path, capsys):
    root, out = exported["root"], tmp_path / "out"
    hydra = str(root / "hydra-bert")
    _fails(
        capsys, ["export", str(tiny_bert_dir), "--format", "onnx", "--output", str(out)], "not a Hydra Ensemble folder"
    )
    _fails(capsys, ["export", str(tmp_path / "nope"), "--format", "onnx", "--output", str(out)], "does not exist")
    _fails(capsys, ["export", hydra, "--format", "tflite", "--output", str(out)], "--format 'tflite' is not supported")
    _fails(capsys, ["export", hydra, "--format", "onnx", "--quantize", "int4", "--output", str(out)], "int8")
    _fails(
        capsys, ["export", hydra, "--format", "onnx", "--quantize", "int8", "--output", str(out)], "--calibration-data"
    )
    _fails(capsys, ["export", hydra, "--format", "onnx", "--quantize", "int8", "--calibration-data",
                    str(tmp_path / "missing.csv"), "--output", str(out)], "missing.csv")
    _fails(capsys, ["export", hydra, "--format", "onnx", "--opset", "13", "--output", str(out)], "opset")
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    _fails(capsys, ["export", hydra, "--format", "onnx", "--output", str(out)], "--overwrite")
    _fails(capsys, ["export", hydra, "--format", "onnx", "--output", str(out), "--overwrite"], "was not written by")
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]
    with pytest.raises(ValueError, match="not a hydra-hf ONNX export"):
        OnnxHydraModel.from_pretrained(root / "hydra-bert")
    with pytest.raises(ValueError, match="takes"):
        OnnxHydraModel.from_pretrained(exported["vit"])(input_ids=torch.ones(1, 3, dtype=torch.long))


def test_without_the_onnx_packages_hydra_hf_works_and_export_says_what_to_install(exported, tmp_path):
    """A fresh process where onnx, onnxruntime and onnxscript cannot be imported: hydra_hf and
    hydra_hf.onnx import, and export / evaluate of an ONNX folder (with data that exists: evaluate checks it
    first) fail in one line naming the extra."""
    code = f"""
    import contextlib, io, sys
    for name in ("onnx", "onnxruntime", "onnxscript"):
        sys.modules[name] = None
    import hydra_hf, hydra_hf.onnx
    from hydra_hf.cli import main
    root = {str(exported['root'])!r}
    for argv in (["export", root + "/hydra-bert", "--format", "onnx", "--output", {str(tmp_path / 'out')!r}],
                 ["evaluate", "--model", {str(exported['bert'])!r}, "--id-data", root + "/id.csv",
                  "--ood-data", root + "/ood.csv", "--report", {str(tmp_path / 'r')!r}]):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = main(argv)
        print(rc, err.getvalue().strip().splitlines()[-1])
    """
    lines = run_fresh_python(code, block_hydra=False).strip().splitlines()[-2:]
    for line, command in zip(lines, ("export", "evaluate")):
        assert line.startswith(f"2 hydra-hf {command}: error:") and "pip install hydra-hf[onnx]" in line, line
    assert not (tmp_path / "out").exists() and not (tmp_path / "r").exists()


def _image_folder(root: Path, classes: tuple[str, ...], per_class: int, seed: int) -> Path:
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(root / c / f"{i}.png")
    return root


def test_clip_int8_with_a_zero_shot_report_on_class_prompts(exported, tmp_path):
    """Two-tower int8: the report classifies the calibration images against prompts of their class names;
    its fp32 numbers are PyTorch's zero-shot predictor's (one template: the same scaled cosines)."""
    from hydra_hf import evaluation as ev
    from hydra_hf import metrics
    from hydra_hf.data import resolve_dataset
    from hydra_hf.evaluation.onnx_check import OnnxZeroShotPredictor

    root = exported["root"]
    ident = _image_folder(tmp_path / "id", ("cat", "dog", "bird"), 6, seed=0)
    ood = _image_folder(tmp_path / "ood" / "x", ("noise",), 8, seed=1).parent / "x"
    rc = main(
        [
            "export",
            str(root / "hydra-clip"),
            "--format",
            "onnx",
            "--output",
            str(tmp_path / "onnx"),
            "--quantize",
            "int8",
            "--calibration-data",
            str(ident),
            "--ood-data",
            f"noise={ood}",
            "--class-template",
            "a photo of a {}.",
            "--batch-size",
            "8",
        ]
    )
    assert rc == 0
    report = json.loads((tmp_path / "onnx" / "quantization_report.json").read_text())
    assert report["settings"]["class_names"] == ["bird", "cat", "dog"] and report["num_examples"] == {
        "calibration": 18,
        "noise": 8,
    }
    assert set(report["models"]["int8"]["ood_auroc"]["noise"]) == {"msp", "mutual_information"}
    assert "Zero-shot classes" in (tmp_path / "onnx" / "quantization_report.md").read_text()
    from transformers import AutoProcessor

    model, _, _ = load_hydra_folder(root / "hydra-clip")
    processor = AutoProcessor.from_pretrained(root / "prep-clip")
    data = resolve_dataset(str(ident), require_labels=True)
    loader = ev.make_loader(data, processor.image_processor, "image", batch_size=8)
    torch_preds = ev.predict(ev.ZeroShotPredictor(model, ["bird", "cat", "dog"], ["a photo of a {}."],
                                                  tokenizer=processor.tokenizer), loader)
    fp32 = OnnxHydraModel.from_pretrained(tmp_path / "onnx" / "model.onnx")
    onnx_preds = ev.predict(
        OnnxZeroShotPredictor(fp32, ["bird", "cat", "dog"], ["a photo of a {}."], processor.tokenizer), loader
    )
    assert torch.allclose(onnx_preds.member_logits, torch_preds.member_logits.float(), atol=1e-4)
    assert report["models"]["fp32"]["nll"] == pytest.approx(
        metrics.nll(torch_preds.probs, torch_preds.labels), abs=1e-4
    )
    assert report["models"]["fp32"]["accuracy"] == pytest.approx(
        float((torch_preds.probs.argmax(-1) == torch_preds.labels).double().mean())
    )
    # a calibration set without class names is one line, and nothing is written
    pd.DataFrame({"image": [str(next(ident.glob("cat/*.png")))] * 3, "label": [0, 1, 2]}).to_csv(
        tmp_path / "ints.csv", index=False
    )
    rc = main(
        [
            "export",
            str(root / "hydra-clip"),
            "--format",
            "onnx",
            "--output",
            str(tmp_path / "bad"),
            "--quantize",
            "int8",
            "--calibration-data",
            str(tmp_path / "ints.csv"),
            "--image-column",
            "image",
        ]
    )
    assert rc == 2 and not (tmp_path / "bad").exists()
    rc = main(
        [
            "export",
            str(root / "hydra-clip"),
            "--format",
            "onnx",
            "--output",
            str(tmp_path / "bad"),
            "--quantize",
            "int8",
            "--calibration-data",
            str(ident),
            "--class-template",
            "a photo",
        ]
    )
    assert rc == 2 and not (tmp_path / "bad").exists()
