"""Every ``hydra-hf`` command is argparse plus one workflows call, read with ``ast`` (nothing is imported):
``cli/<verb>.py``'s ``run(args)`` builds the verb's ``<Verb>Spec`` from the parsed options and hands it to
exactly one function of ``hydra_hf.workflows.<verb>``, as a statement of ``run`` itself (not in a loop or a
branch); what ``run`` does after it is printing the result. The command module defines nothing else than
``add_parser`` (with helpers that only build the parser) and ``run``: the work lives in the workflow."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CLI = Path(__file__).resolve().parents[2] / "src" / "hydra_hf" / "cli"
WORKFLOWS = CLI.parent / "workflows"


def _commands() -> list[str]:
    tree = ast.parse((CLI / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "COMMANDS" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError("hydra_hf/cli/__init__.py defines no COMMANDS")


COMMANDS = [name for name in _commands() if (CLI / f"{name}.py").is_file()]


def _workflow_names(tree: ast.Module, verb: str) -> dict[str, str]:
    """The names ``cli/<verb>.py`` takes from ``hydra_hf.workflows.<verb>``: name -> what it is there."""
    names = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module in (f"workflows.{verb}", f"hydra_hf.workflows.{verb}"):
            names.update({alias.asname or alias.name: alias.name for alias in node.names})
    return names


def _called(node: ast.AST) -> str | None:
    return node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else None


def test_every_verb_has_a_workflow_module():
    assert COMMANDS, "no command modules found"
    missing = [verb for verb in COMMANDS if not (WORKFLOWS / f"{verb}.py").is_file()]
    assert missing == [], f"commands without src/hydra_hf/workflows/<verb>.py: {missing}"


@pytest.mark.parametrize("verb", COMMANDS)
def test_run_builds_the_spec_and_makes_one_workflow_call(verb):
    tree = ast.parse((CLI / f"{verb}.py").read_text(encoding="utf-8"))
    taken = _workflow_names(tree, verb)
    specs = {name for name, original in taken.items() if original.endswith("Spec")}
    functions = {name for name, original in taken.items() if not original.endswith("Spec") and original[0].islower()}
    assert specs, f"cli/{verb}.py takes no <Verb>Spec from hydra_hf.workflows.{verb}"
    assert functions, f"cli/{verb}.py takes no function from hydra_hf.workflows.{verb}"
    run = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run"), None)
    assert run is not None, f"cli/{verb}.py has no run(args)"

    calls = [n for n in ast.walk(run) if _called(n) in functions]
    assert len(calls) == 1, f"cli/{verb}.py run() makes {len(calls)} workflows calls; make exactly one"
    call = calls[0]
    statement = next(s for s in run.body if any(n is call for n in ast.walk(s)))
    assert isinstance(statement, (ast.Assign, ast.Expr, ast.Return)), (
        f"cli/{verb}.py run(): the workflows call sits inside a {type(statement).__name__}; make it a statement "
        "of run itself"
    )
    assert len(call.args) >= 1, f"cli/{verb}.py run(): the workflows call takes no spec"
    spec = call.args[0]
    if _called(spec) in specs:  # built in the call itself
        return
    assert isinstance(spec, ast.Name), f"cli/{verb}.py run(): the workflows call's first argument is not the spec"
    before = run.body[: run.body.index(statement)]
    built = [s for s in before if isinstance(s, ast.Assign) and any(getattr(t, "id", None) == spec.id
                                                                   for t in s.targets)]
    assert built and _called(built[-1].value) in specs, (
        f"cli/{verb}.py run(): {spec.id!r} is not a {sorted(specs)} built before the workflows call"
    )


@pytest.mark.parametrize("verb", COMMANDS)
def test_the_command_module_holds_only_its_parser_and_run(verb):
    """Helpers of a command module only build the parser (``type=`` converters, groups of flags); anything that
    does work is the workflow's."""
    tree = ast.parse((CLI / f"{verb}.py").read_text(encoding="utf-8"))
    defined = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    run = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run")
    used_by_run = {n.id for n in ast.walk(run) if isinstance(n, ast.Name)}
    workers = [name for name in defined if name not in ("add_parser", "run") and name in used_by_run]
    assert workers == [], f"cli/{verb}.py run() calls its helpers {workers}; move them to hydra_hf.workflows.{verb}"
