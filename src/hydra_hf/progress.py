"""Whether hydra-hf shows progress bars: its own (evaluation, fine-tuning) and those of transformers,
datasets and huggingface_hub (loading and writing weights, preparing data). ``hydra-hf COMMAND
--no-progress`` turns them all off; library callers pass ``progress=False`` where a function takes it."""

from __future__ import annotations

from types import ModuleType

import huggingface_hub
from transformers.utils import logging as transformers_logging

from .lazy import lazy_module

# heavy (~2 s): imported on first use; its bars are set when it is (lazy.py)
datasets = lazy_module("datasets")

_enabled = True
_libraries_off = False  # whether set_progress_bars(False) turned the libraries' bars off
_datasets_off = False  # the same for datasets' bars (set when datasets is imported)


def _set_datasets_bars(module: ModuleType) -> None:
    global _datasets_off
    if not _enabled:
        module.disable_progress_bars()
        _datasets_off = True
    elif _datasets_off:
        module.enable_progress_bars()
        _datasets_off = False


def set_progress_bars(enabled: bool) -> None:
    """Show (True) or hide (False) every progress bar of this process. Showing turns the libraries' bars back
    on only if hiding turned them off (a user's own settings, e.g. ``HF_DATASETS_DISABLE_PROGRESS_BARS``, stay)."""
    global _enabled, _libraries_off
    _enabled = bool(enabled)
    if not _enabled:
        transformers_logging.disable_progress_bar()
        huggingface_hub.utils.disable_progress_bars()
        _libraries_off = True
    elif _libraries_off:
        transformers_logging.enable_progress_bar()
        huggingface_hub.utils.enable_progress_bars()
        _libraries_off = False
    datasets.on_load(_set_datasets_bars)  # now if datasets is imported, else when it is


def progress_bars() -> bool:
    """Whether progress bars are shown (see :func:`set_progress_bars`)."""
    return _enabled
