"""The import structure of src/hydra_hf, read with ``ast`` (nothing is imported): imports at the top of
modules, no private names taken from another module, no import circle, and the floors of
docs/architecture.md kept (at most a few imports run back up).

Rules (issue 27, STYLE.md habit 12):

(a) a function-local import only for an optional heavy dependency (:data:`LAZY_ALLOWED`);
(b) no ``from hydra_hf.x import _private`` from another module;
(c) no circle among the modules, counting function-local imports and the package ``__init__.py``
    that importing a submodule runs (``from ..onnx.runtime import X`` runs ``onnx/__init__.py``);
(d) imports that run back up :data:`FLOORS` (from a lower floor to a higher one): at most
    :data:`MAX_BACK_UP` (0), with floors that name whole packages (no package split across floors);
(e) a lazy module (``hydra_hf.lazy.lazy_module("X")``: a stand-in at the top of a module, imported on first use)
    only for the packages of :data:`LAZY_ALLOWED`, like a function-local import;
(f) no circle among the packages (``hydra_hf.X``: a package with every module in it, or a top-level module),
    drawn from the same imports.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "hydra_hf"

# Optional heavy dependencies that may be imported inside a function or through hydra_hf.lazy.lazy_module (an
# extra installs them, or they are slow to import and used by few calls: datasets with pandas and pyarrow ~2 s,
# scikit-learn ~1 s, scipy.stats 1-3 s; `import hydra_hf` loads none of them, tests/repo/test_import_cost.py).
LAZY_ALLOWED = frozenset({
    "onnx", "onnxruntime", "onnxscript", "open_clip", "timm", "peft", "matplotlib", "torchao", "scattertext",
    "mlxtend", "skimage", "gguf", "datasets", "pandas", "sklearn", "scipy",
    # the serve extra (pip install 'hydra-hf[serve]'): Ray Serve and the Starlette responses of its HTTP proxy
    "ray", "starlette",
})

# The floors, lowest first: a module may import from its own floor and the floors below. Every name is a whole
# package or top-level module (hydra_hf.X, never a part of one: test_floors_name_whole_packages); a module is on
# the floor of its package. The package root (hydra_hf/__init__.py: registration and the public names) is on the
# top floor.
FLOORS: list[tuple[str, ...]] = [
    ("hydra_hf.modeling",),  # shipped code: standard library, torch, transformers, siblings
    ("hydra_hf.version", "hydra_hf.errors", "hydra_hf.lazy", "hydra_hf.outputs", "hydra_hf.data",
     "hydra_hf.metrics", "hydra_hf.distributed", "hydra_hf.reproducibility", "hydra_hf.progress",
     "hydra_hf.prompting"),
    ("hydra_hf.masks",),
    ("hydra_hf.convert",),  # readers and the build helpers: no family, no stage
    # the registry, the head adapters, one module per family; cost from a config
    ("hydra_hf.families", "hydra_hf.cost"),
    ("hydra_hf.pruning",),  # gates, Taylor, circuits, members: adapters from the registry
    ("hydra_hf.saving", "hydra_hf.assemble"),  # the stages that write and assemble a Hydra folder
    ("hydra_hf.finetune",),  # the members, the Single and the trained baselines (Deep Ensembles, LoRA)
    ("hydra_hf.calibration",),  # post-hoc maths on a model's outputs: conformal, selective, temperature, thresholds
    ("hydra_hf.onnx",),  # an export: the graph, its int8 recipes, running it
    ("hydra_hf.evaluation",),  # predictors, loading, the run, the report: PyTorch and ONNX models alike
    ("hydra_hf.hub",),  # staging, cards, validation, push
    ("hydra_hf.workflows",),  # one module per verb: a <Verb>Spec and one function, combining the wings below
    ("hydra_hf.recipes",),  # the pipelines, the selection study and the ceiling table
    ("hydra_hf.cli", "hydra_hf"),
]
MAX_BACK_UP = 0


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "metric_modules" not in p.parts}


def _is_package(name: str) -> bool:
    return _modules()[name].name == "__init__.py"


def _in_function(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return True
    return False


def _under_type_checking(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


@cache
def _imports() -> list[tuple[str, int, str, str | None, bool]]:
    """Every import statement of the package: ``(module, line, imported module, name or None, local)``;
    relative imports resolved, ``if TYPE_CHECKING:`` blocks left out (they never run)."""
    out = []
    for name, path in _modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        package = name if _is_package(name) else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or _under_type_checking(node, parents):
                continue
            local = _in_function(node, parents)
            if isinstance(node, ast.Import):
                out += [(name, node.lineno, alias.name, None, local) for alias in node.names]
                continue
            target = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            out += [(name, node.lineno, target, alias.name, local) for alias in node.names]
    return out


def _own_target(target: str, name: str | None) -> str | None:
    """The hydra_hf module an import loads: ``from .x import y`` loads ``x.y`` when that is a module."""
    modules = _modules()
    if name and f"{target}.{name}" in modules:
        return f"{target}.{name}"
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target if target.startswith("hydra_hf") else None


@cache
def _graph() -> dict[str, set[str]]:
    """module -> the hydra_hf modules its imports run, with the package ``__init__`` of each (not the
    root's: every import runs it, and it imports the stages it registers)."""
    graph: dict[str, set[str]] = {name: set() for name in _modules()}
    for module, _, target, name, _ in _imports():
        own = _own_target(target, name)
        if own is None:
            continue
        parts = own.split(".")
        for i in range(2, len(parts) + 1):  # the packages on the way, then the module
            step = ".".join(parts[:i])
            if step != module and not module.startswith(step + "."):
                graph[module].add(step)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def floor_of(module: str) -> int:
    """The floor of ``module`` in :data:`FLOORS` (its longest prefix)."""
    best, floor = -1, None
    for i, prefixes in enumerate(FLOORS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, floor = len(prefix), i
    assert floor is not None, f"{module} is on no floor of FLOORS; add it where it belongs"
    return floor


def back_up_arrows() -> list[str]:
    """The imports (module -> module it imports, function-local ones included) from a lower floor to a
    higher one."""
    arrows = set()
    for module, _, target, name, _ in _imports():
        own = _own_target(target, name)
        if own and own != module and floor_of(own) > floor_of(module):
            arrows.add(f"{module} (floor {floor_of(module)}) -> {own} (floor {floor_of(own)})")
    return sorted(arrows)


def test_imports_are_at_the_top_of_modules():
    local = [f"{module}:{line} imports {target}" for module, line, target, _, is_local in _imports()
             if is_local and target.split(".")[0] not in LAZY_ALLOWED]
    assert local == [], (
        f"{len(local)} function-local imports; put them at the top of the module (only {sorted(LAZY_ALLOWED)} "
        f"may be imported inside a function, with a comment naming the extra):\n" + "\n".join(local)
    )


def test_no_private_name_is_imported_from_another_module():
    private = [f"{module}:{line} imports {name} from {target}" for module, line, target, name, _ in _imports()
               if name and name.startswith("_") and not name.startswith("__") and _own_target(target, name)
               and _own_target(target, name) != module and f"{target}.{name}" not in _modules()]
    assert private == [], "private names imported across modules; make them public:\n" + "\n".join(private)


def test_the_import_graph_has_no_circle():
    circles = _circles(_graph())
    assert circles == [], "import circles (function-local imports and package __init__ files counted):\n" + "\n".join(
        " <-> ".join(c) for c in circles
    )


def test_every_module_is_on_a_floor_and_few_imports_run_back_up():
    for module in _modules():
        floor_of(module)
    arrows = back_up_arrows()
    assert len(arrows) <= MAX_BACK_UP, f"{len(arrows)} imports run back up the floors:\n" + "\n".join(arrows)


def package_of(module: str) -> str:
    """``hydra_hf.X`` of a module (its package, or itself for a top-level module); ``hydra_hf`` for the root."""
    return ".".join(module.split(".")[:2])


def package_graph() -> dict[str, set[str]]:
    """package -> the packages its modules import (the root ``hydra_hf`` left out: every import runs it)."""
    graph: dict[str, set[str]] = {package_of(m): set() for m in _modules()}
    for module, targets in _graph().items():
        for target in targets:
            a, b = package_of(module), package_of(target)
            if a != b and b != "hydra_hf":
                graph[a].add(b)
    return graph


def test_floors_name_whole_packages():
    """A floor holds whole packages: ``hydra_hf.onnx``, never ``hydra_hf.onnx.runtime`` beside ``hydra_hf.onnx.export``
    on another floor; every package is on exactly one floor."""
    named = [name for prefixes in FLOORS for name in prefixes]
    parts = [name for name in named if name != "hydra_hf" and name != package_of(name)]
    assert parts == [], f"floors that name a part of a package, not the package: {parts}"
    assert len(named) == len(set(named)), "a package is on two floors"
    assert {package_of(m) for m in _modules()} <= set(named), "a package on no floor"


def test_the_package_graph_has_no_circle():
    """No two packages import each other, through any number of steps (issue 50: calibration, evaluation, hub and
    onnx formed one while the verbs lived in the wings whose neighbours they combine)."""
    circles = _circles(package_graph())
    assert circles == [], "import circles between packages:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_no_wing_imports_the_workflows():
    """Only the recipes, the CLI and the package root (its thin aliases) import hydra_hf.workflows."""
    importers = sorted(p for p, targets in package_graph().items() if "hydra_hf.workflows" in targets)
    assert set(importers) <= {"hydra_hf.recipes", "hydra_hf.cli"}, importers


def test_lazy_modules_are_heavy_optional_packages():
    """``lazy_module("X")`` defers an import as a function-local one does: the same packages only."""
    found = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            called = getattr(node.func, "id", getattr(node.func, "attr", None)) if isinstance(node, ast.Call) else None
            if called == "lazy_module":
                arg = node.args[0] if node.args else None
                target = arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None
                if target is None or target.split(".")[0] not in LAZY_ALLOWED:
                    found.append(f"{name}:{node.lineno} lazy_module({ast.unparse(arg) if arg else ''})")
    assert found == [], f"lazy modules outside LAZY_ALLOWED {sorted(LAZY_ALLOWED)}:\n" + "\n".join(found)
