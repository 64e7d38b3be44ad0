"""`hydra-hf export --format onnx` of decoder sequence classifiers (a GQA Llama and a GPT-2 Hydra folder): one
graph with dynamic batch and sequence axes whose ONNX Runtime outputs equal PyTorch's on right- and left-padded
batches of other sizes; int8 through the generic path; a causal-LM folder is refused in one line."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from _tiny_decoders import EOS, save_gpt2, save_llama, write_data, write_masks

import hydra_hf  # noqa: F401  (registers the Auto classes)
from hydra_hf.assemble import convert_checkpoint
from hydra_hf.cli import main
from hydra_hf.errors import HydraInputError
from hydra_hf.masks import HeadMasks

pytest.importorskip("onnxruntime")  # a guard only: tools/bootstrap.sh installs the onnx extra
pytest.importorskip("onnxscript")

from hydra_hf.onnx import OnnxHydraModel, pipeline
from hydra_hf.workflows.export import export_onnx

TEXTS = ["the movie was great fun", "awful boring plot", "it", "a film", "the actor was bad and the plot boring"]


def _hydra(tmp_path, save, name: str, **kw):
    base = save(tmp_path / f"{name}-base", **kw)
    masks = HeadMasks.load(write_masks(tmp_path / "masks.json"))
    convert_checkpoint(masks, base=base, output_dir=tmp_path / name)
    return tmp_path / name


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_decoder_classifier_exports_and_equals_pytorch(family, tmp_path):
    """The export checks itself (recorded max |diff|); here again on 1, 3 and 5 texts of other lengths, padded
    on the right and on the left: logits and member logits within 1e-4 of PyTorch, and the same predictions.
    The GQA Llama also goes through the generic int8 path (SmoothQuant recipe + dynamic per-channel int8): the
    int8 graph is the folder's default, close to fp32 (measured max |logit diff| 0.02) and agrees on the labels."""
    save = {"llama": save_llama, "gpt2": save_gpt2}[family]
    folder = _hydra(tmp_path, save, family, pad=True)
    int8 = []
    if family == "llama":
        _, evaluation = write_data(tmp_path)
        int8 = ["--quantize", "int8", "--calibration-data", evaluation]
    assert main(["export", str(folder), "--format", "onnx", "--output", str(tmp_path / "onnx"), *int8]) == 0
    meta = json.loads((tmp_path / "onnx" / "hydra_onnx.json").read_text())
    assert meta["family"] == family and meta["num_members"] == 2 and meta["num_labels"] == 3
    assert meta["inputs"]["input_ids"]["shape"] == ["batch", "sequence"] and "token_type_ids" not in meta["inputs"]
    assert meta["verification"]["max_abs_diff_fp32"] <= 1e-4
    assert (
        meta["verification"]["inputs"][1]["padded_rows"] == 2
        and meta["verification"]["inputs"][1]["padding_side"] == "left"
    )
    if int8:
        assert meta["default_file"] == "model_int8.onnx"
        assert meta["files"]["model_int8.onnx"]["quantized_operators"]["MatMulInteger"] > 0
        assert meta["verification"]["max_abs_diff_int8"] < 0.2
        report = json.loads((tmp_path / "onnx" / "quantization_report.json").read_text())
        assert report["num_examples"]["calibration"] == 9 and report["label_agreement"] >= 0.85
    onnx_model = OnnxHydraModel.from_pretrained(tmp_path / "onnx", file_name="model.onnx")
    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "onnx")
    assert tok.pad_token_id == EOS == model.config.pad_token_id
    for side in ("right", "left"):
        tok.padding_side = side
        for texts in (TEXTS[:1], TEXTS[1:4], TEXTS):
            batch = tok(texts, padding=True, return_tensors="pt")
            with torch.no_grad():
                expected = model(**batch)
            got = onnx_model(**batch)
            torch.testing.assert_close(got.member_logits, expected.member_logits, atol=1e-4, rtol=0)
            torch.testing.assert_close(got.logits, expected.logits, atol=1e-4, rtol=0)
            assert torch.equal(got.logits.argmax(-1), expected.logits.argmax(-1))
    record = pipeline(tmp_path / "onnx")(TEXTS[0])  # the folder's default graph
    record = record[0] if isinstance(record, list) else record
    assert record["label"] in model.config.id2label.values() and 0 <= record["score"] <= 1


def test_causal_lm_and_padless_classifier_are_refused(tmp_path):
    """A causal-LM folder: one line naming PyTorch generate() as the way to run it; a decoder classifier without
    pad_token_id: one line naming the fix. Nothing is written."""
    lm = _hydra(tmp_path, save_gpt2, "lm", head="LMHeadModel")
    with pytest.raises(
        HydraInputError, match=r"is a causal LM \(HydraEnsembleGPT2ForCausalLM\); .*AutoModelForCausalLM"
    ) as info:
        export_onnx(lm, tmp_path / "o1")
    assert "\n" not in str(info.value)
    padless = _hydra(tmp_path, save_llama, "padless")
    with pytest.raises(HydraInputError, match="without pad_token_id.*set pad_token_id in its config.json") as info:
        export_onnx(padless, tmp_path / "o2")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()
