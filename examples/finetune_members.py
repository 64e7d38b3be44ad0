"""Fine-tune the pruned members of a Hydra Ensemble with Accelerate, then fuse them.

The same as `hydra-hf finetune` (same flags), as a script for `accelerate launch`. Command lines
(data: an embedded name such as `rotten_tomatoes:train`, or a csv/jsonl/parquet file):

    # one process (CPU or one GPU)
    python examples/finetune_members.py --model BASE --masks masks.json \
        --train-data rotten_tomatoes:train --eval-data rotten_tomatoes:validation --output hydra-rt

    # two processes on this CPU machine (gloo), the same global batch: the same result as one process
    accelerate launch --multi_gpu --num_processes 2 examples/finetune_members.py ... --batch-size 32

    # four GPUs, bf16, each member trained data-parallel over all four in turn
    accelerate launch --multi_gpu --num_processes 4 --mixed_precision bf16 examples/finetune_members.py ...

    # one member per GPU, as separate launches sharing one work folder; the last to finish fuses
    CUDA_VISIBLE_DEVICES=0 python examples/finetune_members.py ... --work-dir runs/rt --members 0 &
    CUDA_VISIBLE_DEVICES=1 python examples/finetune_members.py ... --work-dir runs/rt --members 1 &

    # after an interruption: the same command with --resume (finished members are skipped)
    python examples/finetune_members.py ... --resume

    # the paper's text recipe is the default; a short run on a small model, settings from a file
    python examples/finetune_members.py ... --config my_settings.yaml --learning-rate 1e-4 --max-steps 300

    # train the fused model directly (one pass; members in lock-step) instead of member by member
    python examples/finetune_members.py ... --fused --mlp-fusion per_member

The library call behind it is `hydra_hf.finetune.finetune_members(model_dir, masks, train_data,
eval_data, output_dir, config)`.
"""

from __future__ import annotations

import argparse
import logging

from hydra_hf.cli import run_script
from hydra_hf.cli.finetune import add_arguments, run
from hydra_hf.reproducibility import add_threads_argument, describe_threads, pin_threads


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    add_threads_argument(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    threads = pin_threads(args.threads)  # first, before any torch work: the runs repeat on any machine of this kind
    print(describe_threads(threads))
    logging.getLogger("accelerate").setLevel(logging.WARNING)  # one line per checkpoint file is too chatty
    return run(args)


if __name__ == "__main__":
    run_script(main)  # bad input: one line, as the hydra-hf commands give it
