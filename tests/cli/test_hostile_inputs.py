"""Hostile folders and careless flags: `hydra-hf convert`, `evaluate`, `prune` and masks files.

Every case asserts the exit code, a one-line message, that no file outside the command's output
changed (a digest of the whole test folder before and after), and that no partial output is left.
The push cases live in hub/test_hostile_push.py, the fine-tuning ones in finetune/test_finetune_resume.py.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from _hostile import assert_one_line_error, run_cli, tree_digest
from conftest import tiny_bert_config, write_masks, write_tiny_tokenizer

KEPT = [[[0, 1], [2], []], [[0, 1, 2, 3], [1], [3]]]
CANARY = "HYDRA_HOSTILE_CODE_RAN"


# ---------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """A folder holding a tiny BERT checkpoint, a masks file, data files and one converted Hydra model."""
    from transformers import BertForSequenceClassification

    from hydra_hf.assemble import convert_checkpoint

    root = tmp_path_factory.mktemp("hostile")
    torch.manual_seed(0)
    BertForSequenceClassification(tiny_bert_config()).save_pretrained(root / "base")
    write_tiny_tokenizer(root / "base")
    write_masks(root / "masks.json", KEPT, 4)
    words = "the a movie film good bad great awful plot actor fun boring".split()
    texts = [" ".join(words[(i * 7 + j) % len(words)] for j in range(3 + i % 4)) for i in range(24)]
    pd.DataFrame({"text": texts, "label": [i % 3 for i in range(24)]}).to_csv(root / "id.csv", index=False)
    pd.DataFrame({"text": [t[::-1] for t in texts]}).to_csv(root / "ood.csv", index=False)
    convert_checkpoint(root / "masks.json", base=root / "base", output_dir=root / "hydra")
    return root


@pytest.fixture
def sandbox(world, tmp_path) -> Path:
    """A private copy of the world per test (tests may damage it)."""
    import shutil

    shutil.copytree(world, tmp_path / "w", symlinks=True)
    return tmp_path / "w"


def _damaged_copy(root: Path, name: str, damage) -> Path:
    import shutil

    folder = root / name
    shutil.copytree(root / "base", folder)
    damage(folder)
    return folder


def _evil_config(folder: Path, canary: Path) -> None:
    """A checkpoint whose config names its own code: loading it with trust_remote_code would run it."""
    (folder / "evil.py").write_text(
        f"import pathlib\npathlib.Path({str(canary)!r}).write_text('ran')\n"
        "from transformers import BertForSequenceClassification as Evil, BertConfig as EvilConfig\n"
    )
    cfg = json.loads((folder / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForSequenceClassification": "evil.Evil",
                       "AutoModel": "evil.Evil"}
    (folder / "config.json").write_text(json.dumps(cfg))


def _pickle_only_bin(folder: Path) -> None:
    """Replace the safetensors weights with a .bin that torch.load(weights_only=True) refuses."""
    from safetensors.torch import load_file

    state = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    torch.save({"state": state, "extra": argparse.Namespace(x=1)}, folder / "pytorch_model.bin")


def _truncate(path: Path, keep: int = 100) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def _shard_index(folder: Path, target: str) -> None:
    (folder / "model.safetensors").rename(folder / "model-00001.safetensors")
    from safetensors import safe_open

    with safe_open(str(folder / "model-00001.safetensors"), "pt") as f:
        names = list(f.keys())
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: target for n in names}}))


def _convert(root: Path, *extra: str, base: str = "base", output: str = "out", masks: str = "masks.json"):
    return run_cli(["convert", "--base", str(root / base), "--masks", str(root / masks),
                    "--output", str(root / output), *extra])


# ---------------------------------------------------------------------------------- convert: outputs
OUTPUT_CASES = {
    # name: (output relative to the world, needs --overwrite, expected words in the message)
    "output is the base": ("base", True, "is (or contains) the input"),
    "output contains the base": (".", True, "is (or contains) the input"),
    "output is an unrelated folder": ("unrelated", True, "was not written by `hydra-hf convert`"),
    "output exists without --overwrite": ("unrelated", False, "pass --overwrite"),
    "output is a file": ("id.csv", True, "is a file"),
    "output is a symlink": ("link", True, "is a symlink"),
    "output is the masks file": ("masks.json", True, "is a file"),
    "output is a hydra evaluate report": ("report", True, "was not written by `hydra-hf convert`"),
}


@pytest.mark.parametrize("case", sorted(OUTPUT_CASES))
def test_convert_refuses_outputs_it_may_not_replace(sandbox, case):
    output, overwrite, words = OUTPUT_CASES[case]
    (sandbox / "unrelated").mkdir()
    (sandbox / "unrelated" / "thesis.tex").write_text("years of work")
    os.symlink(sandbox / "unrelated", sandbox / "link")
    (sandbox / "report").mkdir()
    (sandbox / "report" / ".hydra_hf_output.json").write_text(json.dumps({"command": "evaluate"}))
    before = tree_digest(sandbox)
    rc, _, err = _convert(sandbox, *(["--overwrite"] if overwrite else []), output=output)
    assert rc == 2
    assert words in assert_one_line_error(err)
    assert tree_digest(sandbox) == before


def test_convert_overwrites_its_own_output_only(sandbox):
    rc, _, err = _convert(sandbox, "--overwrite", output="hydra")  # written by convert in the fixture
    assert rc == 0, err
    assert json.loads((sandbox / "hydra" / ".hydra_hf_output.json").read_text())["command"] == "convert"
    assert not [p for p in sandbox.iterdir() if p.name.startswith(".hydra.")], "temporaries left behind"


# ---------------------------------------------------------------------------------- convert: inputs
def _make_evil(folder: Path) -> None:
    _evil_config(folder, folder.parent / "canary")


INPUT_CASES = {
    "shard index leaves the folder": (lambda f: _shard_index(f, "../other/model.safetensors"), "leads outside"),
    "shard index names an absolute path": (lambda f: _shard_index(f, "/etc/passwd"), "absolute path"),
    "shard index is not JSON": (
        lambda f: (
            _shard_index(f, "model-00001.safetensors"),
            (f / "model.safetensors.index.json").write_text("{oops"),
        ),
        "not valid JSON",
    ),
    "shard index without weight_map": (
        lambda f: (_shard_index(f, "model-00001.safetensors"), (f / "model.safetensors.index.json").write_text("{}")),
        "weight_map",
    ),
    "weights are a symlink out of the folder": (
        lambda f: (
            (f.parent / "outside.safetensors").write_bytes((f / "model.safetensors").read_bytes()),
            (f / "model.safetensors").unlink(),
            os.symlink(f.parent / "outside.safetensors", f / "model.safetensors"),
        ),
        "leads outside",
    ),
    "pickle-only .bin": (_pickle_only_bin, "weights_only=True"),
    "truncated safetensors": (lambda f: _truncate(f / "model.safetensors"), "not a readable safetensors"),
    "text in model.safetensors": (
        lambda f: (f / "model.safetensors").write_text("not weights"),
        "not a readable safetensors",
    ),
    "config is not JSON": (lambda f: (f / "config.json").write_text("{"), "not valid JSON"),
    "no weights": (lambda f: (f / "model.safetensors").unlink(), "holds no weights"),
}


@pytest.mark.parametrize("case", sorted(INPUT_CASES))
def test_convert_refuses_hostile_checkpoints(sandbox, case):
    damage, words = INPUT_CASES[case]
    (sandbox / "other").mkdir()
    import shutil

    shutil.copy(sandbox / "base" / "model.safetensors", sandbox / "other" / "model.safetensors")
    _damaged_copy(sandbox, "bad", damage)
    before = tree_digest(sandbox)
    rc, _, err = _convert(sandbox, base="bad")
    assert rc == 2
    assert words in assert_one_line_error(err)
    assert tree_digest(sandbox) == before and not (sandbox / "out").exists()


def test_convert_never_runs_code_shipped_in_the_base(sandbox):
    _damaged_copy(sandbox, "evil", _make_evil)
    rc, _, err = _convert(sandbox, base="evil")
    assert rc == 0, err  # the weights are fine: converting reads config.json as data
    assert not (sandbox / "canary").exists(), "convert executed the checkpoint's code"


MASK_CASES = {
    "num_heads is a string": (
        {"num_heads": "4"},
        "'num_heads' must be an integer, got str '4'; write 4 without quotes",
    ),
    "num_layers is a string": ({"num_layers": "3"}, "'num_layers' must be an integer"),
    "num_heads is a float": ({"num_heads": 4.0}, "'num_heads' must be an integer, got float"),
    "num_layers is zero": ({"num_layers": 0}, "must be at least 1"),
    "num_heads is true": ({"num_heads": True}, "must be an integer"),
    "members is a dict": ({"members": {"kept_heads": KEPT[0]}}, "'members' must be a non-empty list"),
    "a head is a string": ({"members": [{"kept_heads": [["0"], [], []]}]}, "must be a list of integer head indices"),
    "a head out of range": ({"members": [{"kept_heads": [[9], [], []]}]}, "outside [0, 4)"),
    "unsorted heads": ({"members": [{"kept_heads": [[2, 1], [], []]}]}, "must be sorted"),
    "too few layers": ({"members": [{"kept_heads": [[1], []]}]}, "one list of heads per layer"),
    "wrong format name": ({"format": "masks"}, "'format' is 'masks'"),
    "future version": ({"version": 3}, "'version' is 3"),
    "towers is a list": ({"towers": ["vision"]}, "'towers' must map tower names"),
}


@pytest.mark.parametrize("case", sorted(MASK_CASES))
def test_convert_refuses_bad_masks_fields(sandbox, case):
    change, words = MASK_CASES[case]
    data = json.loads((sandbox / "masks.json").read_text())
    data.update(change)
    (sandbox / "bad.json").write_text(json.dumps(data))
    before = tree_digest(sandbox)
    rc, _, err = _convert(sandbox, masks="bad.json")
    assert rc == 2
    assert words in assert_one_line_error(err)
    assert tree_digest(sandbox) == before


@pytest.mark.parametrize(
    "content", [b"", b"\x00\xff\xfe garbage", b"[1, 2", b"null"], ids=["empty", "binary", "truncated", "null"]
)
def test_convert_refuses_broken_masks_files(sandbox, content):
    (sandbox / "bad.json").write_bytes(content)
    before = tree_digest(sandbox)
    rc, _, err = _convert(sandbox, masks="bad.json")
    assert rc == 2
    assert "masks file" in assert_one_line_error(err)
    assert tree_digest(sandbox) == before


def test_convert_masks_path_is_a_folder(sandbox):
    (sandbox / "masks_dir").mkdir()
    rc, _, err = _convert(sandbox, masks="masks_dir")
    assert rc == 2 and "masks file" in assert_one_line_error(err)


# ---------------------------------------------------------------------------------- convert: processes
def _convert_process(root: Path, masks: str, output: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "hydra_hf.cli", "convert", "--base", str(root / "base"), "--masks", str(root / masks),
         "--output", str(root / output)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


def test_two_converts_into_one_new_folder_never_both_succeed(sandbox):
    """Row 7: two writers of the same new folder; exactly one wins and the folder holds its model."""
    write_masks(sandbox / "other.json", [[[0], [0], [0]], [[1], [1], [1]]], 4)
    for attempt in range(2):  # two races: each start order of the two processes is likely met
        out = f"race{attempt}"
        procs = {"masks.json": _convert_process(sandbox, "masks.json", out),
                 "other.json": _convert_process(sandbox, "other.json", out)}
        results = {name: (p.wait(timeout=300), p.stderr.read()) for name, p in procs.items()}
        winners = [name for name, (rc, _) in results.items() if rc == 0]
        assert len(winners) == 1, results
        loser = next(name for name in results if name not in winners)
        assert results[loser][0] == 2 and assert_one_line_error(results[loser][1])
        config = json.loads((sandbox / out / "config.json").read_text())
        expected = json.loads((sandbox / winners[0]).read_text())["members"]
        assert config["kept_heads"] == [m["kept_heads"] for m in expected]
        assert not [p.name for p in sandbox.iterdir() if p.name.startswith(f".{out}.")], "temporaries or locks left"


def test_killed_convert_leaves_nothing_that_survives_the_next_run(sandbox):
    """Row 10: kill -9 at several moments; the next run removes the dead process's temporaries and lock."""
    for delay in (0.5, 2.0, 4.0):
        proc = _convert_process(sandbox, "masks.json", "killed")
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        rc, _, err = _convert(sandbox, "--overwrite", output="killed")
        assert rc == 0, err
        leftovers = [p.name for p in sandbox.iterdir() if p.name.startswith(".killed.")]
        assert leftovers == [], leftovers


def test_stale_temporaries_of_dead_processes_are_removed_and_others_kept(sandbox):
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = sandbox / f".out.tmp-{dead.pid}-abc123"
    stale.mkdir()
    (stale / ".hydra_hf_tmp").write_text("")
    (stale / "model.safetensors").write_bytes(b"x" * 1000)
    alive = sandbox / f".out.tmp-{os.getppid()}-def456"  # a live process's: kept
    alive.mkdir()
    (alive / ".hydra_hf_tmp").write_text("")
    foreign = sandbox / f".out.tmp-{dead.pid}-user"  # no sentinel: not ours, kept
    foreign.mkdir()
    (sandbox / ".out.lock").write_text(f"{dead.pid}\n")  # a dead writer's lock is taken over
    rc, _, err = _convert(sandbox)
    assert rc == 0, err
    assert not stale.exists() and alive.exists() and foreign.exists()
    assert not (sandbox / ".out.lock").exists()


def test_a_live_writers_lock_is_respected(sandbox):
    (sandbox / ".out.lock").write_text(f"{os.getppid()}\n")
    before = tree_digest(sandbox)
    rc, _, err = _convert(sandbox)
    assert rc == 2 and "is writing" in assert_one_line_error(err)
    assert tree_digest(sandbox) == before


# ---------------------------------------------------------------------------------- evaluate
def _evaluate(root: Path, *extra: str, model: str = "hydra", report: str = "report"):
    return run_cli(
        [
            "evaluate",
            "--model",
            str(root / model),
            "--id-data",
            str(root / "id.csv"),
            "--ood-data",
            f"rev={root / 'ood.csv'}",
            "--report",
            str(root / report),
            "--batch-size",
            "8",
            *extra,
        ]
    )


def test_evaluate_never_runs_a_baselines_code_without_trust(sandbox):
    """Row 3: a baseline folder with an auto_map to its own file is refused, its code never runs."""
    _damaged_copy(sandbox, "evil", _make_evil)
    before = tree_digest(sandbox)
    rc, _, err = _evaluate(sandbox, "--baseline", f"Single={sandbox / 'evil'}")
    assert rc == 2
    assert "--trust-remote-code" in assert_one_line_error(err)
    assert not (sandbox / "canary").exists()
    assert tree_digest(sandbox) == before


def test_evaluate_refuses_custom_tokenizer_code(sandbox):
    def damage(folder):
        cfg = json.loads((folder / "tokenizer_config.json").read_text())
        cfg["auto_map"] = {"AutoTokenizer": ["evil_tok.EvilTokenizer", None]}
        (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
        (folder / "evil_tok.py").write_text(f"open({str(folder.parent / 'canary')!r}, 'w').write('ran')\n")

    _damaged_copy(sandbox, "evil", damage)
    rc, _, err = _evaluate(sandbox, model="evil")
    assert rc == 2 and "tokenizer_config.json auto_map" in assert_one_line_error(err)
    assert not (sandbox / "canary").exists()


def test_evaluate_loads_hydra_folders_without_remote_code(sandbox):
    """Our own folders need no trust: hydra_hf's registered classes load them (shipped code never runs)."""
    (sandbox / "hydra" / "hydra_layers.py").write_text(f"open({str(sandbox / 'canary')!r}, 'w').write('ran')\n")
    rc, out, err = _evaluate(sandbox)
    assert rc == 0, err
    assert not (sandbox / "canary").exists()
    report = json.loads((sandbox / "report" / "report.json").read_text())
    assert report["rows"][0]["method"] == "Hydra" and 0 <= report["rows"][0]["accuracy"] <= 1
    assert json.loads((sandbox / "report" / ".hydra_hf_output.json").read_text())["command"] == "evaluate"


REPORT_CASES = {
    "an existing folder without --overwrite": ("unrelated", False, "pass --overwrite"),
    "an unrelated folder with --overwrite": ("unrelated", True, "was not written by `hydra-hf evaluate`"),
    "a file": ("id.csv", True, "is a file"),
    "the model folder": ("hydra", True, "is (or contains) the input"),
    "a convert output": ("hydra_copy", True, "was not written by `hydra-hf evaluate`"),
}


@pytest.mark.parametrize("case", sorted(REPORT_CASES))
def test_evaluate_checks_the_report_folder_before_any_work(sandbox, case, monkeypatch):
    """Row 12: refused at once (no model is loaded), nothing is replaced."""
    from hydra_hf.evaluation import loading

    report, overwrite, words = REPORT_CASES[case]
    (sandbox / "unrelated").mkdir()
    (sandbox / "unrelated" / "notes.md").write_text("mine")
    import shutil

    shutil.copytree(sandbox / "hydra", sandbox / "hydra_copy")
    monkeypatch.setattr(
        loading, "load_classifier", lambda *a, **k: pytest.fail("loaded a model before checking --report")
    )
    before = tree_digest(sandbox)
    rc, _, err = _evaluate(sandbox, *(["--overwrite"] if overwrite else []), report=report)
    assert rc == 2 and words in assert_one_line_error(err)
    assert tree_digest(sandbox) == before


def test_evaluate_replaces_its_own_report_with_overwrite(sandbox):
    assert _evaluate(sandbox)[0] == 0
    (sandbox / "report" / "stale.png").write_bytes(b"old")
    rc, _, err = _evaluate(sandbox, "--overwrite")
    assert rc == 0, err
    assert not (sandbox / "report" / "stale.png").exists() and (sandbox / "report" / "report.json").is_file()


def test_evaluate_pickle_only_weights_are_one_line(sandbox):
    _damaged_copy(sandbox, "pickled", _pickle_only_bin)
    rc, _, err = _evaluate(sandbox, model="pickled")
    assert rc == 2 and assert_one_line_error(err)
    assert not (sandbox / "report").exists()


# ---------------------------------------------------------------------------------- prune
def _prune(root: Path, *extra: str, model: str = "base", output: str = "new.json"):
    return run_cli(["prune", "--model", str(root / model), "--id-data", str(root / "id.csv"), "--method", "taylor",
                    "--members", "2", "--heads-per-layer", "2", "--no-progress", "--batch-size", "8",
                    "--output", str(root / output), *extra])


PRUNE_CASES = {
    "output is a folder": ("unrelated", True, "is a folder"),
    "output is an unrelated file": ("unrelated/thesis.tex", True, "not a previous hydra-hf output"),
    "output is the id data": ("id.csv", True, "not a previous hydra-hf output"),
    "output exists without --overwrite": ("masks.json", False, "pass --overwrite"),
    "output folder does not exist": ("missing/masks.json", False, "does not exist"),
}


@pytest.mark.parametrize("case", sorted(PRUNE_CASES))
def test_prune_refuses_outputs_it_may_not_replace(sandbox, case):
    output, overwrite, words = PRUNE_CASES[case]
    (sandbox / "unrelated").mkdir()
    (sandbox / "unrelated" / "thesis.tex").write_text("years of work")
    before = tree_digest(sandbox)
    rc, _, err = _prune(sandbox, *(["--overwrite"] if overwrite else []), output=output)
    assert rc == 2 and words in assert_one_line_error(err)
    assert tree_digest(sandbox) == before


def test_prune_replaces_a_masks_file_with_overwrite(sandbox):
    rc, _, err = _prune(sandbox, "--overwrite", output="masks.json")
    assert rc == 0, err
    data = json.loads((sandbox / "masks.json").read_text())
    assert len(data["members"]) == 2 and not list(sandbox.glob(".masks.json.tmp*"))


@pytest.mark.parametrize("damage", ["pickle", "evil code"])
def test_prune_refuses_hostile_models(sandbox, damage):
    _damaged_copy(sandbox, "bad", _pickle_only_bin if damage == "pickle" else _make_evil)
    before = tree_digest(sandbox)
    rc, _, err = _prune(sandbox, model="bad")
    assert rc == 2 and assert_one_line_error(err)
    assert not (sandbox / "canary").exists()
    assert tree_digest(sandbox) == before


def test_verbose_shows_the_traceback(sandbox):
    rc, _, err = run_cli(["-v", "convert", "--base", str(sandbox / "base"), "--masks", str(sandbox / "missing.json"),
                          "--output", str(sandbox / "out")])
    assert rc == 2 and "Traceback" in err and err.strip().splitlines()[-1].startswith("hydra-hf convert: error:")


# ---------------------------------------------------------------------------------- recipes
@pytest.mark.parametrize("runner", ["text", "image", "zero-shot"])
def test_recipes_never_take_over_a_users_folder(tmp_path, runner):
    """The pipelines replace their own stage folders (report/, hub/): only inside a folder they created."""
    from hydra_hf import recipes
    from hydra_hf.errors import HydraOutputError

    folder = tmp_path / "mine"
    (folder / "report").mkdir(parents=True)
    (folder / "report" / "paper.md").write_text("mine")
    before = tree_digest(tmp_path)
    run = {"text": recipes.run_text_pipeline, "image": recipes.run_image_pipeline,
           "zero-shot": recipes.run_zero_shot_pipeline}[runner]
    with pytest.raises(HydraOutputError, match="was not created by `hydra-hf recipe`"):
        run(None, folder)
    assert tree_digest(tmp_path) == before


# ---------------------------------------------------------------------------------- issue 25
def _poison(folder: Path, value: float) -> None:
    """One weight of the folder's safetensors file set to ``value`` (NaN, inf)."""
    from safetensors.torch import load_file, save_file

    state = load_file(str(folder / "model.safetensors"))
    name = next(k for k in sorted(state) if ("query" in k or "qkv" in k) and state[k].ndim == 2)
    state[name][0, 0] = value
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_convert_and_export_refuse_non_finite_weights(sandbox, value):
    """Issue 25 item 4: NaN passed the export's equality check (NaN > atol is false) and convert fused
    inf silently; both refuse non-finite weights in one line, before any output is written."""
    pytest.importorskip("onnxscript")
    _damaged_copy(sandbox, "poisoned", lambda f: _poison(f, value))
    import shutil

    shutil.copytree(sandbox / "hydra", sandbox / "hydra_poisoned")
    _poison(sandbox / "hydra_poisoned", value)
    before = tree_digest(sandbox)
    rc, _, err = _convert(sandbox, base="poisoned")
    assert rc == 2 and "not finite" in assert_one_line_error(err)
    rc, _, err = run_cli(
        ["export", str(sandbox / "hydra_poisoned"), "--format", "onnx", "--output", str(sandbox / "onnx")]
    )
    assert rc == 2 and "not finite" in assert_one_line_error(err)
    assert tree_digest(sandbox) == before


def _claim_in_child(output: str, start, results) -> None:
    """A forked writer of ``output`` (no --overwrite): records 'won' or the error it got."""
    from hydra_hf.outputs import write_output_folder

    def write(tmp: Path) -> None:
        (tmp / "who").write_text(str(os.getpid()))
        time.sleep(0.3)

    start.wait()
    try:
        write_output_folder(output, write, command="convert")
        results.put(("won", os.getpid()))
    except Exception as exc:  # noqa: BLE001 - the loser's error is checked below
        results.put((type(exc).__name__, str(exc)))


def test_a_dead_writers_lock_is_taken_over_by_one_writer_only(tmp_path):
    """Issue 25 item 2: with a dead writer's lock beside the output, concurrent writers raced through the
    takeover (a lock found empty or just replaced was unlinked as stale) and two of them succeeded."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    dead = subprocess.Popen(["true"])
    dead.wait()
    for trial in range(6):
        out = tmp_path / f"out{trial}"
        (tmp_path / f".out{trial}.lock").write_text(f"{dead.pid}\n")
        start, results = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_claim_in_child, args=(str(out), start, results)) for _ in range(4)]
        for p in procs:
            p.start()
        start.set()
        for p in procs:
            p.join(30)
        got = [results.get(timeout=5) for _ in procs]
        winners = [pid for kind, pid in got if kind == "won"]
        assert len(winners) == 1, got
        assert all(kind == "HydraOutputError" for kind, _ in got if kind != "won"), got
        assert (out / "who").read_text() == str(winners[0])
        assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(f".out{trial}.")], (
            "locks or temporaries left"
        )


def test_evaluate_refuses_a_folder_without_tokenizer_files(sandbox):
    """Without tokenizer files transformers builds an empty-vocabulary tokenizer (every word [UNK]): refused
    before a report is written."""

    def strip(folder: Path) -> None:
        for f in folder.iterdir():
            if f.name.startswith(("tokenizer", "vocab", "special_tokens")):
                f.unlink()

    _damaged_copy(sandbox, "bare", strip)
    before = tree_digest(sandbox)
    rc, _, err = _evaluate(sandbox, model="bare")
    line = assert_one_line_error(err)
    assert rc == 2 and "no tokenizer vocabulary" in line and "save_pretrained" in line
    assert tree_digest(sandbox) == before and not (sandbox / "report").exists()


def test_evaluate_caps_max_length_at_the_models_positions(sandbox):
    """Issue 25 item 6: --max-length 128 on a model with 64 positions crashed on texts longer than 64 tokens."""
    words = "the movie was good and the plot was fun".split()
    long = [" ".join(words[(i + j) % len(words)] for j in range(150)) for i in range(8)]
    pd.DataFrame({"text": long, "label": [i % 3 for i in range(8)]}).to_csv(sandbox / "long.csv", index=False)
    rc, _, err = run_cli(["evaluate", "--model", str(sandbox / "hydra"), "--baseline", f"Single={sandbox / 'base'}",
                          "--id-data", str(sandbox / "long.csv"), "--ood-data", f"rev={sandbox / 'ood.csv'}",
                          "--report", str(sandbox / "report"), "--batch-size", "4", "--max-length", "128",
                          "--bootstrap", "0"])
    assert rc == 0, err[-2000:]
    assert {r["method"] for r in json.loads((sandbox / "report" / "report.json").read_text())["rows"]} >= {
        "Hydra",
        "Single",
    }


# ---------------------------------------------------------------------------------- the study
STUDY_SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "study_text.py"


def _study_table(folder: Path) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, str(STUDY_SCRIPT), "--output", str(folder), "--table-only"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return proc.returncode, proc.stderr


def test_study_table_only_never_replaces_a_users_files(tmp_path):
    """--table-only never overwrites decision.md / summary.json in a folder with a study.json but no marker."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "study.json").write_text(json.dumps({"settings": {}}))
    (folder / "decision.md").write_text("my decision")
    (folder / "summary.json").write_text('{"mine": true}')
    before = tree_digest(tmp_path)
    rc, err = _study_table(folder)
    assert rc == 2 and "not created by the study" in assert_one_line_error(err)
    assert tree_digest(tmp_path) == before


def test_study_names_a_truncated_record_and_the_fix(tmp_path):
    """Issue 25 item 9: a truncated cell file gave a JSON error naming neither the file nor the fix."""
    from hydra_hf.outputs import prepare_owned_folder

    folder = prepare_owned_folder(tmp_path / "study", command="study", overwrite=False)
    (folder / "study.json").write_text(json.dumps({"settings": {}}))
    record = folder / "cells" / "seed0" / "single.json"
    record.parent.mkdir(parents=True)
    record.write_text('{"seed": 0, "numbers": {"accur')
    rc, err = _study_table(folder)
    line = assert_one_line_error(err)
    assert rc == 2 and str(record) in line and "delete it" in line


def test_study_removes_a_killed_shards_work_folder(tmp_path, monkeypatch):
    """Issue 25 item 9: a killed shard's work/process<PID>/ stayed forever; a live shard's is kept."""
    from hydra_hf.outputs import prepare_owned_folder
    from hydra_hf.recipes import study as st

    folder = prepare_owned_folder(tmp_path / "study", command="study", overwrite=False)
    dead = subprocess.Popen(["true"])
    dead.wait()
    for pid in (dead.pid, os.getppid()):
        (folder / "work" / f"process{pid}" / "member_0").mkdir(parents=True)
    (folder / "work" / "notes").mkdir()

    class Stop(Exception):
        pass

    monkeypatch.setattr(st, "_single_of", lambda *a, **k: (_ for _ in ()).throw(Stop()))
    with pytest.raises(Stop):
        st.run_study(st.TextStudy(), folder, candidates=st.DEFAULT_CANDIDATES[:1])
    assert sorted(p.name for p in (folder / "work").iterdir()) == sorted(["notes", f"process{os.getppid()}"])


# ---------------------------------------------------------------------------------- aggregate
def _seed_reports(root: Path) -> None:
    from hydra_hf.evaluation.report import write_report

    for seed, acc in ((0, 0.82), (1, 0.84)):
        rows = [{"method": "Hydra", "accuracy": acc, "params_m": 22.7, "news": {"auroc": acc - 0.1}},
                {"method": "Single", "accuracy": 0.80, "params_m": 22.7, "news": {"auroc": 0.7}}]
        interval = {"difference": acc - 0.8, "ci_low": -0.01, "ci_high": 0.05, "verdict": "tie"}
        write_report({"rows": rows, "settings": {"seed": seed, "id_data": "id.csv"},
                      "comparisons": {"Hydra − Single": {"accuracy": interval}}}, root / f"r{seed}")


def _edit(text_edit=None, data_edit=None):
    def edit(file: Path) -> None:
        if data_edit is not None:
            data = json.loads(file.read_text())
            data_edit(data)
            file.write_text(json.dumps(data))
        if text_edit is not None:
            file.write_text(text_edit(file.read_text()))
    return edit


AGGREGATE_CASES = {
    # issue 25 item 7: tracebacks
    "rows are strings": (_edit(data_edit=lambda d: d.update(rows=["Hydra", "Single"])), "not an object"),
    "comparisons is a list": (_edit(data_edit=lambda d: d.update(comparisons=[1, 2])), "'comparisons' must map"),
    "nested 200000 deep": (_edit(text_edit=lambda t: "[" * 200_000 + "]" * 200_000), "nested more than"),
    "edited columns": (_edit(data_edit=lambda d: d.update(columns=[["accuracy", "Acc", "%%q"]])), "formats no number"),
    "columns is a string": (_edit(data_edit=lambda d: d.update(columns="accuracy")), "'columns' must be"),
    "a value of 10**400": (_edit(text_edit=lambda t: t.replace("0.84", "1" + "0" * 400, 1)), "not a finite number"),
    # issue 25 item 8: nonsense accepted
    "Infinity": (_edit(text_edit=lambda t: t.replace("0.84", "Infinity", 1)), "Infinity is not JSON"),
    "NaN": (_edit(text_edit=lambda t: t.replace("0.84", "NaN", 1)), "NaN is not JSON"),
    "1e999": (_edit(text_edit=lambda t: t.replace("0.84", "1e999", 1)), "not a finite number"),
    "1e308 overflows the mean": (
        lambda f: [
            _edit(data_edit=lambda d: d["rows"][0].update(accuracy=1e308))(g)
            for g in (f, f.parent.parent / "r0" / "report.json")
        ],
        "no finite mean",
    ),
    "the same numbers twice": (
        lambda f: f.write_text((f.parent.parent / "r0" / "report.json").read_text()),
        "same numbers",
    ),
    "another model under the same name": (
        _edit(data_edit=lambda d: d["rows"][0].update(params_m=33.4)),
        "other models",
    ),
    "other data": (_edit(data_edit=lambda d: d["settings"].update(id_data="other.csv")), "different id_data"),
}


@pytest.mark.parametrize("case", sorted(AGGREGATE_CASES))
def test_aggregate_refuses_edited_or_mismatched_reports(tmp_path, case):
    damage, words = AGGREGATE_CASES[case]
    _seed_reports(tmp_path)
    damage(tmp_path / "r1" / "report.json")
    before = tree_digest(tmp_path)
    rc, _, err = run_cli(["aggregate", str(tmp_path / "r0"), str(tmp_path / "r1"), "--output", str(tmp_path / "agg")])
    assert rc == 2 and words in assert_one_line_error(err)
    assert tree_digest(tmp_path) == before


def test_aggregate_refuses_one_report_given_twice(tmp_path):
    _seed_reports(tmp_path)
    rc, _, err = run_cli(["aggregate", str(tmp_path / "r0"), str(tmp_path / "r0" / "report.json"),
                          "--output", str(tmp_path / "agg")])
    assert rc == 2 and "names the same report" in assert_one_line_error(err)
    assert not (tmp_path / "agg").exists()
    rc, _, err = run_cli(["aggregate", str(tmp_path / "r0"), str(tmp_path / "r1"), "--output", str(tmp_path / "agg")])
    assert rc == 0, err


# ---------------------------------------------------------------------------------- masks: bounds
def test_masks_files_are_read_with_bounds(sandbox):
    """Issue 25 items 7, 10: a masks file nested 100,000 deep was a traceback, a FIFO hung convert, and
    60,000 members kept it busy for minutes; each is one line at once, before any work."""
    (sandbox / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    os.mkfifo(sandbox / "fifo.json")
    data = json.loads((sandbox / "masks.json").read_text())
    data["members"] = data["members"] * 30_000
    (sandbox / "many.json").write_text(json.dumps(data))
    for masks, words in (("deep.json", "nested more than"), ("fifo.json", "not a regular file"),
                         ("many.json", "60000 members, more than")):
        t0 = time.perf_counter()
        rc, _, err = _convert(sandbox, masks=masks)
        assert rc == 2 and words in assert_one_line_error(err), masks
        assert time.perf_counter() - t0 < 30 and not (sandbox / "out").exists()


# ---------------------------------------------------------------------------------- ONNX folders
def _fake_onnx_export(folder: Path, hydra: Path, num_classes: int = 3) -> Path:
    """An export folder whose graph is a few hand-made nodes (logits (B, C) from the attention mask):
    loading it is what these tests check, not what it computes."""
    import shutil

    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    from hydra_hf.onnx.runtime import EXPORT_FORMAT, EXPORT_METADATA

    folder.mkdir()
    weight = helper.make_tensor("w", TensorProto.FLOAT, [1, num_classes], [0.1] * num_classes)
    nodes = [helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["m"], ["s"], keepdims=1),
             helper.make_node("MatMul", ["s", "w"], ["logits"]),
             helper.make_node("Unsqueeze", ["logits", "one"], ["member_logits"])]
    graph = helper.make_graph(
        nodes, "fake", [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
                        for n in ("input_ids", "attention_mask", "token_type_ids")],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", num_classes]),
         helper.make_tensor_value_info("member_logits", TensorProto.FLOAT, ["batch", 1, num_classes])],
        initializer=[weight, helper.make_tensor("one", TensorProto.INT64, [1], [1])])
    graph.node[1].input.append("axis")
    graph.initializer.append(helper.make_tensor("axis", TensorProto.INT64, [1], [1]))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(folder / "model.onnx"))
    config = json.loads((hydra / "config.json").read_text())
    config.pop("auto_map", None)
    (folder / "config.json").write_text(json.dumps(config))
    for f in hydra.iterdir():
        if f.name.startswith(("tokenizer", "vocab", "special_tokens")):
            shutil.copy(f, folder / f.name)
    (folder / EXPORT_METADATA).write_text(json.dumps({
        "format": EXPORT_FORMAT, "version": 1, "modality": "text", "task": "text-classification", "num_members": 1,
        "files": {"model.onnx": {"precision": "fp32", "parameters": num_classes}}, "default_file": "model.onnx"}))
    return folder


def test_onnx_folders_with_edited_metadata_or_labels_are_one_line(sandbox):
    """Issue 25 items 7, 12: hydra_onnx.json whose 'files' is a list was a traceback; a config naming
    5 labels for a graph returning 3 was evaluated without complaint."""
    from hydra_hf.onnx.runtime import EXPORT_METADATA

    onnx_dir = _fake_onnx_export(sandbox / "onnx", sandbox / "hydra")
    rc, _, err = _evaluate(sandbox, model="onnx")
    assert rc == 0, err[-3000:]  # the hand-made folder itself loads and runs
    import shutil

    shutil.rmtree(sandbox / "report")
    metadata = json.loads((onnx_dir / EXPORT_METADATA).read_text())
    (onnx_dir / EXPORT_METADATA).write_text(json.dumps({**metadata, "files": ["model.onnx"]}))
    before = tree_digest(sandbox)
    rc, _, err = _evaluate(sandbox, model="onnx")
    assert rc == 2 and "'files' must map" in assert_one_line_error(err)
    (onnx_dir / EXPORT_METADATA).write_text(json.dumps(metadata))
    config = json.loads((onnx_dir / "config.json").read_text())
    config["id2label"] = {str(i): f"c{i}" for i in range(5)}
    config["label2id"] = {f"c{i}": i for i in range(5)}
    (onnx_dir / "config.json").write_text(json.dumps(config))
    rc, _, err = _evaluate(sandbox, model="onnx")
    line = assert_one_line_error(err)
    assert rc == 2 and "returns 3 classes" in line and "5 labels" in line
    assert not (sandbox / "report").exists()
    del before


def test_export_errors_name_what_export_offers(sandbox):
    """Issue 25 items 7, 11: --batch-size 0 was a traceback; a folder shipping tokenizer code was told to
    'pass --trust-remote-code', which export does not have."""
    pytest.importorskip("onnxscript")
    before = tree_digest(sandbox, exclude=("hydra/tokenizer_config.json",))
    rc, _, err = run_cli(["export", str(sandbox / "hydra"), "--format", "onnx", "--output", str(sandbox / "onnx"),
                          "--quantize", "int8", "--calibration-data", str(sandbox / "id.csv"), "--batch-size", "0"])
    assert rc == 2 and "argument --batch-size: '0'" in assert_one_line_error(err)
    tok = json.loads((sandbox / "hydra" / "tokenizer_config.json").read_text())
    tok["auto_map"] = {"AutoTokenizer": ["evil_tok.EvilTokenizer", None]}
    (sandbox / "hydra" / "tokenizer_config.json").write_text(json.dumps(tok))
    rc, _, err = run_cli(["export", str(sandbox / "hydra"), "--format", "onnx", "--output", str(sandbox / "onnx")])
    line = assert_one_line_error(err)
    assert rc == 2 and "--trust-remote-code" not in line and "never runs" in line
    assert not (sandbox / "onnx").exists() and tree_digest(sandbox, exclude=("hydra/tokenizer_config.json",)) == before


# ---------------------------------------------------------------------------------- where outputs go
def _read_only_folder() -> Path:
    for candidate in ("/proc/sys", "/sys"):
        if os.path.isdir(candidate) and not os.access(candidate, os.W_OK):
            return Path(candidate)
    pytest.skip("no read-only folder on this machine")


def test_an_unwritable_output_is_refused_before_any_work(sandbox, monkeypatch):
    """Issue 25 item 7: a read-only --report was found only after the whole evaluation ran."""
    from hydra_hf.evaluation import loading

    monkeypatch.setattr(
        loading, "load_classifier", lambda *a, **k: pytest.fail("loaded a model before checking --report")
    )
    rc, _, err = run_cli(
        [
            "evaluate",
            "--model",
            str(sandbox / "hydra"),
            "--id-data",
            str(sandbox / "id.csv"),
            "--ood-data",
            str(sandbox / "ood.csv"),
            "--report",
            str(_read_only_folder() / "hydra" / "report"),
        ]
    )
    assert rc == 2 and "is not writable" in assert_one_line_error(err)


def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    """Issue 25 item 7: ENOSPC while writing was a traceback."""
    import errno

    from hydra_hf.evaluation import report

    def full(path, text):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    _seed_reports(tmp_path)
    monkeypatch.setattr(report, "write_text_atomic", full)
    before = tree_digest(tmp_path)
    rc, _, err = run_cli(["aggregate", str(tmp_path / "r0"), str(tmp_path / "r1"), "--output", str(tmp_path / "agg")])
    line = assert_one_line_error(err)
    assert rc == 2 and "No space left on device" in line and "free some space" in line
    assert tree_digest(tmp_path) == before


def test_outputs_get_the_users_umask(sandbox):
    """Issue 25 item 13: every output folder (and masks file) was created mode 700 (600) whatever the umask."""
    from hydra_hf.masks import HeadMasks

    old = os.umask(0o022)
    try:
        rc, _, err = _convert(sandbox)
        assert rc == 0, err
        HeadMasks.load(sandbox / "masks.json").save(sandbox / "copy.json")
    finally:
        os.umask(old)
    assert (sandbox / "out").stat().st_mode & 0o777 == 0o755
    assert (sandbox / "copy.json").stat().st_mode & 0o777 == 0o644


def test_an_output_inside_an_input_folder_is_refused(sandbox):
    """Issue 25, decided: an output never lies inside an input folder (a later command taking the folder
    whole, e.g. push, would take the output for part of the model; a rerun would read its own output)."""
    before = tree_digest(sandbox)
    rc, _, err = _convert(sandbox, output="base/hydra")
    assert rc == 2 and "lies inside the input folder" in assert_one_line_error(err)
    rc, _, err = _evaluate(sandbox, report="hydra/report")
    assert rc == 2 and "lies inside the input folder" in assert_one_line_error(err)
    pytest.importorskip("onnxscript")
    rc, _, err = run_cli(
        ["export", str(sandbox / "hydra"), "--format", "onnx", "--output", str(sandbox / "hydra" / "onnx")]
    )
    assert rc == 2 and "lies inside the input folder" in assert_one_line_error(err)
    assert tree_digest(sandbox) == before


def _config_edit(change):
    def damage(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(change(config)))
    return damage


MISLEADING_CASES = {
    # issue 25 item 11: messages that named the wrong cause
    "num_attention_heads is a string": (_config_edit(lambda c: {**c, "num_attention_heads": "4"}),
                                        "num_attention_heads must be an integer, got str '4'; write 4 without quotes"),
    "config.json is a list": (_config_edit(lambda c: [c]), "holds a JSON list, not a config object"),
}


@pytest.mark.parametrize("case", sorted(MISLEADING_CASES))
def test_convert_names_the_real_problem_of_a_config(sandbox, case):
    damage, words = MISLEADING_CASES[case]
    _damaged_copy(sandbox, "bad", damage)
    before = tree_digest(sandbox)
    rc, _, err = _convert(sandbox, base="bad")
    assert rc == 2 and words in assert_one_line_error(err)
    assert tree_digest(sandbox) == before and not (sandbox / "out").exists()


def test_empty_data_files_are_named(sandbox):
    """Issue 25 item 11: an empty CSV surfaced the datasets builder's message."""
    (sandbox / "empty.csv").write_text("")
    (sandbox / "header.csv").write_text("text,label\n")
    for name, words in (("empty.csv", "is empty (0 bytes)"), ("header.csv", "holds no examples (only a header row)")):
        rc, _, err = run_cli(["evaluate", "--model", str(sandbox / "hydra"), "--id-data", str(sandbox / name),
                              "--ood-data", str(sandbox / "ood.csv"), "--report", str(sandbox / "report")])
        line = assert_one_line_error(err)
        assert rc == 2 and words in line and name in line
    assert not (sandbox / "report").exists()


# ---------------------------------------------------------------------------------- inputs inside the output
@pytest.fixture(scope="module")
def zero_shot_world(tmp_path_factory) -> Path:
    """A Hydra CLIP folder (zero-shot), an image folder of its classes, a class-names and a templates file."""
    from test_prune_cli_vision import _image_folder, save_hf_clip

    from hydra_hf.assemble import convert_checkpoint
    from hydra_hf.masks import HeadMasks

    root = tmp_path_factory.mktemp("zero-shot")
    masks = HeadMasks(towers={"vision": HeadMasks(kept_heads=[[[0, 1], [2, 3]], [[1, 2, 3], []]], num_heads=4),
                              "text": HeadMasks(kept_heads=[[[0], [1]], [[1], [0, 1]]], num_heads=2)})
    convert_checkpoint(masks, base=save_hf_clip(root / "clip"), output_dir=root / "hydra-clip")
    _image_folder(root / "images", ["bird", "cat", "dog"], 3, 0)
    (root / "names.txt").write_text("bird\ncat\ndog\n")
    (root / "templates.txt").write_text("a photo of a {}.\n")
    return root


def _copy_into(source: Path, folder: Path) -> Path:
    import shutil

    target = folder / source.name
    if source.is_dir():
        shutil.copytree(source, target, symlinks=True)
    else:
        shutil.copy(source, target)
    return target


def _dataset_dict(world: Path, src: Path) -> Path:
    """A DatasetDict folder (save_to_disk) of id.csv, for the FOLDER:SPLIT form of a data spec."""
    import datasets

    frame = pd.read_csv(world / "id.csv")
    datasets.DatasetDict({"validation": datasets.Dataset.from_pandas(frame)}).save_to_disk(str(src / "dsdict"))
    return src / "dsdict"


def _finetune_config(src: Path) -> Path:
    (src / "settings.json").write_text(json.dumps({"num_epochs": 1, "batch_size": 8}))
    return src / "settings.json"


def _seed_report(src: Path) -> Path:
    _seed_reports(src)
    return src / "r0"


# case -> (command, zero-shot, args(world, put, src)): put(path) copies path into the output folder and returns the
# copy; src is a scratch folder beside the output (for inputs the world does not hold)
INSIDE_OUTPUT_CASES = {
    "convert --base": ("convert", False, lambda w, put, src: [
        "convert", "--base", put(w / "base"), "--masks", w / "masks.json"]),
    "convert --members": ("convert", False, lambda w, put, src: [
        "convert", "--members", put(w / "base"), w / "base", "--masks", w / "masks.json"]),
    "convert --masks": ("convert", False, lambda w, put, src: [
        "convert", "--base", w / "base", "--masks", put(w / "masks.json")]),
    "finetune --model": ("finetune", False, lambda w, put, src: [
        "finetune", "--model", put(w / "base"), "--masks", w / "masks.json", "--train-data", w / "id.csv"]),
    "finetune --masks": ("finetune", False, lambda w, put, src: [
        "finetune", "--model", w / "base", "--masks", put(w / "masks.json"), "--train-data", w / "id.csv"]),
    "finetune --train-data": ("finetune", False, lambda w, put, src: [
        "finetune", "--model", w / "base", "--masks", w / "masks.json", "--train-data", put(w / "id.csv")]),
    "finetune --eval-data": ("finetune", False, lambda w, put, src: [
        "finetune", "--model", w / "base", "--masks", w / "masks.json", "--train-data", w / "id.csv",
        "--eval-data", put(w / "id.csv")]),
    "finetune --config": ("finetune", False, lambda w, put, src: [
        "finetune", "--model", w / "base", "--masks", w / "masks.json", "--train-data", w / "id.csv",
        "--config", put(_finetune_config(src))]),
    "calibrate FOLDER": ("calibrate", False, lambda w, put, src: [
        "calibrate", put(w / "hydra"), "--data", w / "id.csv", "--risk", "none"]),
    "calibrate --data": ("calibrate", False, lambda w, put, src: [
        "calibrate", w / "hydra", "--data", put(w / "id.csv"), "--risk", "none"]),
    "calibrate --data FOLDER:SPLIT": ("calibrate", False, lambda w, put, src: [
        "calibrate", w / "hydra", "--data", f"{put(_dataset_dict(w, src))}:validation", "--risk", "none"]),
    "calibrate --class-names": ("calibrate", True, lambda w, put, src: [
        "calibrate", w / "hydra-clip", "--data", w / "images", "--risk", "none", "--class-names",
        put(w / "names.txt")]),
    "calibrate --templates": ("calibrate", True, lambda w, put, src: [
        "calibrate", w / "hydra-clip", "--data", w / "images", "--risk", "none", "--templates",
        put(w / "templates.txt")]),
    "evaluate --model": ("evaluate", False, lambda w, put, src: [
        "evaluate", "--model", put(w / "hydra"), "--id-data", w / "id.csv", "--ood-data", w / "ood.csv"]),
    "evaluate --baseline": ("evaluate", False, lambda w, put, src: [
        "evaluate", "--model", w / "hydra", "--baseline", f"Single={put(w / 'base')}", "--id-data", w / "id.csv",
        "--ood-data", w / "ood.csv"]),
    "evaluate --id-data": ("evaluate", False, lambda w, put, src: [
        "evaluate", "--model", w / "hydra", "--id-data", put(w / "id.csv"), "--ood-data", w / "ood.csv"]),
    "evaluate --ood-data NAME=FILE": ("evaluate", False, lambda w, put, src: [
        "evaluate", "--model", w / "hydra", "--id-data", w / "id.csv", "--ood-data", f"rev={put(w / 'ood.csv')}"]),
    "evaluate --val-data": ("evaluate", False, lambda w, put, src: [
        "evaluate", "--model", w / "hydra", "--id-data", w / "id.csv", "--ood-data", w / "ood.csv",
        "--temperature-scaling", "--val-data", put(w / "id.csv")]),
    "evaluate --train-data": ("evaluate", False, lambda w, put, src: [
        "evaluate", "--model", w / "hydra", "--baseline", f"Single={w / 'base'}", "--deep-ensemble", "Single",
        "--id-data", w / "id.csv", "--ood-data", w / "ood.csv", "--train-data", put(w / "id.csv")]),
    "evaluate --class-names": ("evaluate", True, lambda w, put, src: [
        "evaluate", "--model", w / "hydra-clip", "--id-data", w / "images", "--ood-data", w / "images",
        "--class-names", put(w / "names.txt")]),
    "evaluate --templates": ("evaluate", True, lambda w, put, src: [
        "evaluate", "--model", w / "hydra-clip", "--id-data", w / "images", "--ood-data", w / "images",
        "--templates", put(w / "templates.txt")]),
    "export MODEL": ("export", False, lambda w, put, src: [
        "export", put(w / "hydra"), "--format", "onnx"]),
    "export --calibration-data": ("export", False, lambda w, put, src: [
        "export", w / "hydra", "--format", "onnx", "--quantize", "int8", "--calibration-data", put(w / "id.csv")]),
    "export --ood-data": ("export", False, lambda w, put, src: [
        "export", w / "hydra", "--format", "onnx", "--quantize", "int8", "--calibration-data", w / "id.csv",
        "--ood-data", put(w / "ood.csv")]),
    "aggregate REPORT": ("aggregate", False, lambda w, put, src: [
        "aggregate", put(_seed_report(src)), src / "r1"]),
    "push DIR": ("push", False, lambda w, put, src: [
        "push", put(w / "hydra"), "--repo-id", "org/name", "--dry-run"]),
    "push --report": ("push", False, lambda w, put, src: [
        "push", w / "hydra", "--repo-id", "org/name", "--dry-run", "--report", put(_seed_report(src))]),
}
# the flag that names the output folder
OUTPUT_FLAG = {"evaluate": "--report", "push": "--staging"}
# what makes the command quick when it (wrongly) runs: a few examples, one small batch, no bootstrap
QUICK = {"evaluate": ["--batch-size", "8", "--bootstrap", "0"], "finetune": ["--num-epochs", "1", "--batch-size", "8"],
         "calibrate": ["--batch-size", "8"]}


@pytest.mark.parametrize("case", sorted(INSIDE_OUTPUT_CASES))
def test_overwrite_never_deletes_an_input_inside_the_output(world, request, tmp_path, case):
    """Round 5, high: with --overwrite, a command replaced an output folder of its own that held one of
    its inputs (calibrate --data, evaluate --id-data / --ood-data, export --calibration-data, convert
    --masks): the input was read, then deleted with the old output. Every file or folder a command reads
    is an input: placed inside an owned output folder, the command refuses in one line before any work,
    and the input, the output and the folder around them are left as they were."""
    command, zero_shot, build = INSIDE_OUTPUT_CASES[case]
    if command == "export":
        pytest.importorskip("onnxscript")
    owned = tmp_path / "owned"
    owned.mkdir()
    (owned / ".hydra_hf_output.json").write_text(json.dumps({"command": command}))
    (owned / "earlier.txt").write_text("an earlier output of the command")
    (tmp_path / "src").mkdir()
    world = request.getfixturevalue("zero_shot_world") if zero_shot else world
    args = [str(a) for a in build(world, lambda p: _copy_into(p, owned), tmp_path / "src")]
    before = tree_digest(tmp_path)
    rc, _, err = run_cli([*args, OUTPUT_FLAG.get(command, "--output"), str(owned), "--overwrite",
                          *QUICK.get(command, [])])
    line = assert_one_line_error(err)
    assert rc == 2 and "is (or contains) the input" in line, line
    assert tree_digest(tmp_path) == before


def test_library_calls_keep_their_inputs_out_of_the_output(world, tmp_path):
    """The library calls behind the commands refuse too: convert_checkpoint given masks already loaded
    (HeadMasks.load remembers its file), and train_lora_ensemble, whose data lay in the folder it empties."""
    import shutil

    from hydra_hf.assemble import convert_checkpoint
    from hydra_hf.errors import HydraUnsafeError
    from hydra_hf.finetune.baselines import train_lora_ensemble
    from hydra_hf.masks import HeadMasks

    for command in ("convert", "finetune"):
        owned = tmp_path / command
        owned.mkdir()
        (owned / ".hydra_hf_output.json").write_text(json.dumps({"command": command}))
    shutil.copy(world / "masks.json", tmp_path / "convert" / "masks.json")
    shutil.copy(world / "id.csv", tmp_path / "finetune" / "id.csv")
    before = tree_digest(tmp_path)
    masks = HeadMasks.load(tmp_path / "convert" / "masks.json")
    with pytest.raises(HydraUnsafeError, match="is \\(or contains\\) the input"):
        convert_checkpoint(masks, base=world / "base", output_dir=tmp_path / "convert", overwrite=True)
    with pytest.raises(HydraUnsafeError, match="is \\(or contains\\) the input"):
        train_lora_ensemble(world / "base", str(tmp_path / "finetune" / "id.csv"), None, tmp_path / "finetune",
                            overwrite=True)
    assert tree_digest(tmp_path) == before
    assert masks.select_members([0]).source is None  # a copy is not the file


# ---------------------------------------------------------------------------------- slim masks (round 5)
def _slim_masks(root: Path, name: str, *, width: int = 64, neurons=([0, 5], [1], [])) -> Path:
    """The world's masks as a version-2 file: member 0 keeps ``neurons`` of a ``width``-wide MLP, member 1 every
    neuron."""
    data = json.loads((root / "masks.json").read_text())
    data.update(version=2, intermediate_size=width)
    data["members"][0]["kept_neurons"] = [list(n) for n in neurons]
    (root / name).write_text(json.dumps(data))
    return root / name


@pytest.mark.parametrize("width", [32, 10**8, 10**12], ids=["32", "1e8", "1e12"])
def test_a_masks_files_mlp_width_is_checked_against_the_model(sandbox, width):
    """Round 5: a masks file's intermediate_size was never compared with the model's: 32 on the 64-wide MLP
    made member 1, which "keeps every neuron", keep neurons 0-31; 10^8 allocated gigabytes; 10^12 ended in
    a MemoryError traceback. convert and prune --include-masks refuse in one line naming both sizes, at once."""
    _slim_masks(sandbox, "slim.json", width=width)
    before = tree_digest(sandbox)
    t0 = time.perf_counter()
    for run in (lambda: _convert(sandbox, masks="slim.json"), lambda: _prune(sandbox, "--include-masks",
                                                                            str(sandbox / "slim.json"))):
        rc, _, err = run()
        line = assert_one_line_error(err)
        assert rc == 2 and f"intermediate_size {width}" in line and "64 MLP neurons" in line, line
        assert '"intermediate_size": 64' in line
    assert time.perf_counter() - t0 < 60
    assert tree_digest(sandbox) == before


def test_prune_include_masks_adds_the_included_members_unchanged(sandbox):
    """Round 5: prune --include-masks dropped the included members' kept_neurons (or, with --mlp-keep,
    chose new ones), though its help says they are added unchanged."""
    _slim_masks(sandbox, "slim.json")
    included = json.loads((sandbox / "slim.json").read_text())["members"]
    for extra in ([], ["--mlp-keep", "0.5"]):
        rc, _, err = _prune(sandbox, "--members", "1", "--include-masks", str(sandbox / "slim.json"), *extra,
                            "--overwrite")
        assert rc == 0, err
        data = json.loads((sandbox / "new.json").read_text())
        members = data["members"]
        assert data["version"] == 2 and data["intermediate_size"] == 64 and len(members) == 3
        for got, want in zip(members[1:], included):
            assert got["kept_heads"] == want["kept_heads"] and got.get("kept_neurons") == want.get("kept_neurons")
            assert got["source"] == "included"
        if extra:  # the computed member is slim: half of every layer's 64 neurons
            assert [len(n) for n in members[0]["kept_neurons"]] == [32, 32, 32]
        else:
            assert "kept_neurons" not in members[0]


# ---------------------------------------------------------------------------------- stored calibrations
@pytest.mark.parametrize("change", [{"q_hat": 5}, {"threshold": "0.3"}, {"temperature": -1.0}],
                         ids=["q_hat 5", "threshold a string", "temperature -1"])
def test_evaluate_refuses_a_stored_calibration_it_cannot_apply(sandbox, change):
    """Round 5: evaluate reported the decisions of a corrupt config.calibration (or gave a traceback)."""
    stored = {"method": "lac", "alpha": 0.2, "q_hat": 0.6, "n": 40, "randomized": False, "seed": 0, "penalty": 0.1,
              "regularization_rank": 1, "temperature": 1.0, "score": "msp", "risk": None, "delta": None,
              "threshold": None, **change}
    config = json.loads((sandbox / "hydra" / "config.json").read_text())
    (sandbox / "hydra" / "config.json").write_text(json.dumps({**config, "calibration": stored}))
    before = tree_digest(sandbox)
    rc, _, err = _evaluate(sandbox, "--bootstrap", "0")
    line = assert_one_line_error(err)
    key, value = next(iter(change.items()))
    assert rc == 2 and f"config.calibration {key} {value!r}" in line and str(sandbox / "hydra") in line, line
    assert tree_digest(sandbox) == before and not (sandbox / "report").exists()



@pytest.mark.parametrize("command", ["evaluate", "calibrate"])
def test_batch_size_zero_is_refused_before_any_work(sandbox, command, monkeypatch):
    """Round 5: --batch-size 0 divided by zero (a traceback) after the model had been loaded."""
    from hydra_hf.evaluation import loading

    monkeypatch.setattr(loading, "load_classifier", lambda *a, **k: pytest.fail("loaded a model first"))
    before = tree_digest(sandbox)
    if command == "evaluate":
        rc, _, err = _evaluate(sandbox, "--batch-size", "0")
    else:
        rc, _, err = run_cli(["calibrate", str(sandbox / "hydra"), "--data", str(sandbox / "id.csv"), "--output",
                              str(sandbox / "cal"), "--batch-size", "0"])
    assert rc == 2 and "argument --batch-size: '0' is less than 1" in assert_one_line_error(err)
    assert tree_digest(sandbox) == before


# ---------------------------------------------------------------------------------- zero-shot class names
ZERO_SHOT_COMMANDS = {
    "calibrate": lambda w, out: ["calibrate", w / "hydra-clip", "--data", w / "images", "--risk", "none",
                                 "--output", out / "cal"],
    "evaluate": lambda w, out: ["evaluate", "--model", w / "hydra-clip", "--id-data", w / "images", "--ood-data",
                                w / "images", "--bootstrap", "0", "--report", out / "report"],
    "prune": lambda w, out: ["prune", "--model", w / "clip", "--id-data", w / "images", "--method", "taylor",
                             "--members", "1", "--heads-per-layer", "1", "--no-progress", "--output", out / "m.json"],
}


@pytest.mark.parametrize("command", sorted(ZERO_SHOT_COMMANDS))
def test_class_names_that_partly_match_an_image_folder_are_refused(zero_shot_world, tmp_path, command):
    """Round 5: --class-names cat,dgo,bird beside an image folder of bird/cat/dog was mapped by position
    (the bird images labelled cat, the cat images dgo): two classes' labels silently swapped. Names that
    partly match the folder's classes are refused in one line naming the unmatched ones."""
    args = [str(a) for a in ZERO_SHOT_COMMANDS[command](zero_shot_world, tmp_path)]
    rc, _, err = run_cli([*args, "--class-names", "cat,dgo,bird"])
    line = assert_one_line_error(err)
    assert rc == 2 and "'dog'" in line and "'dgo'" in line, line
    assert list(tmp_path.iterdir()) == []


def test_zero_shot_labels_match_by_name_refuse_a_partial_match_and_warn_on_none(caplog):
    import datasets

    from hydra_hf.data import zero_shot_labels

    folder = datasets.Dataset.from_dict({"label": [0, 1, 2, 2]},
                                        features=datasets.Features({"label": datasets.ClassLabel(
                                            names=["bird", "cat", "dog"])}))
    assert zero_shot_labels(folder, ["dog", "bird", "cat"], "data")["label"] == [1, 2, 0, 0]  # by name
    with pytest.raises(ValueError, match="'dog'"):
        zero_shot_labels(folder, ["cat", "dgo", "bird"], "data")
    with caplog.at_level("WARNING"):  # no name in common (e.g. synset ids): in label order, and said so
        assert zero_shot_labels(folder, ["a", "b", "c"], "data")["label"] == [0, 1, 2, 2]
    assert "bird -> a" in caplog.text


# ---------------------------------------------------------------------------------- labels through convert
def test_convert_keeps_the_label2id_of_the_checkpoint(sandbox):
    """Round 5: convert dropped label2id, so data labelled with the model's own class names was refused
    with "give the model's label2id (config.label2id)", a fix no flag applies."""
    config = json.loads((sandbox / "base" / "config.json").read_text())
    names = {0: "negative", 1: "neutral", 2: "positive"}
    config.update(id2label={str(k): v for k, v in names.items()}, label2id={v: k for k, v in names.items()})
    (sandbox / "base" / "config.json").write_text(json.dumps(config))
    rc, _, err = _convert(sandbox)
    assert rc == 0, err
    out = json.loads((sandbox / "out" / "config.json").read_text())
    assert out["label2id"] == {v: k for k, v in names.items()} and out["id2label"] == {str(k): v for k, v in
                                                                                          names.items()}
    frame = pd.read_csv(sandbox / "id.csv")
    frame["label"] = frame["label"].map(names)
    frame.to_csv(sandbox / "named.csv", index=False)
    rc, _, err = run_cli(["evaluate", "--model", str(sandbox / "out"), "--id-data", str(sandbox / "named.csv"),
                          "--ood-data", str(sandbox / "ood.csv"), "--bootstrap", "0", "--report",
                          str(sandbox / "report")])
    assert rc == 0, err


# ---------------------------------------------------------------------------------- a full disk
def test_a_full_disk_names_the_file_being_written(sandbox, monkeypatch):
    """Round 5: the disk-full message named the file being copied (an input) as the one being written."""
    import errno
    import shutil

    from hydra_hf.calibration import fit

    def full(src, dst, **kwargs):  # what shutil's copy raises: filename = the source, filename2 = the destination
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(src), None, str(dst))

    monkeypatch.setattr(fit.shutil, "copy2", full)
    rc, _, err = run_cli(["calibrate", str(sandbox / "hydra"), "--data", str(sandbox / "id.csv"), "--risk", "none",
                          "--output", str(sandbox / "cal"), "--batch-size", "8"])
    line = assert_one_line_error(err)
    assert rc == 2 and "No space left on device writing" in line and "free some space" in line, line
    written = line.split(" writing ")[1]
    assert written.startswith(repr(str(sandbox / ".cal.tmp-"))[:-1]), line  # the output's temporary copy
    assert not (sandbox / "cal").exists() and not list(sandbox.glob(".cal.*"))
    del shutil


# ---------------------------------------------------------------------------------- calibrate's flags
CALIBRATE_FLAG_CASES = {
    "a negative temperature": (["--temperature", "-1"], "--temperature -1.0"),
    "a zero temperature": (["--temperature", "0"], "--temperature 0.0"),
    "a negative RAPS penalty": (["--method", "raps", "--raps-penalty", "-0.5"], "--raps-penalty -0.5"),
    "--raps-penalty without raps": (["--raps-penalty", "0.5"], "--raps-penalty 0.5 applies to --method raps"),
    "--raps-rank without raps": (["--method", "aps", "--raps-rank", "2"], "--raps-rank 2 applies to --method raps"),
    "--delta with --risk none": (["--risk", "none", "--delta", "0.05"], "--delta 0.05"),
    "a risk of 1.5": (["--risk", "1.5"], "--risk 1.5"),
}


@pytest.mark.parametrize("case", sorted(CALIBRATE_FLAG_CASES))
def test_calibrate_checks_its_flags_before_loading_the_model(sandbox, monkeypatch, case):
    """Round 5: calibrate checked --temperature and the RAPS flags only after predicting, and ignored
    --delta with --risk none; each is one line now, before the model is loaded."""
    from hydra_hf import evaluation

    monkeypatch.setattr(evaluation, "load_classifier", lambda *a, **k: pytest.fail("loaded the model first"))
    flags, words = CALIBRATE_FLAG_CASES[case]
    rc, _, err = run_cli(["calibrate", str(sandbox / "hydra"), "--data", str(sandbox / "id.csv"), "--output",
                          str(sandbox / "cal"), *flags])
    line = assert_one_line_error(err)
    assert rc == 2 and words in line and "90% sets" not in line, line
    assert not (sandbox / "cal").exists()


# ---------------------------------------------------------------------------------- messages
def test_messages_name_what_the_user_can_change(sandbox, zero_shot_world, tmp_path):
    """Round 5: messages leaked internals: a template's str.format error (a KeyError traceback), a
    `resolve_dataset(...)` hint, "for 90% sets" shown for a risk, and flags evaluate does not have (the
    uncertified threshold of --conformal-alpha told to "raise --risk or --delta")."""
    import datasets

    from hydra_hf.calibration.report import fit_for_report
    from hydra_hf.data import make_text_loader

    w = zero_shot_world
    for template in ("a {} of {kind}", "a {} of {0}", "a {} }"):
        rc, _, err = run_cli(["evaluate", "--model", str(w / "hydra-clip"), "--id-data", str(w / "images"),
                              "--ood-data", str(w / "images"), "--templates", template, "--report",
                              str(tmp_path / "report")])
        line = assert_one_line_error(err)
        assert rc == 2 and repr(template) in line and "{{" in line, line
    with pytest.raises(ValueError) as info:
        make_text_loader(datasets.Dataset.from_dict({"sentence": ["a"]}), None)
    assert "resolve_dataset" not in str(info.value) and "--text-column" in str(info.value)
    rc, _, err = run_cli(["calibrate", str(sandbox / "hydra"), "--data", str(sandbox / "id.csv"), "--output",
                          str(sandbox / "cal"), "--delta", "2"])
    line = assert_one_line_error(err)
    assert rc == 2 and "--delta 2.0" in line and "90% sets" not in line and "confidence" in line, line
    g = torch.Generator().manual_seed(0)
    member_logits, labels = torch.randn(40, 2, 3, generator=g), torch.randint(0, 3, (40,), generator=g)  # chance
    record = fit_for_report(member_logits, labels, 0.2, {"method": "lac", "score": "msp", "risk": 0.01,
                                                          "delta": 0.1})
    assert record["threshold"] is None and "no threshold" in record["selective_error"]
    assert "--risk" not in record["selective_error"] and "--delta" not in record["selective_error"]
    assert not (tmp_path / "report").exists() and not (sandbox / "cal").exists()


# ---------------------------------------------------------------------------------- slim masks: messages, twins
def test_slim_masks_errors_name_the_entry_and_twins_count_neurons(sandbox, caplog):
    """Round 5: a slim masks error named kept_neurons[0][0][1] for member 0's layer 1 (a spurious [0]); the
    "same heads" warning ignored neurons: members with the same heads and other neurons are not one model
    counted twice, members with the same heads and the same neurons are."""
    from hydra_hf.masks import HeadMasks

    _slim_masks(sandbox, "unsorted.json", neurons=([0, 5], [3, 1], []))
    rc, _, err = _convert(sandbox, masks="unsorted.json")
    line = assert_one_line_error(err)
    assert rc == 2 and "kept_neurons[0][1] must be sorted" in line and "[0][0][1]" not in line, line
    heads = [[0, 1], [2], []]
    twins = HeadMasks(kept_heads=[heads, heads], num_heads=4, kept_neurons=[[[0], [1], []], [[0], [1], []]],
                      intermediate_size=64)
    apart = HeadMasks(kept_heads=[heads, heads], num_heads=4, kept_neurons=[[[0], [1], []], [[2], [1], []]],
                      intermediate_size=64)
    whole = HeadMasks(kept_heads=[heads, heads], num_heads=4, kept_neurons=[None, [list(range(64))] * 3],
                      intermediate_size=64)  # a member keeping every neuron listed, and one keeping them by default
    assert twins.identical_members() == [(0, 1)] and apart.identical_members() == []
    assert whole.identical_members() == [(0, 1)]
    apart.save(sandbox / "apart.json")
    with caplog.at_level("WARNING"):
        rc, _, err = _convert(sandbox, masks="apart.json")
    assert rc == 0, err
    assert "keep the same heads" not in caplog.text


@pytest.mark.parametrize("damage, words", [
    (lambda m: m.update(kept_neuron=m.pop("kept_neurons")), "'kept_neuron'"),
    (lambda m: m.update(kept_head=m.pop("kept_heads")), "'kept_head'"),
    (lambda m: m.pop("kept_neurons"), "no member has 'kept_neurons'"),
], ids=["kept_neuron", "kept_head", "no kept_neurons"])
def test_a_version_2_masks_file_without_neurons_is_refused(sandbox, damage, words):
    """Round 5: a version-2 file whose only kept_neurons was misspelled (kept_neuron) was read as members that
    keep whole MLPs, silently; a member key one letter off a masks key is refused, naming both."""
    path = _slim_masks(sandbox, "slim.json")
    data = json.loads(path.read_text())
    damage(data["members"][0])
    path.write_text(json.dumps(data))
    before = tree_digest(sandbox)
    rc, _, err = _convert(sandbox, masks="slim.json")
    line = assert_one_line_error(err)
    assert rc == 2 and words in line, line
    assert tree_digest(sandbox) == before and not (sandbox / "out").exists()
