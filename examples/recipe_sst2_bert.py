"""The paper's text setting: Hydra Ensembles of bert-base-uncased on SST-2.

Budget (the paper's, its appendix B.2.3): **3 members, each keeping 6 of the 12
heads in every one of BERT-base's 12 layers** (72 of 144 heads removed per member; a per-layer
budget, ``Budget(heads_per_layer=6)``, ``--heads-per-layer 6``; 6 heads removed in total would reproduce
nothing). The members are the paper's **Hydra (Circ)**:
member ``m`` is chosen by criterion ``m`` -- CircAcc, CircOOD, CircAvg (greedy circuit search, one
head per step, scoring a removal by ID validation accuracy, MSP-AUROC between ID and OOD validation
data, or their mean) -- all three on the same 3,000 ID validation sentences held out of train and
the OOD validation texts, so their diversity comes from the criteria (seed-only members are the
paper's ablation, B.5). The three searches run in lockstep and share their evaluations while their
removals agree (:func:`hydra_hf.pruning.circuit_prune_criteria`).

Fine-tuning is the paper's text recipe (:func:`hydra_hf.finetune.text_recipe`): AdamW, lr 1e-5,
weight decay 0.01, 10 % warm-up then linear decay, clipping 1.0, max length 128, up to 7 epochs with
early stopping on validation accuracy (patience 2), frozen embeddings; the same recipe for the Single
baseline and for every member (each member starts from the fine-tuned Single model).

Data (``--data-dir``, written once by :func:`prepare_data` with ``datasets.load_dataset`` and
``save_to_disk``, then read back as ``FOLDER:SPLIT`` specs):

- ID: GLUE SST-2. Its test labels are hidden, so GLUE's *validation* split (872 sentences) is the
  test split here, and a stratified, seeded 3,000-sentence *validation* split (the selection set) is
  carved from train.
- OOD: AG News (news topics; its train split gives the OOD *validation* data used to select members,
  its test split an OOD test set), 20 Newsgroups (test) and Multi30K English captions (test). These
  are the usual OOD sets for sentiment classifiers in the text-OOD literature; the paper's own list of
  text OOD sets could not be checked offline when this script was written, so compare with it before
  quoting numbers side by side.

The pipeline is :func:`hydra_hf.recipes.run_text_pipeline` (the one ``make demo`` runs): fine-tune
Single -> build members -> fine-tune + fuse -> evaluate against Single, Single + TS, MC Dropout,
Deep Ensembles (D) and one pruned member -> Hub-ready folder checked in a fresh process.

    accelerate launch --num_processes 1 examples/recipe_sst2_bert.py --output outputs/sst2-bert
    python examples/recipe_sst2_bert.py --smoke --output /tmp/sst2-smoke   # offline, seconds

``--smoke`` runs the same code (data preparation from DatasetDicts, the same pipeline) on a tiny
local BERT and tiny generated stand-ins for GLUE SST-2 and the OOD sets.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasets

from hydra_hf.cli import run_script
from hydra_hf.pruning import Budget
from hydra_hf.recipes import PipelineResult, TextPipeline, add_budget_arguments, budget_arguments, run_text_pipeline
from hydra_hf.reproducibility import add_threads_argument, describe_threads, pin_threads

BASE_MODEL = "bert-base-uncased"
LABELS = ("negative", "positive")
VALIDATION_SIZE = 3000  # carved from train: the selection set (the paper's 3,000 held-out training rows)
PAPER_HEADS_PER_LAYER = 6  # keep 6 of BERT-base's 12 heads in every layer (72 of 144 removed per member)
HYDRA_CIRC = "circuit-acc,circuit-ood,circuit-avg"  # Hydra (Circ): one criterion per member
# name -> (Hub id, config, text column, splits used: OOD test split, and OOD validation split or None)
OOD_SETS: dict[str, tuple[str, str | None, str, str, str | None]] = {
    "ag_news": ("fancyzhx/ag_news", None, "text", "test", "train"),
    "20newsgroups": ("SetFit/20_newsgroups", None, "text", "test", None),
    "multi30k": ("bentrevett/multi30k", None, "en", "test", None),
}
OOD_VALIDATION = "ag_news"

Loader = Callable[..., datasets.DatasetDict]  # datasets.load_dataset(path, name) -> DatasetDict


def prepare_data(data_dir: Path, load: Loader = datasets.load_dataset, *, max_ood: int = 2000, seed: int = 0,
                 validation_size: int = VALIDATION_SIZE) -> dict[str, Any]:
    """Download (``load``) SST-2 and the OOD sets, standardise them to ``text``/``label`` columns and
    save them under ``data_dir``. Returns the data specs of :class:`TextPipeline`.

    OOD sets are shuffled (``seed``) and cut to ``max_ood`` texts per split; the OOD validation texts
    come from a different split than the OOD test texts, so no test text is used to select members.
    """
    data_dir = Path(data_dir)
    sst2_dir = data_dir / "sst2"
    if not (sst2_dir / "dataset_dict.json").is_file():
        glue = load("glue", "sst2")
        keep = ["text", "label"]
        train = glue["train"].rename_column("sentence", "text").select_columns(keep)
        test = glue["validation"].rename_column("sentence", "text").select_columns(keep)
        parts = train.train_test_split(test_size=validation_size, seed=seed, stratify_by_column="label")
        datasets.DatasetDict(train=parts["train"], validation=parts["test"], test=test).save_to_disk(str(sst2_dir))
    specs: dict[str, Any] = {
        "train_data": f"{sst2_dir}:train",
        "validation_data": f"{sst2_dir}:validation",
        "test_data": f"{sst2_dir}:test",
        "ood_test_data": {},
    }
    for name, (hub_id, config, column, test_split, val_split) in OOD_SETS.items():
        folder = data_dir / f"ood_{name}"
        if not (folder / "dataset_dict.json").is_file():
            raw = load(hub_id, config) if config else load(hub_id)
            out = {}
            for role, split in (("ood_test", test_split), ("ood_validation", val_split)):
                if split is None:
                    continue
                part = raw[split].shuffle(seed=seed).select_columns([column])
                part = part.rename_column(column, "text") if column != "text" else part
                out[role] = part.select(range(min(max_ood, len(part))))
            datasets.DatasetDict(out).save_to_disk(str(folder))
        specs["ood_test_data"][name] = f"{folder}:ood_test"
        if name == OOD_VALIDATION:
            specs["ood_validation_data"] = f"{folder}:ood_validation"
    return specs


def prepare_base(folder: Path, model_id: str = BASE_MODEL, seed: int = 0) -> Path:
    """bert-base-uncased with a new 2-class classifier (initialised with ``seed``) and its tokenizer."""
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    if not (folder / "config.json").is_file():
        torch.manual_seed(seed)
        model = BertForSequenceClassification.from_pretrained(
            model_id,
            num_labels=len(LABELS),
            id2label=dict(enumerate(LABELS)),
            label2id={l: i for i, l in enumerate(LABELS)},
        )
        model.save_pretrained(folder)
        AutoTokenizer.from_pretrained(model_id).save_pretrained(folder)
    return folder


def paper_pipeline(
    base: Path,
    specs: dict[str, Any],
    *,
    members: int = 3,
    heads_per_layer: int | None = PAPER_HEADS_PER_LAYER,
    remove: int | None = None,
    seed: int = 0,
    method: str = HYDRA_CIRC,
    **overrides: Any,
) -> TextPipeline:
    """The paper's SST-2 settings as a :class:`TextPipeline`; ``overrides`` replace any field.

    The budget is per layer (``heads_per_layer``) unless ``remove`` is given (then ``heads_per_layer``
    must be None)."""
    budget = Budget(heads_per_layer=heads_per_layer, remove=remove)
    values: dict[str, Any] = dict(
        base_model=str(base), labels=LABELS, **specs,
        members=members, method=method, remove=remove, heads_per_layer=heads_per_layer, heads_per_step=1,
        prune_samples=VALIDATION_SIZE, prune_data_fraction=1.0,
        max_length=128, batch_size=32, learning_rate=1e-5, member_learning_rate=1e-5, single_steps=None,
        member_steps=None, num_epochs=7, early_stopping_patience=2, max_train_samples=None,
        max_validation_samples=None, max_test_samples=None, max_ood_samples=None, mc_samples=10, ensemble_heads=3,
        seed=seed, hub_base_model=BASE_MODEL,
        report_title=f"Hydra Ensembles of {BASE_MODEL} on SST-2 ({members} members, {budget.describe()})",
        report_notes=f"Members were selected on the SST-2 validation split carved from train and the {OOD_VALIDATION} "
        "OOD validation texts (its train split) only; the test split (GLUE validation) and the OOD test sets were "
        "never used for any choice.",
    )
    values.update(overrides)
    return TextPipeline(**values)


# ------------------------------------------------------------------------------------------ smoke
POS, NEG = "good great fun very".split(), "bad awful boring not".split()
NEUTRAL = "the a movie film plot actor it was is and".split()


def _smoke_sentences(n: int, seed: int) -> dict[str, list]:
    import random

    rng = random.Random(seed)
    rows = [(i % 2, rng.sample(NEUTRAL, 4) + rng.choices(POS if i % 2 else NEG, k=2)) for i in range(n)]
    return {"sentence": [" ".join(rng.sample(w, len(w))) for _, w in rows], "label": [y for y, _ in rows],
            "idx": list(range(n))}


def smoke_loader(path: str, name: str | None = None) -> datasets.DatasetDict:
    """Tiny offline stand-ins with the same splits and columns as the Hub data sets."""
    if path == "glue":  # GLUE's schema: sentence, label (ClassLabel), idx
        features = datasets.Features(
            {
                "sentence": datasets.Value("string"),
                "label": datasets.ClassLabel(names=list(LABELS)),
                "idx": datasets.Value("int32"),
            }
        )
        return datasets.DatasetDict({s: datasets.Dataset.from_dict(_smoke_sentences(n, k), features=features)
                                     for k, (s, n) in enumerate((("train", 128), ("validation", 32), ("test", 32)))})
    hub_id, _, column, test_split, val_split = next(v for v in OOD_SETS.values() if v[0] == path)
    words = {"fancyzhx/ag_news": "x y z", "SetFit/20_newsgroups": "q r s", "bentrevett/multi30k": "u v w"}[path]
    splits = [s for s in (test_split, val_split) if s]
    return datasets.DatasetDict({s: datasets.Dataset.from_dict({column: [f"{words} {i % 7}" for i in range(24)]})
                                 for s in splits})


def smoke_base(folder: Path, seed: int = 0) -> Path:
    """A tiny BERT classifier (2 layers x 4 heads, hidden 32) with a WordPiece tokenizer."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        *POS,
        *NEG,
        *NEUTRAL,
        *letters,
        *(f"##{c}" for c in letters),
    ]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizer(str(folder / "vocab.txt")).save_pretrained(str(folder))
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64, num_labels=2, initializer_range=0.02,
                        id2label=dict(enumerate(LABELS)), label2id={l: i for i, l in enumerate(LABELS)})
    BertForSequenceClassification(config).save_pretrained(folder)
    return folder


SMOKE_HEADS_PER_LAYER = 2  # the tiny BERT has 4 heads per layer: keep half, as the paper's budget does
SMOKE_OVERRIDES: dict[str, Any] = dict(
    heads_per_step=2, prune_samples=16, max_length=16, batch_size=16, learning_rate=1e-3,
    member_learning_rate=1e-3, single_steps=6, member_steps=4, num_epochs=1, max_train_samples=96,
    max_validation_samples=32, max_test_samples=32, max_ood_samples=24, mc_samples=3, ensemble_heads=2,
)


# ------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> PipelineResult:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", default="outputs/sst2-bert", help="output folder")
    parser.add_argument("--data-dir", default=None, help="prepared data (default: <output>/data)")
    parser.add_argument("--smoke", action="store_true", help="tiny local BERT and generated data, offline")
    parser.add_argument("--resume", action="store_true", help="keep the stages already finished in --output")
    parser.add_argument("--members", type=int, default=3)
    add_budget_arguments(parser, heads_per_layer=PAPER_HEADS_PER_LAYER)
    parser.add_argument("--method", default=HYDRA_CIRC,
                        help="member criteria, one per member, comma-separated "
                        "(hydra_hf.pruning.METHODS); default: Hydra (Circ)")
    parser.add_argument("--max-ood", type=int, default=2000, help="texts per OOD split")
    parser.add_argument("--seed", type=int, default=0)
    add_threads_argument(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    threads = pin_threads(args.threads)  # first, before any torch work: the runs repeat on any machine of this kind
    print(describe_threads(threads))
    out = Path(args.output)
    data_dir = Path(args.data_dir) if args.data_dir else out / "data"
    start = time.perf_counter()
    if args.smoke:
        specs = prepare_data(data_dir, smoke_loader, max_ood=args.max_ood, seed=args.seed, validation_size=32)
        base = smoke_base(out / "base", seed=args.seed)
        overrides = {
            **SMOKE_OVERRIDES,
            **budget_arguments(args, smoke_heads_per_layer=SMOKE_HEADS_PER_LAYER, smoke_remove=4),
        }
    else:
        specs = prepare_data(data_dir, max_ood=args.max_ood, seed=args.seed)
        base = prepare_base(out / "base", seed=args.seed)
        overrides = budget_arguments(args)
    p = paper_pipeline(base, specs, members=args.members, seed=args.seed, method=args.method, **overrides)
    result = run_text_pipeline(p, out / "run", resume=args.resume, repo_id="your-org/hydra-bert-base-sst2")
    print(result.summary(time.perf_counter() - start))
    return result


if __name__ == "__main__":
    run_script(main)  # bad input: one line, as the hydra-hf commands give it
