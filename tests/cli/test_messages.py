"""One-line messages that name what is wrong: data files that are not UTF-8 or hold texts that are not
strings, malformed JSONL without the builders' ERROR log lines, the no-tokenizer refusal in full, and a
push whose fresh-process check fails (its traceback only with -v)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from _hostile import assert_one_line_error, run_cli
from _tiny_decoders import save_llama
from safetensors.torch import load_file, save_file
from test_hostile_push import world  # noqa: F401  (the converted tiny BERT folder fixture)
from transformers import AutoTokenizer

from hydra_hf.assemble import convert_checkpoint
from hydra_hf.data import resolve_dataset
from hydra_hf.evaluation.loading import load_causal_lm
from hydra_hf.masks import HeadMasks

DATA = {
    # file name: (bytes, words in the message)
    "latin1.csv": (b"text,label\ncaf\xe9 good,1\nbad,0\n", "is not UTF-8 text (byte 14"),
    "latin1.jsonl": (b'{"text": "good", "label": 1}\n{"text": "caf\xe9", "label": 0}\n', "is not UTF-8 text (byte 42"),
    "number.jsonl": (
        b'{"text": "good", "label": 1}\n{"text": "ok", "label": 1}\n{"text": 5, "label": 0}\n',
        "line 3: the text ('text') is 5, not a string",
    ),
    "null.jsonl": (b'{"text": "good", "label": 1}\n{"text": null, "label": 0}\n', "line 2: the text ('text') is null"),
    "list.jsonl": (
        b'{"text": "good", "label": 1}\n{"text": ["a", "b"], "label": 0}\n',
        'line 2: the text (\'text\') is ["a", "b"]',
    ),
    "all numbers.jsonl": (b'{"text": 5, "label": 1}\n{"text": 7, "label": 0}\n', "line 1: the text ('text') is 5"),
    "malformed.jsonl": (b'{"text": "good", "label": 1}\n{"text": "x", "label": 0\n', "line 2: not JSON"),
    "array line.jsonl": (b'{"text": "good", "label": 1}\n["x", 0]\n', "line 2: a JSON list, not an object"),
}


@pytest.mark.parametrize("name", sorted(DATA))
def test_bad_data_files_are_named_in_one_line(name, tmp_path):
    content, words = DATA[name]
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError) as info:
        resolve_dataset(str(path))
    message = str(info.value)
    assert words in message and str(path) in message and "\n" not in message, message


def test_csv_empty_cells_are_still_empty_texts(tmp_path):
    path = tmp_path / "gaps.csv"
    path.write_text("text,label\ngood,1\n,0\nbad,0\n")
    assert resolve_dataset(str(path))["text"] == ["good", "bad"]


def test_malformed_jsonl_logs_no_builder_errors(tmp_path):
    """The CLI's one line only: no ``ERROR datasets...`` lines from the builders before it."""
    path = tmp_path / "malformed.jsonl"
    path.write_bytes(DATA["malformed.jsonl"][0])
    code = ("import logging, sys; logging.basicConfig(level=logging.INFO)\n"
            "from hydra_hf.data import resolve_dataset\n"
            "try:\n    resolve_dataset(sys.argv[1])\nexcept ValueError as exc:\n    print('REFUSED', exc)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert "REFUSED" in proc.stdout and "line 2: not JSON" in proc.stdout, proc.stdout + proc.stderr
    assert "ERROR" not in proc.stderr, proc.stderr


def test_the_no_tokenizer_refusal_gives_the_whole_reason(tmp_path):
    folder = save_llama(tmp_path / "stock", head="ForCausalLM")
    convert_checkpoint(HeadMasks(kept_heads=[[[0, 1], [2]]], num_heads=4), base=folder, output_dir=tmp_path / "hydra")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "hydra" / name).unlink()
    with pytest.raises(Exception) as original:
        AutoTokenizer.from_pretrained(str(tmp_path / "hydra"))
    reason = " ".join(str(original.value).split())
    assert "\n" in str(original.value).strip()  # transformers' reason spans lines: the first one is cut off
    with pytest.raises(ValueError) as info:
        load_causal_lm(tmp_path / "hydra")
    message = str(info.value)
    assert "has no tokenizer" in message and message.endswith(reason) and "\n" not in message, message


def test_a_failed_fresh_process_check_is_one_line(world, tmp_path):  # noqa: F811
    """A folder that stages but does not load (a weight of the wrong shape): one line, the child's
    traceback only with -v."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(world / "hydra", model)
    weights = load_file(model / "model.safetensors")
    name = next(k for k in weights if k.endswith("classifier.weight") or k.endswith("classifier.bias"))
    weights[name] = torch.zeros(7, *weights[name].shape[1:])
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    rc, _, err = run_cli(["push", str(model), "--repo-id", "org/hydra-tiny", "--dry-run"], fresh=True)
    message = assert_one_line_error(err)
    assert rc == 2 and "does not load with trust_remote_code=True in a fresh process" in message, err
    assert not [line for line in err.splitlines() if line.strip() and line != message], err


def test_evaluate_a_classifier_without_tokenizer_gives_the_whole_reason(world, tmp_path):  # noqa: F811
    import shutil

    model = tmp_path / "model"
    shutil.copytree(world / "hydra", model)
    for path in model.glob("*"):
        if path.name.startswith(("tokenizer", "vocab", "special_tokens")):
            path.unlink()
    data = tmp_path / "id.jsonl"
    data.write_text('{"text": "good movie", "label": 1}\n{"text": "bad movie", "label": 0}\n')
    with pytest.raises(Exception) as original:
        AutoTokenizer.from_pretrained(str(model))
    reason = " ".join(str(original.value).split())
    rc, _, err = run_cli(["evaluate", "--model", str(model), "--id-data", str(data), "--ood-data", str(data),
                          "--report", str(tmp_path / "report")])
    message = assert_one_line_error(err)
    assert rc == 2 and "has no tokenizer that loads" in message and message.endswith(reason), message
    assert not (tmp_path / "report").exists()
