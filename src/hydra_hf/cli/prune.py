"""`hydra-hf prune`: compute the head masks of M Hydra members and write the masks file.

Example::

    hydra-hf prune --model ./minilm --method circuit-avg --members 3 --remove 36 --seed 0 \\
        --id-data rotten_tomatoes:validation --ood-data guardian_headlines:ood_validation \\
        --output masks.json

Models:

- ``--model DIR``: a Hugging Face checkpoint folder: a text classifier (BERT-like, or a decoder
  ``*ForSequenceClassification``), a ViT image classifier, a ``CLIPModel`` (detected from
  ``config.json``), pruned as a zero-shot classifier, or a decoder causal LM (``LlamaForCausalLM``,
  ``MistralForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``, ``GPT2LMHeadModel``), pruned on
  next-token prediction; or a GGUF checkpoint (a ``.gguf`` file or a folder holding one), a causal LM read
  through its cached plain folder (:func:`hydra_hf.families.resolve_checkpoint`);
- ``--open-clip NAME --checkpoint PATH``: an open_clip CLIP model (a model name such as ``ViT-B-32``,
  or a local ``open_clip_config.json`` / a folder holding one) with local weights, zero-shot;
- ``--timm NAME --checkpoint PATH``: a timm ViT image classifier with local weights (a file, or a
  ``save_for_hf`` folder whose ``model_args`` are used). Nothing is downloaded.

CLIP models classify images zero-shot: ``--class-names`` (comma-separated, or a file with one name
per line, in label order; an image folder as ``--id-data`` names them itself) and ``--prompt-template`` (default ``"a
photo of a {}."``) give the class prompts; label values must be ``0 .. C-1`` (or the class names themselves;
image-folder classes are matched by name). ``--tower joint`` (the default for two-tower models) selects every member's
heads over both towers at once (``--remove N`` counts the heads of both, ``--heads-per-layer K`` applies
to every layer of each); ``--tower vision`` / ``text`` prunes one tower and keeps the other whole.
CLIP masks are written in the two-tower format that ``hydra-hf convert`` reads; the file is written
atomically, never half.

Causal LMs read only texts: ``--id-data`` (and ``--ood-data`` for circuit-ood / circuit-avg) are any
text data (the ``--text-column`` of local files, or an embedded corpus), tokenized with the folder's
tokenizer and cut to ``--max-length`` tokens; the labels are the next tokens. Taylor scores the mean
next-token loss; circuit-acc scores next-token accuracy, circuit-ood the AUROC of each sequence's mean
maximum softmax probability (ID against OOD texts), circuit-avg their mean. ``--label-column`` and
``--num-labels`` are refused (an error, not ignored: they mean a classifier was intended). The masks
count query heads; ``hydra-hf convert`` then builds the fused causal LM.

The options become a :class:`~hydra_hf.workflows.prune.PruneSpec` and :func:`~hydra_hf.workflows.prune.prune`
does the work (:func:`~hydra_hf.workflows.prune.build_members`: data specs -> masks, the function every recipe
calls; :mod:`hydra_hf.pruning.loading`: open_clip / timm models and class prompts).
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from ..pruning.diversity import PRUNING_METHODS
from ..workflows.prune import PruneSpec, prune
from . import finite_float, non_negative_int, positive_int


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "prune",
        help="choose the heads every member keeps (Taylor / circuits / random) and write masks.json",
        description=__doc__.split("\n\n")[0],
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="Hugging Face checkpoint folder (text classifier, ViT classifier, CLIPModel, "
                        "causal LM) or a GGUF checkpoint (a .gguf file or a folder holding one)")
    source.add_argument(
        "--open-clip",
        metavar="NAME",
        help="open_clip model name (e.g. ViT-B-32) or local open_clip_config.json; weights from --checkpoint",
    )
    source.add_argument(
        "--timm", metavar="NAME", help="timm ViT architecture (e.g. vit_base_patch16_224); weights from --checkpoint"
    )
    p.add_argument(
        "--checkpoint",
        help="local weights of --open-clip / --timm: a .safetensors/.bin/.pt file or a checkpoint folder",
    )
    p.add_argument(
        "--class-names",
        help="CLIP (or a causal LM with --prompt): class names in label order, comma-separated or a file with one "
        "per line (default with an image folder as --id-data: its sub-folders)",
    )
    p.add_argument("--prompt-template", default=None, help='CLIP: prompt of each class (default "a photo of a {}.")')
    p.add_argument("--prompt", default=None, metavar="TEMPLATE|FILE",
                   help="a causal LM as a zero-shot classifier: the user message holding {text} (or a JSON file of "
                   "one prompt, as `hydra-hf evaluate --prompt` reads it); members are pruned on the cross-entropy of "
                   "the label words' next-token distribution, renormalised over the classes, on labelled --id-data")
    p.add_argument("--label-words", default=None, metavar="WORDS",
                   help="--prompt: each class's label word, comma-separated in label order, alternatives with | "
                   "(default: --class-names)")
    p.add_argument("--tower", help="two-tower models: vision, text or joint (default joint: both towers together)")
    p.add_argument(
        "--method",
        default="taylor",
        help="pruning method, or several comma-separated (one member each): "
        + "; ".join(f"{m.name}: {m.help}" for m in PRUNING_METHODS.values()),
    )
    p.add_argument("--members", type=non_negative_int, default=3, help="members to compute (default 3)")
    budget = p.add_mutually_exclusive_group(required=True)
    budget.add_argument("--heads-per-layer", type=non_negative_int, help="keep K heads in every layer")
    budget.add_argument("--remove", type=non_negative_int, help="remove N heads in total (anywhere)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed of member 0; member m uses seed+m")
    p.add_argument("--id-data", required=True, help="labelled ID data: file, save_to_disk folder or NAME[:SPLIT] "
                   "(a causal LM: any texts; the labels are the next tokens)")
    p.add_argument("--ood-data", help="OOD data (needed by circuit-ood and circuit-avg)")
    p.add_argument(
        "--text-column", default="text", help="column holding the text of csv/jsonl/parquet data (default: text)"
    )
    p.add_argument("--ood-text-column", help="text column of --ood-data (default: --text-column)")
    p.add_argument(
        "--label-column",
        default=None,
        help="column holding the integer class (or class name) of --id-data (default: label; not for causal LMs)",
    )
    p.add_argument("--image-column", help="image column (image data); image folders need none")
    p.add_argument("--max-samples", type=positive_int, help="use at most this many ID (and OOD) examples")
    p.add_argument(
        "--max-length", type=positive_int, default=128,
        help="max tokens per text (default 128; a causal LM: per sequence)"
    )
    p.add_argument(
        "--batch-size",
        type=positive_int,
        default=None,
        help="examples per forward pass while scoring (default 32; causal LMs 8: their logits are B x T x V)",
    )
    p.add_argument("--num-labels", type=positive_int, help="classes of a checkpoint without a trained classifier head")
    p.add_argument(
        "--temperature", type=finite_float, help="Taylor sampling temperature (default 1 for several members)"
    )
    p.add_argument(
        "--data-fraction", type=finite_float, help="fraction of the data per member (default 0.8 for several)"
    )
    p.add_argument("--heads-per-step", type=positive_int, default=1,
                   help="circuit heads removed per step (1 = exact greedy)")
    p.add_argument("--taylor-rounds", type=positive_int, default=None,
                   help="Taylor's recomputes (default: the paper's, after every layer of a --heads-per-layer budget, "
                        "one ranking of a --remove budget); with --heads-per-layer, R recomputes over R groups of "
                        "consecutive layers (1: every layer from one gradient pass)")
    p.add_argument("--mlp-keep", type=finite_float, metavar="F",
                   help="slim members (an extension): every member also keeps this fraction of each layer's MLP "
                        "neurons, by Taylor importance on its own data (e.g. 0.33: 3 members at about one model's "
                        "compute); default: whole MLPs, as in the paper")
    p.add_argument("--mlp-spread", action="store_true",
                   help="with --mlp-keep: members prefer the neurons earlier members left (they cover the MLP)")
    p.add_argument(
        "--include-masks",
        help="masks file whose members are added to the output unchanged (two-tower for --tower joint)",
    )
    p.add_argument("--no-fast", action="store_true", help="circuits: re-run the full model per candidate")
    p.add_argument(
        "--circuit-precision",
        default="fp32",
        choices=["fp32", "screened", "bf16"],
        help="circuits on BERT: fp32 scores every candidate in float32; screened scores in bf16 and re-scores "
        "every candidate near the best in float32 (decisions on float32 scores; faster only when few "
        "candidates are near-tied); bf16 is approximate (default: fp32)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --output file if it is a masks file (never any other file)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow a --model folder that ships its own Python code (auto_map); off by "
                   "default because loading runs that code")
    p.add_argument("--output", required=True, help="masks file to write (JSON)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    spec = PruneSpec(**{f.name: getattr(args, f.name) for f in dataclasses.fields(PruneSpec)})
    masks, output = prune(spec)
    print(masks.summary())
    print(f"wrote {output}")
    return 0
