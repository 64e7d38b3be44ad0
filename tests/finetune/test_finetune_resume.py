"""`hydra-hf finetune --resume` is exact from any checkpoint, and the work folder is ours alone.

- a run interrupted mid-epoch (TrainingInterrupted, or a real `kill -9` of the process) and resumed
  ends with the weights and loss history of the uninterrupted run (dropout on);
- a checkpoint without its RNG or trainer state is a one-line error unless `--resume-partial`; a
  truncated one is a one-line error naming the file;
- `--overwrite` never deletes a folder that `hydra-hf finetune` did not create;
- temporaries that a killed run left (`.model.tmp-PID-*`) are removed by the next run.

Tiny BERT (3 layers x 4 heads), one member that keeps no head in layer 1 (empty projections, which
accelerate's checkpoint writer drops), 48 examples in batches of 8: 6 steps per epoch, 2 epochs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import write_masks
from safetensors.torch import load_file
from test_finetune import _save_tiny_bert, _write_data, fresh_accelerate_state  # noqa: F401 (autouse fixture)

KILL_STEP = 4  # mid epoch 1 (6 steps per epoch)
INTERRUPT_STEP = 8  # mid epoch 2
SETTINGS = dict(
    learning_rate=2e-3, batch_size=8, eval_batch_size=8, num_epochs=2, log_every_steps=1, save_every_steps=1
)


def _config():
    from hydra_hf.finetune import text_recipe

    return text_recipe(**SETTINGS)


def _flags(setup: dict, output: Path, *extra: str) -> list[str]:
    args = ["finetune", "--model", str(setup["model"]), "--masks", str(setup["masks"]), "--train-data", setup["train"],
            "--output", str(output)]
    for name, value in SETTINGS.items():
        args += ["--" + name.replace("_", "-"), str(value)]
    return args + list(extra)


def _history(work: Path) -> list[dict]:
    return json.loads((work / "member_0" / "model" / "finetune_member.json").read_text())["history"]


def _max_difference(a: Path, b: Path) -> float:
    x, y = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert x.keys() == y.keys()
    return max(float((x[k] - y[k]).abs().max()) for k in x if x[k].numel())


def _tree_hash(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        digest.update(str(path.relative_to(folder)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The base model (dropout 0.1), data, one member's masks; the uninterrupted run; a run interrupted
    at step 4 (its work folder is copied by the tests that damage it)."""
    from accelerate.state import AcceleratorState, GradientState

    from hydra_hf.finetune import TrainingInterrupted, finetune_members

    root = tmp_path_factory.mktemp("resume")
    train, _ = _write_data(root)
    setup = {
        "root": root, "model": _save_tiny_bert(root / "tiny-bert"), "train": str(train),
        "masks": write_masks(root / "masks.json", [[[0, 1], [], [0, 3]]], 4),  # no head in layer 1
    }
    finetune_members(setup["model"], setup["masks"], setup["train"], None, root / "full", _config())
    AcceleratorState._reset_state(True)
    GradientState._reset_state()

    def interrupt(info):
        if info["step"] == KILL_STEP:
            raise TrainingInterrupted("simulated crash")

    with pytest.raises(TrainingInterrupted):
        finetune_members(
            setup["model"], setup["masks"], setup["train"], None, root / "part", _config(), step_callback=interrupt
        )
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    return setup


def _interrupted_copy(setup: dict, tmp_path: Path) -> tuple[Path, Path]:
    """A fresh copy of the run interrupted at step 4: (output path, work folder)."""
    work = tmp_path / "part.work"
    shutil.copytree(setup["root"] / "part.work", work, symlinks=True)
    return tmp_path / "part", work


# ----------------------------------------------------------------------------------- exactness
def test_resume_mid_epoch_is_exact(setup, tmp_path):
    """Interrupted at step 8 (2 batches into epoch 2, dropout on), resumed: the same weights (bit for
    bit here; the promise is <= 1e-6) and the same loss history, log.jsonl included."""
    from hydra_hf.finetune import TrainingInterrupted, finetune_members

    def interrupt(info):
        if info["step"] == INTERRUPT_STEP:
            raise TrainingInterrupted("simulated crash")

    args = (setup["model"], setup["masks"], setup["train"], None, tmp_path / "out", _config())
    with pytest.raises(TrainingInterrupted):
        finetune_members(*args, step_callback=interrupt)
    state = json.loads((tmp_path / "out.work" / "member_0" / "checkpoint" / "trainer_state.json").read_text())
    assert (state["epoch"], state["batches_in_epoch"], state["global_step"]) == (1, 2, INTERRUPT_STEP)
    assert len(state["epoch_loss"]) == 1 and state["epoch_loss"][0][1] == 2.0  # the epoch's two batch losses so far
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    finetune_members(*args, resume=True)
    full = setup["root"] / "full"
    assert _max_difference(full, tmp_path / "out") <= 1e-6
    assert _history(tmp_path / "out.work") == _history(setup["root"] / "full.work")
    assert (tmp_path / "out.work" / "log.jsonl").read_text() == (setup["root"] / "full.work" / "log.jsonl").read_text()


def test_kill_9_mid_epoch_then_resume_is_exact(setup, tmp_path, capsys):
    """A real SIGKILL of the training process right after the checkpoint of step 4 (mid epoch 1,
    --save-every-steps 1); `hydra-hf finetune --resume` then ends where the uninterrupted run did,
    and removes the temporary folders a killed export would leave."""
    from hydra_hf.cli import main

    script = textwrap.dedent(f"""
        import os, signal
        from hydra_hf.finetune import finetune_members, text_recipe

        def kill(info):
            if info["step"] == {KILL_STEP}:
                os.kill(os.getpid(), signal.SIGKILL)

        finetune_members({str(setup["model"])!r}, {str(setup["masks"])!r}, {setup["train"]!r}, None,
                         {str(tmp_path / "out")!r}, text_recipe(**{SETTINGS!r}), step_callback=kill)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    work = tmp_path / "out.work"
    state = json.loads((work / "member_0" / "checkpoint" / "trainer_state.json").read_text())
    assert (state["epoch"], state["batches_in_epoch"], state["global_step"]) == (0, KILL_STEP, KILL_STEP)
    # what a kill during the member's export or the final write leaves (the dead process's PID in the name)
    stale = [work / "member_0" / f".model.tmp-{_dead_pid()}-a1b2", tmp_path / f".out.tmp-{_dead_pid()}-c3d4"]
    for folder in stale:
        folder.mkdir()
        (folder / ".hydra_hf_tmp").write_text("")
        (folder / "model.safetensors").write_bytes(b"half")
    assert main(_flags(setup, tmp_path / "out", "--resume")) == 0
    capsys.readouterr()
    assert not any(folder.exists() for folder in stale)
    assert _max_difference(setup["root"] / "full", tmp_path / "out") <= 1e-6
    assert _history(work) == _history(setup["root"] / "full.work")


def _dead_pid() -> int:
    """The PID of a process that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_kill_between_the_checkpoint_renames_is_recovered(setup, tmp_path):
    """Killed after the old checkpoint was moved aside and before the new one was renamed into place:
    the resume takes the complete new one (`checkpoint.tmp` holding trainer_state.json)."""
    from hydra_hf.finetune import finetune_members

    out, work = _interrupted_copy(setup, tmp_path)
    os.replace(work / "member_0" / "checkpoint", work / "member_0" / "checkpoint.tmp")
    finetune_members(setup["model"], setup["masks"], setup["train"], None, out, _config(), resume=True)
    assert _max_difference(setup["root"] / "full", out) <= 1e-6
    assert not (work / "member_0" / "checkpoint.tmp").exists()


# ----------------------------------------------------------------------- incomplete checkpoints
def test_missing_rng_state_needs_resume_partial(setup, tmp_path, capsys, caplog):
    from hydra_hf.cli import main

    out, work = _interrupted_copy(setup, tmp_path)
    (work / "member_0" / "checkpoint" / "random_states_0.pkl").unlink()
    before = _tree_hash(work)
    assert main(_flags(setup, out, "--resume")) == 2
    line = _one_line_error(capsys)
    assert "random_states_0.pkl" in line and "--resume-partial" in line
    assert _tree_hash(work) == before and not out.exists()  # nothing changed

    assert main(_flags(setup, out, "--resume-partial")) == 0
    assert "without random_states_0.pkl" in caplog.text
    # it resumed at step 4 with other dropout masks: not the uninterrupted run (the RNG state matters)
    assert _max_difference(setup["root"] / "full", out) > 1e-4
    assert [h["step"] for h in _history(work)] == [6, 12]


def test_missing_trainer_state_needs_resume_partial(setup, tmp_path, capsys, caplog):
    """Without trainer_state.json the member's progress is unknown: an error, or with --resume-partial
    a retraining from its first step (which is then exactly the uninterrupted run)."""
    from hydra_hf.cli import main

    out, work = _interrupted_copy(setup, tmp_path)
    (work / "member_0" / "checkpoint" / "trainer_state.json").unlink()
    assert main(_flags(setup, out, "--resume")) == 2
    line = _one_line_error(capsys)
    assert "trainer_state.json" in line and "--resume-partial" in line
    assert main(_flags(setup, out, "--resume", "--resume-partial")) == 0
    assert "retraining this member from its first step" in caplog.text
    assert _max_difference(setup["root"] / "full", out) <= 1e-6
    assert _history(work) == _history(setup["root"] / "full.work")


def test_truncated_checkpoint_is_a_one_line_error(setup, tmp_path, capsys):
    from hydra_hf.cli import main
    from hydra_hf.errors import HydraInputError
    from hydra_hf.finetune import finetune_members

    out, work = _interrupted_copy(setup, tmp_path)
    weights = work / "member_0" / "checkpoint" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(HydraInputError, match="model.safetensors' is damaged.*--resume-partial"):
        finetune_members(setup["model"], setup["masks"], setup["train"], None, out, _config(), resume=True)
    for extra in ("--resume", "--resume-partial"):  # damaged is never resumed from
        assert main(_flags(setup, out, extra)) == 2
        line = _one_line_error(capsys)
        assert str(weights) in line and "SafetensorError" in line
    optimizer = work / "member_0" / "checkpoint" / "optimizer.bin"
    weights.unlink()
    shutil.copy(setup["root"] / "part.work" / "member_0" / "checkpoint" / "model.safetensors", weights)
    optimizer.write_bytes(optimizer.read_bytes()[:100])
    assert main(_flags(setup, out, "--resume")) == 2
    assert str(optimizer) in _one_line_error(capsys)


# ------------------------------------------------------------------------------- --overwrite
def test_overwrite_never_deletes_what_finetune_did_not_create(setup, tmp_path, capsys):
    from hydra_hf.cli import main

    mine = tmp_path / "mine"
    (mine / "sub").mkdir(parents=True)
    (mine / "notes.txt").write_text("keep me")
    (mine / "sub" / "data.bin").write_bytes(b"\x00" * 10)
    model = setup["model"]
    protected = {p: _tree_hash(p) for p in (mine, model)}
    cases = [
        (["--work-dir", str(mine), "--overwrite"], "not created by `hydra-hf finetune`"),  # an unrelated folder
        (["--work-dir", str(model), "--overwrite"], "input"),  # the base model itself
        (["--work-dir", str(model.parent), "--overwrite"], "input"),  # a folder holding the base model
        (["--work-dir", str(tmp_path), "--overwrite"], "contain it"),  # a folder holding the output
        (["--work-dir", str(tmp_path / "out" / "w"), "--overwrite"], "inside it"),
    ]
    for extra, message in cases:
        assert main(_flags(setup, tmp_path / "out", *extra)) == 2, extra
        assert message in _one_line_error(capsys), extra
    assert main(_flags(setup, mine, "--overwrite")) == 2  # an unrelated output folder
    assert "not written by `hydra-hf finetune`" in _one_line_error(capsys)
    assert main(_flags(setup, tmp_path / "out", "--resume", "--overwrite")) == 2
    assert "pass one" in _one_line_error(capsys)
    assert {p: _tree_hash(p) for p in protected} == protected
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.work").exists()

    # a work folder and output that finetune wrote are replaced
    shutil.copytree(setup["root"] / "full.work", tmp_path / "run.work")
    shutil.copytree(setup["root"] / "full", tmp_path / "run")
    (tmp_path / "run.work" / "leftover.txt").write_text("from the earlier run")
    assert main(_flags(setup, tmp_path / "run", "--max-steps", "1")) == 2  # without --overwrite: refused
    assert "--overwrite" in _one_line_error(capsys)
    assert main(_flags(setup, tmp_path / "run", "--max-steps", "1", "--overwrite")) == 0
    assert not (tmp_path / "run.work" / "leftover.txt").exists()
    assert _history(tmp_path / "run.work")[-1]["step"] == 1


def test_help_says_what_overwrite_replaces(capsys):
    from hydra_hf.cli import main

    with pytest.raises(SystemExit):
        main(["finetune", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "only folders an earlier `hydra-hf finetune` wrote" in text and ".hydra_hf_output.json" in text
    assert "--resume-partial" in text
