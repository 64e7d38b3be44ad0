"""Running an exported Hydra ONNX folder with ONNX Runtime: :class:`OnnxHydraModel` (the model, called
like the PyTorch one) and :func:`pipeline` (the uncertainty pipelines of ``pipeline_hydra`` on it).

An ONNX export folder (``hydra-hf export DIR --format onnx --output OUT``) holds ``model.onnx`` (and
``model_int8.onnx`` when quantised), the Hydra ``config.json`` (labels, members; its ``auto_map``
names only ``AutoConfig``, whose code ships beside it, so ``AutoConfig.from_pretrained(folder,
trust_remote_code=True)`` opens it without hydra_hf; there is no PyTorch modeling code or weight in
it), the tokenizer / image processor, ``hydra_onnx.json`` (what the graph takes and returns, opset,
quantisation, the export's own check) and a README.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer
from transformers.utils import ModelOutput

from ..convert.io import from_pretrained
from ..errors import HydraInputError
from ..families import family_of_config
from ..modeling import pipeline_hydra
from ..modeling.configuration_hydra import HYDRA_PIPELINES
from ..outputs import read_json, resolve_inside

logger = logging.getLogger(__name__)

EXPORT_METADATA = "hydra_onnx.json"
EXPORT_FORMAT = "hydra-onnx-export"
INSTALL_HINT = "pip install hydra-hf[onnx]"
# inputs a caller may omit: the value every Hugging Face model assumes when they are missing
DEFAULTABLE = {"token_type_ids": 0, "attention_mask": 1}
# keys of a batch that are never model inputs
IGNORED_INPUTS = ("labels", "label", "return_loss")


def require_onnx(*modules: str) -> list[Any]:
    """Import ``modules`` (default ``onnx`` and ``onnxruntime``) or raise one :class:`HydraInputError`
    line naming the optional extra that installs them."""
    modules = modules or ("onnx", "onnxruntime")
    loaded, missing = [], []
    for name in modules:
        try:
            loaded.append(importlib.import_module(name))
        except ImportError:
            missing.append(name)
    if missing:
        raise HydraInputError(
            f"ONNX export and inference need the optional package(s) {', '.join(missing)}, which are not "
            f"installed; install them with `{INSTALL_HINT}`"
        )
    return loaded


def read_export_metadata(folder: str | os.PathLike) -> dict[str, Any] | None:
    """``hydra_onnx.json`` of an ONNX export folder (None when ``folder`` is not one)."""
    file = Path(folder) / EXPORT_METADATA
    if file.is_symlink() or not file.exists():
        return None
    data = read_json(file, what="ONNX export metadata", fix="re-run `hydra-hf export`", max_bytes=2**20)
    if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
        return None
    files = data.get("files")
    if (
        not isinstance(files, dict)
        or not files
        or not all(isinstance(k, str) and isinstance(v, dict) for k, v in files.items())
    ):
        raise HydraInputError(f"{str(file)!r}: 'files' must map each .onnx file name to its description; "
                              "re-run `hydra-hf export`")
    if not isinstance(data.get("default_file", "model.onnx"), str):
        raise HydraInputError(f"{str(file)!r}: 'default_file' must be a file name; re-run `hydra-hf export`")
    return data


def is_onnx_export(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an ONNX export folder or a ``.onnx`` file inside one."""
    path = Path(path)
    if path.suffix == ".onnx" and path.is_file():
        path = path.parent
    return path.is_dir() and (path / EXPORT_METADATA).is_file()


def resolve_onnx_file(path: str | os.PathLike, file_name: str | None = None) -> tuple[Path, Path, dict[str, Any]]:
    """``(folder, onnx file, metadata)`` for an export folder or a ``.onnx`` file inside one.

    Without ``file_name`` a folder gives its default graph (``hydra_onnx.json``'s ``default_file``: the
    int8 graph of a quantised export, else ``model.onnx``).
    """
    path = Path(path)
    if path.suffix == ".onnx" and not path.is_dir():
        if file_name is not None:
            raise HydraInputError(f"pass either a .onnx file ({str(path)!r}) or file_name={file_name!r}, not both")
        folder, file_name = path.parent, path.name
    else:
        folder = path
    if not folder.is_dir():
        raise HydraInputError(f"ONNX model {str(path)!r} does not exist; pass the folder written by `hydra-hf export`")
    metadata = read_export_metadata(folder)
    if metadata is None:
        raise HydraInputError(
            f"{str(folder)!r} is not a hydra-hf ONNX export (it has no {EXPORT_METADATA}); create one with "
            f"`hydra-hf export MODEL_DIR --format onnx --output {str(folder)}`"
        )
    name = file_name or metadata.get("default_file", "model.onnx")
    files = metadata.get("files", {})
    if name not in files:
        raise HydraInputError(f"{str(folder)!r} has no ONNX graph {name!r}; it holds {sorted(files)}")
    file = resolve_inside(folder, name, what="ONNX graph")
    if not file.is_file():
        raise HydraInputError(f"{str(file)!r} is missing from the export folder; re-run `hydra-hf export`")
    return folder, file, metadata


def _check_labels(session: Any, config: Any, metadata: dict[str, Any], file: Path) -> None:
    """Refuse a graph whose logits have another number of classes than its config's labels (an edited
    config.json would name classes the graph never scores)."""
    if metadata.get("modality") == "image-text":
        return  # zero-shot two-tower graphs: the classes are the texts given at run time
    num_labels = getattr(config, "num_labels", None)
    for out in session.get_outputs():
        classes = out.shape[-1] if out.shape else None
        if isinstance(classes, int) and isinstance(num_labels, int) and classes != num_labels:
            raise HydraInputError(
                f"{str(file)!r} returns {classes} classes in {out.name!r} but {str(file.parent / 'config.json')!r} "
                f"names {num_labels} labels; re-run `hydra-hf export` (or restore the exported config.json)"
            )


@dataclass
class OnnxHydraOutput(ModelOutput):
    """What :class:`OnnxHydraModel` returns: the PyTorch model's outputs, as torch tensors.

    Shape:
        classifiers: ``logits (B, C)`` (log of the mean of the members' softmaxes), ``member_logits (B, M, C)``.
        zero-shot (CLIP): ``logits_per_image (B, N)``, ``member_logits_per_image (B, M, N)``; ``logits`` and
        ``member_logits`` are the same tensors.
    """

    logits: torch.Tensor | None = None
    member_logits: torch.Tensor | None = None
    logits_per_image: torch.Tensor | None = None
    member_logits_per_image: torch.Tensor | None = None


class OnnxHydraModel(nn.Module):
    """An exported Hydra Ensemble run by ONNX Runtime, called like the PyTorch model.

    ``model(**tokenizer(texts, padding=True, return_tensors="pt"))`` returns an :class:`OnnxHydraOutput`
    with ``logits`` and ``member_logits``; a missing ``token_type_ids`` / ``attention_mask`` is filled
    in as transformers does (zeros / ones). It has no torch parameters; :meth:`num_parameters` counts the
    graph's weights. ``config`` is the Hydra config (labels, members), so transformers' pipelines and
    hydra_hf's evaluation take it where they take the PyTorch model.

    Args:
        session: the ``onnxruntime.InferenceSession``.
        config: the Hydra config of the exported model.
        metadata: the folder's ``hydra_onnx.json``.
        file: the ``.onnx`` file the session runs.
    """

    main_input_name = "input_ids"

    def __init__(self, session: Any, config: Any, metadata: dict[str, Any], file: Path) -> None:
        super().__init__()
        self.session = session
        self.config = config
        self.metadata = metadata
        self.file = Path(file)
        self.name_or_path = str(self.file.parent)
        self.input_specs = {i.name: i.type for i in session.get_inputs()}
        self.output_names = [o.name for o in session.get_outputs()]
        if "pixel_values" in self.input_specs and "input_ids" not in self.input_specs:
            self.main_input_name = "pixel_values"

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        *,
        file_name: str | None = None,
        providers: list[str] | None = None,
        intra_op_num_threads: int | None = None,
        allow_spinning: bool = False,
    ) -> OnnxHydraModel:
        """Load an export folder (its default graph, or ``file_name``) or one of its ``.onnx`` files.

        Args:
            providers: ONNX Runtime execution providers (default ``["CPUExecutionProvider"]``).
            intra_op_num_threads: threads per operator (default: ONNX Runtime's, the physical cores).
            allow_spinning: let idle ONNX Runtime threads spin-wait for the next run (its default; a little
                faster for back-to-back calls, but the spinning threads take the cores from whatever runs
                between calls, e.g. the PyTorch models that ``hydra-hf evaluate`` times beside it). Off here.
        """
        (ort,) = require_onnx("onnxruntime")
        folder, file, metadata = resolve_onnx_file(path, file_name)
        config = load_export_config(folder)
        options = ort.SessionOptions()
        if intra_op_num_threads is not None:
            options.intra_op_num_threads = int(intra_op_num_threads)
        options.log_severity_level = 3  # errors only: the dynamo graph's shape-inference notes are noise
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if allow_spinning else "0")
        try:
            session = ort.InferenceSession(str(file), sess_options=options,
                                           providers=list(providers or ["CPUExecutionProvider"]))
        except Exception as exc:  # onnxruntime raises its own Fail / InvalidGraph types
            raise HydraInputError(
                f"ONNX Runtime cannot load {str(file)!r}: {str(exc).strip().splitlines()[0][:200]}"
            ) from None
        _check_labels(session, config, metadata, file)
        logger.info("loaded %s (%s)", file, metadata["files"][file.name].get("precision", "?"))
        return cls(session, config, metadata, file)

    # ------------------------------------------------------------------ what pipelines look at
    @property
    def device(self) -> torch.device:
        return torch.device("cpu")  # inputs and outputs are CPU tensors whatever the provider

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    def to(self, *args: Any, **kwargs: Any) -> OnnxHydraModel:  # noqa: D102  (a session is not moved)
        return self

    def can_generate(self) -> bool:
        return False

    def num_parameters(self) -> int:
        """Weights of the graph (elements of its initializers, int8 or float), counted at export."""
        return int(self.metadata["files"][self.file.name].get("parameters", 0))

    @property
    def precision(self) -> str:
        return str(self.metadata["files"][self.file.name].get("precision", "fp32"))

    # ---------------------------------------------------------------------------------- calling
    def _feeds(self, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
        given = {k: v for k, v in inputs.items() if v is not None and k not in IGNORED_INPUTS}
        unknown = sorted(set(given) - set(self.input_specs))
        if unknown:
            raise HydraInputError(
                f"the ONNX graph {self.file.name!r} takes {sorted(self.input_specs)}, not {unknown}; pass the "
                "tokenizer / image processor outputs saved with it"
            )
        feeds = {}
        for name, kind in self.input_specs.items():
            value = given.get(name)
            if value is None:
                like = given.get("input_ids")
                if name not in DEFAULTABLE or like is None:
                    raise HydraInputError(f"the ONNX graph {self.file.name!r} needs the input {name!r}")
                value = torch.full_like(torch.as_tensor(like), DEFAULTABLE[name])
            array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
            feeds[name] = array.astype(np.int64 if "int64" in kind else np.float32, copy=False)
        return feeds

    def forward(self, **inputs: Any) -> OnnxHydraOutput:
        """Run the graph on one batch (torch tensors or numpy arrays); returns CPU float32 tensors."""
        outputs = self.session.run(None, self._feeds(inputs))
        named = {name: torch.from_numpy(np.asarray(value)) for name, value in zip(self.output_names, outputs)}
        if "logits_per_image" in named:  # zero-shot: the classifier names point at the per-image logits
            named.setdefault("logits", named["logits_per_image"])
            named.setdefault("member_logits", named.get("member_logits_per_image"))
        return OnnxHydraOutput(**{k: v for k, v in named.items() if k in OnnxHydraOutput.__dataclass_fields__})

    def __repr__(self) -> str:
        return f"OnnxHydraModel({str(self.file)!r}, {self.precision}, {self.config.num_members} members)"


def load_export_config(folder: str | os.PathLike) -> Any:
    """The Hydra config of an export folder, read as data with hydra_hf's own config class."""
    file = Path(folder) / "config.json"
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        raise HydraInputError(f"{str(file)!r} is missing or not valid JSON; re-run `hydra-hf export`") from None
    config_class = family_of_config(data).config_class()
    return config_class.from_pretrained(str(folder))


def load_preprocessor(folder: str | os.PathLike, modality: str) -> Any:
    """The tokenizer (text), image processor (image) or processor (image-text) saved in the folder."""
    loader = {"text": AutoTokenizer, "image": AutoImageProcessor}.get(modality, AutoProcessor)
    return from_pretrained(loader, Path(folder))


def pipeline(path: str | os.PathLike, *, file_name: str | None = None, intra_op_num_threads: int | None = None,
             **kwargs: Any) -> Any:
    """The Hydra uncertainty pipeline of ``pipeline_hydra`` (label, score, uncertainty, member labels,
    flagged) on an ONNX export, e.g. ``pipeline("hydra-onnx")("a gripping film")``.

    ``intra_op_num_threads`` goes to :meth:`OnnxHydraModel.from_pretrained` (a server pins it per replica);
    ``kwargs`` go to the pipeline (``batch_size``, ``uncertainty_threshold``, ``top_k``, ...).
    """
    model = OnnxHydraModel.from_pretrained(path, file_name=file_name, intra_op_num_threads=intra_op_num_threads)
    family = family_of_config(model.config)
    if not family.uncertainty_pipelines:
        raise HydraInputError(
            f"family {family.name!r} has no Hydra uncertainty pipeline (its prediction is not a softmax)"
        )
    task, class_name, _ = HYDRA_PIPELINES[family.task_auto_class]
    processor = load_preprocessor(model.file.parent, family.modality)
    if family.modality == "text":
        parts = {"tokenizer": processor}
    elif family.modality == "image":
        parts = {"image_processor": processor}
    else:  # two towers: the processor's halves
        parts = {"tokenizer": processor.tokenizer, "image_processor": processor.image_processor}
    with _NotSupportedFilter():  # the pipelines list the PyTorch classes they know; this one is called alike
        return getattr(pipeline_hydra, class_name)(
            model=model, task=task, device=torch.device("cpu"), **parts, **kwargs
        )


class _NotSupportedFilter(logging.Filter):
    """Drops transformers' "The model 'OnnxHydraModel' is not supported for ..." line while a pipeline is built."""

    def __init__(self) -> None:
        super().__init__()
        self.logger = logging.getLogger("transformers.pipelines.base")

    def filter(self, record: logging.LogRecord) -> bool:
        return "is not supported for" not in record.getMessage()

    def __enter__(self) -> _NotSupportedFilter:
        self.logger.addFilter(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.logger.removeFilter(self)
