"""Fine-tuning decoder members (hydra_hf.finetune): a tiny Llama with grouped-query attention as a sequence
classifier, a tiny GPT-2 causal LM trained on the next-token loss of the text, and 2 processes against 1.

The tokenizers have no pad token (as most decoder tokenizers): the runs pad with the end-of-sequence token and
save it as the pad token with every output.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch
import transformers
from _tiny_decoders import EOS, MASKS, save_gpt2, save_llama, write_data, write_masks
from conftest import free_port
from safetensors.torch import load_file

import hydra_hf  # noqa: F401  (registers the Auto classes)
from hydra_hf.assemble import convert_checkpoint
from hydra_hf.errors import HydraInputError
from hydra_hf.finetune import finetune_members, text_recipe
from hydra_hf.finetune.baselines import train_lora_ensemble
from hydra_hf.finetune.run import prepare_run
from hydra_hf.finetune.trainer import next_token_sums


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """Accelerate keeps process-wide singletons; every test starts clean."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("decoder-ft")
    train, evaluation = write_data(root)
    return {"root": root, "train": train, "eval": evaluation, "masks": write_masks(root / "masks.json")}


def _config(**overrides):
    values = dict(learning_rate=3e-3, batch_size=8, eval_batch_size=8, num_epochs=3, log_every_steps=1,
                  mlp_fusion="per_member", early_stopping_patience=None, warmup_ratio=0.0)
    values.update(overrides)
    return text_recipe(**values)


def _texts(folder, side: str):
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    tok.padding_side = side
    return tok(["the movie was great fun", "awful boring plot", "it"], padding=True, return_tensors="pt")


def test_llama_gqa_classifier_members_finetune_and_fuse(data, tmp_path):
    """Each member trains (loss down), its token embeddings stay bit-identical, it exports as a stock
    LlamaForSequenceClassification padding with <eos>; the fused folder is exactly the converter's fusion of
    those stock members, and its member m equals stock member m on right- and left-padded batches."""
    base = save_llama(tmp_path / "llama")
    out = finetune_members(base, data["masks"], data["train"], data["eval"], tmp_path / "out", _config())
    folders = [tmp_path / "out.work" / f"member_{m}" / "model" for m in range(2)]
    base_state = load_file(base / "model.safetensors")
    by_hand = convert_checkpoint(data["masks"], members=folders, mlp_fusion="per_member").state_dict()
    saved = load_file(out / "model.safetensors")
    assert saved.keys() == by_hand.keys() and all(torch.equal(saved[k], v) for k, v in by_hand.items())
    assert torch.equal(saved["hydra.embed_tokens.weight"], base_state["model.embed_tokens.weight"])
    fused = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    assert type(fused).__name__ == "HydraEnsembleLlamaForSequenceClassification" and fused.config.pad_token_id == EOS
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert (tok.pad_token, tok.pad_token_id) == ("<eos>", EOS)  # the eos, saved as the pad token
    for m, folder in enumerate(folders):
        info = json.loads((folder / "finetune_member.json").read_text())
        losses = [h["train_loss"] for h in info["history"]]
        assert losses[-1] < losses[0] - 0.05, losses  # a learnable keyword task
        assert info["history"][0]["eval_examples"] == 9
        weights = load_file(folder / "model.safetensors")
        assert torch.equal(weights["model.embed_tokens.weight"], base_state["model.embed_tokens.weight"])  # frozen
        assert not torch.allclose(weights["score.weight"], base_state["score.weight"])  # trained
        stock = transformers.LlamaForSequenceClassification.from_pretrained(folder).eval()
        assert stock.config.pad_token_id == EOS
        for side in ("right", "left"):
            batch = _texts(out, side)
            with torch.no_grad():
                torch.testing.assert_close(
                    fused(**batch).member_logits[:, m], stock(**batch).logits, atol=1e-5, rtol=0
                )
    assert fused.config.kept_heads == MASKS


def test_gpt2_causal_lm_members_train_on_next_tokens(data, tmp_path):
    """A causal LM base: members train on the next-token loss of the text (labels ignored), export as stock
    GPT2LMHeadModel (tied head), fuse into the Hydra causal LM; the logged validation NLL is the exported
    member's own next-token NLL on the validation texts; wte/wpe stay bit-identical."""
    base = save_gpt2(tmp_path / "gpt2lm", head="LMHeadModel")
    out = finetune_members(
        base, data["masks"], data["train"], data["eval"], tmp_path / "out", _config(learning_rate=1e-2)
    )
    fused = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(fused).__name__ == "HydraEnsembleGPT2ForCausalLM"
    base_state = load_file(base / "model.safetensors")
    evaluation = _texts(out, "right")
    import pandas as pd

    texts = pd.read_csv(data["eval"])["text"].tolist()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok.pad_token_id == EOS
    for m in range(2):
        folder = tmp_path / "out.work" / f"member_{m}" / "model"
        info = json.loads((folder / "finetune_member.json").read_text())
        losses = [h["train_loss"] for h in info["history"]]
        assert losses[-1] < losses[0] - 0.05, losses
        assert "eval_accuracy" not in info["history"][0] and info["history"][0]["eval_tokens"] > 0
        weights = load_file(folder / "model.safetensors")
        for key in ("transformer.wte.weight", "transformer.wpe.weight"):
            assert torch.equal(weights[key], base_state[key]), key
        stock = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
        assert stock.lm_head.weight is stock.transformer.wte.weight
        with torch.no_grad():
            valid = evaluation["attention_mask"].bool()
            got = fused(**evaluation).member_logits[:, m]
            torch.testing.assert_close(got[valid], stock(**evaluation).logits[valid], atol=1e-5, rtol=0)
            enc = tok(texts, padding=True, return_tensors="pt")
            labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
            logits = stock(**enc).logits[:, None]  # (B, 1, T, V): one member
            nll_sum, _, tokens = next_token_sums(logits, labels)
        assert info["best_eval_nll"] == pytest.approx(float(nll_sum.sum() / tokens.sum()), abs=1e-5)
        best = info["history"][info["best_epoch"] - 1]
        assert best["eval_nll"] == pytest.approx(info["best_eval_nll"], abs=1e-9)
        assert best["eval_perplexity"] == pytest.approx(math.exp(best["eval_nll"]), rel=1e-9)


def test_decoder_task_follows_the_classes_and_padding_fails_early(data, tmp_path):
    """A causal LM asked for classes is a last-token classifier (new heads), without them a causal LM; a tokenizer
    with neither a pad nor an eos token cannot pad."""
    lm = save_gpt2(tmp_path / "lm", head="LMHeadModel")
    args = (data["masks"], data["train"], None, tmp_path / "o1")
    asked = prepare_run(lm, *args, _config(num_labels=3), None, False, None)
    assert not asked.causal_lm and asked.num_labels == 3 and not asked.base_has_classifier
    named = prepare_run(lm, *args, _config(), None, False, {0: "pos", 1: "neg", 2: "neutral"})
    assert not named.causal_lm and named.num_labels == 3
    assert prepare_run(lm, *args, _config(), None, False, None).causal_lm
    cls = save_llama(tmp_path / "cls")
    config = json.loads((cls / "tokenizer_config.json").read_text())
    config["eos_token"] = None
    (cls / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(HydraInputError, match="neither a pad nor an end-of-sequence token; set tokenizer.pad_token"):
        finetune_members(cls, data["masks"], data["train"], None, tmp_path / "o2", _config())
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


@pytest.mark.parametrize("kind", ["llama-classifier", "gpt2-causal-lm"])
def test_two_processes_match_one_process(kind, data, tmp_path):
    """`accelerate launch --multi_gpu --num_processes 2 -m hydra_hf.cli finetune` (2 gloo ranks) on the GQA Llama
    classifier and on the GPT-2 causal LM takes the same steps as 1 process with the same global batch: every
    weight within 1e-6 of its tensor's scale (measured 1.2e-7 for the LM; before the LM loss was normalised by the
    global batch's tokens, the processes' halves with unequal token counts made it 3.8e-2), the same logged
    losses and validation scores."""
    from hydra_hf.cli import main

    lm = kind == "gpt2-causal-lm"
    base = save_gpt2(tmp_path / "gpt2lm", head="LMHeadModel") if lm else save_llama(tmp_path / "llama")
    flags = ["finetune", "--model", str(base), "--masks", str(data["masks"]), "--train-data", data["train"],
             "--eval-data", data["eval"], "--batch-size", "8", "--eval-batch-size", "8", "--num-epochs", "1",
             "--learning-rate", "3e-3", "--log-every-steps", "1", "--mlp-fusion", "per_member"]
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
              "--main_process_port", str(free_port()), "-m", "hydra_hf.cli"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [*launch, *flags, "--output", str(tmp_path / "two")], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert main([*flags, "--output", str(tmp_path / "one")]) == 0
    a, b = load_file(tmp_path / "one" / "model.safetensors"), load_file(tmp_path / "two" / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert float((b[key] - a[key]).abs().max()) <= 1e-6 * max(float(a[key].abs().max()), 1.0), key
    base_state = load_file(base / "model.safetensors")
    if lm:  # it did train
        member = load_file(tmp_path / "two.work" / "member_0" / "model" / "model.safetensors")
        key = "transformer.h.0.mlp.c_fc.weight"
        assert not torch.allclose(member[key], base_state[key], atol=1e-4)
    else:
        assert not torch.allclose(a["score.weight"][0], base_state["score.weight"], atol=1e-4)
    logs = [
        [json.loads(x) for x in (tmp_path / f"{n}.work" / "log.jsonl").read_text().splitlines()]
        for n in ("one", "two")
    ]
    assert len(logs[0]) == len(logs[1]) == 2
    for x, y in zip(*logs):
        assert x["eval_examples"] == y["eval_examples"] == 9
        if lm:
            assert x["eval_nll"] == pytest.approx(y["eval_nll"], abs=1e-6) and x["eval_tokens"] == y["eval_tokens"]
        else:
            assert x["eval_accuracy"] == y["eval_accuracy"]
        assert x["train_loss"] == pytest.approx(y["train_loss"], abs=1e-6)
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "two").pad_token == "<eos>"


def test_lora_ensemble_of_a_llama_causal_lm_trains_adapters_only_and_saves_stock_causal_lms(data, tmp_path):
    """LoRA on a causal LM (the LoRA-Ensemble of the language-model study): the next-token loss falls, only the
    adapted projections change in the merged stock LlamaForCausalLM (embeddings, k/o projections and MLPs
    bit-identical), the merge equals the unmerged adapter, the members differ by seed, and the validation NLL
    is recorded."""
    base = save_llama(tmp_path / "llama-lm", head="ForCausalLM")
    steps: list[dict] = []
    config = _config(learning_rate=3e-2, num_epochs=2, mlp_fusion="average")
    folders = train_lora_ensemble(base, data["train"], data["eval"], tmp_path / "lora", config, members=2,
                                  r=4, alpha=8, dropout=0.0, target_modules=("q_proj", "v_proj"),
                                  step_callback=steps.append)
    base_state = load_file(base / "model.safetensors")
    states = [load_file(f / "model.safetensors") for f in folders]
    for m, (folder, state) in enumerate(zip(folders, states)):
        assert json.loads((folder / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
        info = json.loads((folder / "lora_member.json").read_text())
        assert info["merge_max_abs_diff"] < 1e-5 and info["best_eval_nll"] > 0 and info["modules_to_save"] == []
        changed = {k for k in base_state if not torch.equal(base_state[k], state[k])}
        assert changed and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in changed)
        losses = [s["loss"] for s in steps if s["tag"] == f"LoRA seed {config.seed + m}"]
        assert len(losses) == 6 and sum(losses[-2:]) < sum(losses[:2])
    assert not torch.equal(states[0]["model.layers.0.self_attn.q_proj.weight"],
                           states[1]["model.layers.0.self_attn.q_proj.weight"])
