"""Validation of a staged repository, and the one way hydra_hf runs a model folder in a fresh process.

:func:`fresh_check` runs :file:`fresh_check.py` (the only fresh-interpreter check: push, the
recipes and the tests use it) on a **copy** of the folder in a private temporary directory:

- the copy holds the folder's visible regular files only (no symlink leaving it, no dot-files);
- ``python -I``: the interpreter's site-packages (torch, transformers) but not ``PYTHONPATH``, the
  user site or the script's folder; ``cwd`` is an empty folder inside the temporary directory;
- an environment built from scratch (:func:`isolated_env`): ``HOME``, ``TMPDIR`` and the Hugging
  Face caches inside the temporary directory, the Hub offline, no token, no ``PYTHONPATH``;
- ``import hydra_hf`` fails there, as for a Hub user who never installed it.

The process never learns where the staged folder or its parent are, and whatever it writes lands
in the temporary directory, which is removed afterwards.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from ..convert.io import from_pretrained
from ..outputs import regular_files
from .audit import check_shipped_code
from .card import check_card, model_kind
from .common import PICKLE_SUFFIXES, HubError, is_hidden, read_config

logger = logging.getLogger(__name__)

FRESH_CHECK = Path(__file__).resolve().with_name("fresh_check.py")
# Variables a fresh interpreter may inherit: how to find programs and locales, and thread counts.
_INHERITED = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "SYSTEMROOT", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def isolated_env(home: str | os.PathLike, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a fresh interpreter: built from scratch, with ``HOME``, ``TMPDIR`` and the
    Hugging Face caches under ``home``, the Hub offline and no token; ``extra`` is added last."""
    home = Path(home)
    for sub in ("tmp", "hf", "modules", "cache"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    env = {k: os.environ[k] for k in _INHERITED if k in os.environ}
    env.update(
        {
            "HOME": str(home),
            "TMPDIR": str(home / "tmp"),
            "XDG_CACHE_HOME": str(home / "cache"),
            "HF_HOME": str(home / "hf"),
            "HF_MODULES_CACHE": str(home / "modules"),
            "MPLCONFIGDIR": str(home / "cache"),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONNOUSERSITE": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
    )
    env.update(extra or {})
    return env


def run_isolated(
    args: Sequence[str],
    *,
    home: str | os.PathLike,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess:
    """``python -I ARGS`` with ``cwd`` an empty folder under ``home`` and :func:`isolated_env`."""
    work = Path(home) / "work"
    work.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, "-I", *args], capture_output=True, text=True, cwd=work,
                          env=isolated_env(home, env), stdin=subprocess.DEVNULL, timeout=timeout)


def copy_visible(folder: str | os.PathLike, dst: Path) -> None:
    """Copy the visible regular files of ``folder`` to ``dst`` (symlinks leaving it are refused)."""
    src = Path(folder)
    for rel in regular_files(src, what="folder"):
        if is_hidden(rel):
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, dst / rel)


def fresh_check(
    folder: str | os.PathLike,
    *,
    task: str = "load",
    inputs: Mapping[str, Any] | None = None,
    tensors: Mapping[str, Any] | None = None,
    timeout: float = 300,
) -> Any:
    """Run :file:`fresh_check.py` ``--task TASK`` on a private copy of ``folder``; returns its JSON result.

    Args:
        task: ``"load"`` (load, forward, pipeline), ``"text-probs"`` or ``"zero-shot-member-probs"``.
        inputs: JSON-able inputs of the task; ``tensors``: named tensors (saved as safetensors).

    Raises:
        HubError: the folder does not load or run (the child's last stderr line), or it took longer
            than ``timeout`` seconds.
    """
    with tempfile.TemporaryDirectory(prefix="hydra-fresh-") as tmp:  # mode 0700: private
        root = Path(tmp)
        repo = root / "repo"
        repo.mkdir()
        copy_visible(folder, repo)
        args = [str(FRESH_CHECK), str(repo), "--task", task]
        if inputs is not None or tensors:
            (root / "inputs").mkdir()
            (root / "inputs" / "inputs.json").write_text(json.dumps(dict(inputs or {})), encoding="utf-8")
            if tensors:
                save_file(
                    {k: v.contiguous().cpu() for k, v in tensors.items()}, str(root / "inputs" / "inputs.safetensors")
                )
            args += ["--inputs", str(root / "inputs" / "inputs.json")]
        try:
            proc = run_isolated(args, home=root / "home", timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise HubError(f"checking the folder in a fresh process took over {timeout:.0f} s") from exc
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        logger.debug("fresh-process check failed:\n%s", proc.stderr[-4000:])  # its traceback: shown with -v
        raise HubError(
            "the folder does not load with trust_remote_code=True in a fresh process without hydra_hf: "
            f"{lines[-1] if lines else f'exit code {proc.returncode}'}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def generated_ids(model: Any, input_ids: list[list[int]]) -> list[list[int]]:
    """Token ids of ``model``'s greedy ``generate()`` with its generation defaults (as ``fresh_check.py``'s
    ``generate`` task does in a fresh process)."""
    ids = torch.tensor(input_ids)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False)
    return out.tolist()


def check_generation(staged: str | os.PathLike, local: str | os.PathLike, *, timeout: float = 300) -> dict[str, Any]:
    """A causal-LM repository generates what its local folder generates: greedy ``generate()`` with each
    one's generation defaults (its end token, lengths: ``generation_config.json``), the local folder here
    with hydra_hf, the staged one in a fresh process without it. Returns ``{"input_ids", "generated"}``.

    Raises:
        HubError: the two generate different tokens (a generation setting or file was not staged).
    """
    model = from_pretrained(AutoModelForCausalLM, local).eval()
    vocab = int(model.get_input_embeddings().num_embeddings)
    input_ids = [[(5 + 7 * i) % vocab for i in range(5)]]  # a fixed prompt of ids every vocabulary has
    expected = generated_ids(model, input_ids)
    got = fresh_check(staged, task="generate", inputs={"input_ids": input_ids}, timeout=timeout)
    if got != expected:
        raise HubError(
            f"the staged repository generates {len(got[0]) - 5} token(s) {got[0][5:][:12]} where {str(local)!r} "
            f"generates {len(expected[0]) - 5} {expected[0][5:][:12]} (greedy, each with its generation defaults); "
            "a Hub user would get other text: check that generation_config.json is in the folder and valid"
        )
    return {"input_ids": input_ids, "generated": got}


def validate_staged(folder: str | os.PathLike, *, timeout: float = 300, allow_foreign_code: bool = False,
                    local: str | os.PathLike | None = None) -> dict[str, Any]:
    """Check a staged repository as a Hub user would see it; raise :class:`HubError` if it fails.

    Static checks: no pickle files; every shipped ``.py`` is the file hydra_hf ships (or, with
    ``allow_foreign_code``, code the user vouches for) and passes the audit
    (:func:`hydra_hf.hub.audit.check_shipped_code`) -- nothing runs before these pass; ``README.md`` parses with
    ``ModelCard.load`` and its ``model-index`` is readable. Then :func:`fresh_check` (task ``load``) in an isolated
    process where ``import hydra_hf`` fails and the Hub is offline: the config and model load with
    ``trust_remote_code=True``, a forward pass on a dummy input gives finite member logits, and --
    when the folder has the tokenizer / image processor it needs -- the shipped uncertainty pipeline
    (``pipeline(model=folder, trust_remote_code=True)``) builds and runs on a dummy input (the
    zero-shot one only where PIL is installed, as it opens images with PIL).

    A causal LM, given the ``local`` folder it was staged from, must also generate what that folder
    generates (:func:`check_generation`).

    Returns:
        ``{"card": {...}, "load": {...}}`` (and ``"generate"``) -- what was checked.
    """
    root = Path(folder)
    pickled = sorted(p.name for p in root.rglob("*") if p.suffix in PICKLE_SUFFIXES)
    if pickled:
        raise HubError(f"staged folder holds pickle files {pickled}; only safetensors weights may be uploaded")
    check_shipped_code(root, allow_foreign=allow_foreign_code)
    card_summary = check_card(root / "README.md")
    result = {"card": card_summary, "load": fresh_check(root, task="load", timeout=timeout)}
    if local is not None and model_kind(read_config(root)) == "text-generation":
        result["generate"] = check_generation(root, local, timeout=timeout)
    return result
