#!/usr/bin/env python
"""Run transformers 5.24's own generation and causal-LM tests (``GenerationTesterMixin``, ``CausalLMModelTest``,
``ModelTesterMixin``) against this tree's fused decoders: Llama-style and GPT-2, three layouts each, beside a
stock control class per family.

A developer check, not part of ``make test`` (the project's tests never import the harness). The generation
harness is a folder kept beside the project (``--harness``; default ``../shared/conformance/transformers-generation``
from the repository root): transcriptions of the test files transformers' wheel and sdist leave out, its
``build_tree.py`` and its Llama module. This runner does what the harness's ``run.sh`` does, and more::

    .venv/bin/python tools/conformance/run_generation.py                        # Llama and GPT-2, ~5 min on 2 cores
    .venv/bin/python tools/conformance/run_generation.py --family gpt2 -k attention
    .venv/bin/python tools/conformance/run_generation.py --results docs/results/generation_conformance.json

1. installs ``parameterized`` and ``pytest-timeout`` into ``WORK/deps`` and fetches the sdist of the installed
   transformers (cached in ``$TMPDIR/hydra-hf-transformers-sdist/``, as ``tools/transformers_common_tests.py``);
2. builds the test tree with the harness's own ``build_tree.py`` (as ``run.sh``) and adds this folder's GPT-2
   module (``hydra_gpt2_generation.py`` -> ``tests/hydra/test_hydra_gpt2_generation.py``);
3. runs pytest with ``PYTHONPATH`` = the deps, then THIS tree's ``src`` (``run.sh`` sets ``PYTHONPATH`` to its deps
   only, so it tests whichever hydra_hf the venv has installed; the runner checks and prints which one it imports);
4. sorts every failure of a Hydra class: **control-shared** (the family's stock control class fails the same test:
   a harness or version artefact), **head-axis** (one of ``EXPECTED``, the documented layouts of an ensemble whose
   attention maps hold every member's kept heads and whose one cache holds every member's kept key/value heads), or
   **real**. Exit status 0 when no failure is real, 1 otherwise, 2 when the run could not be set up.

docs/transformers.md describes the check; its table is rendered from ``--results``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
DEFAULT_HARNESS = REPO.parent / "shared" / "conformance" / "transformers-generation"
SDIST_CACHE = Path(tempfile.gettempdir()) / "hydra-hf-transformers-sdist"
MODULES = {"llama": "tests/hydra/test_hydra_generation.py", "gpt2": "tests/hydra/test_hydra_gpt2_generation.py"}
GPT2_MODULE = HERE / "hydra_gpt2_generation.py"

# test class -> (family, layout); "control" is the stock model, "extra" the harness's own equivalence test
CLASSES: dict[str, tuple[str, str]] = {
    "LlamaControlTest": ("llama", "control"),
    "HydraLlamaUnequalTest": ("llama", "unequal"),
    "HydraLlamaUniformTest": ("llama", "uniform"),
    "HydraLlamaSingleTest": ("llama", "single"),
    "HydraLlamaEquivalenceTest": ("llama", "extra"),
    "GPT2ControlTest": ("gpt2", "control"),
    "HydraGPT2UnequalTest": ("gpt2", "unequal"),
    "HydraGPT2UniformTest": ("gpt2", "uniform"),
    "HydraGPT2SingleTest": ("gpt2", "single"),
    "HydraGPT2EquivalenceTest": ("gpt2", "extra"),
}
LAYOUTS = ("control", "unequal", "uniform", "single", "extra")


@dataclass(frozen=True)
class Expected:
    """A documented head-axis difference: ``test`` (a regex on the test name) fails in ``layouts`` with a message
    that matches ``message`` (a regex), for ``reason``."""

    test: str
    layouts: tuple[str, ...]
    message: str
    reason: str


# The unequal layout keeps K_l = 6 query heads in layer 0 (4 + 2 + 0) where the base has H = 4, and its one cache
# holds 4 key/value heads per layer where Llama's has 2 (GPT-2's: 4 + 2 + 0 = 6 where the base has 4). With the
# uniform and single layouts K_l = H and KV_l = the base's, so these tests pass there.
ATTENTION_SHAPES = r"Lists differ: \[torch\.Size\(\[\d+, (\d+), \d+, \d+\]\)"
EXPECTED: list[Expected] = [
    Expected(
        r"test_attention_outputs$", ("unequal",), r"\[\d+, \d+, \d+\] != \[\d+, \d+, \d+\]|Lists differ",
        "attentions[l] is (B, K_l, T, S) over every member's kept query heads (member 0's first): K_0 = 6 where the "
        "base has H = 4",
    ),
    Expected(
        r"test_(greedy|sample|beam_search|beam_sample)_generate_dict_outputs?(_use_cache)?$|"
        r"test_assisted_decoding_(matches_greedy_search|sample).*",
        ("unequal",), ATTENTION_SHAPES,
        "generate()'s attentions per step are (B, K_l, T, S) over every member's kept query heads: K_0 = 6 where the "
        "base has H = 4 (the same head axis as test_attention_outputs)",
    ),
    Expected(
        r"test_past_key_values_format$", ("unequal",),
        r"torch\.Size\(\[\d+, \d+, \d+, \d+\]\) != \(\d+, \d+, \d+, \d+\)",
        "the one cache holds every member's kept key/value heads side by side: KV_l (4 for Llama, 6 for GPT-2 in "
        "layer 0) where the base has num_key_value_heads (2) / n_head (4)",
    ),
]


@dataclass
class Result:
    family: str
    layout: str
    test: str
    outcome: str  # passed / failed / skipped
    message: str = ""


# ------------------------------------------------------------------------------------------ setup
def venv_python() -> str:
    python = REPO / ".venv" / "bin" / "python"
    return str(python) if python.is_file() else sys.executable


def run_checked(cmd: list[str], what: str, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if done.returncode:
        sys.stderr.write(done.stdout[-2000:] + done.stderr[-2000:])
        print(f"error: could not {what} (exit {done.returncode}); see the output above", file=sys.stderr)
        sys.exit(2)
    return done


def installed_version(python: str) -> str:
    return run_checked([python, "-c", "import transformers; print(transformers.__version__)"],
                       "import transformers").stdout.strip()


def sdist_of(version: str, given: str | None, python: str) -> Path:
    """The sdist of ``version``: ``given``, a cached copy, or one ``pip download`` fetches (outside the repo)."""
    if given:
        path = Path(given).expanduser().resolve()
        if not path.is_file():
            sys.exit(f"error: --sdist {given} does not exist; give the path of transformers-{version}.tar.gz")
        return path
    cached = SDIST_CACHE / f"transformers-{version}.tar.gz"
    if not cached.is_file():
        SDIST_CACHE.mkdir(parents=True, exist_ok=True)
        print(f"downloading the transformers {version} sdist into {SDIST_CACHE} ...", flush=True)
        run_checked([python, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d",
                     str(SDIST_CACHE), f"transformers=={version}"], f"download transformers=={version}'s sdist")
    return cached


def build(harness: Path, sdist: Path, work: Path, python: str) -> Path:
    """The test tree under ``work/tree`` (the harness's build_tree.py, then the GPT-2 module) and the deps."""
    deps = work / "deps"
    if not (deps / "parameterized").is_dir():
        print("installing parameterized and pytest-timeout into the work folder ...", flush=True)
        run_checked([python, "-m", "pip", "install", "-q", "--no-deps", "--target", str(deps), "parameterized",
                     "pytest-timeout"], "install parameterized and pytest-timeout")
    tree = work / "tree"
    shutil.rmtree(tree, ignore_errors=True)
    run_checked([python, str(harness / "build_tree.py"), str(sdist), str(tree)], "build the harness's test tree")
    shutil.copy(GPT2_MODULE, tree / MODULES["gpt2"])
    return tree


def test_env(work: Path) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", RUN_SLOW="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               HF_MODULES_CACHE=str(work / "modules"))
    env["PYTHONPATH"] = os.pathsep.join([str(work / "deps"), str(REPO / "src")])
    return env


def imported_hydra_hf(python: str, env: dict[str, str], tree: Path) -> Path:
    """Where the test run's ``import hydra_hf`` comes from: this tree's src (checked)."""
    done = run_checked([python, "-c", "import hydra_hf; print(hydra_hf.__file__)"], "import hydra_hf",
                       env=env, cwd=tree)
    path = Path(done.stdout.strip().splitlines()[-1]).resolve()
    if REPO / "src" not in path.parents:
        sys.exit(f"error: the run imports hydra_hf from {path}, not from {REPO / 'src'}; unset what puts it first")
    return path


# ------------------------------------------------------------------------------------------ report
# A pytest plugin the runner loads (-p): pytest's own outcome of every test (its subtests' reports left out, as
# pytest's summary line counts them apart), written to $HYDRA_OUTCOMES as JSON lines at the end of the session.
OUTCOMES_PLUGIN = """
import json, os
from _pytest.subtests import SubtestReport

_OUT = {}

def pytest_runtest_logreport(report):
    if isinstance(report, SubtestReport):
        return
    outcome, message = _OUT.get(report.nodeid, ("passed", ""))
    if report.failed:
        outcome, message = "failed", str(report.longrepr)
    elif report.skipped and outcome != "failed":
        outcome, message = "skipped", str(report.longrepr)
    _OUT[report.nodeid] = (outcome, message)

def pytest_sessionfinish(session):
    with open(os.environ["HYDRA_OUTCOMES"], "w") as f:
        for nodeid, (outcome, message) in _OUT.items():
            f.write(json.dumps({"nodeid": nodeid, "outcome": outcome, "message": message}) + "\\n")
"""


def read_outcomes(path: Path) -> list[Result]:
    results = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        parts = row["nodeid"].split("::")
        where = CLASSES.get(parts[1]) if len(parts) == 3 else None
        if where is not None:
            results.append(Result(*where, parts[2], row["outcome"], row["message"]))
    return results


def one_line(message: str) -> str:
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= 160 else line[:157] + "..."


def verdict(result: Result, results: list[Result]) -> tuple[str, str]:
    """``(kind, reason)`` of a failure: ``control`` (the control class), ``control-shared``, ``head-axis`` or
    ``real``."""
    if result.layout == "control":
        return "control", "the stock control class: a harness or version artefact"
    shared = any(r.family == result.family and r.layout == "control" and r.test == result.test
                 and r.outcome == "failed" for r in results)
    if shared:
        return "control-shared", "the family's stock control class fails it too: a harness or version artefact"
    for exp in EXPECTED:
        if result.layout in exp.layouts and re.fullmatch(exp.test, result.test) and re.search(exp.message,
                                                                                             result.message):
            return "head-axis", exp.reason
    return "real", "a defect to fix"


def summary(results: list[Result], version: str, command: str) -> dict:
    """What docs/transformers.md's table is rendered from (``--results``)."""
    counts = {}
    for family in MODULES:
        for layout in LAYOUTS:
            rows = [r for r in results if r.family == family and r.layout == layout]
            if rows:
                counts.setdefault(family, {})[layout] = {k: sum(r.outcome == k for r in rows)
                                                         for k in ("passed", "failed", "skipped")}
    failures = []
    for r in results:
        if r.outcome == "failed":
            kind, reason = verdict(r, results)
            failures.append({"family": r.family, "layout": r.layout, "test": r.test, "kind": kind, "reason": reason})
    return {"command": command, "transformers": version, "counts": counts, "failures": failures}


def report(results: list[Result]) -> int:
    print("\ntransformers' generation / causal-LM / model tests against the fused decoders")
    print(f"{'family':8s} {'layout':9s} {'passed':>7s} {'failed':>7s} {'skipped':>8s}")
    for family in MODULES:
        for layout in LAYOUTS:
            rows = [r for r in results if r.family == family and r.layout == layout]
            if rows:
                c = {k: sum(r.outcome == k for r in rows) for k in ("passed", "failed", "skipped")}
                print(f"{family:8s} {layout:9s} {c['passed']:7d} {c['failed']:7d} {c['skipped']:8d}")
    real = 0
    failures = [r for r in results if r.outcome == "failed"]
    if failures:
        print("\nfailures:")
    for r in failures:
        kind, reason = verdict(r, results)
        real += kind == "real"
        print(f"  [{r.family} {r.layout}] {r.test}: {one_line(r.message)}\n      -> {kind.upper()}: {reason}")
    for family in MODULES:
        rows = [r for r in results if r.family == family]
        if rows:
            n_real = sum(verdict(r, results)[0] == "real" for r in rows if r.outcome == "failed")
            print(f"{family}: {sum(r.outcome == 'passed' for r in rows)} passed, "
                  f"{sum(r.outcome == 'failed' for r in rows)} failed ({n_real} real)")
    return 1 if real else 0


# -------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--harness", default=os.environ.get("HYDRA_GENERATION_HARNESS", str(DEFAULT_HARNESS)),
                        help="the generation harness folder (its build_tree.py; default: %(default)s)")
    parser.add_argument("--sdist", help="the transformers sdist (default: cached or pip-downloaded)")
    parser.add_argument("--family", action="append", choices=list(MODULES), help="run only these families")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression (e.g. attention)")
    parser.add_argument("--work", help="the work folder (deps, test tree, log; reused: the deps stay)")
    parser.add_argument("--results", help="also write the counts and failures to this JSON file "
                        "(docs/transformers.md's table: docs/results/generation_conformance.json, then `make docs`)")
    args = parser.parse_args(argv)

    harness = Path(args.harness).expanduser().resolve()
    if not (harness / "build_tree.py").is_file() or not (harness / "test_hydra_generation.py").is_file():
        print(f"error: --harness {harness} holds no build_tree.py / test_hydra_generation.py; give the generation "
              "harness folder (or set HYDRA_GENERATION_HARNESS)", file=sys.stderr)
        return 2
    python = venv_python()
    version = installed_version(python)
    work = Path(args.work).expanduser().resolve() if args.work else Path(tempfile.mkdtemp(prefix="hydra-gen-"))
    work.mkdir(parents=True, exist_ok=True)
    tree = build(harness, sdist_of(version, args.sdist, python), work, python)
    env = test_env(work)
    print(f"transformers {version}; harness {harness}; test tree {tree}; hydra_hf from "
          f"{imported_hydra_hf(python, env, tree)}", flush=True)
    (work / "hydra_outcomes.py").write_text(OUTCOMES_PLUGIN.lstrip())
    env["PYTHONPATH"] += os.pathsep + str(work)
    results, logs = [], []
    for family in args.family or list(MODULES):  # one pytest run per family: its own summary line, as run.sh's
        env["HYDRA_OUTCOMES"] = str(work / f"outcomes_{family}.jsonl")
        cmd = [python, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "timeout", "-p",
               "hydra_outcomes", "-q", "--timeout", "300", "-rN", "--tb=short", MODULES[family]]
        if args.keyword:
            cmd += ["-k", args.keyword]
        logs.append(work / f"run_{family}.log")
        print(f"running {MODULES[family]} ...", flush=True)
        with open(logs[-1], "w") as log:
            done = subprocess.run(cmd, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)
        outcomes = Path(env["HYDRA_OUTCOMES"])
        if not outcomes.is_file():
            print(f"error: pytest recorded no outcomes (exit {done.returncode}); see {logs[-1]}", file=sys.stderr)
            return 2
        results += read_outcomes(outcomes)
        print(f"  pytest: {logs[-1].read_text().strip().splitlines()[-1]}", flush=True)
    status = report(results)
    print("full logs: " + ", ".join(map(str, logs)))
    if args.results:
        command = "python tools/conformance/run_generation.py --results " + args.results
        Path(args.results).write_text(json.dumps(summary(results, version, command), indent=1) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
