"""Publishing Hydra Ensembles to the Hugging Face Hub: model cards, staging, validation and push.

The product is a Hub repository that people use with ``trust_remote_code=True`` without installing
hydra_hf. :func:`push` builds that repository in a fresh staging folder, checks it as such a user
would (an isolated new interpreter where ``import hydra_hf`` fails), and uploads it in one commit::

    model folder (convert / save_hydra_model) ─┐
    report.json + PNGs (evaluation, optional) ─┼─> stage_repository ─> validate_staged ─> upload_folder
    model_cards/<kind>.md (Jinja)            ──┘   (staging.py,        (validate.py,       (publish.py,
                                                    audit.py)           fresh_check.py)     one commit)

Modules: :mod:`.card` (the model card), :mod:`.staging` (what is copied, from where),
:mod:`.audit` (the shipped-code allow-list), :mod:`.validate` and :file:`fresh_check.py` (the one
fresh-process check), :mod:`.publish` (push, ``model.push_to_hub``). The model folder and the
report are only read. User errors are :class:`~hydra_hf.errors.HydraError` s with a one-line
message (:class:`HubError` for push failures, ``HydraUnsafeError`` for unsafe input).

:func:`~hydra_hf.evaluation.fit_uncertainty_threshold` lives in :mod:`hydra_hf.evaluation`; the hub reads
only the report's tables and figures from it (:mod:`hydra_hf.evaluation.report`, :mod:`hydra_hf.evaluation.plots`).
"""

from __future__ import annotations

from .audit import check_shipped_code
from .card import (
    KINDS,
    build_model_card,
    card_template_path,
    check_card,
    dataset_info,
    eval_results_from_report,
    load_report,
    model_kind,
    select_model_row,
)
from .common import HubError, folder_digest, read_config
from .publish import PushResult, hydra_push_to_hub, install_push_to_hub, push, push_model
from .staging import StagedRepository, stage_repository
from .validate import fresh_check, validate_staged

__all__ = [
    "KINDS",
    "HubError",
    "PushResult",
    "StagedRepository",
    "build_model_card",
    "card_template_path",
    "check_card",
    "check_shipped_code",
    "dataset_info",
    "eval_results_from_report",
    "folder_digest",
    "fresh_check",
    "hydra_push_to_hub",
    "install_push_to_hub",
    "load_report",
    "model_kind",
    "push",
    "push_model",
    "read_config",
    "select_model_row",
    "stage_repository",
    "validate_staged",
]

