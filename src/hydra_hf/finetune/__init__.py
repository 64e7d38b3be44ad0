"""Fine-tuning Hydra members with Accelerate, then fusing them (the paper's Appendix D.2).

Two ways to train, over the same training loop (:class:`MemberTrainer`):

- :func:`finetune_members` (recommended, the paper's path): member m is the base model with the heads
  it does not keep removed from the weights — a one-member Hydra model built with
  ``convert_checkpoint(HeadMasks([kept_heads[m]]), base=...)`` — so no compute is spent on removed
  heads. Every member is trained on its own (seed ``config.seed + m``: its own data order, dropout and,
  for a bare encoder, classifier initialisation) with the embeddings frozen, so that all members still
  share them. Each trained member is exported as a stock ``BertForSequenceClassification`` folder
  (removed heads zeroed; a usable stand-alone pruned model: the "single pruned model" baseline), and
  the members are fused with the converter into one Hydra Ensemble folder.
- :func:`finetune_fused`: the fused model is trained directly, loss = mean over members of each
  member's cross-entropy. With ``mlp_fusion="per_member"`` and frozen embeddings the members share no
  trainable weight, so this is M members trained in lock-step on the same batches in one pass (see
  ``docs/finetune.md`` for where it differs from separate training).

Decoders (families ``llama`` and ``gpt2``): a sequence classifier trains as above (the tokenizer pads with
its pad token, else with its end-of-sequence token, which is then saved as the pad token with every output);
a causal LM trains on the next-token loss of the text (``labels`` = input ids, -100 at padding; no classes),
is evaluated by its next-token NLL and exported as stock ``*ForCausalLM`` members (docs/finetune.md).

Distributed data parallel (``accelerate launch --multi_gpu --num_processes N``; on CPU N gloo ranks):
``batch_size`` is the *global* batch; Accelerate splits every batch across the processes
(``split_batches=True``), the per-epoch order is a seeded permutation that does not depend on the
number of processes, and the last incomplete batch of an epoch is dropped, so N processes take the
same optimizer steps as one (up to dropout masks, which are drawn per process, and float summation
order). Evaluation goes through ``gather_for_metrics``, so every rank takes the same early-stopping
decision. Only the main process writes files, except Accelerate's per-process RNG states.

Checkpointing: after every epoch (and every ``save_every_steps`` optimizer steps) the member's
model, optimizer, scheduler and every process's RNG states (Python, NumPy, torch: the dropout
masks) are saved with ``accelerator.save_state`` together with ``trainer_state.json`` (epoch, batches
into the epoch, step, the epoch's partial loss sums, best metric, patience counter). ``resume=True``
continues from there -- the same epoch permutation with its consumed batches skipped, the RNG states
of that exact step -- and ends with the weights and loss history of an uninterrupted run. The data
loader draws from its own generator, never from the global one, so that iterating it does not shift
the dropout stream between a run and its resumption. A checkpoint without its RNG or trainer state
is an error unless ``resume_partial=True`` (see :func:`finetune_members`).

Work folder layout (``work_dir``, by default ``<output_dir>.work`` beside the output; it holds the
``.hydra_hf_output.json`` marker of ``hydra-hf finetune``, and ``overwrite`` empties only such a folder)::

    finetune_config.json          the FinetuneConfig of the run (a resumed run must match it)
    log.jsonl                     one JSON line per epoch and member
    member_<m>/checkpoint/        latest accelerate state + trainer_state.json (removed when done)
    member_<m>/best.safetensors   best weights so far (by validation accuracy)
    member_<m>/model/             the fine-tuned member as a stock checkpoint folder (+ masks.json)
    fused/...                     the same for finetune_fused

Modules, one job each: ``config`` (:class:`FinetuneConfig` and the recipes), ``run`` (inputs checked,
data and preprocessor loaded, the Accelerator), ``checkpoint`` (the work folder, checkpoint/resume),
``trainer`` (:class:`MemberTrainer`, the loop every path shares, :mod:`hydra_hf.finetune.baselines` included) and
``members`` (:func:`finetune_members`, :func:`finetune_fused`: member export and fusion).
"""

from .checkpoint import CONFIG_FILE, RNG_FILE, STATE_FILE, Checkpoints, check_resume_flags, claim_work_dir
from .config import (
    COMMAND,
    MIXED_PRECISION,
    MLP_FUSIONS,
    OPTIMIZERS,
    RECIPES,
    RESUME_FREE,
    SCHEDULERS,
    FinetuneConfig,
    Recipe,
    default_recipe,
    demo_precision,
    get_recipe,
    image_recipe,
    register_recipe,
    text_recipe,
)
from .members import finetune_fused, finetune_members
from .run import FinetuneRun, cpu_has_native_bf16, make_accelerator, prepare_run
from .trainer import MemberTrainer, TrainingInterrupted, member_cross_entropy

__all__ = [
    "COMMAND",
    "CONFIG_FILE",
    "MIXED_PRECISION",
    "MLP_FUSIONS",
    "OPTIMIZERS",
    "RECIPES",
    "RESUME_FREE",
    "RNG_FILE",
    "SCHEDULERS",
    "STATE_FILE",
    "Checkpoints",
    "FinetuneConfig",
    "FinetuneRun",
    "MemberTrainer",
    "Recipe",
    "TrainingInterrupted",
    "check_resume_flags",
    "claim_work_dir",
    "cpu_has_native_bf16",
    "default_recipe",
    "demo_precision",
    "finetune_fused",
    "finetune_members",
    "get_recipe",
    "image_recipe",
    "make_accelerator",
    "member_cross_entropy",
    "prepare_run",
    "register_recipe",
    "text_recipe",
]
