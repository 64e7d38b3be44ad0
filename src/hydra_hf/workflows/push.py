"""``hydra-hf push``: a Hydra Ensemble folder published to the Hugging Face Hub.

:func:`push` reads a :class:`PushSpec` and runs :func:`hydra_hf.hub.push`: the repository staged in a fresh
folder (safetensors weights, config with ``auto_map`` and ``custom_pipelines``, audited shipped code,
tokenizer / processor, README.md card, evaluation report and plots), validated in an isolated fresh process
without hydra_hf, then uploaded in one commit; ``dry_run`` stops after validation. The staging and the push
stay the hub's own (``model.push_to_hub`` runs the same function); docs/hub.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .. import hub
from ..hub.publish import PushResult, check_repo_id

__all__ = ["PushSpec", "push"]


@dataclass(frozen=True)
class PushSpec:
    """What ``hydra-hf push`` publishes; one field per option of the command.

    Attributes:
        model_dir: the Hydra folder (only read).
        repo_id: the Hub repository, ``ORG/NAME`` (created if missing, not with ``create_pr``).
        private, revision, create_pr, commit_message: the repository's visibility, the branch to commit to, a
            pull request instead of a commit, the commit message.
        dry_run: stage and validate only.
        token: a Hub token (default: ``HF_TOKEN`` or the saved login).
        report, base_model, license, training: what the model card shows (:func:`hydra_hf.hub.build_model_card`).
        staging: stage into this new or empty folder and keep it (default: a temporary folder).
        overwrite: replace ``staging`` when an earlier ``hydra-hf push`` staged it.
        trust_foreign_code: ship ``.py`` files that differ from the ones this hydra_hf ships.

    Raises:
        HubError: ``repo_id`` is not ``ORG/NAME``.
    """

    model_dir: str | os.PathLike
    repo_id: str
    private: bool = False
    revision: str | None = None
    create_pr: bool = False
    commit_message: str | None = None
    dry_run: bool = False
    token: str | None = None
    report: str | os.PathLike | None = None
    base_model: str | None = None
    license: str | None = None
    training: str | None = None
    staging: str | os.PathLike | None = None
    overwrite: bool = False
    trust_foreign_code: bool = False

    def __post_init__(self) -> None:
        check_repo_id(self.repo_id)


def push(spec: PushSpec) -> PushResult:
    """Stage, validate and (unless ``spec.dry_run``) upload ``spec.model_dir`` to ``spec.repo_id``."""
    return hub.push(
        spec.model_dir, spec.repo_id, private=spec.private, revision=spec.revision, create_pr=spec.create_pr,
        commit_message=spec.commit_message, dry_run=spec.dry_run, token=spec.token, report=spec.report,
        base_model=spec.base_model, license=spec.license, training=spec.training, staging_dir=spec.staging,
        overwrite=spec.overwrite, trust_foreign_code=spec.trust_foreign_code,
    )
