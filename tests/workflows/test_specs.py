"""Every workflow is a typed, frozen ``<Verb>Spec`` checked when it is built, and one function: a spec of the
command's defaults builds, a bad value is refused in one line before anything runs, and a built spec cannot be
changed (``dataclasses.replace`` makes another, checked again)."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil

import pytest

import hydra_hf.workflows
from hydra_hf.errors import HydraError
from hydra_hf.workflows.aggregate import AggregateSpec
from hydra_hf.workflows.calibrate import CalibrateSpec
from hydra_hf.workflows.convert import ConvertSpec
from hydra_hf.workflows.export import ExportSpec
from hydra_hf.workflows.finetune import FinetuneSpec
from hydra_hf.workflows.prune import PruneSpec
from hydra_hf.workflows.push import PushSpec
from hydra_hf.workflows.serve import ServeSpec

VERBS = sorted(m.name for m in pkgutil.iter_modules(hydra_hf.workflows.__path__))


@pytest.mark.parametrize("verb", VERBS)
def test_every_workflow_has_one_frozen_spec_that_checks_itself(verb):
    module = importlib.import_module(f"hydra_hf.workflows.{verb}")
    specs = [v for k, v in vars(module).items() if k.endswith("Spec") and isinstance(v, type)
             and v.__module__ == module.__name__]
    assert len({id(s) for s in specs}) == 1, f"hydra_hf.workflows.{verb} defines {len(specs)} spec classes"
    spec = specs[0]
    assert spec.__name__ == f"{verb.capitalize()}Spec", spec.__name__
    assert dataclasses.is_dataclass(spec) and spec.__dataclass_params__.frozen, (
        f"{spec.__name__} is not a frozen dataclass: @dataclass(frozen=True) (set derived fields in __post_init__ "
        "with object.__setattr__)"
    )
    assert "__post_init__" in vars(spec), f"{spec.__name__} does not check itself in __post_init__"


# one bad value per spec, and the words of its one-line refusal
BAD = {
    "aggregate": (lambda: AggregateSpec(["only-one"], "out"), "at least 2 seeds"),
    "calibrate": (lambda: CalibrateSpec("f", "d", "o", seed=3), "--seed 3 seeds the randomised scores"),
    "convert": (lambda: ConvertSpec("m.json", "o", base="b", num_labels=3, labels="a,b"),
                "--num-labels 3 disagrees with 2 --labels"),
    "export": (lambda: ExportSpec("m", "o", opset=11), "opset 11 is not supported"),
    "finetune": (lambda: FinetuneSpec("m", "k.json", "t", "o", labels="one"), "--labels needs at least two"),
    "prune": (lambda: PruneSpec("o.json", "id", model="m", method="circuit-avg", remove=1), "needs OOD validation"),
    "push": (lambda: PushSpec("f", "no-namespace"), "has no namespace"),
    "serve": (lambda: ServeSpec("m", port=0), "port=0 is out of range"),
}


@pytest.mark.parametrize("verb", sorted(BAD))
def test_a_bad_value_is_refused_when_the_spec_is_built(verb):
    build, words = BAD[verb]
    with pytest.raises((HydraError, ValueError)) as caught:
        build()
    message = str(caught.value)
    assert words in message and "\n" not in message, message


def test_a_built_spec_is_fixed_and_a_replaced_one_is_checked_again():
    spec = PruneSpec("o.json", "id", model="m", remove=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.members = 5
    assert dataclasses.replace(spec, members=5).members == 5 and spec.members == 3
    with pytest.raises(ValueError, match="--mlp-spread spreads slim members"):
        dataclasses.replace(spec, mlp_spread=True)
