"""The Hub round trip as users meet it: a Hydra folder published (staged by `hydra-hf push`, committed) to a local
olah server on loopback, which serves local repositories over the Hub's download API, loads in a fresh process
without hydra_hf from ``HF_ENDPOINT``: model, tokenizer, pipeline and the Inference Endpoints handler."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import requests
import torch
from conftest import free_port, run_fresh_python, tiny_bert_config, write_tiny_tokenizer
from transformers import AutoTokenizer, BertForSequenceClassification

from hydra_hf import hub
from hydra_hf.assemble import convert_checkpoint
from hydra_hf.masks import HeadMasks

pytest.importorskip("olah", reason="olah: a test dependency (the dev extra)")

REPO_ID = "org/hydra-bert-sst2"
KEPT = [[[0, 1], [2, 3], [1]], [[1, 2, 3], [0], []], [[0], [0, 1, 2, 3], [0, 2]]]
TEXTS = ["the movie was very good", "a boring plot and awful actor"]


def _git(folder, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=hub@localhost", "-c", "user.name=hub", *args], cwd=folder,
                          check=True, capture_output=True, text=True).stdout.strip()


def test_a_published_folder_loads_from_a_local_hub_without_hydra_hf(tmp_path):
    torch.manual_seed(0)
    BertForSequenceClassification(tiny_bert_config()).save_pretrained(tmp_path / "tiny")
    write_tiny_tokenizer(tmp_path / "tiny")
    model = convert_checkpoint(HeadMasks(kept_heads=KEPT, num_heads=4), base=tmp_path / "tiny",
                               output_dir=tmp_path / "hydra")
    with torch.no_grad():
        expected = model(**AutoTokenizer.from_pretrained(tmp_path / "hydra")(TEXTS, padding=True,
                                                                             return_tensors="pt")).logits
    # the repository content `hydra-hf push` uploads, as a git repository on branch main under olah's mirrors
    repo = tmp_path / "mirrors" / "models" / REPO_ID
    hub.push(tmp_path / "hydra", REPO_ID, dry_run=True, staging_dir=repo)
    for hidden in repo.glob(".*"):  # the upload holds the visible files only (the staging folder's marker stays out)
        hidden.unlink()
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "hydra-hf push")
    commit = _git(repo, "rev-parse", "HEAD")

    port = free_port()
    config = tmp_path / "olah.toml"
    config.write_text(f"""[basic]
host = "127.0.0.1"
port = {port}
mirror-netloc = "127.0.0.1:{port}"
mirror-lfs-netloc = "127.0.0.1:{port}"
repos-path = "{tmp_path / 'olah-cache'}"
mirrors-path = ["{tmp_path / 'mirrors'}"]
[accessibility]
offline = true
""")
    endpoint = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "olah.server", "-c", str(config)], cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{endpoint}/api/models/{REPO_ID}/revision/main", timeout=5).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            time.sleep(0.5)
        code = f"""
            import importlib.util, json, os, sys
            import torch
            from huggingface_hub import HfApi, snapshot_download
            from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline
            repo = {REPO_ID!r}
            revision = HfApi().model_info(repo, revision="main").sha  # pinned, as the model card's snippets pin it
            model = AutoModelForSequenceClassification.from_pretrained(repo, revision=revision, trust_remote_code=True)
            tokenizer = AutoTokenizer.from_pretrained(repo, revision=revision, trust_remote_code=True)
            with torch.no_grad():
                logits = model(**tokenizer({TEXTS!r}, padding=True, return_tensors="pt")).logits
            pipe = pipeline(model=repo, revision=revision, trust_remote_code=True)
            result = pipe({TEXTS[0]!r})
            # Inference Endpoints: the repository's snapshot, its handler.py loaded by path and called
            folder = snapshot_download(repo, revision=revision)
            spec = importlib.util.spec_from_file_location("handler", os.path.join(folder, "handler.py"))
            module = importlib.util.module_from_spec(spec)
            sys.modules["handler"] = module
            spec.loader.exec_module(module)
            answer = module.EndpointHandler(folder)({{"inputs": {TEXTS!r}}})
            assert sys.modules.get("hydra_hf") is None
            print(json.dumps({{"revision": revision, "logits": logits.tolist(), "pipe": type(pipe).__name__,
                              "mi": result["uncertainty"]["mutual_information"], "answer": answer}}))
        """
        env = {"HF_ENDPOINT": endpoint, "HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0"}
        out = json.loads(run_fresh_python(code, env=env, timeout=240).splitlines()[-1])
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert out["revision"] == commit and out["pipe"] == "HydraTextClassificationPipeline"
    torch.testing.assert_close(torch.tensor(out["logits"]), expected, atol=1e-5, rtol=0)
    assert out["mi"] >= 0 and len(out["answer"]) == 2
    probs = expected.softmax(-1)
    for row, per_text in zip(probs, out["answer"]):
        assert per_text[0]["score"] == pytest.approx(float(row.max()), abs=1e-5)
        assert len(per_text[0]["member_scores"]) == 3 and "mutual_information" in per_text[0]["uncertainty"]
