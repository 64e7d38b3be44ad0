"""Conformance with what transformers' own common model tests (``ModelTesterMixin``) check, written for
this project and run for EVERY registered family (``_family_specs.SPECS``) in three layouts:

- ``unequal``: 3 members keeping 2/4, 3/0 and 1/4 heads (member 1 keeps no head in layer 1), per-member MLPs;
- ``uniform``: 2 members keeping 2 heads in every layer (the members are folded into the batch axis);
- ``single``: 1 member keeping every head;
- ``slim``: the ``unequal`` heads, and members that keep unequal subsets of every layer's MLP neurons too (one
  keeps none in layer 0), slices of the averaged MLP.

Checks (numbers, fp32, atol 1e-5): the config reads and writes the base model's settings through
(attribute access, ``get_text_config()``, ``from_pretrained(**overrides)``), save/load round trips
(also after ``resize_token_embeddings``), init on the meta device, eager vs sdpa, padding and batching
equivalence, ``return_dict=False`` tuples vs outputs, gradients reaching the returned hidden states and
attention maps (and only the slots of their member), gradient checkpointing by recomputation count,
``torch.export`` and dtype / device_map loading.

Cost: models are tiny and converted once per (family, layout); ``torch.export`` (0.3-0.8 s a model)
runs on the ``unequal`` layout only, the one with every code path (unequal widths, a 0-head member layer).
"""

from __future__ import annotations

import copy
import json
import warnings

import pytest
import torch
from _family_specs import SPECS, FamilySpec, inputs
from torch import nn
from transformers import AutoConfig, PreTrainedConfig
from transformers.modeling_layers import GradientCheckpointingLayer

from hydra_hf.assemble import convert_checkpoint
from hydra_hf.families import get_family
from hydra_hf.masks import HeadMasks
from hydra_hf.pruning.neurons import mlp_shapes

ATOL = 1e-5
H = 4
LAYOUTS = {
    "unequal": [[[0, 1], [2, 3]], [[1, 2, 3], []], [[0], [0, 1, 2, 3]]],
    "uniform": [[[0, 1], [1, 2]], [[2, 3], [0, 3]]],
    "single": [[[0, 1, 2, 3], [0, 1, 2, 3]]],
    "slim": [[[0, 1], [2, 3]], [[1, 2, 3], []], [[0], [0, 1, 2, 3]]],
}
CASES = [pytest.param(spec, layout, id=f"{spec.name}-{layout}") for spec in SPECS for layout in LAYOUTS]
TEXT_CASES = [c for c in CASES if c.values[0].text]
# the base setting every family has that a user may override at load time (DistilBERT and ModernBERT name
# their dropout differently)
DROPOUT_KEY = {"distilbert": "dropout", "modernbert": "embedding_dropout"}


# ---------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Per (family, layout): the converted model and its saved folder, built once for the module. Tests
    that change a model work on a deep copy (``_model``)."""
    root = tmp_path_factory.mktemp("conformance")
    stock_dirs: dict[str, object] = {}
    built: dict[tuple[str, str], tuple[nn.Module, object]] = {}

    def get(spec: FamilySpec, layout: str) -> tuple[nn.Module, object]:
        if spec.name not in stock_dirs:
            folder = root / f"stock-{spec.name}"
            spec.stock().save_pretrained(folder)
            stock_dirs[spec.name] = folder
        if (spec.name, layout) not in built:
            torch.manual_seed(0)
            fusion = "per_member" if layout == "unequal" else "average"
            masks = HeadMasks(kept_heads=LAYOUTS[layout], num_heads=H)
            if layout == "slim":
                inner = _mlp_width(spec)
                neurons = [[list(range(0, inner, 2)), list(range(inner // 3))], [list(range(1, inner, 3)), []],
                           [[], [0, inner - 1]]]
                masks = HeadMasks(
                    kept_heads=LAYOUTS[layout], num_heads=H, kept_neurons=neurons, intermediate_size=inner
                )
            model = convert_checkpoint(masks, base=stock_dirs[spec.name], mlp_fusion=fusion).eval()
            _perturb(model)
            folder = root / f"hydra-{spec.name}-{layout}"
            model.save_pretrained(folder)
            built[spec.name, layout] = (model, folder)
        return built[spec.name, layout]

    return get


def _mlp_width(spec: FamilySpec) -> int:
    """The MLP width of the family's tiny stock model (DINOv2's SwiGLU MLP is narrower than intermediate_size)."""
    family = get_family(spec.name)
    stock = spec.stock()
    if spec.name == "albert":
        family.adapter(stock)  # unties the shared layer
    return mlp_shapes(stock, family)[family.towers[0]][1]


def _perturb(model: nn.Module) -> None:
    """Every weight moved a little (biases, LayerNorms, members' copies differ: outputs that can differ)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))


def _model(store, spec: FamilySpec, layout: str) -> nn.Module:
    return copy.deepcopy(store(spec, layout)[0]).eval()


def _dropout_key(spec: FamilySpec) -> str:
    return DROPOUT_KEY.get(spec.name, "hidden_dropout_prob")


def _kept(layout: str, layer: int) -> list[list[int]]:
    return [member[layer] for member in LAYOUTS[layout]]


# ------------------------------------------------------------------------------ config: base settings
@pytest.mark.parametrize("spec, layout", CASES)
def test_config_reads_the_base_settings_through(spec, layout, store):
    model, _ = store(spec, layout)
    config = model.config
    base = config.base_config
    key = _dropout_key(spec)
    assert getattr(config, key) == base[key]
    assert config.get_text_config() is config  # a one-tower model: the config itself, as transformers' flat configs
    if spec.text:
        assert config.vocab_size == config.get_text_config().vocab_size == base["vocab_size"] == 99
        assert config.pad_token_id == base["pad_token_id"]
    assert not hasattr(config, "no_such_setting")
    with pytest.raises(AttributeError, match="no_such_setting"):
        config.no_such_setting  # noqa: B018
    # the config's own attributes stay its own
    assert config.num_members == len(LAYOUTS[layout]) and config.return_dict is True


@pytest.mark.parametrize("spec, layout", CASES)
def test_config_overrides_at_load_time_reach_the_base_settings(spec, layout, store):
    """``from_pretrained(folder, <base setting>=...)`` (the model's and AutoConfig's) sets the base's value,
    which the rebuilt model uses; before, transformers handed it to the model's ``__init__`` (TypeError)."""
    model, folder = store(spec, layout)
    key = _dropout_key(spec)
    loaded = type(model).from_pretrained(folder, **{key: 0.37})
    assert loaded.config.base_config[key] == 0.37 and getattr(loaded.config, key) == 0.37
    assert key not in loaded.config.to_dict()  # one place only: base_config
    assert any(isinstance(m, nn.Dropout) and m.p == 0.37 for m in loaded.modules())
    config = AutoConfig.from_pretrained(folder, trust_remote_code=True, **{key: 0.21})
    assert config.base_config[key] == 0.21
    if spec.text:
        grown = type(model).from_pretrained(folder, vocab_size=110, ignore_mismatched_sizes=True)
        assert grown.get_input_embeddings().weight.shape[0] == 110 == grown.config.base_config["vocab_size"]


def test_config_built_with_a_base_setting_keeps_it_in_base_config(store):
    model, _ = store(SPECS[0], "single")
    config = type(model.config)(**{**model.config.to_dict(), "hidden_dropout_prob": 0.3})
    assert config.base_config["hidden_dropout_prob"] == 0.3 == config.hidden_dropout_prob
    config.attention_probs_dropout_prob = 0.2  # a write reaches the model built from the config, and the file
    assert config.to_dict()["base_config"]["attention_probs_dropout_prob"] == 0.2
    assert "attention_probs_dropout_prob" not in config.to_dict()
    rebuilt = type(model)(config)
    assert rebuilt.hydra.layers[0].attention.dropout == 0.2  # the attention-probability dropout
    assert any(isinstance(m, nn.Dropout) and m.p == 0.3 for m in rebuilt.modules())
    assert isinstance(config, PreTrainedConfig) and copy.deepcopy(config) == config


@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_config_given_the_bases_labels_equals_its_saved_copy(spec, store, tmp_path):
    """A config built from the base's full ``to_dict()`` (as the docstring says: ``BertConfig().to_dict()``
    holds the base's labels, ``id2label {0: "LABEL_0", ...}``) equals its saved and reloaded copy, as
    transformers' ConfigTester checks: the labels are the Hydra config's own (top level), base_config
    keeps none (JSON would turn their integer keys into strings)."""
    model, _ = store(spec, "single")
    labels = {k: v for k, v in spec.stock_config().to_dict().items() if k in ("id2label", "label2id")}
    assert set(labels) == {"id2label", "label2id"}
    config = type(model.config).from_dict(
        {**model.config.to_dict(), "base_config": {**model.config.base_config, **labels}}
    )
    config.save_pretrained(tmp_path)
    loaded = type(model.config).from_pretrained(tmp_path)
    assert loaded.to_dict() == config.to_dict()
    assert loaded.to_json_string() == config.to_json_string()
    assert "id2label" not in config.base_config and "label2id" not in config.base_config


# ------------------------------------------------------------------------------------- save / load
@pytest.mark.parametrize("spec, layout", CASES)
def test_save_load_round_trip_is_exact(spec, layout, store):
    model, folder = store(spec, layout)
    loaded = type(model).from_pretrained(folder).eval()
    batch = inputs(spec, model)
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).member_logits, model(**batch).member_logits, atol=0, rtol=0)
    assert loaded.config.to_diff_dict() == model.config.to_diff_dict()


@pytest.mark.parametrize("spec, layout", TEXT_CASES)
def test_resize_token_embeddings_then_save_and_load(spec, layout, store, tmp_path):
    """``resize_token_embeddings`` updates ``base_config['vocab_size']`` (it wrote a stray top-level
    ``vocab_size`` and the saved folder no longer loaded: a size mismatch)."""
    model = _model(store, spec, layout)
    model.resize_token_embeddings(107)
    assert model.config.base_config["vocab_size"] == model.config.vocab_size == 107
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert "vocab_size" not in saved and saved["base_config"]["vocab_size"] == 107
    loaded = type(model).from_pretrained(tmp_path).eval()
    assert loaded.get_input_embeddings().weight.shape[0] == 107
    batch = inputs(spec, model)
    batch["input_ids"][0, 1] = 105  # a new token
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).member_logits, model(**batch).member_logits, atol=0, rtol=0)


def test_folder_saved_after_resize_by_an_older_version_loads(store, tmp_path):
    """Folders written before the fix hold the new size at the top level and the old one in base_config;
    the top-level value is a base setting and wins."""
    spec = SPECS[0]
    model = _model(store, spec, "unequal")
    model.resize_token_embeddings(104)
    model.save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    raw = json.loads(path.read_text())
    raw["base_config"]["vocab_size"], raw["vocab_size"] = 99, 104  # what the older version wrote
    path.write_text(json.dumps(raw))
    loaded = type(model).from_pretrained(tmp_path)
    assert loaded.get_input_embeddings().weight.shape[0] == 104 == loaded.config.base_config["vocab_size"]


# --------------------------------------------------------------------------------- meta-device init
@pytest.mark.parametrize("spec, layout", CASES)
def test_init_on_meta_device_then_initialise(spec, layout, store):
    """Built on the meta device (as ``from_pretrained`` does), materialised and initialised: every parameter
    finite, every buffer (position ids, rotary tables ...) the one a model built on the CPU has."""
    model, _ = store(spec, layout)
    with torch.device("meta"):
        meta = type(model)(model.config)
    assert all(p.device.type == "meta" for p in meta.parameters())
    meta.to_empty(device="cpu")
    meta.init_weights()
    assert all(torch.isfinite(p).all() for p in meta.parameters())
    reference = dict(type(model)(model.config).named_buffers())
    for name, buffer in meta.named_buffers():
        torch.testing.assert_close(buffer, reference[name], atol=0, rtol=0, msg=name)
    with torch.no_grad():
        assert torch.isfinite(meta.eval()(**inputs(spec, model)).logits).all()


# ---------------------------------------------------------------------------------- forward checks
@pytest.mark.parametrize("spec, layout", CASES)
def test_eager_and_sdpa_agree(spec, layout, store):
    model = _model(store, spec, layout)
    batch = inputs(spec, model)
    out = {}
    for attn in ("sdpa", "eager"):
        model.set_attn_implementation(attn)
        with torch.no_grad():
            out[attn] = model(**batch, output_hidden_states=True, output_member_hidden_states=True)
    torch.testing.assert_close(out["eager"].member_logits, out["sdpa"].member_logits, atol=ATOL, rtol=0)
    for a, b in zip(out["eager"].member_hidden_states, out["sdpa"].member_hidden_states):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


@pytest.mark.parametrize("spec, layout", CASES)
def test_padding_and_batching_do_not_change_a_row(spec, layout, store):
    """Row i of a padded batch == row i alone without its padding (text), == row i alone (images)."""
    model, _ = store(spec, layout)
    batch = inputs(spec, model)
    with torch.no_grad():
        together = model(**batch).member_logits  # (B, M, C)
        for i in range(together.shape[0]):
            if spec.text:
                n = int(batch["attention_mask"][i].sum())
                alone = {
                    "input_ids": batch["input_ids"][i : i + 1, :n],
                    "attention_mask": batch["attention_mask"][i : i + 1, :n],
                }
            else:
                alone = {"pixel_values": batch["pixel_values"][i : i + 1]}
            torch.testing.assert_close(model(**alone).member_logits[0], together[i], atol=ATOL, rtol=0)
    if len(LAYOUTS[layout]) > 1:
        assert (together[:, 0] - together[:, 1]).abs().max() > 1e-4  # members that really differ


@pytest.mark.parametrize("spec, layout", CASES)
def test_return_dict_false_gives_the_outputs_as_a_tuple(spec, layout, store):
    model = _model(store, spec, layout)
    model.set_attn_implementation("eager")
    batch = inputs(spec, model)
    labels = torch.tensor([0, 2, 1])
    kwargs = dict(labels=labels, output_hidden_states=True, output_member_hidden_states=True, output_attentions=True)
    with torch.no_grad():
        as_dict = model(**batch, **kwargs)
        as_tuple = model(**batch, **kwargs, return_dict=False)
    expected = as_dict.to_tuple()
    # loss, logits, member_logits, hidden states, attentions, member hidden states
    assert isinstance(as_tuple, tuple) and len(as_tuple) == len(expected) == 6
    for got, want in zip(as_tuple, expected):
        torch.testing.assert_close(got, want, atol=0, rtol=0)
    L = model.config.num_hidden_layers
    assert len(as_dict.hidden_states) == len(as_dict.member_hidden_states) == L + 1 and len(as_dict.attentions) == L
    for layer, weights in enumerate(as_dict.attentions):  # (B, K_l, T, T): every member's kept heads
        assert weights.shape[1] == sum(len(k) for k in _kept(layout, layer))


# ------------------------------------------------------------------------------------------ gradients
def _head_slices(layout: str, layer: int) -> list[slice]:
    """Member m's rows of the head axis of ``attentions[layer]``: member-major, as documented."""
    widths = [len(k) for k in _kept(layout, layer)]
    return [slice(sum(widths[:m]), sum(widths[: m + 1])) for m in range(len(widths))]


@pytest.mark.parametrize("spec, layout", CASES)
def test_gradients_reach_the_returned_hidden_states_and_attentions(spec, layout, store):
    """The returned tensors are those the computation reads (``retain_grad()`` gets gradients, as in
    transformers' ``test_retain_grad_hidden_states_attentions``), laid out as documented: the gradient of
    member m's logits lands only in slot ``[:, m]`` of every hidden state and only in member m's heads of
    every attention map."""
    model = _model(store, spec, layout)
    model.set_attn_implementation("eager")
    out = model(**inputs(spec, model), output_hidden_states=True, output_member_hidden_states=True,
                output_attentions=True)
    tensors = [*out.member_hidden_states, *out.attentions]
    for t in [*tensors, out.hidden_states[0]]:  # hidden_states[0]: the shared embeddings every member reads
        t.retain_grad()
    out.logits.sum().backward(retain_graph=True)
    assert all(t.grad is not None for t in tensors) and out.hidden_states[0].grad.abs().max() > 0
    M = len(LAYOUTS[layout])
    for m in range(M):
        grads = torch.autograd.grad(out.member_logits[:, m].sum(), tensors, retain_graph=True, allow_unused=False)
        hidden_grads, attention_grads = grads[: len(out.member_hidden_states)], grads[len(out.member_hidden_states) :]
        for g in hidden_grads:  # (B, M, T, d)
            assert g[:, m].abs().max() > 0
            assert all(g[:, other].abs().max() == 0 for other in range(M) if other != m)
        for layer, g in enumerate(attention_grads):  # (B, K, T, T)
            for other, rows in enumerate(_head_slices(layout, layer)):
                if rows.stop == rows.start:  # a member keeping no head in this layer
                    continue
                assert (g[:, rows].abs().max() > 0) == (other == m)


def _layers(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


@pytest.mark.parametrize("spec, layout", CASES)
def test_gradient_checkpointing_recomputes_every_layer(spec, layout, store):
    """Every fused layer is a ``GradientCheckpointingLayer`` (the shared base gives every family
    checkpointing); with it enabled each layer runs again in the backward pass and the gradients are
    those without it (dropout on: the recomputation replays the same masks)."""
    grads, calls = {}, {}
    for checkpointing in (False, True):
        model = _model(store, spec, layout).train()
        layers = _layers(model)
        assert len(layers) == model.config.num_hidden_layers
        if checkpointing:
            model.activation_checkpointing_enable()
        counter = [0]  # calls of the layers' attention (transformers checkpoints a layer's forward, inside its hooks)
        for layer in layers:
            layer.attention.register_forward_hook(lambda *_: counter.__setitem__(0, counter[0] + 1))
        torch.manual_seed(3)
        model(**inputs(spec, model), labels=torch.tensor([0, 2, 1])).loss.backward()
        calls[checkpointing] = counter[0]
        grads[checkpointing] = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    L = spec.stock_config().num_hidden_layers
    assert calls == {False: L, True: 2 * L}
    assert grads[False].keys() == grads[True].keys()
    for name, grad in grads[False].items():
        torch.testing.assert_close(grads[True][name], grad, atol=1e-6, rtol=0, msg=name)


# ------------------------------------------------------------------------------ export and dtypes
@pytest.mark.parametrize("spec, layout", [c for c in CASES if c.values[1] in ("unequal", "slim")])
def test_torch_export_equals_eager(spec, layout, store):
    """``torch.export`` of the ``unequal`` and ``slim`` layouts (every code path: unequal widths, a 0-head and a
    0-neuron member layer; 0.3-0.8 s a family, so not repeated for the other layouts): the program's outputs
    equal the model's."""
    model, _ = store(spec, layout)
    batch = inputs(spec, model)
    program = torch.export.export(model, (), kwargs=batch)
    with torch.no_grad():
        expected = model(**batch)
    got = program.module()(**batch)
    torch.testing.assert_close(got["member_logits"], expected.member_logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(got["logits"], expected.logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("spec, layout", CASES)
def test_loads_in_bfloat16_on_a_device_map(spec, layout, store):
    model, folder = store(spec, layout)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = type(model).from_pretrained(folder, dtype=torch.bfloat16, device_map="cpu").eval()
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    assert loaded.config.base_config == model.config.base_config
    batch = inputs(spec, model)
    with torch.no_grad():
        out = loaded(**batch)
        expected = model(**batch)
    assert out.member_logits.dtype == torch.bfloat16
    torch.testing.assert_close(out.member_logits.float(), expected.member_logits, atol=0.1, rtol=0.05)


# ------------------------------------------------------------------------------ two-tower families
def _two_tower(name: str) -> nn.Module:
    """A tiny Hydra CLIP / SigLIP (random weights): 2 members with unequal heads, a 0-head member layer."""
    from transformers import CLIPConfig, SiglipConfig

    from hydra_hf.modeling.configuration_hydra_clip import HydraEnsembleCLIPConfig
    from hydra_hf.modeling.configuration_hydra_siglip import HydraEnsembleSiglipConfig
    from hydra_hf.modeling.modeling_hydra_clip import HydraEnsembleCLIPModel
    from hydra_hf.modeling.modeling_hydra_siglip import HydraEnsembleSiglipModel

    towers = dict(
        text_config=dict(
            vocab_size=99,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=16,
        ),
        vision_config=dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            image_size=16,
            patch_size=8,
        ),
    )
    kept = dict(vision_kept_heads=[[[0, 1], [2]], [[3], []]], text_kept_heads=[[[0], [1, 2]], [[1, 2, 3], [0]]])
    torch.manual_seed(0)
    if name == "clip":
        model = HydraEnsembleCLIPModel(
            HydraEnsembleCLIPConfig(base_config=CLIPConfig(**towers, projection_dim=16).to_dict(), **kept)
        )
    else:
        model = HydraEnsembleSiglipModel(
            HydraEnsembleSiglipConfig(base_config=SiglipConfig(**towers).to_dict(), **kept)
        )
    _perturb(model)
    return model.eval()


@pytest.mark.parametrize("name", ["clip", "siglip"])
def test_two_tower_checkpointing_gradients_and_config(name):
    """CLIP / SigLIP: the towers' layers are recomputed under gradient checkpointing (SigLIP raised), the
    towers' returned hidden states receive gradients, and the config reads the base's top-level settings
    (the towers' own stay in ``base_config['text_config']`` / ``['vision_config']``)."""
    from hydra_hf.modeling.hydra_layers import HydraSelfAttention

    g = torch.Generator().manual_seed(0)
    batch = {
        "input_ids": torch.randint(5, 60, (3, 7), generator=g),
        "attention_mask": torch.ones(3, 7, dtype=torch.long),
        "pixel_values": torch.randn(2, 3, 16, 16, generator=g),
    }
    calls = {}
    for checkpointing in (False, True):
        model = _two_tower(name).train()
        if checkpointing:
            model.activation_checkpointing_enable()
        counter = [0]
        for module in model.modules():
            if isinstance(module, HydraSelfAttention):
                module.register_forward_hook(lambda *_: counter.__setitem__(0, counter[0] + 1))
        out = model(**batch, output_hidden_states=True, output_member_hidden_states=True)
        hidden = [*out.vision_model_output.member_hidden_states, *out.text_model_output.member_hidden_states]
        for h in hidden:
            h.retain_grad()
        out.logits_per_image.sum().backward()
        assert all(h.grad is not None and h.grad.abs().max() > 0 for h in hidden)
        calls[checkpointing] = counter[0]
    assert calls == {False: 4, True: 8}  # 2 layers in each tower
    config = model.config
    assert config.base_config["text_config"]["vocab_size"] == 99 and config.get_text_config() is config
    key = "projection_dim" if name == "clip" else "initializer_factor"
    assert getattr(config, key) == config.base_config[key]


@pytest.mark.parametrize("name, layout", [("bert", "unequal"), ("vit", "unequal"), ("modernbert", "unequal"),
                                          ("bert", "slim"), ("modernbert", "slim")])
def test_trainer_gradient_accumulation_equals_one_batch(name, layout, store, tmp_path):
    """One optimiser step over 6 rows as one batch, or as 2 accumulated batches of 3: the same update. (The
    Trainer passes ``num_items_in_batch`` to a forward that takes ``**kwargs`` and then stops dividing the loss by
    the accumulation steps; the Hydra classes' losses are means, so they say ``accepts_loss_kwargs = False``.
    Before, every accumulated update was ``steps`` times too large.) One family per skeleton: post-LN text,
    pre-LN vision, a text family with its own layers; and slim members (MLP neurons too) of a plain and a gated MLP."""
    from transformers import Trainer, TrainingArguments

    spec = next(s for s in SPECS if s.name == name)
    _, folder = store(spec, layout)
    batch = inputs(spec, store(spec, layout)[0], batch=6, seq=9)
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    rows = [{**{k: v[i] for k, v in batch.items()}, "labels": labels[i]} for i in range(6)]
    updates = {}
    for size, steps in ((6, 1), (3, 2)):
        no_dropout = {"modernbert": {"embedding_dropout": 0.0, "attention_dropout": 0.0, "mlp_dropout": 0.0}}.get(
            name, {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
        )
        model = type(store(spec, layout)[0]).from_pretrained(folder, **no_dropout)
        args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=size,
                                 gradient_accumulation_steps=steps, report_to=[], use_cpu=True, save_strategy="no",
                                 logging_strategy="no", disable_tqdm=True, optim="sgd", learning_rate=0.1,
                                 max_grad_norm=0.0)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        Trainer(model=model, args=args, train_dataset=rows).train()
        updates[steps] = {n: p.detach() - before[n] for n, p in model.named_parameters()}
    assert any(u.abs().max() > 0 for u in updates[1].values())
    for name_, update in updates[1].items():
        torch.testing.assert_close(updates[2][name_], update, atol=1e-6, rtol=1e-4, msg=name_)
