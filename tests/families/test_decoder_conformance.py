"""The contract of transformers' models (what ``ModelTesterMixin`` / ``GenerationTesterMixin`` check and what
users rely on), for the decoder families, as tests/families/test_every_family_conformance.py checks it for the
encoders:

- families: ``llama`` (grouped-query attention, 2 key/value heads for 4 query heads; tied embeddings),
  ``qwen3`` (``head_dim`` 12 != hidden / heads, per-head q/k norms, GQA), ``mistral`` (a 4-token sliding
  window, shorter than the batch) and ``gpt2`` (learned positions, tied embeddings);
- tasks: the causal LM and the sequence classifier (last non-padding token);
- layouts: ``unequal`` (3 members from 3 different checkpoints keeping 2/4, 3/0 and 1/4 heads, per-member
  MLPs and, for the causal LM, per-member LM heads), ``uniform`` (2 members, 2 heads in every layer) and
  ``single`` (1 member keeping every head), converted from stock checkpoints with ``convert_checkpoint``.

Checks (fp32, atol 1e-5): the config reads the base's settings through and takes overrides at load time;
save/load is exact, also after ``resize_token_embeddings`` (the LM head follows: tied, shared or per member);
init on the meta device; eager == sdpa; LEFT padding and batching do not change a row; ``return_dict=False``
tuples; gradients reach the returned hidden states and attention maps (member m's slot only); gradient
checkpointing recomputes every layer (and the cache is off while training); ``torch.export`` == eager
(causal LM without the cache; classifier); bfloat16 loading; ``generate()`` with and without the cache give
the same tokens (greedy, beam search, from ``inputs_embeds``), ``logits_to_keep``; ``generation_config`` takes
the base's defaults and its ``generation_config.json``; transformers' ``Trainer`` runs a step, and gradient
accumulation gives the update of one big batch; one member keeping every head has the stock model's loss;
``shift_labels`` are the targets as given; the configs build without arguments; the cache is ``cache`` in and out
(``past_key_values`` renamed with transformers' FutureWarning, as the stock decoders).

transformers' own ``GenerationTesterMixin`` / ``CausalLMModelTest`` / ``ModelTesterMixin`` live in its
repository's ``tests/`` folder, which the installed wheel does not ship (``transformers.tests`` is not
importable): this file checks what they check that applies to a fused ensemble.

Cost: about 20 s (``torch.export`` and the Trainer runs on the ``unequal`` layout only).
"""

from __future__ import annotations

import copy
import json
import warnings

import pytest
import torch
import transformers
from torch import nn
from transformers import AutoConfig
from transformers.modeling_layers import GradientCheckpointingLayer

from hydra_hf.assemble import convert_checkpoint
from hydra_hf.families import get_family
from hydra_hf.masks import HeadMasks
from hydra_hf.modeling.hydra_layers import HydraMemberLinear
from hydra_hf.pruning.neurons import mlp_shapes

ATOL = 1e-5
H, V, PAD, BOS, EOS = 4, 99, 0, 1, 2
LAYOUTS = {
    "unequal": [[[0, 1], [2, 3]], [[1, 2, 3], []], [[0], [0, 1, 2, 3]]],
    "uniform": [[[0, 1], [1, 2]], [[2, 3], [0, 3]]],
    "single": [[[0, 1, 2, 3], [0, 1, 2, 3]]],
    "slim": [[[0, 1], [2, 3]], [[1, 2, 3], []], [[0], [0, 1, 2, 3]]],  # + unequal MLP neurons, a 0-neuron layer
}
LLAMA_SIZES = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=H, intermediate_size=48,
                   max_position_embeddings=64, initializer_range=0.2, attention_dropout=0.1, pad_token_id=PAD,
                   bos_token_id=BOS, eos_token_id=EOS)
FAMILIES = {
    # name: (config class, settings, causal-LM class, classifier class)
    "llama": ("LlamaConfig", dict(num_key_value_heads=2, tie_word_embeddings=True), "LlamaForCausalLM",
              "LlamaForSequenceClassification"),
    "qwen3": ("Qwen3Config", dict(num_key_value_heads=2, head_dim=12), "Qwen3ForCausalLM",
              "Qwen3ForSequenceClassification"),
    "mistral": ("MistralConfig", dict(num_key_value_heads=4, sliding_window=4), "MistralForCausalLM",
                "MistralForSequenceClassification"),
    "gpt2": ("GPT2Config", dict(n_embd=32, n_layer=2, n_head=H, vocab_size=V, n_positions=64, initializer_range=0.2,
                                pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS),
             "GPT2LMHeadModel", "GPT2ForSequenceClassification"),
}
TASKS = ("causal_lm", "classifier")
# a base setting every family has that a user may override at load time
DROPOUT_KEY = {"gpt2": "attn_pdrop"}

CASES = [
    pytest.param(family, task, layout, id=f"{family}-{task}-{layout}")
    for family in FAMILIES for task in TASKS for layout in LAYOUTS
]
LM_CASES = [c for c in CASES if c.values[1] == "causal_lm"]


# ---------------------------------------------------------------------------------------- fixtures
def stock_model(family: str, task: str, seed: int) -> nn.Module:
    config_name, settings, lm, classifier = FAMILIES[family]
    sizes = {} if family == "gpt2" else LLAMA_SIZES
    config = getattr(transformers, config_name)(**{**sizes, **settings}, num_labels=3)
    torch.manual_seed(seed)
    return getattr(transformers, lm if task == "causal_lm" else classifier)(config).eval()


def _perturb(model: nn.Module, seed: int = 1) -> None:
    """Every weight moved a little (biases, norms, members' copies differ: outputs that can differ)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Per (family, task, layout): the converted model and its saved folder, built once for the module.
    ``unequal`` fuses three different checkpoints (every weight perturbed; the shared embeddings are the
    first member's): a causal LM gets per-member LM heads. Tests that change a model use ``_model``."""
    root = tmp_path_factory.mktemp("conformance-decoders")
    built: dict[tuple[str, str, str], tuple[nn.Module, object]] = {}

    def stock_folder(family: str, task: str, seed: int):
        folder = root / f"stock-{family}-{task}-{seed}"
        if not folder.exists():
            model = stock_model(family, task, 0)
            if seed:
                _perturb(model, seed)
            model.save_pretrained(folder)
        return folder

    def get(family: str, task: str, layout: str) -> tuple[nn.Module, object]:
        key = (family, task, layout)
        if key not in built:
            masks = HeadMasks(kept_heads=LAYOUTS[layout], num_heads=H)
            if layout == "slim":
                stock = stock_model(family, task, 0)
                inner = mlp_shapes(stock, get_family(family))["text"][1]
                neurons = [[list(range(0, inner, 2)), list(range(inner // 3))], [list(range(1, inner, 3)), []],
                           [[], [0, inner - 1]]]
                masks = HeadMasks(
                    kept_heads=LAYOUTS[layout], num_heads=H, kept_neurons=neurons, intermediate_size=inner
                )
            torch.manual_seed(0)
            if layout in ("unequal", "slim"):
                folders = [stock_folder(family, task, seed) for seed in range(len(LAYOUTS[layout]))]
                model = convert_checkpoint(masks, members=folders, mlp_fusion="per_member", shared="first")
            else:
                model = convert_checkpoint(masks, base=stock_folder(family, task, 0), mlp_fusion="average")
            model = model.eval()
            _perturb(model)
            folder = root / f"hydra-{family}-{task}-{layout}"
            model.save_pretrained(folder)
            built[key] = (model, folder)
        return built[key]

    return get


def _model(store, family: str, task: str, layout: str) -> nn.Module:
    return copy.deepcopy(store(family, task, layout)[0]).eval()


def _inputs(batch: int = 3, seq: int = 9, seed: int = 7) -> dict[str, torch.Tensor]:
    """A LEFT-padded batch (rows of different lengths, padded with the base's pad token) with the position ids
    ``generate()`` gives left-padded rows (each row counts from its first token)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 60, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    for i in range(1, batch):
        mask[i, : 3 * i] = 0
    position_ids = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    return {"input_ids": ids * mask + PAD * (1 - mask), "attention_mask": mask, "position_ids": position_ids}


def _labels(task: str, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    if task == "causal_lm":
        return batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    return torch.tensor([0, 2, 1])


def _kept(layout: str, layer: int) -> list[list[int]]:
    return [member[layer] for member in LAYOUTS[layout]]


def _attention(layer: nn.Module) -> nn.Module:
    """A fused layer's attention module (``self_attn`` in Llama-style layers, ``attn`` in GPT-2 blocks)."""
    return layer.self_attn if hasattr(layer, "self_attn") else layer.attn


# ------------------------------------------------------------------------------ config: base settings
@pytest.mark.parametrize("family, task, layout", CASES)
def test_config_reads_the_base_settings_through(family, task, layout, store):
    model, _ = store(family, task, layout)
    config = model.config
    base = config.base_config
    key = DROPOUT_KEY.get(family, "attention_dropout")
    assert getattr(config, key) == base[key]
    assert config.get_text_config() is config
    assert config.vocab_size == config.get_text_config().vocab_size == base["vocab_size"] == V
    assert config.pad_token_id == base["pad_token_id"] == PAD and config.eos_token_id == EOS
    assert config.num_hidden_layers == 2 and config.num_attention_heads == H and config.hidden_size == 32
    assert not hasattr(config, "no_such_setting")
    with pytest.raises(AttributeError, match="no_such_setting"):
        config.no_such_setting  # noqa: B018
    assert config.num_members == len(LAYOUTS[layout]) and config.return_dict is True
    want = "per_member" if task == "causal_lm" and layout in ("unequal", "slim") else "shared"
    assert config.lm_head_fusion == want


@pytest.mark.parametrize("family, task, layout", CASES)
def test_config_overrides_at_load_time_reach_the_base_settings(family, task, layout, store):
    model, folder = store(family, task, layout)
    key = DROPOUT_KEY.get(family, "attention_dropout")
    loaded = type(model).from_pretrained(folder, **{key: 0.37})
    assert loaded.config.base_config[key] == 0.37 and getattr(loaded.config, key) == 0.37
    assert key not in loaded.config.to_dict()  # one place only: base_config
    attention = _attention(loaded.hydra.h[0] if family == "gpt2" else loaded.hydra.layers[0])
    assert attention.dropout == 0.37  # the attention-probability dropout the model uses
    config = AutoConfig.from_pretrained(folder, trust_remote_code=True, **{key: 0.21})
    assert config.base_config[key] == 0.21
    grown = type(model).from_pretrained(folder, vocab_size=110, ignore_mismatched_sizes=True)
    assert grown.get_input_embeddings().weight.shape[0] == 110 == grown.config.base_config["vocab_size"]
    if task == "causal_lm":
        assert grown.get_output_embeddings().weight.shape[-2] == 110
        # the cache switch of transformers' decoder configs: set at load time (it raised a TypeError: transformers
        # handed it to the model's __init__), saved, and obeyed
        quiet = type(model).from_pretrained(folder, use_cache=False).eval()
        assert quiet.config.use_cache is False and quiet.config.to_dict()["use_cache"] is False
        with torch.no_grad():
            assert quiet(**_inputs()).cache is None and model(**_inputs()).cache is not None


# ------------------------------------------------------------------------------------- save / load
@pytest.mark.parametrize("family, task, layout", CASES)
def test_save_load_round_trip_is_exact(family, task, layout, store):
    model, folder = store(family, task, layout)
    loaded = type(model).from_pretrained(folder).eval()
    batch = _inputs()
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).member_logits, model(**batch).member_logits, atol=0, rtol=0)
    assert loaded.config.to_diff_dict() == model.config.to_diff_dict()
    if task == "causal_lm":
        tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
        assert tied == (loaded.get_output_embeddings().weight is loaded.get_input_embeddings().weight)
        # a shared head is tied exactly when the base ties its embeddings (Llama here and GPT-2)
        assert tied == (layout not in ("unequal", "slim") and family in ("llama", "gpt2"))


@pytest.mark.parametrize("family, task, layout", CASES)
def test_resize_token_embeddings_then_save_and_load(family, task, layout, store, tmp_path):
    """``resize_token_embeddings`` grows the input embeddings and the LM head with them (a tied head is the
    embeddings' tensor; an untied or per-member head gets new rows), writes the size into
    ``base_config['vocab_size']``, and the saved folder loads and computes the same."""
    model = _model(store, family, task, layout)
    tied = task == "causal_lm" and model.get_output_embeddings().weight is model.get_input_embeddings().weight
    model.resize_token_embeddings(107)
    assert model.config.base_config["vocab_size"] == model.config.vocab_size == 107
    assert model.get_input_embeddings().weight.shape[0] == 107
    if task == "causal_lm":
        head = model.get_output_embeddings()
        assert head.weight.shape[-2] == 107
        assert (head.weight is model.get_input_embeddings().weight) == tied  # a tied head stays tied
        if isinstance(head, HydraMemberLinear):
            assert head.weight.shape == (len(LAYOUTS[layout]), 107, model.config.hidden_size)
            # added tokens start at every member's mean row: its next-token distribution hardly moves
            torch.testing.assert_close(head.weight[:, 100], head.weight[:, :V].mean(1), atol=1e-6, rtol=0)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert "vocab_size" not in saved and saved["base_config"]["vocab_size"] == 107
    loaded = type(model).from_pretrained(tmp_path).eval()
    assert loaded.get_input_embeddings().weight.shape[0] == 107
    batch = _inputs()
    batch["input_ids"][0, 1] = 105  # a new token
    with torch.no_grad():
        got, want = loaded(**batch), model(**batch)
    torch.testing.assert_close(got.member_logits, want.member_logits, atol=0, rtol=0)
    if task == "causal_lm":
        assert got.member_logits.shape[-1] == 107


# --------------------------------------------------------------------------------- meta-device init
@pytest.mark.parametrize("family, task, layout", CASES)
def test_init_on_meta_device_then_initialise(family, task, layout, store):
    model, _ = store(family, task, layout)
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
        assert torch.isfinite(meta.eval()(**_inputs()).logits).all()


# ---------------------------------------------------------------------------------- forward checks
@pytest.mark.parametrize("family, task, layout", CASES)
def test_eager_and_sdpa_agree(family, task, layout, store):
    model = _model(store, family, task, layout)
    batch = _inputs()
    real = batch["attention_mask"].bool()
    out = {}
    for attn in ("sdpa", "eager"):
        model.set_attn_implementation(attn)
        with torch.no_grad():
            out[attn] = model(**batch, output_hidden_states=True, output_member_hidden_states=True)
    eager, sdpa = out["eager"].member_logits, out["sdpa"].member_logits
    if task == "causal_lm":  # padding positions attend to nothing: not compared
        eager, sdpa = eager.transpose(1, 2)[real], sdpa.transpose(1, 2)[real]
    torch.testing.assert_close(eager, sdpa, atol=ATOL, rtol=0)
    for a, b in zip(out["eager"].member_hidden_states, out["sdpa"].member_hidden_states):
        torch.testing.assert_close(a.transpose(1, 2)[real], b.transpose(1, 2)[real], atol=ATOL, rtol=0)


@pytest.mark.parametrize("family, task, layout", CASES)
def test_left_padding_and_batching_do_not_change_a_row(family, task, layout, store):
    """Row i of a left-padded batch (with the position ids ``generate()`` gives it) == row i alone without its
    padding, at every real token (causal LM) or for the pooled last token (classifier)."""
    model, _ = store(family, task, layout)
    batch = _inputs()
    with torch.no_grad():
        together = model(**batch).member_logits  # (B, M, T, V) or (B, M, C)
        for i in range(together.shape[0]):
            start = int((batch["attention_mask"][i] == 0).sum())
            alone = model(input_ids=batch["input_ids"][i : i + 1, start:]).member_logits[0]
            want = together[i][:, start:] if task == "causal_lm" else together[i]
            torch.testing.assert_close(alone, want, atol=ATOL, rtol=0)
    if len(LAYOUTS[layout]) > 1:
        assert (together[:, 0] - together[:, 1]).abs().max() > 1e-4  # members that really differ


@pytest.mark.parametrize("family, task, layout", CASES)
def test_return_dict_false_gives_the_outputs_as_a_tuple(family, task, layout, store):
    model = _model(store, family, task, layout)
    model.set_attn_implementation("eager")
    batch = _inputs()
    kwargs = dict(labels=_labels(task, batch), output_hidden_states=True, output_member_hidden_states=True,
                  output_attentions=True)
    if task == "causal_lm":
        kwargs["use_cache"] = False
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
    for layer, weights in enumerate(as_dict.attentions):  # (B, K_l, T, T): every member's kept query heads
        assert weights.shape[1] == sum(len(k) for k in _kept(layout, layer))
    if task == "causal_lm":  # with the cache: (logits, member_logits, cache), as transformers' past_key_values
        with torch.no_grad():
            cached = model(**batch, use_cache=True, return_dict=False)
        assert len(cached) == 3 and isinstance(cached[2], transformers.Cache)
        assert cached[2].get_seq_length() == batch["input_ids"].shape[1]


# ------------------------------------------------------------------------------------------ gradients
def _head_slices(layout: str, layer: int) -> list[slice]:
    widths = [len(k) for k in _kept(layout, layer)]
    return [slice(sum(widths[:m]), sum(widths[: m + 1])) for m in range(len(widths))]


@pytest.mark.parametrize("family, task, layout", CASES)
def test_gradients_reach_the_returned_hidden_states_and_attentions(family, task, layout, store):
    model = _model(store, family, task, layout)
    model.set_attn_implementation("eager")
    out = model(**_inputs(), output_hidden_states=True, output_member_hidden_states=True, output_attentions=True,
                use_cache=False)
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
                if rows.stop == rows.start:
                    continue
                assert (g[:, rows].abs().max() > 0) == (other == m)


@pytest.mark.parametrize("family, task, layout", CASES)
def test_gradient_checkpointing_recomputes_every_layer(family, task, layout, store):
    """Every fused layer is a ``GradientCheckpointingLayer``: enabled, each runs again in the backward pass and
    the gradients are those without it (attention dropout on: the recomputation replays the same masks); the
    cache is off while training with checkpointing, as in transformers' models."""
    grads, calls = {}, {}
    batch = _inputs()
    for checkpointing in (False, True):
        model = _model(store, family, task, layout).train()
        layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
        assert len(layers) == model.config.num_hidden_layers
        if checkpointing:
            model.activation_checkpointing_enable()
        counter = [0]
        for layer in layers:
            _attention(layer).register_forward_hook(lambda *_: counter.__setitem__(0, counter[0] + 1))
        torch.manual_seed(3)
        kwargs = {"use_cache": True} if task == "causal_lm" else {}
        out = model(**batch, labels=_labels(task, batch), **kwargs)
        if task == "causal_lm":
            assert (out.cache is None) == checkpointing
        out.loss.backward()
        calls[checkpointing] = counter[0]
        grads[checkpointing] = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert calls == {False: 2, True: 4}
    assert grads[False].keys() == grads[True].keys()
    for name, grad in grads[False].items():
        torch.testing.assert_close(grads[True][name], grad, atol=1e-6, rtol=0, msg=name)


# ------------------------------------------------------------------------------ export and dtypes
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("task", TASKS)
def test_torch_export_equals_eager(family, task, store):
    """``torch.export`` of the ``unequal`` layout (every code path), the causal LM without the cache."""
    model, _ = store(family, task, "unequal")
    batch = _inputs()
    if task == "causal_lm":
        batch["use_cache"] = False
    program = torch.export.export(model, (), kwargs=batch)
    with torch.no_grad():
        expected = model(**batch)
    got = program.module()(**batch)
    torch.testing.assert_close(got["member_logits"], expected.member_logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(got["logits"], expected.logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("family, task, layout", CASES)
def test_loads_in_bfloat16_on_a_device_map(family, task, layout, store):
    model, folder = store(family, task, layout)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = type(model).from_pretrained(folder, dtype=torch.bfloat16, device_map="cpu").eval()
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    assert loaded.config.base_config == model.config.base_config
    batch = _inputs()
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        out = loaded(**batch)
        expected = model(**batch)
    assert out.member_logits.dtype == torch.bfloat16
    got, want = out.member_logits.float(), expected.member_logits
    if task == "causal_lm":  # logits over the vocabulary at every real token: bfloat16's rounding, a wider margin
        got, want = got.transpose(1, 2)[real], want.transpose(1, 2)[real]
    torch.testing.assert_close(got, want, atol=0.1 if task == "classifier" else 0.25, rtol=0.05)


# ----------------------------------------------------------------------------------------- generate
@pytest.mark.parametrize("family, task, layout", LM_CASES)
def test_generate_with_and_without_the_cache_gives_the_same_tokens(family, task, layout, store):
    model, _ = store(family, task, layout)
    batch = _inputs(seq=6)
    prompt = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    common = dict(max_new_tokens=7, do_sample=False, eos_token_id=None)
    with_cache = model.generate(**prompt, **common, use_cache=True)
    without = model.generate(**prompt, **common, use_cache=False)
    assert with_cache.shape == (3, 13)
    assert torch.equal(with_cache, without)
    # from the prompts' embeddings (the new tokens only), and the last position's logits alone
    embeds = model.get_input_embeddings()(prompt["input_ids"])
    from_embeds = model.generate(inputs_embeds=embeds, attention_mask=prompt["attention_mask"], **common)
    assert torch.equal(from_embeds, with_cache[:, 6:])
    with torch.no_grad():
        last = model(**batch, logits_to_keep=1)
        torch.testing.assert_close(last.member_logits, model(**batch).member_logits[:, :, -1:], atol=1e-6, rtol=0)
    # beam search reorders the cache's batch axis
    beams = dict(max_new_tokens=4, do_sample=False, eos_token_id=None, num_beams=2)
    beam_tokens = {cache: model.generate(**prompt, **beams, use_cache=cache) for cache in (True, False)}
    assert torch.equal(beam_tokens[True], beam_tokens[False])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_generation_config_defaults_from_the_base(family, store, tmp_path):
    """``model.generation_config`` holds the base's start, end and padding tokens, after a round trip too; a
    base whose ``generation_config.json`` has its own settings (a chat model's list of end tokens, sampling
    defaults) passes them on (the converter dropped the file: generation ran past the base's end tokens)."""
    model, folder = store(family, "causal_lm", "unequal")
    for m in (model, type(model).from_pretrained(folder)):
        generation = m.generation_config
        assert (generation.bos_token_id, generation.eos_token_id, generation.pad_token_id) == (BOS, EOS, PAD)
    assert model.can_generate()
    base = stock_model(family, "causal_lm", 0)
    base.generation_config.update(eos_token_id=[EOS, 7], do_sample=True, temperature=0.6, top_k=5)
    base.save_pretrained(tmp_path / "base")
    convert_checkpoint(HeadMasks(kept_heads=LAYOUTS["uniform"], num_heads=H), base=tmp_path / "base",
                       output_dir=tmp_path / "hydra")
    loaded = type(model).from_pretrained(tmp_path / "hydra")
    generation = loaded.generation_config
    settings = (generation.eos_token_id, generation.do_sample, generation.temperature, generation.top_k)
    assert settings == ([EOS, 7], True, 0.6, 5)
    assert (generation.bos_token_id, generation.pad_token_id) == (BOS, PAD)


@pytest.mark.parametrize(("family", "task"), [("llama", "causal_lm"), ("gpt2", "classifier")])
def test_trainer_runs_a_step(family, task, store, tmp_path):
    """transformers' ``Trainer`` trains the model (the ``unequal`` layout, gradient checkpointing on) one step on
    left-padded rows: a finite loss, every parameter moved."""
    from transformers import Trainer, TrainingArguments

    model = _model(store, family, task, "unequal").train()
    batch = _inputs()
    labels = _labels(task, batch)
    rows = [{"input_ids": batch["input_ids"][i], "attention_mask": batch["attention_mask"][i], "labels": labels[i]}
            for i in range(3)]
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=3, report_to=[],
                             use_cpu=True, save_strategy="no", logging_strategy="no", disable_tqdm=True,
                             activation_checkpointing=True, learning_rate=1e-2)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    result = Trainer(model=model, args=args, train_dataset=rows).train()
    assert torch.isfinite(torch.tensor(result.training_loss))
    assert all(not torch.equal(before[n], p) for n, p in model.named_parameters())


@pytest.mark.parametrize(("family", "task"), [("llama", "causal_lm"), ("gpt2", "classifier")])
def test_trainer_gradient_accumulation_equals_one_batch(family, task, store, tmp_path):
    """One optimiser step over 6 rows as one batch, or as 2 accumulated batches of 3: the same update. (The
    Trainer passes ``num_items_in_batch`` to a forward with ``**kwargs`` and then does not divide the loss by the
    accumulation steps: the causal LM now divides its summed loss by it, as transformers' causal LMs; the
    classifier says ``accepts_loss_kwargs = False``. Before, the accumulated update was twice too large.)"""
    from transformers import Trainer, TrainingArguments

    _, folder = store(family, task, "unequal")
    no_dropout = {"attention_dropout": 0.0}
    if family == "gpt2":
        no_dropout = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 60, (6, 9), generator=g)
    mask = (torch.arange(9)[None, :] >= torch.arange(6)[:, None]).long()  # row i: i pads on the left
    ids = ids * mask
    labels = ids.masked_fill(mask == 0, -100) if task == "causal_lm" else torch.tensor([0, 1, 2, 0, 1, 2])
    rows = [{"input_ids": ids[i], "attention_mask": mask[i], "labels": labels[i]} for i in range(6)]
    updates = {}
    for size, steps in ((6, 1), (3, 2)):
        model = type(store(family, task, "unequal")[0]).from_pretrained(folder, **no_dropout)
        args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=size,
                                 gradient_accumulation_steps=steps, report_to=[], use_cpu=True, save_strategy="no",
                                 logging_strategy="no", disable_tqdm=True, optim="sgd", learning_rate=0.1,
                                 max_grad_norm=0.0)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        Trainer(model=model, args=args, train_dataset=rows).train()
        updates[steps] = {n: p.detach() - before[n] for n, p in model.named_parameters()}
    for name, update in updates[1].items():
        torch.testing.assert_close(updates[2][name], update, atol=1e-6, rtol=1e-4, msg=name)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_one_member_with_every_head_has_the_stock_models_loss(family, tmp_path):
    """The causal LM's loss (shifted labels, -100 ignored) of one member keeping every head is the stock model's,
    also divided by the ``num_items_in_batch`` the Trainer passes (a sum over the tokens, then divided)."""
    stock = stock_model(family, "causal_lm", 0)
    stock.save_pretrained(tmp_path / "base")
    model = convert_checkpoint(HeadMasks(kept_heads=LAYOUTS["single"], num_heads=H), base=tmp_path / "base")
    batch = _inputs()
    labels = _labels("causal_lm", batch)
    with torch.no_grad():
        for extra in ({}, {"num_items_in_batch": torch.tensor(40)}):
            want = stock(**batch, labels=labels, **extra).loss
            torch.testing.assert_close(model(**batch, labels=labels, **extra).loss, want, atol=1e-5, rtol=0)


# -------------------------------------------------------------- transformers' contract: loss, config, cache
@pytest.mark.parametrize("family, task, layout", LM_CASES)
def test_shift_labels_are_the_targets_as_given(family, task, layout, store):
    """``shift_labels`` (what the Trainer passes under sequence or context parallelism) are used as given, as
    transformers' ``ForCausalLMLoss`` uses them: the loss is the members' mean of that loss on their own logits;
    shifted by hand they give the loss of ``labels``; other targets give another loss."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    model = _model(store, family, task, layout)
    batch = _inputs()
    labels = _labels(task, batch)
    shifted = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=-100)  # position t's next token
    other = shifted.roll(1, dims=0)
    with torch.no_grad():
        out = model(**batch, labels=labels)
        given = model(**batch, labels=labels, shift_labels=shifted).loss
        moved = model(**batch, labels=labels, shift_labels=other)
    V = out.member_logits.shape[-1]
    members = [ForCausalLMLoss(moved.member_logits[:, m].contiguous(), labels, V, shift_labels=other)
               for m in range(len(LAYOUTS[layout]))]
    torch.testing.assert_close(moved.loss, torch.stack(members).mean(), atol=ATOL, rtol=0)
    torch.testing.assert_close(given, out.loss, atol=ATOL, rtol=0)
    assert (moved.loss - out.loss).abs() > 1e-3


@pytest.mark.parametrize("family", list(FAMILIES))
def test_config_constructs_without_arguments(family, store, tmp_path):
    """As transformers' ``ConfigTester`` (``check_config_can_be_init_without_params``, save / load): the family's
    config class builds with no argument (no base, no members yet; the base's settings answered from its stock
    default config, as ``LlamaConfig()`` answers them) and survives a save / load round trip."""
    config_class = type(store(family, "causal_lm", "single")[0].config)
    config = config_class()
    stock = AutoConfig.for_model(config.base_model_type)
    assert config.base_config == {} and config.kept_heads == []
    assert (config.hidden_size, config.num_attention_heads) == (stock.hidden_size, stock.num_attention_heads)
    assert config.head_dim == getattr(stock, "head_dim", stock.hidden_size // stock.num_attention_heads)
    config.save_pretrained(tmp_path)
    assert config_class.from_pretrained(tmp_path).to_dict() == config.to_dict()


@pytest.mark.parametrize("family, task, layout", LM_CASES)
def test_the_cache_is_named_cache_in_and_out(family, task, layout, store):
    """transformers 5.24's name: ``cache=`` in, ``out.cache`` out (what ``generate()`` passes and reads); the older
    ``past_key_values=`` gives the same numbers with the FutureWarning the stock decoders give."""
    model = _model(store, family, task, layout)
    batch = _inputs()
    head = {k: v[:, :6] for k, v in batch.items()}
    tail = {"input_ids": batch["input_ids"][:, 6:], "position_ids": batch["position_ids"][:, 6:],
            "attention_mask": batch["attention_mask"]}
    with torch.no_grad():
        first = model(**head, use_cache=True)
        assert "cache" in first.keys() and "past_key_values" not in first.keys()
        new = model(**tail, cache=copy.deepcopy(first.cache), use_cache=True)
        with pytest.warns(FutureWarning, match="`past_key_values` is deprecated"):
            old = model(**tail, past_key_values=copy.deepcopy(first.cache), use_cache=True)
        assert new.cache.get_seq_length() == old.cache.get_seq_length() == 9
        torch.testing.assert_close(old.member_logits, new.member_logits, atol=0, rtol=0)
        full = model(**batch, use_cache=False).member_logits[:, :, 6:]
        torch.testing.assert_close(new.member_logits, full, atol=ATOL, rtol=0)
        stock = stock_model(family, "causal_lm", 0).eval()  # the control: transformers' own decoder
        with pytest.warns(FutureWarning, match="`past_key_values` is deprecated"):
            stock(**tail, past_key_values=stock(**head, use_cache=True).cache, use_cache=True)
