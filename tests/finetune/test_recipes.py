"""Named fine-tuning recipes (`hydra-hf finetune --recipe NAME`) and the check that a run learned (issue 49).

The README's Quickstart trains with the recipes the demo trains with: `demo-single` and `demo-members` must be
examples/demo.py's settings exactly (the demo reads them from hydra_hf.recipes.TextPipeline), flags override a
recipe, the recipe is logged, and a run whose loss stays near the loss of predicting the class frequencies
warns in one line with the likely cause."""

from __future__ import annotations

import argparse
import json
import logging
from types import SimpleNamespace

import pytest

from hydra_hf.cli import finetune as cli_finetune
from hydra_hf.finetune import RECIPES, FinetuneConfig, demo_precision, get_recipe
from hydra_hf.finetune.trainer import MemberTrainer
from hydra_hf.recipes.text import TextPipeline
from hydra_hf.recipes.text import _finetune_config as finetune_config  # what examples/demo.py trains with


def test_the_demo_recipes_are_the_demos_settings():
    pipeline = TextPipeline(mixed_precision=demo_precision())
    assert RECIPES["demo-single"].config() == finetune_config(pipeline, pipeline.single_steps,
                                                               pipeline.learning_rate)
    assert RECIPES["demo-members"].config() == finetune_config(pipeline, pipeline.member_steps,
                                                                pipeline.member_learning_rate)
    single = RECIPES["demo-single"].config()
    assert (single.learning_rate, single.max_steps, single.max_train_samples, single.early_stopping_patience) == (
        1e-4, 180, 6000, None)
    # the paper's text recipe stays the default of a BERT-like model, unchanged
    assert RECIPES["text"].config() == FinetuneConfig()


def _args(tmp_path, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli_finetune.add_arguments(parser)
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "model" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    return parser.parse_args(["--model", str(tmp_path / "model"), "--masks", "m.json", "--train-data", "x",
                              "--output", "o", *argv])


def test_flags_override_the_recipe_and_the_recipe_is_logged(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="hydra_hf.cli.finetune")
    config = cli_finetune.config_from_args(_args(tmp_path, "--recipe", "demo-single", "--max-steps", "40"))
    assert (config.learning_rate, config.max_steps, config.max_length) == (1e-4, 40, 48)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("recipe demo-single"))
    assert "learning_rate=0.0001" in line and line.endswith("overridden by max_steps=40")
    # no --recipe: the paper's recipe for the base (text for BERT)
    assert cli_finetune.config_from_args(_args(tmp_path)) == FinetuneConfig()


def test_a_config_file_names_a_recipe_and_an_unknown_one_is_refused(tmp_path):
    (tmp_path / "c.yaml").write_text("recipe: demo-members\nmax_steps: 10\n")
    config = FinetuneConfig.from_file(tmp_path / "c.yaml")
    assert (config.learning_rate, config.max_steps, config.max_train_samples) == (5e-5, 10, 6000)
    with pytest.raises(ValueError, match=r"recipe 'demo' is unknown; use one of \['text', 'image', 'demo-single'"):
        get_recipe("demo")
    with pytest.raises(SystemExit):  # argparse: invalid choice
        _args(tmp_path, "--recipe", "demo")


def _trainer(windows, *, train_labels, eval_labels, best, lr=1e-5, steps=180):
    """What MemberTrainer.learning_problem reads, without a model."""
    run = SimpleNamespace(causal_lm=False, num_labels=2, train={"label": train_labels},
                          eval={"label": eval_labels} if eval_labels is not None else None)
    return SimpleNamespace(run=run, config=FinetuneConfig(learning_rate=lr), tag="member 0",
                           state={"loss_windows": windows, "best_metric": best, "global_step": steps})


BALANCED = [0, 1] * 50


@pytest.mark.parametrize("windows, lr, best, cause", [
    # the README's step 0 at the paper's lr 1e-5: loss flat near ln 2, validation near the majority rate
    ([[50, 0.6865], [100, 0.6812], [180, 0.6747]], 1e-5, 0.572,
     "learning rate 1e-05 is likely too small for 180 steps"),
    # a step too large: the loss rose above where it started, then sat at chance
    ([[20, 0.6925], [40, 0.7355], [60, 0.6998], [180, 0.6931]], 5e-4, 0.51,
     "0.0005 is likely too large (the loss rose"),
    # the loss fell but the labels say nothing (shuffled labels, another column)
    ([[20, 0.9], [180, 0.68]], 1e-4, 0.5, "check the labels (--label-column)"),
])
def test_a_run_that_barely_learns_warns_with_the_likely_cause(windows, lr, best, cause):
    problem = MemberTrainer.learning_problem(_trainer(windows, train_labels=BALANCED, eval_labels=BALANCED,
                                                      best=best, lr=lr))
    assert problem is not None and "\n" not in problem and problem.startswith("member 0 barely learned: ")
    assert cause in problem and "0.6931, the loss of predicting the class frequencies" in problem


def test_a_run_that_learned_or_is_too_short_to_tell_is_quiet():
    learned = _trainer([[20, 0.69], [100, 0.45], [180, 0.38]], train_labels=BALANCED, eval_labels=BALANCED,
                       best=0.82, lr=1e-4)
    assert MemberTrainer.learning_problem(learned) is None
    # members that start from a trained Single: low loss from the first window on, nothing to fall
    member = _trainer([[20, 0.41], [120, 0.40]], train_labels=BALANCED, eval_labels=BALANCED, best=0.80, lr=5e-5)
    assert MemberTrainer.learning_problem(member) is None
    short = _trainer([[2, 0.69], [4, 0.69]], train_labels=BALANCED, eval_labels=BALANCED, best=0.5, steps=4)
    assert MemberTrainer.learning_problem(short) is None
    # imbalanced data: 0.6 accuracy is the majority rate, however it got there
    skewed = _trainer([[20, 0.5], [180, 0.4]], train_labels=[0] * 90 + [1] * 10, eval_labels=[0] * 60 + [1] * 40,
                      best=0.62, lr=1e-4)
    assert "best validation accuracy 0.620 is within 0.05 of the majority rate 0.600" in \
        MemberTrainer.learning_problem(skewed)
