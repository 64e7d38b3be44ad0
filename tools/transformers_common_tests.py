#!/usr/bin/env python
"""Run transformers' own common model tests (``ModelTesterMixin``, ``ConfigTester``) against the Hydra
BERT classes, the way transformers tests BERT (``tests/models/bert/test_modeling_bert.py``).

A developer check, not part of ``make test``: it needs the transformers source distribution, whose
``tests/`` folder holds the common tests (the wheel does not ship them)::

    .venv/bin/python tools/transformers_common_tests.py                 # every layout
    .venv/bin/python tools/transformers_common_tests.py --layout unequal -k save_load
    .venv/bin/python tools/transformers_common_tests.py --sdist transformers-5.24.0.tar.gz --keep /tmp/tct

What it does:

1. finds the sdist of the INSTALLED transformers version (``--sdist``, else a cached copy in
   ``$TMPDIR/hydra-hf-transformers-sdist/``, else ``pip download`` into that folder: never into the repo);
2. builds a throw-away test tree in a temporary folder: the sdist's ``tests/test_modeling_common.py`` and
   ``tests/test_configuration_common.py``, stand-ins for the helper modules they import that the sdist
   does not ship (``tests/exporters``, ``tests/generation``, ``tests/utils``: see ``STANDINS``), and a
   generated ``tests/hydra/test_modeling_hydra_bert.py`` with a ``ModelTester`` and one TestCase per layout
   (``LAYOUTS``); ``parameterized`` (which the common tests import) is installed into that folder when the
   venv lacks it;
3. runs it with ``python -m pytest -p no:cacheprovider -p no:xdist`` and ``OMP_NUM_THREADS=1``, and prints
   passed / failed / skipped per layout, every failure with its one-line reason, and whether it is one of
   the documented differences (``EXPECTED``).

Exit status: 0 when every failure is an expected difference, 1 otherwise (2: the sdist or the run could
not be set up). docs/transformers.md describes the check and its last numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SDIST_CACHE = Path(tempfile.gettempdir()) / "hydra-hf-transformers-sdist"

# The three layouts (kept_heads[m][l] over a 2-layer, 4-head BERT) and their MLP fusion, as in
# tests/families/test_every_family_conformance.py.
LAYOUTS: dict[str, dict] = {
    # 3 members with unequal heads; member 1 keeps no head in layer 1; one MLP per member
    "unequal": {"kept_heads": [[[0, 1], [2, 3]], [[1, 2, 3], []], [[0], [0, 1, 2, 3]]], "mlp_fusion": "per_member"},
    # 2 members keeping 2 heads in every layer (the members fold into the batch axis); the averaged MLP
    "uniform": {"kept_heads": [[[0, 1], [1, 2]], [[2, 3], [0, 3]]], "mlp_fusion": "average"},
    # 1 member keeping every head: the stock model's shapes
    "single": {"kept_heads": [[[0, 1, 2, 3], [0, 1, 2, 3]]], "mlp_fusion": "average"},
}
CLASS_NAMES = {"unequal": "HydraBertUnequalTest", "uniform": "HydraBertUniformTest", "single": "HydraBertSingleTest"}


@dataclass(frozen=True)
class Expected:
    """A documented difference: ``test`` fails in ``layouts`` (None: every layout) with a message that
    matches ``message`` (a regex), for ``reason``."""

    test: str
    layouts: tuple[str, ...] | None
    message: str
    reason: str


# Every failure the check accepts. Anything else is a defect to fix (or a new test-version artefact to
# add here, with its reason).
EXPECTED: list[Expected] = [
    Expected(
        "test_attention_outputs",
        ("unequal",),
        r"\[6, 7, 7\] != \[4, 7, 7\]|Lists differ",
        "ensemble shape: the head axis of `attentions[l]` holds every member's kept heads (member 0's first, "
        "K_l = 6 here) where a BERT has H = 4; with uniform or single members K_l happens to equal H, and "
        "test_attention_outputs_over_the_kept_heads (H read as K_l) passes in every layout",
    ),
]

# Helper modules test_modeling_common / test_configuration_common import that the sdist leaves out
# (they live in transformers' git tree only). Each stand-in keeps the name and says what it replaces.
STANDINS: dict[str, str] = {
    "exporters/test_export.py": '''
        """Stand-in: the sdist does not ship tests/exporters (torch.export / executorch tests of
        ExportTesterMixin are not run; tests/families/test_every_family_conformance.py exports every family with
        torch.export)."""


        class ExportTesterMixin:
            pass
    ''',
    "generation/test_utils.py": '''
        """Stand-in: the sdist does not ship tests/generation. A Hydra classifier does not generate, so
        its test class does not use GenerationTesterMixin (as BERT's encoder-only classes)."""


        class GenerationTesterMixin:
            pass
    ''',
    "utils/test_configuration_utils.py": '''
        """Stand-in: the sdist does not ship tests/utils. The arguments every transformers config takes,
        set to non-default values (what ConfigTester.check_config_arguments_init checks are kept)."""

        config_common_kwargs = {
            "return_dict": False,
            "output_hidden_states": True,
            "output_attentions": True,
            "dtype": "float16",
            "chunk_size_feed_forward": 5,
            "architectures": ["HydraEnsembleModel"],
            "id2label": {0: "label"},
            "label2id": {"label": "0"},
            "problem_type": "regression",
        }
    ''',
}

TEST_MODULE = '''
"""transformers' common tests for the Hydra BERT classes (generated by tools/transformers_common_tests.py).

As tests/models/bert/test_modeling_bert.py for BertModel / BertForSequenceClassification: a ModelTester
that builds a tiny config and inputs, and one TestCase per layout.
"""

import json
import unittest

import torch
from transformers import BertConfig
from transformers.models.auto import modeling_auto
from transformers.testing_utils import require_torch, torch_device

import hydra_hf  # registers the Hydra classes with the Auto classes
from hydra_hf.modeling.configuration_hydra import HydraEnsembleConfig
from hydra_hf.modeling.modeling_hydra_bert import HydraEnsembleForSequenceClassification, HydraEnsembleModel

from ..test_configuration_common import ConfigTester
from ..test_modeling_common import ModelTesterMixin, ids_tensor, random_attention_mask

LAYOUTS = json.loads(%(layouts)r)

# transformers' common tests decide what a class is (a bare encoder, a sequence classifier: which labels
# to pass, which classes to train) by its name in the auto-mapping NAME tables, where a library model has
# its entries. Give the Hydra classes theirs, as BertModel / BertForSequenceClassification have.
modeling_auto.MODEL_MAPPING_NAMES.setdefault("hydra_ensemble", "HydraEnsembleModel")
modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES.setdefault(
    "hydra_ensemble", "HydraEnsembleForSequenceClassification"
)


class HydraBertModelTester:
    def __init__(
        self,
        parent,
        kept_heads,
        mlp_fusion,
        batch_size=13,
        seq_length=7,
        is_training=True,
        use_input_mask=True,
        use_token_type_ids=True,
        use_labels=True,
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        hidden_act="gelu",
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        max_position_embeddings=512,
        type_vocab_size=16,
        type_sequence_label_size=2,
        initializer_range=0.02,
        num_labels=3,
    ):
        self.parent = parent
        self.kept_heads = kept_heads
        self.mlp_fusion = mlp_fusion
        self.num_members = len(kept_heads)
        self.batch_size = batch_size
        self.seq_length = seq_length
        self.is_training = is_training
        self.use_input_mask = use_input_mask
        self.use_token_type_ids = use_token_type_ids
        self.use_labels = use_labels
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads  # what the common tests read
        self.base_num_heads = num_attention_heads  # the base's H (the config)
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.max_position_embeddings = max_position_embeddings
        self.type_vocab_size = type_vocab_size
        self.type_sequence_label_size = type_sequence_label_size
        self.initializer_range = initializer_range
        self.num_labels = num_labels

    def base_config(self):
        """The base settings as hydra_hf's converter writes them: BertConfig's, without its labels (a Hydra
        config's labels are its own; ConfigTester compares the JSON of every argument with the argument, and
        JSON turns id2label's integer keys into strings)."""
        config = BertConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.base_num_heads,
            intermediate_size=self.intermediate_size,
            hidden_act=self.hidden_act,
            hidden_dropout_prob=self.hidden_dropout_prob,
            attention_probs_dropout_prob=self.attention_probs_dropout_prob,
            max_position_embeddings=self.max_position_embeddings,
            type_vocab_size=self.type_vocab_size,
            is_decoder=False,
            initializer_range=self.initializer_range,
        ).to_dict()
        return {k: v for k, v in config.items() if k not in ("id2label", "label2id")}

    def get_config(self):
        return HydraEnsembleConfig(
            base_config=self.base_config(),
            kept_heads=self.kept_heads,
            mlp_fusion=self.mlp_fusion,
            num_labels=self.num_labels,
        )

    def prepare_config_and_inputs(self):
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        input_mask = random_attention_mask([self.batch_size, self.seq_length]) if self.use_input_mask else None
        token_type_ids = None
        if self.use_token_type_ids:
            token_type_ids = ids_tensor([self.batch_size, self.seq_length], self.type_vocab_size)
        sequence_labels = None
        if self.use_labels:
            sequence_labels = ids_tensor([self.batch_size], self.type_sequence_label_size)
        return self.get_config(), input_ids, token_type_ids, input_mask, sequence_labels

    def create_and_check_model(self, config, input_ids, token_type_ids, input_mask, sequence_labels):
        model = HydraEnsembleModel(config=config).to(torch_device).eval()
        model(input_ids, attention_mask=input_mask, token_type_ids=token_type_ids)
        model(input_ids, token_type_ids=token_type_ids)
        result = model(input_ids)
        M = self.num_members  # the standard fields in BERT's shapes (the members' mean), every member's apart
        self.parent.assertEqual(result.last_hidden_state.shape, (self.batch_size, self.seq_length, self.hidden_size))
        self.parent.assertEqual(result.pooler_output.shape, (self.batch_size, self.hidden_size))
        self.parent.assertEqual(result.member_last_hidden_state.shape,
                                (self.batch_size, M, self.seq_length, self.hidden_size))
        self.parent.assertEqual(result.member_pooler_output.shape, (self.batch_size, M, self.hidden_size))

    def create_and_check_for_sequence_classification(self, config, input_ids, token_type_ids, input_mask,
                                                      sequence_labels):
        config.num_labels = self.num_labels
        model = HydraEnsembleForSequenceClassification(config).to(torch_device).eval()
        result = model(input_ids, attention_mask=input_mask, token_type_ids=token_type_ids, labels=sequence_labels)
        self.parent.assertEqual(result.logits.shape, (self.batch_size, self.num_labels))
        self.parent.assertEqual(result.member_logits.shape, (self.batch_size, self.num_members, self.num_labels))

    def prepare_config_and_inputs_for_common(self):
        config, input_ids, token_type_ids, input_mask, _ = self.prepare_config_and_inputs()
        return config, {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": input_mask}


class _HydraBertTest(ModelTesterMixin):
    """BertModelTest's setup for the Hydra classes (no GenerationTesterMixin / PipelineTesterMixin: the
    classes do not generate, and pipeline tests need the Hub's tiny-model summaries)."""

    layout = None
    all_model_classes = (HydraEnsembleModel, HydraEnsembleForSequenceClassification)
    # transformers runs this test for models added since 2023 (it reads the year from the config file's
    # copyright line, which the Hydra files do not have): the Hydra classes are new, so run it
    test_can_init_all_missing_weights_before_2023 = True

    def setUp(self):
        self.model_tester = HydraBertModelTester(self, **LAYOUTS[self.layout])
        self.config_tester = ConfigTester(
            self,
            config_class=HydraEnsembleConfig,
            base_config=self.model_tester.base_config(),
            kept_heads=LAYOUTS[self.layout]["kept_heads"],
            mlp_fusion=LAYOUTS[self.layout]["mlp_fusion"],
        )

    def test_config(self):
        self.config_tester.run_common_tests()

    def test_model(self):
        self.model_tester.create_and_check_model(*self.model_tester.prepare_config_and_inputs())

    def test_for_sequence_classification(self):
        self.model_tester.create_and_check_for_sequence_classification(*self.model_tester.prepare_config_and_inputs())

    def test_attention_outputs_over_the_kept_heads(self):
        """transformers' test_attention_outputs with its H read as K_l, the heads all members keep in layer l
        (`attentions[l]` is (B, K_l, T, T)): everything else it checks holds in every layout."""
        kept = self.model_tester.kept_heads
        counts = {sum(len(member[layer]) for member in kept) for layer in range(self.model_tester.num_hidden_layers)}
        if len(counts) != 1:
            self.skipTest(reason="K_l differs between layers; the common test expects one head count")
        self.model_tester.num_attention_heads = counts.pop()
        self.test_attention_outputs()

%(classes)s
'''

CLASS_TEMPLATE = '''
@require_torch
class %(name)s(_HydraBertTest, unittest.TestCase):
    layout = %(layout)r
'''


# ------------------------------------------------------------------------------------------ setup
def venv_python() -> str:
    python = REPO / ".venv" / "bin" / "python"
    return str(python) if python.is_file() else sys.executable


def installed_version(python: str) -> str:
    out = subprocess.run([python, "-c", "import transformers; print(transformers.__version__)"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def find_sdist(version: str, given: str | None, python: str) -> Path:
    """The sdist of ``version``: ``given``, a cached copy, or one ``pip download`` fetches (outside the repo)."""
    if given:
        path = Path(given).expanduser().resolve()
        if not path.is_file():
            sys.exit(f"error: --sdist {given} does not exist")
        if f"transformers-{version}.tar.gz" != path.name:
            print(f"warning: {path.name} is not the sdist of the installed transformers {version}", file=sys.stderr)
        return path
    cached = SDIST_CACHE / f"transformers-{version}.tar.gz"
    if cached.is_file():
        return cached
    SDIST_CACHE.mkdir(parents=True, exist_ok=True)
    print(f"downloading the transformers {version} sdist into {SDIST_CACHE} ...", flush=True)
    cmd = [python, "-m", "pip", "download", f"transformers=={version}", "--no-deps", "--no-binary", ":all:",
           "--no-build-isolation", "-d", str(SDIST_CACHE)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if not cached.is_file():
        sys.stderr.write(done.stdout[-2000:] + done.stderr[-2000:])
        print(f"error: could not download transformers=={version}'s sdist; pass --sdist PATH", file=sys.stderr)
        sys.exit(2)
    return cached


def build_tree(sdist: Path, version: str, work: Path, python: str) -> Path:
    """The test tree under ``work`` (returns the folder pytest runs in)."""
    tests = work / "tests"
    tests.mkdir(parents=True)
    wanted = {"test_modeling_common.py", "test_configuration_common.py"}
    with tarfile.open(sdist) as tar:
        prefix = f"transformers-{version}/tests/"
        for member in tar.getmembers():
            if member.isfile() and member.name.startswith(prefix) and member.name[len(prefix):] in wanted:
                (tests / member.name[len(prefix):]).write_bytes(tar.extractfile(member).read())
    missing = wanted - {p.name for p in tests.iterdir()}
    if missing:
        sys.exit(f"error: {sdist.name} has no tests/{', tests/'.join(sorted(missing))}")
    (tests / "__init__.py").write_text("")
    for rel, text in STANDINS.items():
        path = tests / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        if not path.exists():
            path.write_text(textwrap.dedent(text).lstrip())
    hydra = tests / "hydra"
    hydra.mkdir()
    (hydra / "__init__.py").write_text("")
    classes = "\n".join(CLASS_TEMPLATE % {"name": CLASS_NAMES[k], "layout": k} for k in LAYOUTS)
    (hydra / "test_modeling_hydra_bert.py").write_text(
        TEST_MODULE.lstrip() % {"layouts": json.dumps(LAYOUTS), "classes": classes}
    )
    (work / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    # parameterized: imported by test_modeling_common, not a hydra_hf dependency
    if subprocess.run([python, "-c", "import parameterized"], capture_output=True).returncode:
        deps = work / "_deps"
        print("installing parameterized into the temporary folder ...", flush=True)
        subprocess.run([python, "-m", "pip", "install", "-q", "--target", str(deps), "parameterized"], check=True)
    return work


# ------------------------------------------------------------------------------------------ report
@dataclass
class Result:
    layout: str
    test: str
    outcome: str  # passed / failed / skipped
    message: str = ""


def read_junit(path: Path) -> list[Result]:
    layout_of = {v: k for k, v in CLASS_NAMES.items()}
    results = []
    for case in ET.parse(path).getroot().iter("testcase"):
        layout = layout_of.get(case.get("classname", "").rsplit(".", 1)[-1])
        if layout is None:
            continue
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = "skipped" if tag == "skipped" else "failed"
                message = (node.get("message") or node.text or "").strip()
                break
        results.append(Result(layout, case.get("name", ""), outcome, message))
    return results


def one_line(message: str) -> str:
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= 200 else line[:197] + "..."


def expected_for(result: Result) -> Expected | None:
    name = result.test.split("[", 1)[0]
    for exp in EXPECTED:
        if exp.test == name and (exp.layouts is None or result.layout in exp.layouts):
            if re.search(exp.message, result.message):
                return exp
    return None


def results_summary(results: list[Result], layouts: list[str], version: str, command: str) -> dict:
    """What docs/transformers.md's table is rendered from (``--results``): counts per layout, every failure."""
    return {
        "command": command,
        "transformers": version,
        "layouts": {layout: {k: sum(r.layout == layout and r.outcome == k for r in results)
                             for k in ("passed", "failed", "skipped")} for layout in layouts},
        "failures": [{"layout": r.layout, "test": r.test, "expected": expected_for(r) is not None}
                     for r in results if r.outcome == "failed"],
    }


def report(results: list[Result], layouts: list[str]) -> int:
    unexpected = 0
    print("\ntransformers common tests against the Hydra BERT classes")
    print(f"{'layout':10s} {'passed':>7s} {'failed':>7s} {'skipped':>8s}")
    for layout in layouts:
        rows = [r for r in results if r.layout == layout]
        counts = {k: sum(r.outcome == k for r in rows) for k in ("passed", "failed", "skipped")}
        print(f"{layout:10s} {counts['passed']:7d} {counts['failed']:7d} {counts['skipped']:8d}")
    total = {k: sum(r.outcome == k for r in results) for k in ("passed", "failed", "skipped")}
    print(f"{'total':10s} {total['passed']:7d} {total['failed']:7d} {total['skipped']:8d}")
    failures = [r for r in results if r.outcome == "failed"]
    if failures:
        print("\nfailures:")
    for r in failures:
        exp = expected_for(r)
        unexpected += exp is None
        verdict = f"expected: {exp.reason}" if exp else "UNEXPECTED"
        print(f"  [{r.layout}] {r.test}: {one_line(r.message)}\n      -> {verdict}")
    print(f"\n{len(failures) - unexpected} expected failure(s), {unexpected} unexpected")
    return 1 if unexpected else 0


# -------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sdist", help="the transformers sdist (default: cached or pip-downloaded)")
    parser.add_argument("--layout", action="append", choices=list(LAYOUTS), help="run only these layouts")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression (e.g. save_load)")
    parser.add_argument("--keep", help="build the test tree in this (new) folder and keep it")
    parser.add_argument("--show-skips", action="store_true", help="list the skipped tests with their reasons")
    parser.add_argument(
        "--results",
        help="also write the counts and failures to this JSON file (docs/transformers.md's "
        "table: docs/results/transformers_common_tests.json, then `make docs`)",
    )
    args = parser.parse_args(argv)

    python = venv_python()
    version = installed_version(python)
    sdist = find_sdist(version, args.sdist, python)
    layouts = args.layout or list(LAYOUTS)
    work = Path(args.keep).resolve() if args.keep else Path(tempfile.mkdtemp(prefix="hydra-tf-common-"))
    if args.keep and work.exists() and any(work.iterdir()):
        sys.exit(f"error: --keep {work} is not empty")
    try:
        build_tree(sdist, version, work, python)
        env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
                   HF_MODULES_CACHE=str(work / "_modules"))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(work / "_deps"), env.get("PYTHONPATH", "")) if p)
        selected = [f"tests/hydra/test_modeling_hydra_bert.py::{CLASS_NAMES[k]}" for k in layouts]
        cmd = [python, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "-rN",
               f"--junitxml={work / 'report.xml'}", "-o", "junit_family=xunit1", *selected]
        if args.keyword:
            cmd += ["-k", args.keyword]
        print(f"transformers {version} (sdist {sdist}); test tree {work}", flush=True)
        run = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
        if not (work / "report.xml").is_file():
            sys.stderr.write(run.stdout[-5000:] + run.stderr[-5000:])
            print("error: pytest wrote no report", file=sys.stderr)
            return 2
        results = read_junit(work / "report.xml")
        if args.show_skips:
            for r in results:
                if r.outcome == "skipped":
                    print(f"  skipped [{r.layout}] {r.test}: {one_line(r.message)}")
        if args.results:
            command = " ".join(
                ["python tools/transformers_common_tests.py", *(argv if argv is not None else sys.argv[1:])]
            )
            summary = results_summary(results, layouts, version, command)
            Path(args.results).write_text(json.dumps(summary, indent=1) + "\n")
        return report(results, layouts)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
