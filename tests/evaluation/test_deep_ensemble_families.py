"""Deep Ensembles (D) (``hydra-hf evaluate --deep-ensemble NAME``) on every classifier family: new heads are
trained on the features each family feeds its own classification layer (a decoder's last non-padding token).

Numbers: heads that are copies of the model's classification layer give the model's own logits, to 1e-5, for
every encoder and vision family and the Llama / GPT-2 classifiers; the command runs on RoBERTa end to end and
refuses a Hydra folder in one line before loading anything.
"""

from __future__ import annotations

import pytest
import torch
from _family_specs import SPECS, inputs
from _hostile import assert_one_line_error, run_cli
from _tiny_decoders import save_gpt2, save_llama, write_data, write_masks
from torch import nn
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from hydra_hf.assemble import convert_checkpoint
from hydra_hf.evaluation import HeadsEnsemblePredictor, classifier_layer

ATOL = 1e-5


def _decoder(name: str, tmp_path) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    folder = (save_llama if name == "llama" else save_gpt2)(tmp_path / name, pad=True)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    batch = tokenizer(["the movie was good", "bad", "a plot it was fun boring"], padding=True, return_tensors="pt")
    return model, dict(batch)


@pytest.mark.parametrize("name", [s.name for s in SPECS] + ["llama", "gpt2"])
def test_heads_copied_from_the_classifier_give_the_models_logits(name, tmp_path):
    if name in ("llama", "gpt2"):
        model, batch = _decoder(name, tmp_path)
    else:
        spec = next(s for s in SPECS if s.name == name)
        model = spec.stock()
        batch = inputs(spec, model)
    layer = classifier_layer(model)
    heads = nn.ModuleList()
    for scale in (0.0, 0.5):  # the classifier itself, then one that differs
        head = nn.Linear(layer.in_features, layer.out_features)
        with torch.no_grad():
            head.weight.copy_(layer.weight * (1 + scale))
            head.bias.copy_(layer.bias if layer.bias is not None else torch.zeros(layer.out_features))
        heads.append(head)
    with torch.no_grad():
        member_logits = HeadsEnsemblePredictor(model, heads).member_logits(batch)  # (B, 2, C)
        logits = model(**batch).logits
    torch.testing.assert_close(member_logits[:, 0], logits, atol=ATOL, rtol=0)
    assert (member_logits[:, 1] - logits).abs().max() > 1e-3


def test_evaluate_deep_ensemble_on_roberta_and_refusals(tmp_path):
    spec = next(s for s in SPECS if s.name == "roberta")
    spec.stock().save_pretrained(tmp_path / "roberta")
    spec.tokenizer().save_pretrained(tmp_path / "roberta")
    train, evaluation = write_data(tmp_path)
    code, out, err = run_cli(["evaluate", "--model", str(tmp_path / "roberta"), "--name", "Single", "--deep-ensemble",
                              "Single", "--train-data", train, "--id-data", evaluation, "--ood-data", train,
                              "--bootstrap", "0", "--report", str(tmp_path / "report")])
    assert code == 0, err
    assert "Deep Ensembles (D)" in (tmp_path / "report" / "report.md").read_text()
    # a Hydra folder as NAME: one line, before any model is loaded
    base = save_llama(tmp_path / "llama", pad=True)
    convert_checkpoint(write_masks(tmp_path / "masks.json"), base=base, output_dir=tmp_path / "hydra")
    code, _, err = run_cli(["evaluate", "--model", str(tmp_path / "hydra"), "--deep-ensemble", "Hydra", "--train-data",
                            train, "--id-data", evaluation, "--ood-data", train, "--report", str(tmp_path / "r2")])
    assert code == 2 and "is a Hydra Ensemble" in assert_one_line_error(err) and "Loading" not in err
    assert not (tmp_path / "r2").exists()
