"""The family registry: one module per base architecture, looked up by name or detected from a folder.

``get_family("roberta")``, ``detect_family(folder)``, ``families()``; see :mod:`.base` for the
:class:`Family` interface and how to add one. Importing this package registers the built-in families
(it imports no model code: each family imports what it needs on first use).
"""

from .base import (
    TASKS,
    Built,
    Family,
    canonical_name,
    detect_family,
    families,
    family_names,
    family_of_config,
    get_family,
    register_family,
)

# Built-in families, in detection order (the first whose detect() accepts a folder wins).
from . import bert, vit, timm_vit, clip, open_clip  # noqa: E402,F401  isort: skip
from . import roberta, electra, distilbert, albert  # noqa: E402,F401  isort: skip
from . import deberta_v2, modernbert  # noqa: E402,F401  isort: skip
from . import deit, beit, dinov2, siglip  # noqa: E402,F401  isort: skip

__all__ = [
    "TASKS",
    "Built",
    "Family",
    "canonical_name",
    "detect_family",
    "families",
    "family_names",
    "family_of_config",
    "get_family",
    "register_family",
]
