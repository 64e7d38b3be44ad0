"""`accelerate launch --multi_gpu --num_processes 2 -m hydra_hf.cli evaluate` (2 gloo ranks on CPU):
every data set is split across the processes, gathered in order without duplicates, and the report
equals the one-process report (PyTorch models and an ONNX Runtime int8 export alike)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import free_port, tiny_bert_config, write_masks, write_tiny_tokenizer

from hydra_hf import distributed


def _numbers(row: dict, prefix: str = "") -> dict[str, float]:
    out = {}
    for key, value in row.items():
        if key == "latency_ms":
            continue
        if isinstance(value, dict):
            out.update(_numbers(value, f"{prefix}{key}."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[prefix + key] = float(value)
    return out


@pytest.mark.slow
def test_two_processes_write_the_one_process_report(tmp_path):
    from transformers import BertForSequenceClassification

    from hydra_hf.assemble import convert_checkpoint

    torch.manual_seed(0)
    BertForSequenceClassification(tiny_bert_config()).save_pretrained(tmp_path / "base")
    write_tiny_tokenizer(tmp_path / "base")
    write_masks(tmp_path / "masks.json", [[[0, 1], [2], []], [[0, 1, 2, 3], [1], [3]]], 4)
    convert_checkpoint(tmp_path / "masks.json", base=tmp_path / "base", output_dir=tmp_path / "hydra")
    words = "the a movie film good bad great awful plot actor fun boring".split()
    # 37 / 23 / 11 examples: shards of unequal length, batches that do not divide them
    texts = [" ".join(words[(i * 7 + j) % len(words)] for j in range(2 + i % 6)) for i in range(37)]
    pd.DataFrame({"text": texts, "label": [i % 3 for i in range(37)]}).to_csv(tmp_path / "id.csv", index=False)
    pd.DataFrame({"text": texts[:23], "label": [i % 3 for i in range(23)]}).to_csv(tmp_path / "val.csv", index=False)
    pd.DataFrame({"text": [t[::-1] for t in texts[:11]]}).to_csv(tmp_path / "ood.csv", index=False)
    # an ONNX Runtime int8 export of the same model as one more row (needs the onnx extra)
    pytest.importorskip("onnxruntime")
    from hydra_hf.workflows.export import export_onnx

    export_onnx(tmp_path / "hydra", tmp_path / "onnx", quantize="int8", calibration_data=str(tmp_path / "val.csv"))
    args = ["evaluate", "--model", str(tmp_path / "hydra"), "--baseline", f"Single={tmp_path / 'base'}",
            "--baseline", f"ONNX int8={tmp_path / 'onnx'}",
            "--deep-ensemble", "Single", "--train-data", str(tmp_path / "val.csv"),
            "--temperature-scaling", "--val-data", str(tmp_path / "val.csv"), "--mc-dropout", "Single",
            "--mc-samples", "3", "--id-data", str(tmp_path / "id.csv"), "--ood-data", f"rev={tmp_path / 'ood.csv'}",
            "--batch-size", "4"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    one = subprocess.run([sys.executable, "-m", "hydra_hf.cli", *args, "--report", str(tmp_path / "r1")],
                         capture_output=True, text=True, env=env, timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]
    launcher = Path(sys.executable).with_name("accelerate")
    two = subprocess.run([str(launcher), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                          "--main_process_port", str(free_port()),
                          "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "hydra_hf.cli", *args,
                          "--report", str(tmp_path / "r2")], capture_output=True, text=True, env=env, timeout=600)
    assert two.returncode == 0, "\n".join(l for l in two.stderr.splitlines() if "error" in l.lower())[-3000:]
    r1 = json.loads((tmp_path / "r1" / "report.json").read_text())
    r2 = json.loads((tmp_path / "r2" / "report.json").read_text())
    assert r2["settings"]["processes"] == 2 and "processes" not in r1["settings"]
    assert [row["method"] for row in r1["rows"]] == [row["method"] for row in r2["rows"]]
    assert len(r1["rows"]) == 10  # Hydra, Single, ONNX int8, MC Dropout, Deep Ensembles (D), and each + TS
    for a, b in zip(r1["rows"], r2["rows"]):
        na, nb = _numbers(a), _numbers(b)
        assert na.keys() == nb.keys()
        bad = {k: (na[k], nb[k]) for k in na if abs(na[k] - nb[k]) > 1e-6}
        assert not bad, f"{a['method']}: {bad}"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".r2.")]


def test_batch_shards_cover_the_data_once_in_order(monkeypatch):
    """The pure parts: runs of whole batches (one process may get none) concatenate to the data set."""
    import datasets

    data = datasets.Dataset.from_dict({"x": list(range(11))})
    pieces, starts = [], []
    for rank in range(5):
        monkeypatch.setattr(distributed, "process_info", lambda rank=rank: distributed.ProcessInfo(5, rank))
        subset, part = distributed.shard(data, batch_size=3)
        pieces.append(list(subset["x"]))
        starts.append((part.first_batch, part.end_batch, part.total_batches))
        assert len(subset) == min(3 * part.end_batch, 11) - 3 * part.first_batch
    assert sum(pieces, []) == list(range(11)) and [] in pieces
    assert starts[0][0] == 0 and starts[-1][1] == 4 and all(a[1] == b[0] for a, b in zip(starts, starts[1:]))


def test_mc_dropout_seeds_follow_the_batch_position(tiny_bert_dir):
    """MC Dropout gives every batch the same masks whether one process predicts all batches or a
    process starts in the middle (begin_pass with its first batch)."""
    from transformers import BertForSequenceClassification

    from hydra_hf.evaluation import MCDropoutPredictor

    model = BertForSequenceClassification.from_pretrained(tiny_bert_dir, hidden_dropout_prob=0.3)
    batches = [
        {"input_ids": torch.randint(5, 90, (2, 6), generator=torch.Generator().manual_seed(i % 3))} for i in range(4)
    ]
    whole = MCDropoutPredictor(model, samples=3)
    whole.begin_pass(0, 4)
    expected = [whole.member_logits(b) for b in batches]
    tail = MCDropoutPredictor(model, samples=3)
    tail.begin_pass(2, 4)
    assert torch.equal(tail.member_logits(batches[2]), expected[2])
    assert torch.equal(batches[0]["input_ids"], batches[3]["input_ids"])
    assert not torch.allclose(expected[0], expected[3])  # same input, other position: other masks
