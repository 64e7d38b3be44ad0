"""Staging: the repository content of a Hydra folder, assembled in a fresh folder of our own.

Only what belongs in the repository is copied, and only from inside the folders the user named:

- ``config.json`` (checked by the Hydra config class; ``custom_pipelines`` added when missing);
- ``*.safetensors`` weights, each of which must parse as safetensors (and their index, whose
  ``weight_map`` may name only those files);
- the shipped ``.py`` files: the modules ``auto_map`` and ``custom_pipelines`` name (each must be
  ``MODULE.CLASS`` with ``MODULE.py`` a file of the folder, or one hydra_hf ships) and the siblings
  they import, and ``handler.py`` (the servers' entry point: hydra_hf's when the folder has none), nothing else;
  each must be the file this hydra_hf ships, unchanged (read as Python reads
  it: UTF-8 only), and is staged as hydra_hf's own bytes, unless the user vouches for foreign code
  (``allow_foreign_code``: the folder's bytes), and all must pass the audit (:mod:`hydra_hf.hub.audit`);
- tokenizer / image-processor / processor files and a causal LM's ``generation_config.json`` (their JSON
  configs may not name loader code);
- ``README.md`` (the card), the kept-heads heat maps and, with a report, ``evaluation/``
  (``report.json``, ``report.md``, and PNG figures that lie inside the report's folder).

Never staged: pickle files, hidden files (the ``.hydra_hf_output.json`` marker, dot-files), anything
else of the folder. A symlink leaving the model or report folder, a path from a file that leads
outside its folder (``"../x.Foo"``, ``"/abs/x.Foo"``, ``"org/repo--x.Foo"``) or a file that is
not what its name says is refused with one line. The staging folder is an output of ``hydra-hf
push`` (:func:`hydra_hf.outputs.write_output_folder`): written atomically, marked, and replaced
only with ``overwrite`` when an earlier push staged it; a user's folder is never deleted.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from safetensors import safe_open

from ..errors import HydraTypeError, HydraUnsafeError, one_line
from ..evaluation.plots import heads_heatmap
from ..modeling.configuration_hydra import custom_pipelines_for
from ..outputs import regular_files, resolve_inside, write_output_folder
from ..saving import HANDLER_FILE, MODELING_DIR, PIPELINE_FILE
from .audit import (
    check_packaged,
    check_shipped_code,
    is_packaged,
    python_source,
    read_python_source,
    sibling_imports,
)
from .card import build_model_card, load_report, model_kind
from .common import (
    PICKLE_SUFFIXES,
    PREPROCESSOR_CONFIGS,
    PREPROCESSOR_FILES,
    WEIGHT_INDEX,
    HubError,
    is_hidden,
    read_config,
    read_hub_json,
    towers,
    visible_files,
)

logger = logging.getLogger(__name__)

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _module_of(reference: str, where: str) -> str:
    """``MODULE`` of an ``auto_map`` / ``custom_pipelines`` reference ``MODULE.CLASS``, which must name a
    file inside the folder (no other repository, no path)."""
    if "--" in reference:
        raise HydraUnsafeError(
            f"config.json {where} {reference!r} loads code from another repository; a Hydra repository ships "
            "its own code: use 'module.Class' (re-save the folder with hydra-hf convert)"
        )
    module, _, cls = reference.rpartition(".")
    if not (_IDENTIFIER.fullmatch(module) and _IDENTIFIER.fullmatch(cls)):
        raise HydraUnsafeError(
            f"config.json {where} {reference!r} is not 'module.Class' naming a .py file inside the model folder "
            "(no paths, no '..'); re-save the folder with hydra-hf convert"
        )
    return module


def shipped_modules(config: Mapping[str, Any]) -> list[str]:
    """The module names ``auto_map`` and ``custom_pipelines`` refer to (checked by :func:`_module_of`)."""
    refs = [(f"auto_map[{k!r}]", v) for k, v in (config.get("auto_map") or {}).items()]
    refs += [
        (f"custom_pipelines[{k!r}].impl", spec["impl"]) for k, spec in (config.get("custom_pipelines") or {}).items()
    ]
    names: list[str] = []
    for where, ref in refs:
        module = _module_of(ref, where)
        if module not in names:
            names.append(module)
    return names


# --------------------------------------------------------------------------------- file checks
def check_safetensors(path: Path, name: str) -> None:
    """Raise :class:`HubError` unless ``path`` is a complete safetensors file (header and data)."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            list(handle.keys())
    except Exception as exc:  # SafetensorError, header errors, truncation
        raise HubError(
            f"{name} is not a valid safetensors file ({one_line(exc)}); re-save the weights with save_pretrained"
        ) from exc


def _check_weight_index(src: Path, weights: set[str]) -> None:
    index = read_hub_json(resolve_inside(src, WEIGHT_INDEX, what=WEIGHT_INDEX), WEIGHT_INDEX,
                          "re-save the weights with save_pretrained")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise HydraTypeError(f"{WEIGHT_INDEX}: 'weight_map' must map tensor names to file names")
    for shard in sorted(set(weight_map.values())):
        resolve_inside(src, shard, what=f"{WEIGHT_INDEX} weight_map file")
        if shard not in weights:
            raise HubError(f"{WEIGHT_INDEX} names {shard!r}, which is not a .safetensors file of the folder")


def _check_preprocessor_config(path: Path, name: str) -> None:
    data = read_hub_json(path, name, "re-save the tokenizer / processor with save_pretrained")
    if isinstance(data, dict) and data.get("auto_map"):
        raise HydraUnsafeError(
            f"{name} names loader code of its own (auto_map {data['auto_map']!r}); a Hydra repository ships only "
            "its modeling code: remove the auto_map or save the stock tokenizer/processor"
        )


def report_figures(report: Mapping[str, Any], report_dir: Path | None) -> list[tuple[str, Path]]:
    """(caption, PNG path) of the report's figures: the listed ones, then other PNGs beside it.

    Listed paths must lie inside the report's folder (:class:`HydraUnsafeError` otherwise); listed
    files that are missing or not ``.png`` are skipped with a warning; a ``.png`` must be a PNG image.
    """
    if report_dir is None:
        return []
    figures = report.get("figures") or {}
    if isinstance(figures, str):
        figures = [figures]
    if isinstance(figures, Mapping):
        listed = list(figures.items())
    elif isinstance(figures, list):
        listed = [(Path(p).stem.replace("_", " ") if isinstance(p, str) else "", p) for p in figures]
    else:
        raise HydraTypeError(
            f"report.json 'figures' must be a dict (caption -> file) or a list of files, got {figures!r}"
        )
    found, seen = [], set()
    for caption, rel in listed:
        if not isinstance(rel, str):
            raise HydraTypeError(f"report.json figure {caption!r} must be a file name, got {rel!r}")
        path = resolve_inside(report_dir, rel, what=f"report.json figure {str(caption)!r}")
        if not path.is_file() or path.suffix.lower() != ".png":
            logger.warning("report figure %r (%s) is not a .png file of the report folder; not staged", caption, rel)
            continue
        if path.name not in seen:
            found.append((str(caption), path))
            seen.add(path.name)
    for rel in regular_files(report_dir, what="report folder"):
        if len(rel.parts) == 1 and rel.suffix.lower() == ".png" and not is_hidden(rel) and rel.name not in seen:
            found.append((rel.stem.replace("_", " "), report_dir / rel))
            seen.add(rel.name)
    for caption, path in found:
        with open(path, "rb") as handle:
            if handle.read(8) != _PNG_SIGNATURE:
                raise HubError(f"report figure {path.name} ({caption!r}) is not a PNG image; re-draw it or remove it")
    return found


# ------------------------------------------------------------------------------------- staging
@dataclass
class StagedRepository:
    """A staged repository folder and what it uploads (``files``: relative path -> bytes)."""

    folder: Path
    files: dict[str, int] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    kind: str = ""


def _copy(src: Path, name: str, dst: Path, what: str) -> None:
    shutil.copyfile(resolve_inside(src, name, what=what), dst)


def _stage_module(src: Path, file: str, out: Path, allow_foreign: bool) -> tuple[str, bool]:
    """Stage the folder's shipped module ``file``: hydra_hf's own bytes when it is hydra_hf's file (read as
    Python reads it), the folder's bytes when it is foreign code the user vouches for (audited
    afterwards), nothing otherwise. Returns its source and whether it was staged."""
    data = resolve_inside(src, file, what="shipped module").read_bytes()
    source = python_source(data, file)
    ours = is_packaged(file, source)
    if ours:
        shutil.copyfile(MODELING_DIR / file, out / file)
    elif allow_foreign:
        (out / file).write_bytes(data)
    return source, ours or allow_foreign


def stage_into(
    model_dir: str | os.PathLike,
    out: Path,
    *,
    repo_id: str,
    report: str | os.PathLike | Mapping[str, Any] | None = None,
    revision: str | None = None,
    base_model: str | None = None,
    license: str | None = None,
    training: str | None = None,
    tags: list[str] | None = None,
    allow_foreign_code: bool = False,
) -> StagedRepository:
    """Write the repository content of ``model_dir`` into the fresh folder ``out`` (see the module doc)."""
    src = Path(model_dir)
    config = read_config(src)
    kind = model_kind(config)
    modules = shipped_modules(config)
    # top-level, non-hidden files; any symlink leaving the folder is refused here
    names = {p.name for p in regular_files(src, what="model folder") if len(p.parts) == 1 and not is_hidden(p)}

    weights = sorted(n for n in names if n.endswith(".safetensors"))
    if not weights:
        pickled = sorted(n for n in names if n.endswith(PICKLE_SUFFIXES))
        hint = f" (found {pickled}: re-save with safe_serialization=True)" if pickled else ""
        raise HubError(f"{str(src)!r} has no .safetensors weights{hint}; only safetensors are uploaded")
    for name in weights:
        _copy(src, name, out / name, "weights file")
        check_safetensors(out / name, name)  # the staged copy is what is checked and uploaded
    if WEIGHT_INDEX in names:
        _check_weight_index(src, set(weights))
        _copy(src, WEIGHT_INDEX, out / WEIGHT_INDEX, WEIGHT_INDEX)
    for name in sorted(n for n in PREPROCESSOR_FILES if n in names):
        _copy(src, name, out / name, name)
        if name in PREPROCESSOR_CONFIGS:
            _check_preprocessor_config(out / name, name)

    # config: make sure it names the uncertainty pipeline that is shipped below
    config = dict(config)
    if not config.get("custom_pipelines"):
        config["custom_pipelines"] = custom_pipelines_for(config["auto_map"])
        modules = shipped_modules(config)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")

    # shipped code: the modules the config names and, transitively, the siblings they import; the
    # folder's own file when it has one, else hydra_hf's
    todo, shipped, foreign = [(module, "config.json refers to") for module in modules], [], {}
    while todo:
        module, needed_by = todo.pop(0)
        if module in shipped:
            continue
        if not _IDENTIFIER.fullmatch(module):
            raise HydraUnsafeError(f"{needed_by} '.{module}', which is not a module name; ship plain sibling files")
        file = f"{module}.py"
        if file in names:
            source, staged = _stage_module(src, file, out, allow_foreign_code)
            if not staged:
                foreign[file] = source
        elif (MODELING_DIR / file).is_file():
            shutil.copyfile(MODELING_DIR / file, out / file)
            source = read_python_source(out / file)
        else:
            raise HubError(f"{needed_by} {file}, which is neither in {str(src)!r} nor shipped with hydra_hf")
        shipped.append(module)
        try:
            imports = sibling_imports(source, file)
        except (SyntaxError, ValueError):
            continue  # the checks below name the file and line
        todo += [(name, f"{file} imports") for name in sorted(imports)]
    # the servers' entry point: the folder's own when it has one (checked like every shipped file), else hydra_hf's
    # (a folder written before folders shipped it gets it here)
    if HANDLER_FILE in names:
        source, staged = _stage_module(src, HANDLER_FILE, out, allow_foreign_code)
        if not staged:
            foreign[HANDLER_FILE] = source
    else:
        shutil.copyfile(MODELING_DIR / HANDLER_FILE, out / HANDLER_FILE)
    for file in sorted(foreign):  # foreign code nobody vouched for: the first file, with its first differing line
        check_packaged(file, foreign[file])
    if not (out / PIPELINE_FILE).exists():
        shutil.copyfile(MODELING_DIR / PIPELINE_FILE, out / PIPELINE_FILE)
    check_shipped_code(out, allow_foreign=allow_foreign_code)

    heads_images = {}
    try:
        for tower, (kept, num_heads) in towers(config).items():
            name = f"heads_{tower}.png" if tower else "heads.png"
            title = f"Attention heads kept by each member{f' ({tower} tower)' if tower else ''}"
            heads_heatmap(kept, out / name, num_heads=num_heads, title=title)
            heads_images[tower] = name
    except Exception as exc:  # matplotlib missing or an odd layout: the card keeps its tables
        logger.warning("no kept-heads heat map (%s); the card shows the table only", exc)

    report_data, report_dir = load_report(report)
    links: dict[str, Any] = {}
    if report_data is not None:
        figures_found = report_figures(report_data, report_dir)  # checked before anything is written
        eval_dir = out / "evaluation"
        eval_dir.mkdir()
        (eval_dir / "report.json").write_text(
            json.dumps(report_data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )
        links["report"] = "evaluation/report.json"
        if report_dir is not None and (report_dir / "report.md").is_file():
            _copy(report_dir, "report.md", eval_dir / "report.md", "report.md")
            links["report"] = "evaluation/report.md"
        figures = {}
        for caption, png in figures_found:
            shutil.copyfile(png, eval_dir / png.name)
            figures[caption] = f"evaluation/{png.name}"
            if "reliability" not in links and re.search(r"reliab|calibrat", f"{caption} {png.name}", re.I):
                links["reliability"] = f"evaluation/{png.name}"
        links["figures"] = {c: p for c, p in figures.items() if p != links.get("reliability")}

    card = build_model_card(src, report_data, repo_id=repo_id, revision=revision, base_model=base_model,
                            license=license, training=training, heads_images=heads_images, report_links=links,
                            tags=tags)
    card.save(out / "README.md")
    files = visible_files(out)
    skipped = sorted(n for n in names if n not in files)
    if skipped:
        logger.info("not uploaded from %s: %s", src, ", ".join(skipped))
    return StagedRepository(folder=out, files=files, skipped=skipped, kind=kind)


def check_staging_place(staging: Path, model_dir: str | os.PathLike, report: Any = None) -> list[Path]:
    """The inputs of a push (model folder, report folder); refuses a staging folder inside one of
    them (the inputs are only read). Returns them for :func:`write_output_folder`'s ``inputs``."""
    inputs = [Path(model_dir)]
    if report is not None and not isinstance(report, Mapping):
        inputs.append(Path(report) if Path(report).is_dir() else Path(report).parent)
    real = staging.resolve()
    for item in inputs:
        if item.resolve() in real.parents:
            raise HydraUnsafeError(
                f"staging folder {str(staging)!r} is inside the input {str(item)!r}, which hydra-hf push only "
                "reads; choose a staging folder outside it"
            )
    return inputs


def stage_repository(
    model_dir: str | os.PathLike,
    staging_dir: str | os.PathLike,
    *,
    repo_id: str,
    report: str | os.PathLike | Mapping[str, Any] | None = None,
    revision: str | None = None,
    base_model: str | None = None,
    license: str | None = None,
    training: str | None = None,
    tags: list[str] | None = None,
    overwrite: bool = False,
    allow_foreign_code: bool = False,
) -> StagedRepository:
    """Assemble the repository content of ``model_dir`` in ``staging_dir`` (see the module doc).

    ``staging_dir`` must be new or empty, or -- with ``overwrite`` -- a folder an earlier
    ``hydra-hf push`` staged (its marker says so); it is written atomically (a failure leaves it as
    it was). ``model_dir`` and the report are only read.
    """
    staging = Path(staging_dir)
    inputs = check_staging_place(staging, model_dir, report)
    result: list[StagedRepository] = []

    def write(tmp: Path) -> None:
        result.append(stage_into(model_dir, tmp, repo_id=repo_id, report=report, revision=revision,
                                 base_model=base_model, license=license, training=training, tags=tags,
                                 allow_foreign_code=allow_foreign_code))

    write_output_folder(staging, write, command="push", overwrite=overwrite, inputs=inputs)
    staged = result[0]
    staged.folder = staging
    return staged
