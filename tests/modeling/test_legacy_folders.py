"""Folders written by hydra_hf 0.1.0 before the shared formulas became one shipped module (``hydra_formulas.py``)
still load, with the outputs that version computed (``tests/data/legacy/``: a BERT classifier of 3 unequal
members, a Llama causal LM with grouped-query attention, a SigLIP zero-shot model): locally, with this
hydra_hf's classes, and as remote code, in a fresh process without hydra_hf, running the files they were saved
with. Both to float rounding (ATOL: another thread count than the fixture's two sums in another order)."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
import torch
import transformers
from conftest import run_fresh_python
from safetensors.torch import load_file

import hydra_hf  # noqa: F401  (registers the Hydra classes: local loading uses this tree's code)

ARCHIVE = Path(__file__).resolve().parents[1] / "data" / "legacy" / "folders.tar.xz"
ATOL = 1e-6
AUTO = {"bert": "AutoModelForSequenceClassification", "llama": "AutoModelForCausalLM", "siglip": "AutoModel"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("legacy")
    with tarfile.open(ARCHIVE) as tar:
        tar.extractall(root, filter="data")
    return root


def _expected(folder: Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    tensors = load_file(str(folder / "expected.safetensors"))
    split = {kind: {k.split(".", 1)[1]: v for k, v in tensors.items() if k.startswith(f"{kind}.")}
             for kind in ("input", "output")}
    return split["input"], split["output"]


@pytest.mark.parametrize("family", list(AUTO))
def test_an_old_folder_loads_locally_with_the_same_numbers(folders, family):
    folder = folders / family
    assert json.loads((folder / "expected.json").read_text())["hydra_hf"] == "0.1.0"
    assert not (folder / "hydra_formulas.py").exists()  # written before the module existed
    inputs, expected = _expected(folder)
    model = getattr(transformers, AUTO[family]).from_pretrained(folder).eval()
    assert type(model).__module__.startswith("hydra_hf.modeling.")  # this tree's classes, not the folder's files
    with torch.no_grad():
        out = model(**inputs)
    for name, want in expected.items():
        torch.testing.assert_close(out[name], want, atol=ATOL, rtol=0, msg=name)
    member = next(v for k, v in expected.items() if k.startswith("member_"))
    assert float((member[:, 0] - member[:, 1]).abs().max()) > 10 * ATOL  # members that differ: a real check


def test_old_folders_load_as_remote_code_with_the_same_numbers(folders):
    """transformers loads every folder with trust_remote_code=True from its own (0.1.0) files, hydra_hf absent."""
    code = f"""
    import torch, transformers
    from pathlib import Path
    from safetensors.torch import load_file
    for family, auto in {AUTO!r}.items():
        folder = Path({str(folders)!r}) / family
        tensors = load_file(str(folder / "expected.safetensors"))
        inputs = {{k[6:]: v for k, v in tensors.items() if k.startswith("input.")}}
        model = getattr(transformers, auto).from_pretrained(folder, trust_remote_code=True).eval()
        assert not type(model).__module__.startswith("hydra_hf"), type(model).__module__
        with torch.no_grad():
            out = model(**inputs)
        for key, want in tensors.items():
            if key.startswith("output."):
                torch.testing.assert_close(out[key[7:]], want, atol={ATOL}, rtol=0)
        print(family, "ok")
    """
    assert run_fresh_python(code).split() == ["bert", "ok", "llama", "ok", "siglip", "ok"]
