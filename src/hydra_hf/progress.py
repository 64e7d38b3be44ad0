"""Whether hydra-hf shows progress bars: its own (evaluation, fine-tuning) and those of transformers,
datasets and huggingface_hub (loading and writing weights, preparing data). ``hydra-hf COMMAND
--no-progress`` turns them all off; library callers pass ``progress=False`` where a function takes it."""

from __future__ import annotations

import datasets
import huggingface_hub
from transformers.utils import logging as transformers_logging

_enabled = True


def set_progress_bars(enabled: bool) -> None:
    """Show (True) or hide (False) every progress bar of this process."""
    global _enabled
    _enabled = bool(enabled)
    if _enabled:
        transformers_logging.enable_progress_bar()
        datasets.enable_progress_bars()
        huggingface_hub.utils.enable_progress_bars()
    else:
        transformers_logging.disable_progress_bar()
        datasets.disable_progress_bars()
        huggingface_hub.utils.disable_progress_bars()


def progress_bars() -> bool:
    """Whether progress bars are shown (see :func:`set_progress_bars`)."""
    return _enabled
