"""The errors hydra_hf raises for its users' mistakes.

Every error caused by the user's input, files or flags is a :class:`HydraError`. The CLI prints it as
one line (``hydra-hf COMMAND: error: ...``) with exit code 2; ``-v`` shows the traceback. Anything
else (a bug, an out-of-memory) keeps its traceback. The subclasses also derive from the built-in
exception a Python caller would expect (``ValueError``, ``FileExistsError``, ...), so library users
can catch either.
"""

from __future__ import annotations


class HydraError(Exception):
    """An error caused by the user's input: one line that names the bad value and the fix."""


class HydraInputError(HydraError, ValueError):
    """A bad argument, file content or model folder."""


class HydraTypeError(HydraError, TypeError):
    """A value of the wrong type (e.g. a JSON field holding a string where a number belongs)."""


class HydraOutputError(HydraError, FileExistsError):
    """An output path that hydra_hf may not write or replace."""


class HydraUnsafeError(HydraError, PermissionError):
    """Input that would make hydra_hf read, write or run something outside what the user named."""


def one_line(exc: BaseException) -> str:
    """The first non-empty line of ``exc``'s message (its type name if it has none)."""
    for line in str(exc).strip().splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__
