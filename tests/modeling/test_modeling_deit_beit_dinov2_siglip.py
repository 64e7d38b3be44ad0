"""The vision and two-tower families DeiT, BEiT, DINOv2 and SigLIP against their references: the stock
transformers model with each member's removed heads zeroed in W_O (out_proj), per tower. Numbers, not
shapes: logits (eager and SDPA), gradients, unfused stock members, a fresh process without hydra_hf
(remote code) and the pipelines."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from conftest import run_fresh_python, write_tiny_tokenizer
from transformers import (
    BeitConfig,
    BeitForImageClassification,
    BeitImageProcessor,
    DeiTConfig,
    DeiTForImageClassification,
    DeiTForImageClassificationWithTeacher,
    DeiTImageProcessor,
    Dinov2Config,
    Dinov2ForImageClassification,
    Dinov2WithRegistersConfig,
    Dinov2WithRegistersForImageClassification,
    SiglipConfig,
    SiglipImageProcessor,
    SiglipModel,
)

from hydra_hf.assemble import convert_checkpoint
from hydra_hf.families import get_family
from hydra_hf.masks import HeadMasks
from hydra_hf.pruning.gates import zero_head_columns_

ATOL = 1e-5
H, DK, SIZE = 4, 8, 32
VISION = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=H, image_size=SIZE, patch_size=8, num_labels=3,
              id2label={0: "cat", 1: "dog", 2: "bird"})
UNEQUAL = [[[0, 1], [2, 3]], [[1, 2, 3], []], [[0], [0, 1, 2, 3]]]  # member 1 keeps no head in layer 1
UNIFORM = [[[0, 1], [2, 3]], [[1, 3], [0, 1]]]  # equal widths: members folded into the attention batch
ALL = [[[0, 1, 2, 3]] * 2] * 2
TEXT_UNEQUAL = [[[0, 1], []], [[3], [0, 1]], [[0, 2], [1, 2, 3]]]


@dataclass(frozen=True)
class Variant:
    """One stock checkpoint kind: its family, how to build it and its image processor, and parameters
    whose gradients are compared (fused name, stock name, kind)."""

    family: str
    make: Callable[[], Any]
    processor: Callable[[], Any]
    probes: tuple[tuple[str, str, str], ...]
    shared_prefixes: tuple[str, ...]  # stock parameter names members share (kept equal across members)


def _deit(cls):
    return lambda: cls(DeiTConfig(**VISION, intermediate_size=64))


def _beit(**kw):
    return lambda: BeitForImageClassification(BeitConfig(**VISION, intermediate_size=64, **kw))


def _dinov2(registers: bool = False, **kw):
    if registers:
        return lambda: Dinov2WithRegistersForImageClassification(
            Dinov2WithRegistersConfig(**VISION, mlp_ratio=2, num_register_tokens=2, **kw))
    return lambda: Dinov2ForImageClassification(Dinov2Config(**VISION, mlp_ratio=2, **kw))


def _siglip():
    return SiglipModel(SiglipConfig(
        text_config=dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=H,
                         intermediate_size=64, max_position_embeddings=64),
        vision_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=H, intermediate_size=64,
                           image_size=SIZE, patch_size=8),
    ))


def _size_processor(cls):
    return lambda: cls(size={"height": SIZE, "width": SIZE}, do_center_crop=False) if cls is not SiglipImageProcessor \
        else cls(size={"height": SIZE, "width": SIZE})


EMB = ("embeddings.",)
VARIANTS = {
    "deit": Variant(
        "deit",
        _deit(DeiTForImageClassification),
        _size_processor(DeiTImageProcessor),
        (
            ("classifier.weight", "classifier.weight", "member"),
            ("hydra.layernorm.weight", "deit.layernorm.weight", "member"),
            (
                "hydra.embeddings.patch_embeddings.projection.weight",
                "deit.embeddings.patch_embeddings.projection.weight",
                "shared",
            ),
            ("hydra.embeddings.distillation_token", "deit.embeddings.distillation_token", "shared"),
            ("hydra.layers.0.attention.o_weight", "deit.layers.0.attention.o_proj.weight", "o_rows"),
        ),
        EMB,
    ),
    "deit_distilled": Variant(
        "deit",
        _deit(DeiTForImageClassificationWithTeacher),
        _size_processor(DeiTImageProcessor),
        (
            ("cls_classifier.weight", "cls_classifier.weight", "member"),
            ("distillation_classifier.weight", "distillation_classifier.weight", "member"),
            ("hydra.embeddings.distillation_token", "deit.embeddings.distillation_token", "shared"),
        ),
        EMB,
    ),
    "beit": Variant(
        "beit",
        _beit(
            use_relative_position_bias=True,
            use_shared_relative_position_bias=True,
            use_absolute_position_embeddings=True,
            layer_scale_init_value=0.5,
        ),
        _size_processor(BeitImageProcessor),
        (
            ("hydra.layers.1.lambda_1", "beit.layers.1.lambda_1", "member"),
            ("hydra.pooler_layernorm.weight", "beit.pooler.layernorm.weight", "member"),
            (
                "hydra.shared_relative_position_bias_table",
                "beit.shared_position_bias.relative_position_bias_table",
                "member",
            ),
            (
                "hydra.layers.0.relative_position_bias_table",
                "beit.layers.0.relative_position_bias.relative_position_bias_table",
                "columns",
            ),
            ("hydra.layers.0.attention.o_weight", "beit.layers.0.attention.o_proj.weight", "o_rows"),
        ),
        EMB,
    ),
    "beit_cls": Variant(
        "beit",
        _beit(use_relative_position_bias=True, use_mean_pooling=False, layer_scale_init_value=0.0),
        _size_processor(BeitImageProcessor),
        (("hydra.layernorm.weight", "beit.layernorm.weight", "member"),),
        EMB,
    ),
    "dinov2": Variant(
        "dinov2",
        _dinov2(),
        _size_processor(DeiTImageProcessor),
        (
            ("hydra.layers.0.lambda_2", "dinov2.encoder.layer.0.layer_scale2.lambda1", "member"),
            ("classifier.weight", "classifier.weight", "member"),
            ("hydra.embeddings.cls_token", "dinov2.embeddings.cls_token", "shared"),
        ),
        EMB,
    ),
    "dinov2_swiglu": Variant(
        "dinov2",
        _dinov2(use_swiglu_ffn=True),
        _size_processor(DeiTImageProcessor),
        (("hydra.layers.1.lambda_1", "dinov2.encoder.layer.1.layer_scale1.lambda1", "member"),),
        EMB,
    ),
    "dinov2_registers": Variant(
        "dinov2",
        _dinov2(registers=True),
        _size_processor(DeiTImageProcessor),
        (
            ("hydra.embeddings.register_tokens", "dinov2_with_registers.embeddings.register_tokens", "shared"),
            ("classifier.weight", "classifier.weight", "member"),
        ),
        EMB,
    ),
    "siglip": Variant(
        "siglip",
        _siglip,
        _size_processor(SiglipImageProcessor),
        (
            ("logit_bias", "logit_bias", "member"),
            ("vision_model.head.probe", "vision_model.head.probe", "member"),
            ("vision_model.head.in_proj_weight", "vision_model.head.attention.in_proj_weight", "member"),
            ("text_model.head.weight", "text_model.head.weight", "member"),
            ("text_model.embeddings.token_embedding.weight", "text_model.embeddings.token_embedding.weight", "shared"),
            (
                "vision_model.layers.1.attention.o_weight",
                "vision_model.encoder.layers.1.self_attn.out_proj.weight",
                "o_rows",
            ),
        ),
        EMB,
    ),
}
IMAGE_VARIANTS = [v for v in VARIANTS if v != "siglip"]


def perturb(model, seed: int, scale: float = 0.1, skip: tuple[str, ...] = ()):
    """Random offsets on every parameter (stock inits leave tokens, tables and biases at zero), except
    those whose name contains one of ``skip``."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not any(s in name for s in skip):
                p.add_(scale * torch.randn(p.shape, generator=g))
    return model.eval()


def stock(variant: str, seed: int = 0):
    torch.manual_seed(seed)
    model = perturb(VARIANTS[variant].make(), seed)
    if variant == "siglip":
        with torch.no_grad():  # sharper members, so that their sigmoids differ visibly
            model.logit_scale.fill_(2.0)
    return model


def save_stock(model, folder: Path, variant: str) -> Path:
    model.save_pretrained(folder)
    VARIANTS[variant].processor().save_pretrained(folder)
    if variant == "siglip":
        write_tiny_tokenizer(folder)
    return folder


def masks_for(variant: str, kept) -> HeadMasks:
    if variant != "siglip":
        return HeadMasks(kept_heads=kept, num_heads=H)
    text = TEXT_UNEQUAL if kept is UNEQUAL else kept
    return HeadMasks(
        towers={"vision": HeadMasks(kept_heads=kept, num_heads=H), "text": HeadMasks(kept_heads=text, num_heads=H)}
    )


def kept_per_tower(variant: str, masks) -> list[dict[str, list[list[int]]]]:
    """``out[m][tower]`` = member m's kept heads per layer."""
    names = masks.tower_names if masks.named else ["vision"]  # one-tower masks: the vision tower
    return [{t: masks.tower(t).kept_heads[m] for t in names} for m in range(masks.num_members)]


def zeroed(model, variant: str, kept: dict[str, list[list[int]]]):
    """The reference: a copy of the stock model with every removed head's W_O columns zeroed (through the
    family's pruning adapter, which is tested with it)."""
    ref = copy.deepcopy(model)
    gates = {}
    for tower, layers in kept.items():
        gates[tower] = torch.zeros(len(layers), H)
        for layer, heads in enumerate(layers):
            gates[tower][layer, heads] = 1.0
    zero_head_columns_(ref, gates, adapter=get_family(VARIANTS[variant].family).adapter(ref))
    return ref.eval()


INPUTS = {
    "pixel_values": torch.randn(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(5)),
    "input_ids": torch.randint(5, 99, (3, 10), generator=torch.Generator().manual_seed(6)),
    "attention_mask": torch.tensor([[1] * 10, [1] * 6 + [0] * 4, [1] * 8 + [0] * 2]),
}


def run(model, variant: str):
    """``(member logits, ensemble logits)``: ``(B, M, C)`` / ``(B, C)`` (SigLIP: per image, over the texts)."""
    if variant == "siglip":
        out = model(**INPUTS)
        return out.member_logits_per_image, out.logits_per_image
    out = model(INPUTS["pixel_values"])
    return out.member_logits, out.logits


def stock_logits(model, variant: str) -> torch.Tensor:
    if variant == "siglip":
        return model(**INPUTS).logits_per_image
    return model(INPUTS["pixel_values"]).logits


def expected_ensemble(variant: str, member_logits: torch.Tensor) -> torch.Tensor:
    """What the stock pipeline's scores must be: the mean of the members' probabilities, as the stock
    model's pipeline computes them (sigmoid for SigLIP, softmax otherwise)."""
    if variant == "siglip":
        return torch.sigmoid(member_logits).mean(1)
    return torch.softmax(member_logits, -1).mean(1)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """These models are tiny: one thread avoids threading overhead (and contention on a shared machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("stock")
    return {v: save_stock(stock(v), root / v, v) for v in VARIANTS}


# --------------------------------------------------------------------------------- equivalence
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("kept", [ALL, UNEQUAL, UNIFORM], ids=["all-heads", "unequal", "uniform"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fused_equals_stock_with_removed_heads_zeroed(folders, variant, kept, attn):
    base = stock(variant)
    base.set_attn_implementation(attn)
    masks = masks_for(variant, kept)
    model = convert_checkpoint(masks, base=folders[variant])
    model.set_attn_implementation(attn)
    with torch.no_grad():
        member_logits, logits = run(model, variant)
        ref = torch.stack([stock_logits(zeroed(base, variant, k), variant) for k in kept_per_tower(variant, masks)], 1)
    torch.testing.assert_close(member_logits, ref, atol=ATOL, rtol=0)
    probs = torch.sigmoid(logits) if variant == "siglip" else torch.softmax(logits, -1)
    torch.testing.assert_close(probs, expected_ensemble(variant, ref), atol=ATOL, rtol=0)
    if kept is ALL:  # every member is the stock model itself
        torch.testing.assert_close(ref[:, 0], stock_logits(base, variant), atol=ATOL, rtol=0)
    else:  # the masks really mask something, and the members really differ
        assert (ref[:, 0] - ref[:, 1]).abs().max() > 1e-3
        with torch.no_grad():
            assert (ref[:, 0] - stock_logits(base, variant)).abs().max() > 1e-3


def distinct_members(variant: str, folder: Path, n: int = 3) -> tuple[list[Any], list[Path]]:
    """n members 'fine-tuned separately' from one base: everything but the shared embeddings differs."""
    base = stock(variant)
    members = [perturb(copy.deepcopy(base), seed, 0.05, VARIANTS[variant].shared_prefixes) for seed in range(1, n + 1)]
    return members, [save_stock(m, folder / f"member{i}", variant) for i, m in enumerate(members)]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_members_from_separate_checkpoints(tmp_path, variant):
    """Per-member parts (layer scales, bias tables, pooling heads, classifiers, logit scale/bias) come from
    each member's own checkpoint; per-member MLPs are exact; unfused members reload as stock models."""
    members, dirs = distinct_members(variant, tmp_path)
    masks = masks_for(variant, UNEQUAL)
    model = convert_checkpoint(masks, members=dirs, mlp_fusion="per_member")
    kept = kept_per_tower(variant, masks)
    with torch.no_grad():
        member_logits, _ = run(model, variant)
        refs = [zeroed(m, variant, k) for m, k in zip(members, kept)]
        ref = torch.stack([stock_logits(r, variant) for r in refs], 1)
    torch.testing.assert_close(member_logits, ref, atol=ATOL, rtol=0)
    family = get_family(model.config.base_model_type)
    extra = {"distilled": model.config.distilled} if family.name == "deit" else {}
    assert type(family.stock_model(model.config.base_config, **extra)) is type(members[0])
    for m, sd in enumerate(family.unfuse(model.state_dict(), model.config)):
        reloaded = copy.deepcopy(members[0])
        reloaded.load_state_dict(sd, strict=True)  # the installed transformers' module names
        with torch.no_grad():
            torch.testing.assert_close(stock_logits(reloaded, variant), member_logits[:, m], atol=ATOL, rtol=0)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_gradients_equal_the_references(folders, variant):
    """loss = mean over members of each member's loss; so d loss / d (member m's part) = d loss_m / d
    (its stock counterpart) / M, and a shared part gets the mean over the members."""
    base = stock(variant)
    masks = masks_for(variant, UNEQUAL)
    kept = kept_per_tower(variant, masks)
    model = convert_checkpoint(masks, base=folders[variant], mlp_fusion="per_member")
    M = masks.num_members
    if variant == "siglip":
        inputs = {**INPUTS, "input_ids": INPUTS["input_ids"][:2], "attention_mask": INPUTS["attention_mask"][:2]}
        loss_of = lambda m: m(**inputs, return_loss=True).loss  # noqa: E731
    else:
        labels = torch.tensor([0, 2])
        loss_of = lambda m: torch.nn.functional.cross_entropy(stock_logits(m, variant), labels)  # noqa: E731
        inputs = None
    loss = model(**inputs, return_loss=True).loss if inputs else model(INPUTS["pixel_values"], labels=labels).loss
    loss.backward()
    refs = [zeroed(base, variant, k) for k in kept]
    for r in refs:
        loss_of(r).backward()
    checked = 0
    for fused_name, stock_name, kind in VARIANTS[variant].probes:
        grad = model.get_parameter(fused_name).grad
        ref_grads = [r.get_parameter(stock_name).grad for r in refs]
        if kind == "shared":
            torch.testing.assert_close(grad, sum(ref_grads) / M, atol=ATOL, rtol=0)
        elif kind == "member":
            for m in range(M):
                torch.testing.assert_close(grad[m].reshape(ref_grads[m].shape), ref_grads[m] / M, atol=ATOL, rtol=0)
        else:  # per kept head: BEiT's bias table columns ("columns") or W_O's column blocks ("o_rows", transposed)
            tower = "text" if fused_name.startswith("text_model") else "vision"
            layer = int(fused_name.split(".layers.")[1].split(".")[0])
            offset = 0
            for m in range(M):
                heads = kept[m][tower][layer]
                if kind == "columns":
                    torch.testing.assert_close(
                        grad[:, offset : offset + len(heads)], ref_grads[m][:, heads] / M, atol=ATOL, rtol=0
                    )
                else:
                    cols = (
                        torch.cat([torch.arange(h * DK, (h + 1) * DK) for h in heads])
                        if heads
                        else torch.zeros(0, dtype=torch.long)
                    )
                    torch.testing.assert_close(
                        grad[offset * DK : (offset + len(heads)) * DK], ref_grads[m][:, cols].T / M, atol=ATOL, rtol=0
                    )
                offset += len(heads)
        assert grad.abs().sum() > 0, fused_name
        checked += 1
    assert checked == len(VARIANTS[variant].probes)


@pytest.mark.parametrize("variant", ["deit", "beit", "beit_cls", "dinov2_registers", "siglip"])
def test_other_image_sizes_match_the_stock_model(folders, variant):
    """48x48 images for a 32x32 base: the position embeddings (and BEiT's bias tables) are resized exactly
    as the stock model resizes them (``interpolate_pos_encoding``; DINOv2 always interpolates)."""
    base = stock(variant)
    masks = masks_for(variant, UNEQUAL)
    model = convert_checkpoint(masks, base=folders[variant])
    x = torch.randn(2, 3, 48, 48, generator=torch.Generator().manual_seed(7))
    kwargs = {} if variant.startswith("dinov2") else {"interpolate_pos_encoding": True}
    if variant == "siglip":
        kwargs.update(input_ids=INPUTS["input_ids"], attention_mask=INPUTS["attention_mask"])
    refs = [zeroed(base, variant, k) for k in kept_per_tower(variant, masks)]
    with torch.no_grad():
        if variant == "siglip":
            ref = torch.stack([r(pixel_values=x, **kwargs).logits_per_image for r in refs], 1)
            out = model(pixel_values=x, **kwargs).member_logits_per_image
        else:
            ref = torch.stack([r(x, **kwargs).logits for r in refs], 1)
            out = model(x, **kwargs).member_logits
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=0)


def test_beit_bias_and_layer_scale_matter(folders):
    """The relative position bias and the layer scale are really used (zeroing them changes the logits)."""
    model = convert_checkpoint(masks_for("beit", UNEQUAL), base=folders["beit"])
    with torch.no_grad():
        before = run(model, "beit")[0]
        model.hydra.shared_relative_position_bias_table.zero_()
        after_shared = run(model, "beit")[0]
        model.hydra.layers[0].relative_position_bias_table.zero_()
        after_layer = run(model, "beit")[0]
        model.hydra.layers[1].lambda_1.fill_(1.0)
        after_scale = run(model, "beit")[0]
    for a, b in ((before, after_shared), (after_shared, after_layer), (after_layer, after_scale)):
        assert (a - b).abs().max() > 1e-4


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: __import__("transformers").DeiTForMaskedImageModeling(DeiTConfig(**VISION, intermediate_size=64)),
            "is a DeiTForMaskedImageModeling checkpoint",
        ),
        (
            lambda: __import__("transformers").BeitForMaskedImageModeling(BeitConfig(**VISION, intermediate_size=64)),
            "is a BeitForMaskedImageModeling checkpoint",
        ),
        (
            lambda: __import__("transformers").SiglipForImageClassification(_siglip().config),
            "is a SiglipForImageClassification",
        ),
    ],
    ids=["deit-mim", "beit-mim", "siglip-classifier"],
)
def test_other_task_heads_are_refused_in_one_line(tmp_path, capsys, make, message):
    from hydra_hf.cli import main

    make().save_pretrained(tmp_path / "base")
    masks = HeadMasks(kept_heads=UNIFORM, num_heads=H)
    masks.save(tmp_path / "m.json")
    capsys.readouterr()  # the progress bar of save_pretrained
    assert (
        main(
            [
                "convert",
                "--base",
                str(tmp_path / "base"),
                "--masks",
                str(tmp_path / "m.json"),
                "--output",
                str(tmp_path / "out"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "out").exists()


def test_reader_names_unknown_tensors(tmp_path):
    from transformers import DeiTForMaskedImageModeling

    from hydra_hf.convert.hf_deit import deit_member_from_state_dict
    from hydra_hf.convert.io import read_state_dict

    folder = tmp_path / "mim"
    DeiTForMaskedImageModeling(DeiTConfig(**VISION, intermediate_size=64)).save_pretrained(folder)
    with pytest.raises(ValueError, match=r"tensors this DeiT layout does not know: decoder\."):
        deit_member_from_state_dict(read_state_dict(folder), DeiTConfig(**VISION).to_dict())


@pytest.mark.parametrize("name", ["deit", "beit", "dinov2"])
def test_bare_encoders_get_new_classifiers(tmp_path, name):
    """A bare encoder (``DeiTModel``...) converts with new per-member classifiers; its encoder is the stock one."""
    from transformers import BeitModel, DeiTModel, Dinov2Model

    cls, config = {"deit": (DeiTModel, DeiTConfig(**VISION, intermediate_size=64)),
                   "beit": (BeitModel, BeitConfig(**VISION, intermediate_size=64, use_relative_position_bias=True)),
                   "dinov2": (Dinov2Model, Dinov2Config(**VISION, mlp_ratio=2))}[name]
    torch.manual_seed(0)
    encoder = perturb(cls(config), 0)
    encoder.save_pretrained(tmp_path / "enc")
    model = convert_checkpoint(HeadMasks(kept_heads=ALL, num_heads=H), base=tmp_path / "enc", num_labels=5, seed=1)
    assert model.config.num_labels == 5 and model.get_parameter("classifier.weight").shape[:2] == (2, 5)
    with torch.no_grad():
        ours = model.hydra(INPUTS["pixel_values"])
        theirs = encoder(INPUTS["pixel_values"])
    torch.testing.assert_close(ours.member_last_hidden_state[:, 1], theirs.last_hidden_state, atol=ATOL, rtol=0)


# ------------------------------------------------------------------ CLI, remote code, pipelines, pruning
def image_folder(root: Path, classes: list[str], per_class: int, seed: int) -> Path:
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray((torch.rand(SIZE, SIZE, 3, generator=g) * 255).to(torch.uint8).numpy()).save(
                root / c / f"{i}.png"
            )
    return root


FRESH = """
import json, torch
torch.set_num_threads(1)  # tiny models
from PIL import Image
from transformers import pipeline
jobs = json.loads(JOBS)
inputs = torch.load(INPUTS_FILE)
out = {}
for name, job in jobs.items():
    pipe = pipeline(job["task"], model=job["folder"], trust_remote_code=True)
    model = pipe.model  # loaded by the task's Auto class from the folder's auto_map
    assert type(model).__name__ == job["cls"], type(model)
    assert type(model).__module__.startswith("transformers_modules"), type(model)
    with torch.no_grad():
        if job["task"] == "zero-shot-image-classification":
            logits = model(**inputs).logits_per_image
        else:
            logits = model(inputs["pixel_values"]).logits
    image = Image.open(job["image"])
    if job["task"] == "zero-shot-image-classification":
        result = pipe(image, candidate_labels=["cat", "dog", "bird"])
    else:
        result = pipe(image, top_k=None)
    out[name] = {"logits": logits.tolist(), "pipeline": {r["label"]: r["score"] for r in result}}
print(json.dumps(out))
"""


def test_cli_convert_remote_code_and_pipelines(folders, tmp_path):
    """Every variant through `hydra-hf convert` (registry: detect, build, export with auto_map and the shipped
    files), then ONE fresh process without hydra_hf: remote-code logits equal the in-process model's, and the
    stock pipeline's scores equal the mean of the members' probabilities as the stock model's pipeline
    computes them (softmax; SigLIP: sigmoid)."""
    from PIL import Image
    from transformers import AutoImageProcessor, AutoTokenizer

    from hydra_hf.cli import main

    image_file = tmp_path / "image.png"
    Image.fromarray(
        (torch.rand(40, 40, 3, generator=torch.Generator().manual_seed(9)) * 255).to(torch.uint8).numpy()
    ).save(image_file)
    torch.save(INPUTS, tmp_path / "inputs.pt")
    jobs, expected = {}, {}
    for variant in VARIANTS:
        masks = masks_for(variant, UNEQUAL)
        masks_file = tmp_path / f"{variant}.json"
        masks.save(masks_file)
        out = tmp_path / f"hydra-{variant}"
        assert (
            main(["convert", "--base", str(folders[variant]), "--masks", str(masks_file), "--output", str(out)]) == 0
        )
        family = get_family(VARIANTS[variant].family)
        assert set(family.shipped_files) <= {p.name for p in out.iterdir()}
        assert not any(
            f.startswith("modeling_hydra_") and f != family.modeling_file for f in (p.name for p in out.iterdir())
        )
        config = json.loads((out / "config.json").read_text())
        assert config["auto_map"] == family.auto_map
        assert bool(config.get("custom_pipelines")) is family.uncertainty_pipelines
        cls = family.model_class_names[family.task_auto_class]
        jobs[variant] = {"folder": str(out), "cls": cls, "task": family.task, "image": str(image_file)}
        model = convert_checkpoint(masks, base=folders[variant])
        base = stock(variant)
        refs = [zeroed(base, variant, k) for k in kept_per_tower(variant, masks)]
        processor = AutoImageProcessor.from_pretrained(out)
        pixel_values = processor(Image.open(image_file), return_tensors="pt")["pixel_values"]
        with torch.no_grad():
            logits = run(model, variant)[1]
            if variant == "siglip":
                prompts = [f"This is a photo of {c}." for c in ("cat", "dog", "bird")]
                text = dict(
                    AutoTokenizer.from_pretrained(out)(
                        prompts, return_tensors="pt", padding="max_length", max_length=64, truncation=True
                    )
                )
                text.pop("token_type_ids", None)
                member = torch.stack([r(pixel_values=pixel_values, **text).logits_per_image for r in refs], 1)
                names = ["cat", "dog", "bird"]
            else:
                member = torch.stack([r(pixel_values).logits for r in refs], 1)
                names = [base.config.id2label[i] for i in range(3)]
        mean = expected_ensemble(variant, member)[0]
        expected[variant] = (logits, dict(zip(names, mean.tolist())))
    code = FRESH.replace("INPUTS_FILE", repr(str(tmp_path / "inputs.pt"))).replace("JOBS", repr(json.dumps(jobs)))
    results = json.loads(run_fresh_python(code).strip().splitlines()[-1])
    for variant, (logits, scores) in expected.items():
        torch.testing.assert_close(torch.tensor(results[variant]["logits"]), logits, atol=ATOL, rtol=0)
        got = results[variant]["pipeline"]
        assert set(got) == set(scores), (variant, got)
        for label, score in scores.items():
            assert abs(got[label] - score) <= ATOL, (variant, label, got[label], score)


@pytest.mark.parametrize("family", ["deit", "beit", "dinov2", "siglip"])
def test_prune_taylor_and_circuits_then_convert(folders, tmp_path, family):
    """`hydra-hf prune --method taylor,circuit-avg` on a tiny model of the family (the registry's adapter:
    gates on W_O), then `hydra-hf convert` of the masks it wrote."""
    from hydra_hf.cli import main
    from hydra_hf.masks import load_masks

    variant = {"deit": "deit_distilled", "beit": "beit", "dinov2": "dinov2_registers", "siglip": "siglip"}[family]
    id_dir = image_folder(tmp_path / "id", ["bird", "cat", "dog"], 3, 0)
    ood_dir = image_folder(tmp_path / "ood", ["x"], 4, 1)
    out = tmp_path / "masks.json"
    extra = ["--class-names", "cat,dog,bird"] if family == "siglip" else []
    rc = main(["prune", "--model", str(folders[variant]), "--id-data", str(id_dir), "--ood-data", str(ood_dir),
               "--method", "taylor,circuit-avg", "--members", "2", "--remove", "3", "--heads-per-step", "3",
               "--batch-size", "8", "--no-progress", "--output", str(out), *extra])
    assert rc == 0
    masks = load_masks(out)
    assert [m["method"] for m in masks.member_metadata] == ["taylor", "circuit-avg"]
    if family == "siglip":
        assert set(masks.towers) == {"vision", "text"}
        assert all(masks.towers["vision"].num_kept(m) + masks.towers["text"].num_kept(m) == 16 - 3 for m in range(2))
    else:
        assert all(sum(len(h) for h in kept) == 8 - 3 for kept in masks.kept_heads)
    converted = tmp_path / "hydra"
    assert main(["convert", "--base", str(folders[variant]), "--masks", str(out), "--output", str(converted)]) == 0
    config = json.loads((converted / "config.json").read_text())
    assert config["base_model_type"] in (family, "dinov2_with_registers")


def test_members_with_different_heads_are_refused(folders):
    with pytest.raises(
        ValueError, match=r"members differ in \['classifier.bias', 'classifier.weight', 'cls_classifier"
    ):
        convert_checkpoint(
            masks_for("deit", UNEQUAL), members=[folders["deit"], folders["deit_distilled"], folders["deit"]]
        )
