"""`hydra-hf push` and hydra_hf.hub: staging, fresh-process validation, one-commit upload, clean
failures that leave the model folder untouched. No test touches the network."""

from __future__ import annotations

import fnmatch
import json
import shutil
from pathlib import Path

try:  # the HTTP client huggingface_hub itself uses: httpx2 from huggingface_hub 2.x, httpx before
    import httpx2 as httpx
except ImportError:  # pragma: no cover - older huggingface_hub
    import httpx
import pytest
import torch
from conftest import REPO, tiny_bert_config, write_tiny_tokenizer
from huggingface_hub import HfApi, errors
from transformers import BertForSequenceClassification

import hydra_hf.hub as hub
from hydra_hf import metrics
from hydra_hf.assemble import convert_checkpoint
from hydra_hf.cli import main as cli_main
from hydra_hf.errors import HydraUnsafeError
from hydra_hf.evaluation import report
from hydra_hf.masks import HeadMasks
from hydra_hf.outputs import MARKER
from hydra_hf.saving import SHIPPED

KEPT = [[[0, 1], [2, 3], [1]], [[1, 2, 3], [0], []], [[0], [0, 1, 2, 3], [0, 2]]]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """A converted tiny Hydra folder (with stray files that must not be uploaded) and a report."""
    root = tmp_path_factory.mktemp("hub")
    torch.manual_seed(0)
    BertForSequenceClassification(tiny_bert_config()).eval().save_pretrained(root / "tiny")
    write_tiny_tokenizer(root / "tiny")
    model_dir = root / "hydra"
    convert_checkpoint(HeadMasks(kept_heads=KEPT, num_heads=4), base=root / "tiny", output_dir=model_dir)
    (model_dir / "notes.txt").write_text("local notes, not for the Hub")
    torch.save({"x": torch.zeros(1)}, model_dir / "pytorch_model.bin")  # a pickle: never uploaded
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(40, 3, generator=g), -1)
    labels = torch.randint(0, 3, (40,), generator=g)
    rows = [{"method": "Hydra (M=3)", **metrics.calibration_report(probs, labels)}]
    report.write_report(
        {"rows": rows, "title": "tiny", "settings": {"id_data": "rotten_tomatoes:test"}}, root / "report"
    )
    return model_dir, root / "report"


def _error(args, capsys) -> str:
    code = cli_main(args)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    return err


def test_dry_run_stages_validates_and_leaves_model_untouched(assets, tmp_path, capsys):
    model_dir, report_dir = assets
    before = hub.folder_digest(model_dir)
    staging = tmp_path / "staged"
    code = cli_main(["push", str(model_dir), "--repo-id", "org/hydra-tiny", "--dry-run", "--report", str(report_dir),
                     "--staging", str(staging), "--revision", "v1"])
    out = capsys.readouterr().out
    assert code == 0
    summary = json.loads(out.strip().splitlines()[-1])
    assert out.startswith("would upload") and summary["dry_run"] and summary["commit_url"] is None
    assert summary["validated"] == {"auto_class": "AutoModelForSequenceClassification",
                                    "pipeline": "HydraTextClassificationPipeline", "model_index_metrics": 6}
    files = set(summary["files"])
    on_disk = {p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file()}
    assert files == on_disk - {MARKER} and MARKER in on_disk  # the staging folder is marked as ours, not uploaded
    assert {"README.md", "config.json", "model.safetensors", "pipeline_hydra.py", "heads.png", "tokenizer.json",
            "evaluation/report.json", "evaluation/report.md", *SHIPPED["bert"]["files"]} <= files
    assert "notes.txt" not in files and not any(f.endswith(".bin") for f in files)
    config = json.loads((staging / "config.json").read_text())
    assert "hydra-text-classification" in config["custom_pipelines"]
    assert "revision = \"v1\"" in (staging / "README.md").read_text()
    assert hub.folder_digest(model_dir) == before


def test_push_uploads_the_staged_folder_in_one_commit(assets, monkeypatch):
    model_dir, report_dir = assets
    calls: list[tuple[str, dict]] = []

    def record(name):
        def method(self, *args, **kwargs):
            if name == "upload_folder":
                folder = Path(kwargs["folder_path"])
                kwargs["files"] = sorted(  # what huggingface_hub uploads: ignore_patterns applied as it does
                    p for p in (p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
                    if not any(fnmatch.fnmatch(p, pattern) for pattern in kwargs["ignore_patterns"]))
                calls.append((name, kwargs))
                return type("Commit", (), {"commit_url": "https://hub/commit/abc", "pr_url": None})()
            calls.append((name, kwargs))
        return method

    for name in ("create_repo", "create_branch", "upload_folder"):
        monkeypatch.setattr(HfApi, name, record(name))
    monkeypatch.setattr(hub.publish, "validate_staged", lambda folder, **kw: {"stub": True})
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    result = hub.push(model_dir, "org/hydra-tiny", revision="dev", token="hf_fake", report=report_dir,
                      commit_message="first")
    assert [c[0] for c in calls] == ["create_repo", "create_branch", "upload_folder"]
    upload = calls[-1][1]
    assert upload["revision"] == "dev" and upload["commit_message"] == "first" and upload["delete_patterns"] == "*"
    assert upload["files"] == sorted(result.files) and result.commit_url == "https://hub/commit/abc"
    assert not Path(upload["folder_path"]).exists()  # the temporary staging folder is removed


@pytest.mark.parametrize("failure, message", [
    ("offline", "HF_HUB_OFFLINE is set"),
    ("no_token", "no Hugging Face token"),
    ("unreachable", "cannot reach the Hugging Face Hub"),
    ("missing_repo", "does not exist or your token cannot write to it"),
    ("rejected", "HTTP 403"),
])
def test_push_failures_are_one_line_and_leave_everything_intact(
    assets, tmp_path, monkeypatch, capsys, failure, message
):
    model_dir, _ = assets
    before = hub.folder_digest(model_dir)
    monkeypatch.setattr(hub.publish, "validate_staged", lambda folder, **kw: {})
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", failure == "offline")
    monkeypatch.setenv("HF_TOKEN", "hf_fake")
    if failure == "no_token":
        monkeypatch.delenv("HF_TOKEN")
        monkeypatch.setattr("huggingface_hub.get_token", lambda: None)  # and no saved login
    if failure == "unreachable":  # a closed local port: a real connection error, no network needed
        monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
        monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", "http://127.0.0.1:9")
    request = httpx.Request("POST", "https://huggingface.co/api/repos/create")
    if failure == "missing_repo":
        def boom(self, *a, **k):
            raise errors.RepositoryNotFoundError("404 Client Error: Repository Not Found",
                                                 response=httpx.Response(404, request=request))
        monkeypatch.setattr(HfApi, "create_repo", boom)
    if failure == "rejected":
        monkeypatch.setattr(HfApi, "create_repo", lambda self, *a, **k: None)

        def reject(self, *a, **k):
            raise errors.HfHubHTTPError("403 Forbidden: You don't have the rights",
                                        response=httpx.Response(403, request=request))
        monkeypatch.setattr(HfApi, "upload_folder", reject)
    staging = tmp_path / "staging"
    err = _error(["push", str(model_dir), "--repo-id", "org/hydra-tiny", "--staging", str(staging)], capsys)
    assert message in err, err
    assert hub.folder_digest(model_dir) == before
    assert not staging.exists()  # no half-built staging folder is left behind


def test_bad_inputs_fail_before_any_upload(assets, tmp_path, capsys):
    model_dir, _ = assets
    err = _error(["push", str(model_dir), "--repo-id", "no namespace!", "--dry-run"], capsys)
    assert "not a valid repository id" in err
    err = _error(["push", str(model_dir), "--repo-id", "hydra-tiny", "--dry-run"], capsys)
    assert "no namespace" in err
    err = _error(["push", str(tmp_path / "nope"), "--repo-id", "org/x", "--dry-run"], capsys)
    assert "does not exist" in err
    stock = tmp_path / "stock"
    stock.mkdir()
    (stock / "config.json").write_text(json.dumps({"model_type": "bert"}))
    err = _error(["push", str(stock), "--repo-id", "org/x", "--dry-run"], capsys)
    assert "not a Hydra Ensemble config" in err
    pickled = tmp_path / "pickled"
    shutil.copytree(model_dir, pickled)
    (pickled / "model.safetensors").unlink()
    err = _error(["push", str(pickled), "--repo-id", "org/x", "--dry-run"], capsys)
    assert "no .safetensors weights" in err and "pytorch_model.bin" in err
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "old.txt").write_text("stray")
    err = _error(["push", str(model_dir), "--repo-id", "org/x", "--dry-run", "--staging", str(busy)], capsys)
    assert "is not empty" in err and (busy / "old.txt").read_text() == "stray"
    # --overwrite replaces only a staging folder an earlier push wrote: never this one
    err = _error(
        ["push", str(model_dir), "--repo-id", "org/x", "--dry-run", "--staging", str(busy), "--overwrite"], capsys
    )
    assert "was not written by `hydra-hf push`" in err and (busy / "old.txt").read_text() == "stray"


def test_shipped_code_check_accepts_the_package_and_rejects_network_imports(tmp_path):
    folder = tmp_path / "code"
    folder.mkdir()
    for name in sorted({n for spec in SHIPPED.values() for n in spec["files"]} | {"pipeline_hydra.py"}):
        shutil.copyfile(REPO / "src" / "hydra_hf" / "modeling" / name, folder / name)
    assert "pipeline_hydra.py" in hub.check_shipped_code(folder)
    (folder / "evil.py").write_text("import math\n")  # harmless, but not a file hydra_hf ships
    with pytest.raises(HydraUnsafeError, match="evil.py: is not a file hydra_hf .* ships"):
        hub.check_shipped_code(folder)
    # code the user vouches for must still pass the AST audit
    assert "evil.py" in hub.check_shipped_code(folder, allow_foreign=True)
    (folder / "evil.py").write_text("import math\nimport urllib.request\n")
    with pytest.raises(HydraUnsafeError, match="evil.py:2: imports urllib.request"):
        hub.check_shipped_code(folder, allow_foreign=True)
    (folder / "evil.py").write_text("from hydra_hf import metrics\n")
    with pytest.raises(HydraUnsafeError, match="evil.py:1: imports hydra_hf"):
        hub.check_shipped_code(folder, allow_foreign=True)
    (folder / "evil.py").write_text("from .missing import x\n")
    with pytest.raises(HydraUnsafeError, match="not a file shipped beside it"):
        hub.check_shipped_code(folder, allow_foreign=True)


def test_model_push_to_hub_gives_the_same_repository(assets, tmp_path, monkeypatch):
    """model.push_to_hub (hydra_hf's local classes) stages exactly what `hydra-hf push DIR` stages."""
    from transformers import AutoModelForSequenceClassification

    from hydra_hf.modeling.modeling_hydra_bert import HydraEnsemblePreTrainedModel

    model_dir, report_dir = assets
    monkeypatch.setattr(hub.publish, "validate_staged", lambda folder, **kw: {})
    monkeypatch.setattr(HydraEnsemblePreTrainedModel, "push_to_hub", HydraEnsemblePreTrainedModel.push_to_hub)
    hub.install_push_to_hub(HydraEnsemblePreTrainedModel)  # what hydra_hf/__init__ does
    model = AutoModelForSequenceClassification.from_pretrained(model_dir)  # local registration, no remote code
    assert type(model).__module__.startswith("hydra_hf.")
    kwargs = dict(dry_run=True, report=report_dir, base_model="google-bert/bert-base-uncased")
    from_model = model.push_to_hub("org/hydra-tiny", staging_dir=tmp_path / "a", **kwargs)
    from_dir = hub.push(model_dir, "org/hydra-tiny", staging_dir=tmp_path / "b", **kwargs)
    assert sorted(from_model.files) == sorted(from_dir.files)
    for name in from_dir.files:
        a, b = (tmp_path / "a" / name), (tmp_path / "b" / name)
        if name == "model.safetensors":
            from safetensors.torch import load_file

            ta, tb = load_file(a), load_file(b)
            assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)
        elif name.endswith(".json"):
            assert json.loads(a.read_text()) == json.loads(b.read_text()), name
        elif not name.endswith(".png"):
            assert a.read_bytes() == b.read_bytes(), name
    with pytest.raises(TypeError, match="hydra_hf's own model classes"):
        hub.install_push_to_hub(BertForSequenceClassification)


@pytest.mark.parametrize("arch", ["vit", "clip"])
def test_dry_run_image_and_zero_shot_models(tmp_path, arch):
    """Converted tiny ViT / CLIP folders stage and load in a fresh process with their uncertainty pipeline."""
    from _tiny_models import tiny_hf_clip, tiny_vit
    from conftest import write_tiny_tokenizer
    from transformers import CLIPImageProcessor, ViTImageProcessor


    heads = [[[0, 1], [2]], [[1, 2, 3], [0]], [[3], [1, 2]]]
    base = tmp_path / "base"
    if arch == "vit":
        tiny_vit().save_pretrained(base)
        ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(base)
        masks = HeadMasks(kept_heads=heads, num_heads=4)
    else:
        tiny_hf_clip().save_pretrained(base)
        write_tiny_tokenizer(base, vocab_size=40)
        CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16}).save_pretrained(base)
        masks = HeadMasks(towers={"vision": HeadMasks(kept_heads=heads, num_heads=4),
                                       "text": HeadMasks(kept_heads=heads, num_heads=4)})
    convert_checkpoint(masks, base=base, output_dir=tmp_path / "hydra")
    result = hub.push(tmp_path / "hydra", f"org/hydra-{arch}", dry_run=True, staging_dir=tmp_path / "staged")
    load = result.validation["load"]
    expected = {"vit": ("AutoModelForImageClassification", "HydraImageClassificationPipeline"),
                "clip": ("AutoModelForZeroShotImageClassification", "HydraZeroShotImageClassificationPipeline")}[arch]
    assert (load["auto_class"], load["pipeline"]) == expected and load["member_logits"][1] == 3
    assert load["handler"]["inputs"] == 2  # the folder's handler.py, loaded by path, answered in the task's shape
    assert {"preprocessor_config.json", "processor_config.json"} & set(result.files)
    heat_maps = {"heads.png"} if arch == "vit" else {"heads_vision.png", "heads_text.png"}
    assert heat_maps <= set(result.files)
    readme = (tmp_path / "staged" / "README.md").read_text()
    assert "trust_remote_code=True" in readme and ("vision tower" in readme) == (arch == "clip")
