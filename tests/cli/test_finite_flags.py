"""Non-finite numbers are refused in one line wherever a command takes a float.

``float("nan")`` parses, and ``nan`` passes every range check written as ``value < minimum``: a
``--member-perturb nan`` trained members to NaN and left ``OUTPUT.work`` behind. Every float flag of every
command, and every float setting of a fine-tuning ``--config`` file (YAML ``.nan`` / ``.inf``, JSON
``NaN`` / ``Infinity``), is refused before any work, naming the value.
"""

from __future__ import annotations

import argparse
import math

import pytest
import torch
from _hostile import assert_one_line_error, run_cli

from hydra_hf.cli import build_parser
from hydra_hf.finetune import FinetuneConfig
from hydra_hf.pruning.taylor import select_top


def _float_flags() -> list[tuple[str, str, object]]:
    """(command, flag, type) of every option whose type parses "0.5" as a float."""
    found = []
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    for command, parser in commands.items():
        for action in parser._actions:
            if action.type is None or not action.option_strings:
                continue
            try:
                parsed = action.type("0.5")
            except (ValueError, TypeError, argparse.ArgumentTypeError):
                continue
            if isinstance(parsed, float):
                found.append((command, action.option_strings[0], action.type))
    return found


def test_every_float_flag_refuses_non_finite_values():
    flags = _float_flags()
    names = {(c, f) for c, f, _ in flags}
    assert {("prune", "--temperature"), ("prune", "--data-fraction"), ("finetune", "--member-perturb"),
            ("finetune", "--learning-rate")} <= names, names
    for command, flag, parse in flags:
        for text in ("nan", "NaN", "inf", "-inf", "1e999"):
            with pytest.raises(argparse.ArgumentTypeError, match="not a finite number"):
                parse(text)
        assert parse("0.25") == 0.25, (command, flag)


def _finetune(tmp_path, *extra: str) -> tuple[int, str]:
    rc, _, err = run_cli(["finetune", "--model", str(tmp_path / "model"), "--masks", str(tmp_path / "masks.json"),
                          "--train-data", str(tmp_path / "train.jsonl"), "--output", str(tmp_path / "out"), *extra])
    return rc, err


@pytest.mark.parametrize("flag", ["--member-perturb", "--learning-rate", "--max-grad-norm", "--warmup-ratio"])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_finetune_flag_nan_is_one_line_and_no_work_folder(tmp_path, flag, value):
    rc, err = _finetune(tmp_path, flag, value)
    message = assert_one_line_error(err)
    assert rc == 2 and f"argument {flag}: '{value}' is not a finite number" in message, err
    assert not list(tmp_path.iterdir())  # no output, no OUTPUT.work


CONFIGS = {
    "config.yaml": ("member_perturb: .nan\n", "member_perturb=nan must be a finite number"),
    "inf.yaml": ("learning_rate: .inf\n", "learning_rate=inf must be a finite number"),
    "config.json": ('{"adam_beta2": NaN}', "adam_beta2=nan must be a finite number"),
    "minus.json": ('{"weight_decay": -Infinity}', "weight_decay=-inf must be a finite number"),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_finetune_config_file_nan_is_one_line(tmp_path, name):
    text, words = CONFIGS[name]
    (tmp_path / "settings").mkdir()
    config = tmp_path / "settings" / name
    config.write_text(text)
    rc, err = _finetune(tmp_path, "--config", str(config))
    assert rc == 2 and words in assert_one_line_error(err), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["settings"]


def test_the_config_class_refuses_every_non_finite_float():
    floats = [f.name for f in FinetuneConfig.__dataclass_fields__.values() if "float" in str(f.type)]
    assert "member_perturb" in floats and len(floats) >= 8
    for name in floats:
        for value in (math.nan, math.inf):
            with pytest.raises(ValueError, match=f"{name}={value!r} must be a finite number"):
                FinetuneConfig(**{name: value})


@pytest.mark.parametrize("temperature", [math.nan, math.inf])
def test_taylor_sampling_refuses_a_non_finite_temperature(temperature):
    """The library check behind prune --temperature: nan passed `temperature < 0` and sampled heads from NaN keys."""
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
        select_top(torch.tensor([0.3, 0.1, 0.6, 0.2]), 2, temperature=temperature)


# ------------------------------------------------------------------------------------ whole numbers
# count flags: (command, flag) -> smallest value; round 5: --batch-size 0 crashed evaluate and calibrate
# (ZeroDivisionError; the causal-LM calibrate's "range() arg 3 must not be zero") after the model was loaded
COUNT_FLAGS = {
    **{(c, f): 1 for c in ("calibrate", "evaluate", "export", "prune") for f in ("--batch-size", "--max-samples",
                                                                                 "--max-length")},
    ("evaluate", "--mc-samples"): 1, ("evaluate", "--ensemble-size"): 1, ("evaluate", "--bootstrap"): 0,
    ("export", "--opset"): 1, ("convert", "--num-labels"): 1, ("prune", "--num-labels"): 1,
    ("prune", "--heads-per-step"): 1, ("prune", "--taylor-rounds"): 1, ("prune", "--members"): 0,
    ("prune", "--heads-per-layer"): 0, ("prune", "--remove"): 0, ("calibrate", "--raps-rank"): 0,
    ("finetune", "--members"): 0, ("finetune", "--batch-size"): 1, ("finetune", "--eval-batch-size"): 1,
    ("finetune", "--num-epochs"): 1, ("finetune", "--max-train-samples"): 1, ("finetune", "--max-length"): 1,
    ("finetune", "--gradient-accumulation-steps"): 1,
    **{(c, "--seed"): 0 for c in ("calibrate", "convert", "prune", "finetune")},
}


def _int_flags() -> dict[tuple[str, str], object]:
    """(command, flag) -> type of every option whose type parses "3" as an integer."""
    found = {}
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    for command, parser in commands.items():
        for action in parser._actions:
            if action.type is None or not action.option_strings:
                continue
            try:
                parsed = action.type("3")
            except (ValueError, TypeError, argparse.ArgumentTypeError):
                continue
            if isinstance(parsed, int) and not isinstance(parsed, bool):
                found[command, action.option_strings[0]] = action.type
    return found


@pytest.mark.parametrize("command, flag", sorted(COUNT_FLAGS))
def test_count_flags_refuse_what_no_count_is_at_parse_time(command, flag):
    """0 (where a count must be positive), negatives and non-integers are one line naming the flag and the
    value, before any argument is checked further (nothing is loaded)."""
    minimum = COUNT_FLAGS[command, flag]
    for value in [str(minimum - 1), "-3", "1.5", "two"]:
        rc, _, err = run_cli([command, flag, value])
        line = assert_one_line_error(err)
        assert rc == 2 and f"argument {flag}: '{value}' is " in line and "whole number" in line, line


def test_every_integer_flag_is_a_checked_whole_number():
    """No command takes a count with a bare ``type=int`` again: every integer option refuses what its
    count cannot be."""
    from hydra_hf.cli import non_negative_int, positive_int

    flags = _int_flags()
    assert set(COUNT_FLAGS) <= set(flags), sorted(set(COUNT_FLAGS) - set(flags))
    unchecked = sorted(key for key, parse in flags.items()
                       if parse not in (positive_int, non_negative_int)
                       and getattr(parse, "__name__", "") not in ("positive_int or none", "non_negative_int or none"))
    assert unchecked == [], unchecked
