"""`hydra-hf push`: publish a Hydra Ensemble folder to the Hugging Face Hub.

Stages the repository in a fresh folder (safetensors weights, config with `auto_map` and
`custom_pipelines`, audited shipped code, tokenizer/processor, README.md card, evaluation report and
plots), validates it in an isolated fresh process without hydra_hf, then uploads it in one commit.
`--dry-run` stops after validation and lists what would be uploaded. The options become a
:class:`~hydra_hf.workflows.push.PushSpec` and :func:`~hydra_hf.workflows.push.push` does the work. See docs/hub.md.
"""

from __future__ import annotations

import argparse
import json

from ..workflows.push import PushSpec, push


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "push",
        help="publish a Hydra Ensemble folder to the Hub (model card, validation, one commit)",
        description="Stage DIR as a Hub repository (safetensors only, shipped code that is exactly the code this "
        "hydra_hf ships unless --trust-foreign-code, and passes the import/name allow-list audit, tokenizer, "
        "README.md model card, evaluation report and plots), check that it loads "
        "with trust_remote_code=True in an isolated fresh process without hydra_hf, then upload it in one "
        "commit. DIR and the report are only read: files are taken only from inside them (symlinks or paths "
        "leading out are refused), hidden files are never uploaded.",
    )
    p.add_argument("model_dir", metavar="DIR", help="a folder written by hydra-hf convert")
    p.add_argument("--repo-id", required=True, metavar="ORG/NAME", help="the Hub repository (created if missing)")
    p.add_argument("--private", action="store_true", help="create the repository as private")
    p.add_argument("--revision", metavar="BRANCH", default=None, help="branch to commit to (created if missing)")
    p.add_argument("--create-pr", action="store_true", help="open a pull request instead of committing directly")
    p.add_argument("--commit-message", default=None, help="commit message")
    p.add_argument("--dry-run", action="store_true", help="stage and validate only; print what would be uploaded")
    p.add_argument("--report", metavar="PATH", default=None,
                   help="evaluation report.json (or its folder); its table, metrics and plots go into the card")
    p.add_argument("--base-model", metavar="ID", default=None,
                   help="the base checkpoint's Hub id, for the card (default: what the report or config.json records)")
    p.add_argument("--license", default=None,
                   help="license id for the card (default: the report's, the folder's README/config's, or the base "
                   "model card's; the card says 'not recorded' rather than guessing)")
    p.add_argument("--training", default=None, help="one paragraph on how the members were fine-tuned, for the card")
    p.add_argument("--staging", metavar="DIR", default=None,
                   help="stage into this new or empty folder and keep it (default: a temporary folder); it must "
                   "lie outside DIR and the report")
    p.add_argument("--overwrite", action="store_true",
                   help="replace --staging DIR only if an earlier hydra-hf push staged it (its "
                   ".hydra_hf_output.json marker says so); never a folder of yours")
    p.add_argument("--token", default=None, help="Hub token (default: HF_TOKEN or the saved login)")
    p.add_argument("--trust-foreign-code", action="store_true",
                   help="ship .py files that differ from the ones this hydra_hf ships (they still must pass the "
                   "import/name audit, and the isolated check runs them); only for code you wrote and vouch for")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    spec = PushSpec(
        args.model_dir, args.repo_id, private=args.private, revision=args.revision, create_pr=args.create_pr,
        commit_message=args.commit_message, dry_run=args.dry_run, token=args.token, report=args.report,
        base_model=args.base_model, license=args.license, training=args.training, staging=args.staging,
        overwrite=args.overwrite, trust_foreign_code=args.trust_foreign_code,
    )
    result = push(spec)
    total = sum(result.files.values())
    target = f"{args.repo_id}@{args.revision or 'main'}{' (pull request)' if args.create_pr else ''}"
    verb = "would upload" if args.dry_run else "uploaded"
    print(f"{verb} {len(result.files)} files ({total / 1e6:.2f} MB) to {target}:")
    for path, size in result.files.items():
        print(f"  {path}  ({size} bytes)")
    print(json.dumps({
        "repo_id": args.repo_id, "dry_run": args.dry_run, "files": result.files,
        "staging": str(result.staging) if result.staging else None,
        "commit_url": result.commit_url, "pr_url": result.pr_url,
        "validated": {"auto_class": result.validation.get("load", {}).get("auto_class"),
                      "pipeline": result.validation.get("load", {}).get("pipeline"),
                      "model_index_metrics": result.validation.get("card", {}).get("eval_results")},
    }))
    return 0
