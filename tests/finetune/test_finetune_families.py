"""`finetune_members` on a tiny model of every text and image family of the registry: members train,
export as stock checkpoints of their family, and the fused Hydra model reproduces them."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from _family_specs import SPECS, WORDS
from conftest import write_masks

NEW = [s for s in SPECS if s.name != "bert"]  # BERT: tests/finetune/test_finetune.py


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("ftdata")
    g = torch.Generator().manual_seed(0)
    texts = [" ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (5,), generator=g)) for _ in range(24)]
    pd.DataFrame({"text": texts, "label": [i % 3 for i in range(24)]}).to_csv(root / "text.csv", index=False)
    images = root / "images"
    for c in range(3):
        (images / f"c{c}").mkdir(parents=True)
        for i in range(4):
            from PIL import Image

            pixels = (torch.rand(16, 16, 3, generator=g) * 255).to(torch.uint8).numpy()
            Image.fromarray(pixels).save(images / f"c{c}" / f"{i}.png")
    return root


@pytest.mark.parametrize("spec", NEW, ids=[s.name for s in NEW])
def test_family_members_finetune_and_fuse(spec, data, tmp_path):
    from transformers import AutoModelForImageClassification, AutoModelForSequenceClassification

    import hydra_hf  # noqa: F401
    from hydra_hf.finetune import finetune_members, image_recipe, text_recipe

    base = tmp_path / "base"
    spec.stock().save_pretrained(base)
    if spec.text:
        spec.tokenizer().save_pretrained(base)
    else:
        from transformers import ViTImageProcessor

        ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(base)
    masks = write_masks(tmp_path / "masks.json", [[[0, 1], []], [[1, 2, 3], [0]]], 4)  # unequal, a 0-head layer
    recipe = text_recipe if spec.text else image_recipe
    config = recipe(learning_rate=1e-3, batch_size=4, eval_batch_size=4, num_epochs=1, log_every_steps=1,
                    mlp_fusion="per_member", max_length=16)
    train = str(data / "text.csv") if spec.text else str(data / "images")
    out = finetune_members(base, masks, train, None, tmp_path / "out", config)
    auto = AutoModelForSequenceClassification if spec.text else AutoModelForImageClassification
    fused = auto.from_pretrained(out).eval()
    if spec.text:
        from transformers import AutoTokenizer

        batch = dict(
            AutoTokenizer.from_pretrained(base)(["the movie was fun", "awful plot"], padding=True, return_tensors="pt")
        )
    else:
        batch = {"pixel_values": torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))}
    with torch.no_grad():
        member_logits = fused(**batch).member_logits  # (B, M, C)
        for m in range(2):
            stock = auto.from_pretrained(tmp_path / "out.work" / f"member_{m}" / "model").eval()
            torch.testing.assert_close(member_logits[:, m], stock(**batch).logits, atol=1e-5, rtol=1e-5)
    trained = auto.from_pretrained(tmp_path / "out.work" / "member_0" / "model").state_dict()
    original = spec.stock().state_dict()
    assert any(not torch.equal(trained[k], original[k]) for k in original if k in trained), "nothing was trained"


def test_distilled_deit_members_finetune_with_both_heads(data, tmp_path):
    """A DeiTForImageClassificationWithTeacher base (``cls_classifier`` + ``distillation_classifier``): its
    trained heads are kept (not a bare encoder) and every member exports as the same architecture (the
    export used DeiTForImageClassification and crashed after member 0, issue 24 item 6)."""
    from transformers import DeiTForImageClassificationWithTeacher, ViTImageProcessor

    from hydra_hf.finetune import finetune_members, image_recipe
    from hydra_hf.finetune import prepare_run as _prepare_run

    spec = next(s for s in SPECS if s.name == "deit")
    base = tmp_path / "base"
    torch.manual_seed(0)
    DeiTForImageClassificationWithTeacher(spec.stock_config()).save_pretrained(base)
    ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(base)
    masks = write_masks(tmp_path / "masks.json", [[[0, 1], []], [[1, 2, 3], [0]]], 4)
    config = image_recipe(learning_rate=1e-3, batch_size=4, eval_batch_size=4, num_epochs=1, log_every_steps=1,
                          mlp_fusion="per_member")
    run = _prepare_run(base, masks, str(data / "images"), None, tmp_path / "check", config, None, False, None)
    assert run.base_has_classifier
    out = finetune_members(base, masks, str(data / "images"), None, tmp_path / "out", config)
    from transformers import AutoModelForImageClassification

    fused = AutoModelForImageClassification.from_pretrained(out).eval()
    assert fused.config.distilled
    batch = {"pixel_values": torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))}
    with torch.no_grad():
        member_logits = fused(**batch).member_logits  # (B, M, C)
        for m in range(2):
            stock = DeiTForImageClassificationWithTeacher.from_pretrained(
                tmp_path / "out.work" / f"member_{m}" / "model"
            )
            torch.testing.assert_close(member_logits[:, m], stock.eval()(**batch).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["roberta", "electra"])
def test_a_text_classifier_checkpoint_keeps_its_head(name, data, tmp_path):
    """RoBERTa / ELECTRA name their classifier ``classifier.dense`` / ``classifier.out_proj``: the
    checkpoint's trained head is found (it was taken for a bare encoder: "bare encoder: N classes")."""
    from hydra_hf.finetune import prepare_run as _prepare_run
    from hydra_hf.finetune import text_recipe

    spec = next(s for s in SPECS if s.name == name)
    base = tmp_path / "base"
    spec.stock().save_pretrained(base)
    spec.tokenizer().save_pretrained(base)
    masks = write_masks(tmp_path / "masks.json", [[[0, 1], [2]], [[3], [0, 1]]], 4)
    run = _prepare_run(
        base, masks, str(data / "text.csv"), None, tmp_path / "out", text_recipe(batch_size=4), None, False, None
    )
    assert run.base_has_classifier and run.num_labels == 3
