"""What hydra_hf may read and write: paths kept inside the folders the user named, and output folders
that are claimed exclusively, written atomically and replaced only when they are ours.

Rules every command follows (docs/cli.md, "What each command promises"):

- **Paths taken from files stay inside their folder.** A name read from a file (``auto_map`` entries,
  a shard index's ``weight_map``, a report's figures) is resolved with :func:`resolve_inside`, which
  refuses absolute paths, ``..`` escapes and symlinks that leave the folder.
- **Outputs are written atomically.** :func:`write_output_folder` writes into a temporary sibling
  ``.NAME.tmp-PID-XXXX`` and renames it into place; a failure leaves the output as it was.
- **Two writers never both succeed.** An exclusive lock (a ``flock`` on ``.NAME.lock``, which holds
  the writer's PID) is held beside the output for the whole write; a second writer gets a one-line
  error. The kernel releases the lock of a killed writer, so exactly one later writer takes it over.
- **--overwrite replaces only our own output.** A folder written by hydra-hf holds the marker file
  ``.hydra_hf_output.json`` naming the command that wrote it; ``--overwrite`` replaces a non-empty
  folder only when its marker names the same command, and never a folder that is, or contains, one
  of the command's inputs.
- **Leftovers of killed processes are removed.** Temporary folders and locks carry their writer's
  PID; the next write beside them removes those whose process is gone.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import re
import shutil
import stat
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from .errors import HydraInputError, HydraOutputError, HydraUnsafeError
from .version import __version__

try:
    import fcntl
except ImportError:  # Windows: output_lock falls back to an O_EXCL lock file
    fcntl = None

logger = logging.getLogger(__name__)

MARKER = ".hydra_hf_output.json"
_TEMP_RE = re.compile(r"^\.(?P<name>.+)\.(?:tmp|old)-(?P<pid>\d+)-[A-Za-z0-9_]+$")
_TEMP_SENTINEL = ".hydra_hf_tmp"


# --------------------------------------------------------------------------------------------------
# reading: paths from files stay inside their folder


def resolve_inside(root: str | os.PathLike, name: str | os.PathLike, *, what: str) -> Path:
    """``root / name`` if it stays inside ``root`` (after resolving ``..`` and symlinks).

    Raises:
        HydraUnsafeError: ``name`` is absolute, escapes ``root`` with ``..``, or is (or passes
            through) a symlink whose target lies outside ``root``.
    """
    root = Path(root)
    text = os.fspath(name)
    if not isinstance(text, str) or not text or "\x00" in text:
        raise HydraUnsafeError(f"{what} {text!r} is not a file name; expected a path relative to {str(root)!r}")
    if os.path.isabs(text) or text.startswith("~"):
        raise HydraUnsafeError(
            f"{what} {text!r} is an absolute path; it must name a file inside {str(root)!r} (a relative path)"
        )
    real_root = root.resolve()
    target = (root / text).resolve()
    if target != real_root and real_root not in target.parents:
        raise HydraUnsafeError(
            f"{what} {text!r} leads outside {str(root)!r} (to {str(target)!r}); only files inside the folder are used"
        )
    return root / text


def regular_files(root: str | os.PathLike, *, what: str = "folder") -> list[Path]:
    """Every file under ``root`` (sorted, relative paths), refusing symlinks that leave ``root``.

    A symlink whose target stays inside ``root`` is listed (its target is what gets read); one that
    points outside, or dangles, raises :class:`HydraUnsafeError`.
    """
    root = Path(root)
    real_root = root.resolve()
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for entry in [*dirnames, *filenames]:
            path = Path(dirpath) / entry
            if path.is_symlink():
                target = path.resolve()
                if not target.exists() or (target != real_root and real_root not in target.parents):
                    raise HydraUnsafeError(
                        f"{str(path)!r} is a symlink to {os.readlink(path)!r}, outside {str(root)!r}; "
                        "replace it with the file itself"
                    )
                if target.is_dir():
                    raise HydraUnsafeError(f"{str(path)!r} is a symlink to a folder; copy the files instead")
        for entry in filenames:
            found.append((Path(dirpath) / entry).relative_to(root))
    return sorted(found)


JSON_MAX_DEPTH = 64  # hydra-hf's files nest a handful of levels; deeper is hostile (or a recursion crash)


def read_json(path: str | os.PathLike, *, what: str, fix: str, max_bytes: int = 64 * 2**20,
              unique_keys: bool = False) -> Any:
    """The JSON in ``path``, read with bounds: a regular file (a FIFO or device is refused without
    blocking), at most ``max_bytes``, strict JSON (no ``NaN`` / ``Infinity``) nested at most
    :data:`JSON_MAX_DEPTH` levels; with ``unique_keys``, no object names a key twice (JSON readers
    disagree on which value wins). Every problem is one :class:`HydraInputError` line naming ``what``
    and ``path`` and ending with ``fix``.
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO opens without waiting for a writer
    except FileNotFoundError:
        raise HydraInputError(f"{what} {str(path)!r} does not exist; {fix}") from None
    except IsADirectoryError:
        raise HydraInputError(f"{what} {str(path)!r} is a folder; {fix}") from None
    except OSError as exc:
        raise HydraInputError(f"{what} {str(path)!r} cannot be read ({exc.strerror}); {fix}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file (a FIFO, device or socket)"
        raise HydraInputError(f"{what} {str(path)!r} is {kind}; {fix}")
    with os.fdopen(fd, "rb") as handle:
        raw = handle.read(max_bytes + 1)  # bounded even if the file grows while it is read
    if len(raw) > max_bytes:
        raise HydraInputError(
            f"{what} {str(path)!r} is larger than {max_bytes / 2**20:g} MB, far more than such a file needs; {fix}"
        )

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON (hydra-hf writes null for a missing number)")

    def one_value_per_key(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in pairs]
        repeated = next((key for key in keys if keys.count(key) > 1), None)
        if repeated is not None:
            raise ValueError(f"the key {repeated!r} appears twice in one object")
        return dict(pairs)

    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=no_constant,
                          object_pairs_hook=one_value_per_key if unique_keys else None)
    except RecursionError:
        data, too_deep = None, True
    except (UnicodeDecodeError, ValueError) as exc:
        raise HydraInputError(
            f"{what} {str(path)!r} is not valid JSON ({str(exc).splitlines()[0][:160]}); {fix}"
        ) from None
    else:
        too_deep = json_depth(data) > JSON_MAX_DEPTH
    if too_deep:
        raise HydraInputError(f"{what} {str(path)!r} is nested more than {JSON_MAX_DEPTH} levels deep; {fix}")
    return data


# config.json fields that transformers and hydra_hf use as counts: a string there ("4") would compare
# unequal to the number it prints as
CONFIG_COUNTS = ("num_attention_heads", "num_hidden_layers", "hidden_size", "intermediate_size",
                 "max_position_embeddings", "vocab_size", "num_heads", "num_layers", "n_head", "n_layer")


def read_model_config(file: str | os.PathLike) -> dict[str, Any]:
    """A model folder's ``config.json`` as a dict, read with :func:`read_json`'s bounds; a config that is
    not an object, or whose counts (``num_attention_heads`` ..., nested tower configs too) are not
    integers, is one line naming the field and the fix."""
    file = Path(file)
    fix = "restore the config.json that save_pretrained wrote"
    data = read_json(file, what="model config", fix=fix, max_bytes=16 * 2**20)
    if not isinstance(data, dict):
        raise HydraInputError(f"{str(file)!r} holds a JSON {type(data).__name__}, not a config object; {fix}")
    for where, config in [("", data), *((f"{k}.", v) for k, v in data.items() if k.endswith("_config"))]:
        if not isinstance(config, dict):
            continue
        for key in CONFIG_COUNTS:
            value = config.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                hint = f"write {value} without quotes" if isinstance(value, str) and value.strip().isdigit() else fix
                raise HydraInputError(
                    f"{str(file)!r}: {where}{key} must be an integer, got {type(value).__name__} {value!r}; {hint}")
    return data


def json_depth(data: Any) -> int:
    """How many levels of lists / dicts ``data`` nests (iteratively: no recursion limit)."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            value = list(value.values())
        if isinstance(value, list):
            deepest = max(deepest, depth)
            if depth <= JSON_MAX_DEPTH:
                stack.extend((v, depth + 1) for v in value)
    return deepest


# --------------------------------------------------------------------------------------------------
# writing: owned, locked, atomic output folders


def read_marker(folder: str | os.PathLike) -> dict | None:
    """The marker a hydra-hf command left in ``folder`` (None when there is none or it is unreadable)."""
    file = Path(folder) / MARKER
    if file.is_symlink() or not file.is_file():
        return None
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_marker(folder: str | os.PathLike, command: str, **extra) -> None:
    """Mark ``folder`` as the output of ``hydra-hf COMMAND`` (what ``--overwrite`` may later replace)."""
    data = {"command": command, "hydra_hf": __version__,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), **extra}
    (Path(folder) / MARKER).write_text(json.dumps(data, indent=2) + "\n")


def is_owned(folder: str | os.PathLike, command: str) -> bool:
    marker = read_marker(folder)
    return marker is not None and marker.get("command") == command


def _check_not_input(out: Path, inputs: Iterable[str | os.PathLike | None]) -> None:
    """An output is never an input, never contains one, and never lies inside one: inside, it would be
    read back as part of that input by every later command that takes the folder whole (``push`` stages
    every file of a model folder), and a rerun of the same command would read its own output."""
    real_out = out.resolve()
    for item in inputs:
        if item is None:
            continue
        real_in = Path(item).resolve()
        if real_in == real_out or real_out in real_in.parents:
            raise HydraUnsafeError(
                f"output {str(out)!r} is (or contains) the input {str(item)!r}; choose an output folder "
                "outside the inputs"
            )
        if real_in in real_out.parents and real_in.is_dir():
            raise HydraUnsafeError(
                f"output {str(out)!r} lies inside the input folder {str(item)!r}, which would then hold it as part "
                f"of its files; choose an output folder outside the inputs (e.g. beside it)"
            )


def _check_writable(out: Path) -> None:
    """Fail before any work when ``out`` cannot be written (its temporary sibling goes in its parent): the
    nearest existing folder above it must be writable (not a read-only filesystem, not someone else's)."""
    folder = out.parent if str(out.parent) else Path(".")
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not os.access(folder, os.W_OK | os.X_OK):
        raise HydraOutputError(
            f"output {str(out)!r} cannot be written: {str(folder)!r} is not writable (a read-only filesystem or no "
            "permission); choose a writable output folder"
        )


def check_output(
    output: str | os.PathLike,
    *,
    command: str,
    overwrite: bool,
    inputs: Iterable[str | os.PathLike | None] = (),
) -> Path:
    """Check, before any work, that ``output`` may be written by ``hydra-hf COMMAND``.

    Allowed: a path that does not exist, an empty folder, or -- with ``overwrite`` -- a folder whose
    marker says ``command`` wrote it. Never a file, a symlink, or a folder that is or contains an input.
    """
    out = Path(output)
    if out.is_symlink():
        raise HydraOutputError(f"output {str(out)!r} is a symlink; pass the real folder path")
    if out.exists() and not out.is_dir():
        raise HydraOutputError(f"output {str(out)!r} is a file; choose a folder path")
    _check_not_input(out, inputs)
    _check_writable(out)
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise HydraOutputError(
                f"output folder {str(out)!r} exists and is not empty; choose another folder or pass --overwrite"
            )
        if not is_owned(out, command):
            raise HydraOutputError(
                f"output folder {str(out)!r} was not written by `hydra-hf {command}` (it has no {MARKER} "
                f"marker of that command); --overwrite only replaces such a folder: remove it yourself or "
                "choose another folder"
            )
    return out


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temporaries(output: str | os.PathLike) -> list[Path]:
    """Remove ``.NAME.tmp-PID-*`` / ``.NAME.old-PID-*`` folders beside ``output`` whose process is gone.

    Only folders that hydra-hf created (they hold a sentinel file) are removed. Returns what was removed.
    """
    out = Path(output)
    parent = out.parent if str(out.parent) else Path(".")
    removed = []
    if not parent.is_dir():
        return removed
    for entry in parent.iterdir():
        match = _TEMP_RE.match(entry.name)
        if not match or match["name"] != out.name or entry.is_symlink() or not entry.is_dir():
            continue
        if not (entry / _TEMP_SENTINEL).is_file() or _pid_alive(int(match["pid"])):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        logger.info("removed %s, left by a process that no longer runs", entry)
        removed.append(entry)
    return removed


def remove_dead_process_folders(folder: str | os.PathLike, prefix: str = "process") -> list[Path]:
    """Remove the ``folder/PREFIX<PID>`` scratch folders of processes that no longer run (a killed
    worker's), keeping those of live processes. Returns what was removed."""
    removed = []
    root = Path(folder)
    if root.is_symlink() or not root.is_dir():
        return removed
    for entry in sorted(root.iterdir()):
        pid = entry.name[len(prefix):]
        if not entry.name.startswith(prefix) or not pid.isdigit() or entry.is_symlink() or not entry.is_dir():
            continue
        if not _pid_alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)
            logger.info("removed %s, left by a process that no longer runs", entry)
            removed.append(entry)
    return removed


@contextlib.contextmanager
def output_lock(output: str | os.PathLike) -> Iterator[Path]:
    """Hold the exclusive lock file ``.NAME.lock`` beside ``output`` for the whole write.

    The lock is an advisory ``flock`` on that file, which the kernel releases when its holder exits
    (``kill -9`` included): a dead writer's lock is taken over by exactly one process, with no
    check-then-unlink race between takers. The file also holds the writer's PID, for the error
    message, and a live PID in it is respected even without a ``flock`` (a lock of an earlier
    hydra-hf). Where ``flock`` does not exist (Windows), an ``O_EXCL`` file is the lock.
    """
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    lock = out.parent / f".{out.name}.lock"
    fd = _claim_lock(lock, out) if fcntl is not None else _claim_lock_exclusive(lock, out)
    try:
        yield lock
    finally:
        # unlinked while still held: a process that opened the old file gets its flock only after we
        # close, then sees that the path no longer names the file it locked, and starts again
        with contextlib.suppress(FileNotFoundError):
            lock.unlink()
        os.close(fd)


def _busy(pid: int, out: Path) -> HydraOutputError:
    holder = f"pid {pid}" if pid else "pid unknown"
    return HydraOutputError(
        f"another hydra-hf process ({holder}) is writing {str(out)!r}; wait for it to finish or choose another output"
    )


def _read_pid(fd: int) -> int:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        return int(os.read(fd, 64).decode("ascii", "replace").strip() or 0)
    except (OSError, ValueError):
        return 0


def _claim_lock(lock: Path, out: Path) -> int:
    """Open ``lock`` and take its ``flock``; the open file descriptor, once it is ours."""
    for _ in range(100):
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        except OSError as exc:
            raise HydraOutputError(
                f"could not open the lock file {str(lock)!r} ({exc.strerror}); remove it if no hydra-hf process is "
                "running"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held by a live process
            pid = _read_pid(fd)
            os.close(fd)
            raise _busy(pid, out) from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(lock, follow_symlinks=False))
        except FileNotFoundError:
            same = False
        if not same:  # its holder finished and removed it between our open and our flock
            os.close(fd)
            continue
        pid = _read_pid(fd)
        if pid and pid != os.getpid() and _pid_alive(pid):
            os.close(fd)
            raise _busy(pid, out)
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, f"{os.getpid()}\n".encode())
        return fd
    raise HydraOutputError(f"could not lock {str(lock)!r}; remove it if no hydra-hf process is running")


def _claim_lock_exclusive(lock: Path, out: Path) -> int:
    """Without ``flock``: the lock is a file created with ``O_EXCL``; a stale one is never removed
    automatically (only its writer's PID tells it is stale, and checking then unlinking it races)."""
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
    except FileExistsError:
        try:
            pid = int(lock.read_text().strip() or 0)
        except (OSError, ValueError):
            pid = 0
        if pid and not _pid_alive(pid):
            raise HydraOutputError(
                f"{str(lock)!r} was left by a process that no longer runs (pid {pid}); remove it and run again"
            ) from None
        raise _busy(pid, out) from None
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def make_temporary(output: str | os.PathLike) -> Path:
    """A fresh ``.NAME.tmp-PID-XXXX`` folder beside ``output`` (removed later if this process dies)."""
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    # os.mkdir with 0o777 (not mkdtemp's 0o700): the finished folder gets the user's umask, as mkdir gives it
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    os.mkdir(tmp, 0o777)
    (tmp / _TEMP_SENTINEL).write_text("")
    return tmp


def current_umask() -> int:
    """The process's umask (read by setting it and setting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def with_umask_permissions(folder: Path) -> None:
    """Give every file under ``folder`` that its writer created private (``mkstemp``'s 0o600: safetensors'
    ``save_file``, so every ``model.safetensors``) the permissions the user's umask gives a new file
    (0o666 less the umask), as every other output file has."""
    mode = 0o666 & ~current_umask()
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.stat().st_mode & 0o777 == 0o600 and mode != 0o600:
            path.chmod(mode)


def write_output_folder(
    output: str | os.PathLike,
    write: Callable[[Path], None],
    *,
    command: str,
    overwrite: bool = False,
    inputs: Iterable[str | os.PathLike | None] = (),
) -> Path:
    """Call ``write(tmp)`` on a fresh temporary sibling folder, then move it to ``output``.

    ``output`` is checked (:func:`check_output`) before and again under the exclusive lock, so two
    writers never both succeed; on any error the temporary folder is removed and ``output`` is left
    as it was. The finished folder holds the marker of ``command``.
    """
    inputs = list(inputs)
    out = check_output(output, command=command, overwrite=overwrite, inputs=inputs)
    with output_lock(out):
        remove_stale_temporaries(out)
        check_output(out, command=command, overwrite=overwrite, inputs=inputs)  # another writer may have finished
        tmp = make_temporary(out)
        try:
            write(tmp)
            with_umask_permissions(tmp)
            (tmp / _TEMP_SENTINEL).unlink()
            write_marker(tmp, command)
            if out.exists():
                old = out.with_name(f".{out.name}.old-{os.getpid()}-{tmp.name.rsplit('-', 1)[-1]}")
                os.replace(out, old)
                (old / _TEMP_SENTINEL).write_text("")  # if we die now, the next run removes it
                os.replace(tmp, out)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    logger.debug("wrote %s", out)
    return out


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write a file atomically: a reader (another process) sees the old file or the new one, never a
    half-written one, and a failed write leaves the old file and no temporary file. The temporary name
    is fresh per call, so concurrent writers never share it."""
    path = Path(path)
    # a fresh name opened with "x" (not mkstemp) so the file gets the usual umask permissions
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    try:
        with open(tmp, "x", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def prepare_owned_folder(
    folder: str | os.PathLike,
    *,
    command: str,
    overwrite: bool,
    inputs: Iterable[str | os.PathLike | None] = (),
    keep: bool = False,
) -> Path:
    """Make ``folder`` a (possibly persistent) working folder owned by ``command``.

    - missing or empty: created and marked;
    - ours (marker of ``command``) and ``keep``: left as it is (e.g. to resume from it);
    - ours and ``overwrite``: emptied and marked again;
    - anything else non-empty: :class:`HydraOutputError` -- nothing of the user's is deleted.
    """
    inputs = list(inputs)
    path = Path(folder)
    if path.is_symlink():
        raise HydraOutputError(f"{str(path)!r} is a symlink; pass the real folder path")
    if path.exists() and not path.is_dir():
        raise HydraOutputError(f"{str(path)!r} is a file; choose a folder path")
    _check_not_input(path, inputs)
    _check_writable(path / "x" if path.is_dir() else path)  # a working folder is written inside itself
    if path.is_dir() and any(path.iterdir()):
        if not is_owned(path, command):
            raise HydraOutputError(
                f"folder {str(path)!r} is not empty and was not created by `hydra-hf {command}` (no {MARKER} "
                "marker); hydra-hf never deletes such a folder: choose an empty or new folder"
            )
        if keep:
            return path
        if not overwrite:
            raise HydraOutputError(
                f"folder {str(path)!r} holds an earlier `hydra-hf {command}` run; pass --overwrite to replace "
                "it (or --resume to continue it)"
            )
        remove_owned(path, command)
    path.mkdir(parents=True, exist_ok=True)
    write_marker(path, command)
    return path


def remove_owned(folder: str | os.PathLike, command: str) -> None:
    """Delete ``folder`` only if its marker says ``command`` created it."""
    path = Path(folder)
    if path.is_symlink() or not is_owned(path, command):
        raise HydraOutputError(
            f"refusing to delete {str(path)!r}: it was not created by `hydra-hf {command}` (no {MARKER} marker)"
        )
    shutil.rmtree(path)


def check_output_file(
    output: str | os.PathLike,
    *,
    overwrite: bool,
    accept: Callable[[Path], bool] | None = None,
    what: str = "output file",
) -> Path:
    """Check a single output file: not a folder or symlink; an existing file only with ``overwrite`` and
    only if ``accept(path)`` says it is a previous output of the same kind."""
    path = Path(output)
    if path.is_symlink():
        raise HydraOutputError(f"{what} {str(path)!r} is a symlink; pass a real file path")
    if path.is_dir():
        raise HydraOutputError(
            f"{what} {str(path)!r} is a folder; pass a file path (e.g. {str(path / 'masks.json')!r})"
        )
    if path.exists():
        if not overwrite:
            raise HydraOutputError(f"{what} {str(path)!r} exists; choose another path or pass --overwrite")
        if accept is not None and not accept(path):
            raise HydraOutputError(
                f"{what} {str(path)!r} exists and is not a previous hydra-hf output of this kind; --overwrite "
                "does not replace it: remove it yourself or choose another path"
            )
    if not path.parent.exists() and str(path.parent):
        raise HydraInputError(f"folder {str(path.parent)!r} of the {what} does not exist; create it first")
    _check_writable(path)
    return path


def write_output_file(output: str | os.PathLike, data: bytes | str) -> Path:
    """Write a single file atomically (a temporary sibling, then ``os.replace``)."""
    path = Path(output)
    payload = data.encode() if isinstance(data, str) else data
    # 0o666 less the umask (not mkstemp's 0o600), as any file the user writes
    tmp = (path.parent if str(path.parent) else Path(".")) / f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path
