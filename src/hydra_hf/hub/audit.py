"""The shipped-code audit: which ``.py`` files a Hub repository may ship, and what they may import and name.

Users run these files with ``trust_remote_code=True``; ``hydra-hf push`` runs them too (in a fresh,
isolated process, :mod:`hydra_hf.hub.validate`). Two lines of defence, both before anything runs:

1. **An allow-list by content** (:func:`check_shipped_code`): the shipped files are *ours*, so every
   ``.py`` file of the folder must be a file this version of hydra_hf ships (same name) whose
   normalised AST (:func:`normalised_source`: comments and layout ignored, every name, string and
   statement compared) equals ours. Anything else -- an appended line, a sibling helper, a file of
   an older hydra_hf -- is refused with the first line that differs
   (:class:`~hydra_hf.errors.HydraUnsafeError`), unless the caller vouches for foreign code
   (``allow_foreign=True``, ``hydra-hf push --trust-foreign-code``). A deny-list of names cannot win
   this: ``torch.utils.collect_env.run``, ``torch.fx`` helpers that ``exec`` source,
   ``torch.utils.benchmark.Timer(stmt=...)`` all run code through allowed modules.
2. **The AST audit** (:func:`audit_source`), which vouched-for foreign code must still pass: every
   file is parsed and checked against an **allow-list of imports** and a **deny-list of names and
   attributes**; the first violation is refused with its file and line number.

- **Imports** (``import x`` / ``from x import y``): the pure standard-library modules of
  :data:`ALLOWED_STDLIB` (what the shipped files use, plus a few modules without I/O), ``torch``
  and ``transformers`` with their submodules except those of :data:`FORBIDDEN_SUBMODULES`, and
  sibling files (``from .hydra_layers import ...``, one dot, a file that is shipped).
- **Names**: never the builtins that run or reach code, files or the interpreter
  (:data:`FORBIDDEN_NAMES`: ``eval``, ``exec``, ``compile``, ``__import__``, ``open``,
  ``globals``, ``__builtins__``, ...). ``getattr`` / ``setattr`` / ``hasattr`` / ``delattr`` are
  allowed only as direct calls whose attribute name is a string literal, or an f-string that cannot
  spell a forbidden or dunder name (``f"{tower}_kept_heads"``), or a variable in the branch of an
  ``if k in ("a", "b")`` test (or ``not in``, its ``else``) that holds only when it is one of those
  literals (``ModelOutput.to_tuple``'s ``... if k not in (...) else getattr(self, k)``).
- **Attributes**: never the modules an allowed module re-exports (``torch.os``,
  ``x.importlib``), process/file/network/deserialization entry points (``system``, ``load``,
  ``save``, ``from_pretrained``, ``load_library``, ...), frames and code objects, nor dunder
  attributes other than :data:`ALLOWED_DUNDER_ATTRIBUTES` (so no ``__subclasses__`` /
  ``__globals__`` walks). ``trust_remote_code`` may not appear at all.
- String annotations are parsed and checked like code (``typing`` can evaluate them).
- **The entry point** (:data:`ENTRY_POINTS`: ``handler.py``, the folder's Inference Endpoints handler) is run by
  a server, never imported when the model loads, and loads its own folder: it alone may pass
  ``trust_remote_code=True`` (the literal ``True``, as a call's keyword); every other rule holds for it too.

Both read a file as the interpreter does (:func:`python_source`): Python decodes a source file with the
encoding its ``# -*- coding: X -*-`` line names, and under ``raw_unicode_escape`` (``\\u000a``) or
``utf-7`` (``+AAo-``) a line that is a comment to a UTF-8 reader holds code. Shipped code is UTF-8: any
other declaration (or a BOM that contradicts one) is refused, and push stages hydra_hf's own bytes for
every file that is ours, so no byte of the user's copy of a shipped file is run.

No static check can prove foreign Python code harmless; the AST audit closes the known doors
(aliases, ``from``-imports, ``importlib``, ``__import__``, ``eval``/``exec``, ``getattr`` tricks,
``open``) and the isolated validation process is the last line. Read code you vouch for.
"""

from __future__ import annotations

import ast
import codecs
import difflib
import importlib.util
import io
import logging
import os
import tokenize
from functools import cache
from importlib import metadata
from pathlib import Path

from ..errors import HydraUnsafeError

logger = logging.getLogger(__name__)

# The folder of the files hydra_hf ships with every Hydra repository (hydra_hf/modeling, flat).
PACKAGED_CODE_DIR = Path(__file__).resolve().parents[1] / "modeling"
FOREIGN_CODE_FLAG = "--trust-foreign-code"

# Standard-library modules shipped code may import: no file, process, network or code-loading access.
# The shipped files use __future__, collections(.abc), dataclasses, math and typing; the rest are
# equally pure and common in modeling code.
ALLOWED_STDLIB = frozenset({
    "__future__", "abc", "collections", "collections.abc", "contextlib", "copy", "dataclasses", "enum",
    "functools", "itertools", "math", "numbers", "typing", "warnings",
})
ALLOWED_PACKAGES = ("torch", "transformers")
# Submodules of the allowed packages that load code or pickles, compile extensions, spawn processes or download.
FORBIDDEN_SUBMODULES = (
    "torch.hub", "torch.utils.cpp_extension", "torch.package", "torch.serialization", "torch.multiprocessing",
    "torch.utils.tensorboard", "transformers.dynamic_module_utils", "transformers.utils.hub", "transformers.commands",
)
# Builtins (and similar names) that run dynamic code, reach the interpreter's internals or files.
FORBIDDEN_NAMES = frozenset({
    "eval", "exec", "compile", "__import__", "open", "globals", "locals", "vars", "breakpoint", "input",
    "help", "exit", "quit", "__builtins__", "__loader__", "__spec__", "trust_remote_code",
})
ATTRIBUTE_BUILTINS = frozenset({"getattr", "setattr", "hasattr", "delattr"})
# Attribute names never used: modules re-exported by allowed ones, process / file / network /
# deserialization entry points, code loading, frames and code objects.
FORBIDDEN_ATTRIBUTES = frozenset({
    # modules reachable as attributes (torch imports os and sys: torch.os.system would work)
    "os", "sys", "subprocess", "builtins", "importlib", "ctypes", "pickle", "marshal", "shelve", "shutil",
    "socket", "pathlib", "io", "runpy", "pty", "tempfile", "glob", "urllib", "http", "requests", "httpx",
    "ssl", "multiprocessing", "inspect", "threading",
    # processes, files, deserialization, downloads and code loading
    "system", "popen", "fork", "execv", "execve", "execl", "execlp", "execvp", "spawnv", "spawnve", "kill",
    "remove", "unlink", "rmdir", "rmtree", "load", "loads", "save", "from_file", "fromfile", "tofile",
    "load_library", "load_inline", "cpp_extension", "hub", "package", "serialization", "tensorboard",
    "from_pretrained", "save_pretrained", "push_to_hub", "hf_hub_download", "snapshot_download", "cached_file",
    "get_class_from_dynamic_module", "dynamic_module_utils", "get_type_hints", "ForwardRef",
    # frames and code objects
    "f_globals", "f_locals", "f_builtins", "f_back", "f_code", "gi_frame", "cr_frame", "ag_frame", "tb_frame",
    "tb_next", "co_code", "mro", "trust_remote_code",
})
ALLOWED_DUNDER_ATTRIBUTES = frozenset({
    "__init__", "__name__", "__qualname__", "__class__", "__doc__", "__module__", "__call__", "__post_init__",
    "__len__", "__iter__", "__getitem__", "__setitem__", "__contains__", "__repr__", "__eq__", "__hash__",
    "__enter__", "__exit__",
})
# Files a server runs as the folder's entry point (never imported by the modeling code): they may pass
# trust_remote_code=True, to load the folder they ship in.
ENTRY_POINTS = frozenset({"handler.py"})
# The source encodings shipped code may have (``utf-8-sig``: a UTF-8 byte-order mark).
UTF8_CODECS = ("utf-8", "utf-8-sig")
ENCODING_FIX = ("save it as UTF-8 without a coding line naming another encoding, or re-write the folder with "
                "hydra-hf convert")
RULE = ("shipped code may import only torch, transformers, pure standard-library modules and sibling files, "
        "and may not reach files, processes, the network or dynamic code (docs/hub.md, shipped-code audit)")


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _bad_attribute(name: str) -> bool:
    return name in FORBIDDEN_ATTRIBUTES or (_is_dunder(name) and name not in ALLOWED_DUNDER_ATTRIBUTES)


class _Auditor(ast.NodeVisitor):
    """Walks one file's AST; raises :class:`HydraUnsafeError` at the first violation."""

    def __init__(self, filename: str, siblings: set[str]) -> None:
        self.filename = filename
        self.siblings = siblings  # module names shipped beside the file
        self.entry_point = filename in ENTRY_POINTS
        self.checked_calls: set[int] = set()  # ids of Name nodes that are the callee of a vetted getattr(...)
        self.bound: list[set[str]] = []  # names known to hold a safe literal attribute name (see _bound_name)

    def fail(self, node: ast.AST, what: str) -> None:
        raise HydraUnsafeError(f"{self.filename}:{getattr(node, 'lineno', 0)}: {what}; {RULE}")

    # -------------------------------------------------------------------------------- imports
    def _check_module(self, node: ast.AST, module: str) -> None:
        root = module.split(".")[0]
        if module in ALLOWED_STDLIB:
            return
        if root in ALLOWED_PACKAGES:
            if any(module == bad or module.startswith(bad + ".") for bad in FORBIDDEN_SUBMODULES):
                self.fail(node, f"imports {module}")
            if any(_bad_attribute(part) for part in module.split(".")[1:]):
                self.fail(node, f"imports {module}")
            return
        self.fail(node, f"imports {module}")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_module(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            targets = [node.module] if node.module else [alias.name for alias in node.names]
            for target in targets:
                if node.level != 1 or "." in target or target not in self.siblings:
                    self.fail(node, f"imports '{'.' * node.level}{target}', which is not a file shipped beside it")
        else:
            self._check_module(node, node.module or "")
        for alias in node.names:
            if alias.name == "*":
                self.fail(node, f"uses 'from {node.module} import *'")
            if not node.level and f"{node.module}.{alias.name}".startswith(FORBIDDEN_SUBMODULES):
                self.fail(node, f"imports {node.module}.{alias.name}")
            if _bad_attribute(alias.name) or alias.name in FORBIDDEN_NAMES:
                self.fail(node, f"imports the name {alias.name!r} from {'.' * node.level}{node.module or ''}")

    # ------------------------------------------------------------------------ names, attributes
    def visit_Name(self, node: ast.Name) -> None:
        if node.id in FORBIDDEN_NAMES:
            self.fail(node, f"uses {node.id}")
        if node.id in ATTRIBUTE_BUILTINS and id(node) not in self.checked_calls:
            self.fail(node, f"uses {node.id} other than as a direct call with a literal attribute name")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.generic_visit(node)  # the object first: `__import__("os").system` is refused for __import__
        if _bad_attribute(node.attr):
            self.fail(node, f"uses the attribute .{node.attr}")

    def visit_Call(self, node: ast.Call) -> None:
        for keyword in node.keywords:
            if keyword.arg == "trust_remote_code" and not (
                self.entry_point and isinstance(keyword.value, ast.Constant) and keyword.value.value is True
            ):
                self.fail(node, "passes trust_remote_code")
        func = node.func
        if isinstance(func, ast.Name) and func.id in ATTRIBUTE_BUILTINS:
            if len(node.args) < 2 or node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
                self.fail(node, f"calls {func.id} without a plain object and attribute name")
            if isinstance(node.args[1], ast.Constant) and not self._safe_attribute_name(node.args[1]):
                self.fail(node, f"calls {func.id} with the attribute {node.args[1].value!r}")
            if not (self._safe_attribute_name(node.args[1]) or self._bound_name(node.args[1])):
                self.fail(node, f"calls {func.id} with an attribute name that is not a plain literal")
            self.checked_calls.add(id(func))
        self.generic_visit(node)

    def _bound_name(self, arg: ast.expr) -> bool:
        """``arg`` is a variable that, where it is used, can only hold safe literal names: inside the
        branch of ``x if k not in ("a", "b") else getattr(o, k)`` (or of an ``if k in (...)``) that
        holds only when ``k`` is one of the literals, and that never reassigns ``k``."""
        return isinstance(arg, ast.Name) and any(arg.id in scope for scope in self.bound)

    @staticmethod
    def _membership(test: ast.expr) -> tuple[str, bool] | None:
        """``(name, positive)`` for ``name in (<safe str literals>)`` / ``not in``; else None."""
        if not (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and len(test.ops) == 1
                and isinstance(test.ops[0], (ast.In, ast.NotIn))):
            return None
        options = test.comparators[0]
        if not isinstance(options, (ast.Tuple, ast.List, ast.Set)) or not all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) and not _bad_attribute(e.value)
            for e in options.elts
        ):
            return None
        return test.left.id, isinstance(test.ops[0], ast.In)

    def _visit_branches(self, test: ast.expr, body: list[ast.AST], orelse: list[ast.AST]) -> None:
        self.visit(test)
        membership = self._membership(test)
        for branch, holds in ((body, True), (orelse, False)):
            name = None
            if membership is not None and membership[1] == holds:
                stores = [n for part in branch for n in ast.walk(part)
                          if isinstance(n, ast.Name) and n.id == membership[0] and not isinstance(n.ctx, ast.Load)]
                name = None if stores else membership[0]
            self.bound.append({name} if name else set())
            for part in branch:
                self.visit(part)
            self.bound.pop()

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self._visit_branches(node.test, [node.body], [node.orelse])

    def visit_If(self, node: ast.If) -> None:
        self._visit_branches(node.test, node.body, node.orelse)

    @staticmethod
    def _safe_attribute_name(arg: ast.expr) -> bool:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return not _bad_attribute(arg.value)
        if isinstance(arg, ast.JoinedStr) and arg.values:
            literals = [v.value for v in arg.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
            last = arg.values[-1]
            # ends with literal text that is not "_": cannot spell a dunder; holds literal text no
            # forbidden name contains: cannot spell a forbidden name
            ends_plain = (
                isinstance(last, ast.Constant) and isinstance(last.value, str) and not last.value.endswith("_")
            )
            distinctive = any(text and not any(text in bad for bad in FORBIDDEN_ATTRIBUTES) for text in literals)
            return ends_plain and distinctive
        return False

    # ------------------------------------------------------------------------- annotations
    def _visit_annotation(self, annotation: ast.expr | None) -> None:
        if annotation is None:
            return
        self.visit(annotation)
        for node in ast.walk(annotation):  # string annotations: typing may evaluate them
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                try:
                    parsed = ast.parse(node.value.strip(), mode="eval")
                except SyntaxError:
                    continue  # not an expression: nothing can evaluate it
                ast.increment_lineno(parsed, node.lineno - 1)
                self._visit_annotation(parsed.body)

    def visit_arg(self, node: ast.arg) -> None:
        if node.arg == "trust_remote_code":
            self.fail(node, "uses trust_remote_code")
        self._visit_annotation(node.annotation)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._visit_annotation(node.annotation)
        self.visit(node.target)
        if node.value is not None:
            self.visit(node.value)

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for decorator in node.decorator_list:
            self.visit(decorator)
        self.visit(node.args)
        self._visit_annotation(node.returns)
        for statement in node.body:
            self.visit(statement)

    visit_FunctionDef = _visit_function
    visit_AsyncFunctionDef = _visit_function


def python_source(data: bytes, name: str) -> str:
    """The text Python runs for the source-file bytes ``data`` (its BOM and ``coding`` line read as the
    interpreter reads them), refused unless that is UTF-8.

    Raises:
        HydraUnsafeError: ``NAME: ...`` for a coding declaration other than UTF-8, one Python cannot read
            (unknown, or contradicting a BOM), or bytes that are not UTF-8.
    """
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:  # an unknown encoding, a BOM with another declaration, an undecodable first line
        raise HydraUnsafeError(f"{name}: Python cannot read its source encoding ({exc.msg}); shipped code is UTF-8: "
                               f"{ENCODING_FIX}") from None
    if codecs.lookup(encoding).name not in UTF8_CODECS:
        raise HydraUnsafeError(
            f"{name}: declares the source encoding {encoding!r}, under which Python runs other code than a UTF-8 "
            f"reader sees; shipped code is UTF-8: {ENCODING_FIX}"
        )
    try:
        text = importlib.util.decode_source(data)
    except UnicodeDecodeError as exc:
        raise HydraUnsafeError(f"{name} is not UTF-8 text (byte {exc.start}: {exc.reason}); shipped code is plain "
                               f"Python source: {ENCODING_FIX}") from None
    try:  # the interpreter's own reading of the bytes gives the same code as the text checked here
        same = ast.dump(ast.parse(data)) == ast.dump(ast.parse(text))
    except (SyntaxError, ValueError):
        same = True  # it does not parse: the checks name the line, and Python cannot run it either
    if not same:
        raise HydraUnsafeError(f"{name}: Python reads other code from its bytes than from their UTF-8 text; "
                               f"{ENCODING_FIX}")
    return text


def read_python_source(path: str | os.PathLike, name: str | None = None) -> str:
    """:func:`python_source` of the file ``path`` (``name``: how messages call it, default its file name)."""
    path = Path(path)
    return python_source(path.read_bytes(), name or path.name)


def _parse(source: str, filename: str) -> ast.Module:
    """``ast.parse`` with a one-line :class:`HydraUnsafeError` for source that does not parse."""
    try:
        return ast.parse(source, filename=filename)
    except SyntaxError as exc:
        where = f"{filename}:{exc.lineno}" if exc.lineno else filename  # None for null bytes
        raise HydraUnsafeError(f"{where}: does not parse as Python ({exc.msg})") from None
    except ValueError as exc:  # null bytes
        raise HydraUnsafeError(f"{filename}: does not parse as Python ({exc})") from None


def sibling_imports(source: str, filename: str = "<shipped>") -> set[str]:
    """Sibling module names a file imports (``from .x import``, ``from . import x``); other
    relative imports are left to the audit, which refuses them."""
    tree = ast.parse(source, filename=filename)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found.update([node.module] if node.module else [alias.name for alias in node.names])
    return found


def audit_source(source: str, filename: str, siblings: set[str]) -> None:
    """Check one file's source against the allow-list; raises :class:`HydraUnsafeError` with ``FILE:LINE``."""
    _Auditor(filename, siblings).visit(_parse(source, filename))


def normalised_source(source: str, filename: str = "<shipped>") -> str:
    """The AST of ``source`` without positions: equal for two files that differ only in comments,
    blank lines and layout; different as soon as a name, a string, a number or a statement differs.

    Raises:
        HydraUnsafeError: the source does not parse.
    """
    return ast.dump(_parse(source, filename), annotate_fields=True, include_attributes=False)


@cache
def packaged_code() -> dict[str, tuple[str, str]]:
    """``{file name: (source, normalised AST)}`` of every ``.py`` file hydra_hf ships (its modeling folder)."""
    out = {}
    for path in sorted(PACKAGED_CODE_DIR.glob("*.py")):
        if path.name.startswith("_"):
            continue  # the package's __init__.py is never shipped
        source = read_python_source(path)
        out[path.name] = (source, normalised_source(source, path.name))
    return out


def _version() -> str:
    try:
        return metadata.version("hydra_hf")
    except metadata.PackageNotFoundError:  # a source checkout without installed metadata
        return "(source checkout)"


def _first_difference(ours: str, theirs: str) -> int:
    """1-based line of ``theirs`` where it first differs from ``ours`` (blank lines and indentation ignored)."""
    a = [line.strip() for line in ours.splitlines() if line.strip()]
    numbered = [(n, line.strip()) for n, line in enumerate(theirs.splitlines(), 1) if line.strip()]
    matcher = difflib.SequenceMatcher(a=a, b=[line for _, line in numbered], autojunk=False)
    for tag, _, _, j1, _ in matcher.get_opcodes():
        if tag != "equal":
            return numbered[j1][0] if j1 < len(numbered) else (numbered[-1][0] + 1 if numbered else 1)
    return 1  # the texts agree line by line: the difference is inside a line's layout


def is_packaged(name: str, source: str) -> bool:
    """Whether ``source`` (decoded by :func:`python_source`) is the file hydra_hf ships as ``name``."""
    ours = packaged_code().get(name)
    return ours is not None and ours[1] == normalised_source(source, name)


def check_packaged(name: str, source: str) -> None:
    """Refuse ``source`` (the folder's file ``name``) unless it is the file hydra_hf ships under that name.

    Raises:
        HydraUnsafeError: ``NAME:LINE: ...`` naming the first differing line and the two ways out.
    """
    if is_packaged(name, source):
        return
    ours = packaged_code().get(name)
    fix = (f"re-write the folder with hydra-hf convert (it copies hydra_hf's own files), or pass {FOREIGN_CODE_FLAG} "
           "if you wrote this code and vouch for it")
    if ours is None:
        raise HydraUnsafeError(f"{name}: is not a file hydra_hf {_version()} ships, so it is foreign code; {fix}")
    line = _first_difference(ours[0], source)
    raise HydraUnsafeError(f"{name}:{line}: differs from the {name} hydra_hf {_version()} ships; {fix}")


def check_shipped_code(folder: str | os.PathLike, *, allow_foreign: bool = False) -> list[str]:
    """Check every top-level ``.py`` file of ``folder`` (hidden files aside); returns their names.

    Each file is read as the interpreter reads it, and must be UTF-8 (:func:`python_source`). Each
    must be a file hydra_hf ships, unchanged (:func:`check_packaged`), unless
    ``allow_foreign`` (the user vouches for the code); every file, ours or vouched for, must then pass
    the AST audit (:func:`audit_source`). Nothing is imported or run.

    Raises:
        HydraUnsafeError: ``FILE:LINE: what`` for the first file that is not ours (without
            ``allow_foreign``) or the first import or name outside the audit's allow-list.
    """
    root = Path(folder)
    files = sorted(p.name for p in root.glob("*.py") if not p.name.startswith(".") and p.is_file())
    siblings = {name.removesuffix(".py") for name in files}
    for name in files:
        path = root / name
        if path.is_symlink():
            raise HydraUnsafeError(f"{name} is a symlink; ship the file itself")
        source = read_python_source(path)
        if allow_foreign:
            if not is_packaged(name, source):
                logger.warning("%s is not the file hydra_hf ships; shipping it because you vouch for it (%s)",
                               name, FOREIGN_CODE_FLAG)
        else:
            check_packaged(name, source)
        audit_source(source, name, siblings)
    return files
