"""``push``: stage, validate and upload a Hydra folder in one commit; ``model.push_to_hub``.

(The module is not called ``push.py`` so that ``hydra_hf.hub.push`` stays the function.)
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from huggingface_hub import HfApi, constants, errors, get_token
from huggingface_hub.utils import validate_repo_id

from ..errors import HydraError, one_line
from ..outputs import is_owned, remove_owned, write_output_folder
from ..saving import save_hydra_model
from .common import HubError, visible_files
from .staging import StagedRepository, check_staging_place, stage_into
from .validate import validate_staged

logger = logging.getLogger(__name__)

# Never uploaded from a staged folder: hidden files (the staging folder's .hydra_hf_output.json marker).
UPLOAD_IGNORE = [".*", "*/.*"]


@dataclass
class PushResult:
    """What :func:`push` did. ``commit_url`` is None for a dry run."""

    repo_id: str
    files: dict[str, int]
    staging: Path | None
    commit_url: str | None = None
    pr_url: str | None = None
    validation: dict[str, Any] = field(default_factory=dict)


# transport errors of the HTTP clients huggingface_hub may use (httpx, its vendored httpx2, requests)
_HTTP_MODULES = ("httpx", "httpcore", "requests", "urllib3")


def _hub_error(exc: BaseException, repo_id: str, revision: str | None) -> HubError:
    """A one-line message (what failed, and what to do) for an upload error."""
    if isinstance(exc, errors.OfflineModeIsEnabled):
        return HubError("cannot upload: HF_HUB_OFFLINE is set; unset it (or use --dry-run) to push")
    if isinstance(exc, errors.RevisionNotFoundError):
        return HubError(f"revision {revision!r} does not exist in {repo_id}; check --revision")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return HubError(f"repository {repo_id} does not exist or your token cannot write to it; "
                        "check --repo-id and that the token has write access to the namespace")
    if isinstance(exc, errors.HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        hint = {401: "the token is invalid or expired: run `hf auth login`",
                403: "the token has no write access to this repository"}.get(status, "the Hub rejected the upload")
        return HubError(f"upload to {repo_id} failed (HTTP {status}): {hint}: {one_line(exc)}")
    if isinstance(exc, (ConnectionError, TimeoutError, OSError)) or type(exc).__module__.startswith(_HTTP_MODULES):
        return HubError(
            f"cannot reach the Hugging Face Hub ({type(exc).__name__}: {one_line(exc)}); check the network"
        )
    return HubError(f"upload to {repo_id} failed: {type(exc).__name__}: {one_line(exc)}")


def _check_repo_id(repo_id: str) -> None:
    try:
        validate_repo_id(repo_id)
    except Exception as exc:
        raise HubError(f"--repo-id {repo_id!r} is not a valid repository id ({one_line(exc)}); use ORG/NAME") from exc
    if "/" not in repo_id:
        raise HubError(f"--repo-id {repo_id!r} has no namespace; use ORG/NAME (or USER/NAME)")


def push(
    model_dir: str | os.PathLike,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    create_pr: bool = False,
    commit_message: str | None = None,
    commit_description: str | None = None,
    dry_run: bool = False,
    token: str | None = None,
    report: str | os.PathLike | Mapping[str, Any] | None = None,
    base_model: str | None = None,
    license: str | None = None,
    training: str | None = None,
    tags: list[str] | None = None,
    staging_dir: str | os.PathLike | None = None,
    overwrite: bool = False,
    endpoint: str | None = None,
    validate_timeout: float = 300,
    trust_foreign_code: bool = False,
) -> PushResult:
    """Stage, validate and upload the Hydra folder ``model_dir`` to ``repo_id`` in one commit.

    The repository then holds exactly the staged folder's visible files (``upload_folder`` with
    ``delete_patterns="*"``: files of earlier commits that are not staged now are removed in the same
    commit; ``.gitattributes`` is kept). The repository is created if it does not exist (not with
    ``create_pr``); ``revision`` names a branch, created from main if needed.

    Args:
        dry_run: stop after validation; nothing is sent.
        staging_dir: stage into this folder (new or empty; with ``overwrite`` also one an earlier
            push staged) and keep it after a successful push or dry run; a failed push removes it
            only if this push created it. Default: a private temporary folder, always removed.
        overwrite: replace ``staging_dir`` when an earlier ``hydra-hf push`` staged it (its marker).
        trust_foreign_code: ship (and run, in the isolated check) ``.py`` files that are not the ones this
            hydra_hf ships -- only for code you wrote and vouch for; it must still pass the AST audit.
        token: a Hub token (default: ``HF_TOKEN`` or the saved login).
        endpoint: another Hub endpoint (default ``HF_ENDPOINT`` / huggingface.co).
        report, base_model, license, training, tags: see :func:`hydra_hf.hub.build_model_card`.

    Raises:
        HubError and the other :class:`~hydra_hf.errors.HydraError` s: one-line message: invalid repo
            id, unsafe or invalid folder, validation failure, offline mode, no token, unreachable Hub,
            missing repository, rejected upload. ``model_dir`` and the report are never modified.
    """
    _check_repo_id(repo_id)
    keep = staging_dir is not None
    temporary = None if keep else Path(tempfile.mkdtemp(prefix="hydra-push-"))  # ours alone: removed at the end
    staging = Path(staging_dir) if keep else temporary / "repo"
    inputs = check_staging_place(staging, model_dir, report)
    existed_as_ours = staging.is_dir() and is_owned(staging, "push")
    staged: list[StagedRepository] = []
    validation: dict[str, Any] = {}

    def write(tmp: Path) -> None:  # a failure here leaves no staging folder (write_output_folder)
        staged.append(stage_into(model_dir, tmp, repo_id=repo_id, report=report, revision=revision,
                                 base_model=base_model, license=license, training=training, tags=tags,
                                 allow_foreign_code=trust_foreign_code))
        validation.update(validate_staged(tmp, timeout=validate_timeout, allow_foreign_code=trust_foreign_code,
                                          local=model_dir))

    created = False
    try:
        write_output_folder(staging, write, command="push", overwrite=overwrite, inputs=inputs)
        created = True
        result = PushResult(repo_id=repo_id, files=visible_files(staging), staging=staging if keep else None,
                            validation=validation)
        if dry_run:
            return result
        commit = _upload(staging, repo_id, private=private, revision=revision, create_pr=create_pr,
                         commit_message=commit_message or f"Upload Hydra Ensemble ({staged[0].kind}) with hydra_hf",
                         commit_description=commit_description, token=token, endpoint=endpoint)
        result.commit_url = getattr(commit, "commit_url", None) or str(commit)
        result.pr_url = getattr(commit, "pr_url", None)
        return result
    except BaseException:
        # a failed upload leaves no staging folder behind -- only ever one this push staged itself
        if keep and created and not existed_as_ours and is_owned(staging, "push"):
            remove_owned(staging, "push")
        raise
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)


def _upload(folder: Path, repo_id: str, *, private: bool, revision: str | None, create_pr: bool,
            commit_message: str, commit_description: str | None, token: str | None, endpoint: str | None) -> Any:
    if constants.is_offline_mode():
        raise HubError("cannot upload: HF_HUB_OFFLINE is set; unset it (or use --dry-run) to push")
    if token is None and get_token() is None:
        raise HubError("no Hugging Face token: run `hf auth login`, set HF_TOKEN, or pass --token")
    api = HfApi(endpoint=endpoint, token=token)
    try:
        if not create_pr:
            api.create_repo(repo_id, private=private, exist_ok=True)
            if revision:
                api.create_branch(repo_id, branch=revision, exist_ok=True)
        return api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message=commit_message,
                                 commit_description=commit_description, revision=revision, create_pr=create_pr,
                                 delete_patterns="*", ignore_patterns=UPLOAD_IGNORE)
    except HydraError:
        raise
    except Exception as exc:
        raise _hub_error(exc, repo_id, revision) from exc


def push_model(
    model: Any,
    repo_id: str,
    *,
    preprocessor_from: str | os.PathLike | None = None,
    **kwargs: Any,
) -> PushResult:
    """Push an in-memory Hydra model: the same repository content as ``hydra-hf push`` on a folder.

    Saves ``model`` with :func:`hydra_hf.saving.save_hydra_model` (config with ``auto_map`` and
    ``custom_pipelines``, safetensors, shipped code, the tokenizer/processor of
    ``preprocessor_from`` -- by default the folder the model was loaded from, when it is one) into a
    temporary folder, then calls :func:`push` with ``kwargs``.
    """
    if preprocessor_from is None:
        source = getattr(model, "name_or_path", None) or getattr(model.config, "_name_or_path", None)
        if source and Path(source).is_dir():
            preprocessor_from = source
    with tempfile.TemporaryDirectory(prefix="hydra-save-") as tmp:
        folder = Path(tmp) / "model"
        save_hydra_model(model, folder, preprocessor_from=preprocessor_from)
        return push(folder, repo_id, **kwargs)


def hydra_push_to_hub(
    self: Any,
    repo_id: str,
    *,
    commit_message: str | None = None,
    commit_description: str | None = None,
    private: bool | None = None,
    token: str | None = None,
    revision: str | None = None,
    create_pr: bool = False,
    tags: list[str] | None = None,
    **kwargs: Any,
) -> PushResult:
    """``model.push_to_hub(repo_id, ...)`` for Hydra models: the repository ``hydra-hf push`` makes.

    Takes transformers' ``push_to_hub`` arguments (except ``max_shard_size``) plus those of
    :func:`push_model` (``preprocessor_from``, ``report``, ``base_model``, ``license``,
    ``training``, ``dry_run``, ``staging_dir``). Returns a :class:`PushResult`.
    """
    return push_model(self, repo_id, commit_message=commit_message, commit_description=commit_description,
                      private=bool(private), token=token, revision=revision, create_pr=create_pr, tags=tags, **kwargs)


hydra_push_to_hub.__hydra_hub__ = True  # type: ignore[attr-defined]


def install_push_to_hub(*classes: type) -> None:
    """Make ``cls.push_to_hub`` (and its subclasses') publish the full Hydra repository.

    ``hydra_hf/__init__.py`` installs ``hydra_hf.push_to_hub``, which calls :func:`hydra_push_to_hub`, on
    hydra_hf's own registered classes without importing this module; this function installs it on other
    classes of hydra_hf's (tests, subclasses defined later). The shipped modeling files cannot import
    hydra_hf, so classes loaded with ``trust_remote_code`` keep transformers' ``push_to_hub`` (which
    uploads only what ``save_pretrained`` writes); use :func:`push_model` for those.
    """
    for cls in classes:
        if not cls.__module__.startswith("hydra_hf."):
            raise TypeError(
                f"install_push_to_hub is for hydra_hf's own model classes, not {cls.__module__}.{cls.__name__}"
            )
    for cls in classes:
        cls.push_to_hub = hydra_push_to_hub
