"""Slim members (members that keep subsets of the MLP neurons too), numbers not shapes, for every family of
the shared suite (``_family_specs.SPECS``):

- every slim member == the stock model with its removed heads' W_O column blocks and its removed neurons'
  down-projection input columns zeroed (fp32, eager and sdpa, padded batches), unequal widths with a
  0-head and a 0-neuron layer, per-member MLPs (3 checkpoints) and the averaged MLP (equal widths: the
  batched path); the neurons really matter (the heads-only reference differs);
- unfuse -> the family's stock model reproduces each slim member;
- parameters follow the kept sizes.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from _family_specs import SPECS, FamilySpec, inputs, perturbed

from hydra_hf.assemble import convert_checkpoint
from hydra_hf.families import get_family
from hydra_hf.masks import HeadMasks
from hydra_hf.pruning.gates import HeadGates, zero_head_columns_
from hydra_hf.pruning.neurons import (
    mlp_shapes,
    neuron_gates,
    select_neurons,
    taylor_neuron_scores,
    zero_removed_neurons_,
)

ATOL = 1e-5
H = 4
UNEQUAL = [[[0, 1], [2, 3]], [[1, 2, 3], []], [[0], [0, 1, 2, 3]]]  # member 1 keeps no head in layer 1
ids = [s.name for s in SPECS]


def slim_neurons(inner: int) -> list[list[list[int]]]:
    """Three members over 2 layers of ``inner`` neurons: unequal widths, member 2 keeps no neuron in layer 0."""
    return [
        [list(range(0, inner, 2)), list(range(inner // 3))],
        [list(range(1, inner, 3)), list(range(inner // 2, inner))],
        [[], [0, inner - 1]],
    ]


def split_neurons(inner: int, members: int = 3, layers: int = 2) -> list[list[list[int]]]:
    """Members splitting every layer's neurons (equal widths: the batched path)."""
    return [[list(range(m, inner, members))[: inner // members] for _ in range(layers)] for m in range(members)]


def reference(
    spec: FamilySpec, model: torch.nn.Module, heads: list[list[int]], neurons: list[list[int]]
) -> torch.nn.Module:
    """A copy of a stock model with the removed heads' W_O column blocks and removed neurons' columns zeroed."""
    ref = copy.deepcopy(model)
    family = get_family(spec.name)
    adapter = family.adapter(ref)  # ALBERT: unties its shared layers first
    gates = torch.zeros(len(heads), H)
    for layer, kept in enumerate(heads):
        gates[layer, kept] = 1.0
    zero_head_columns_(ref, gates, adapter=adapter)
    zero_removed_neurons_(ref, family, {family.towers[0]: neurons})
    return ref.eval()


def _logits(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch).logits


def _inner(spec: FamilySpec, model: torch.nn.Module) -> int:
    family = get_family(spec.name)
    probe = copy.deepcopy(model)
    if spec.name == "albert":
        family.adapter(probe)
    return mlp_shapes(probe, family)[family.towers[0]][1]


@pytest.mark.parametrize("spec", SPECS, ids=ids)
def test_slim_members_equal_the_zeroed_references(spec, tmp_path):
    base = spec.stock()
    inner = _inner(spec, base)
    neurons = slim_neurons(inner)
    members = [perturbed(base, seed) for seed in (1, 2, 3)]
    folders = []
    for i, member in enumerate(members):
        member.save_pretrained(tmp_path / f"m{i}")
        folders.append(tmp_path / f"m{i}")
    masks = HeadMasks(kept_heads=UNEQUAL, num_heads=H, kept_neurons=neurons, intermediate_size=inner)
    model = convert_checkpoint(masks, members=folders, mlp_fusion="per_member")
    assert model.config.slim and model.config.kept_neurons == neurons
    batch = inputs(spec, base)
    refs = [reference(spec, member, UNEQUAL[m], neurons[m]) for m, member in enumerate(members)]
    heads_only = [reference(spec, member, UNEQUAL[m], [list(range(inner))] * 2) for m, member in enumerate(members)]
    for attn in ("sdpa", "eager"):
        model.set_attn_implementation(attn)
        with torch.no_grad():
            got = model(**batch).member_logits  # (B, M, C)
        for m, ref in enumerate(refs):
            ref.set_attn_implementation(attn)
            heads_only[m].set_attn_implementation(attn)
            expected = _logits(ref, batch)
            torch.testing.assert_close(got[:, m], expected, atol=ATOL, rtol=0)
            assert (expected - _logits(heads_only[m], batch)).abs().max() > 1e-3  # the neurons matter
    # parameters follow the kept sizes: the slim MLPs hold exactly the kept neurons' weights
    full = convert_checkpoint(HeadMasks(kept_heads=UNEQUAL, num_heads=H), members=folders, mlp_fusion="per_member")
    kept = sum(len(n) for member in neurons for n in member)
    saved = sum(p.numel() for p in full.parameters()) - sum(p.numel() for p in model.parameters())
    per_neuron = saved / (3 * 2 * inner - kept)
    assert per_neuron == pytest.approx(round(per_neuron)) and round(per_neuron) in (2 * 32 + 1, 3 * 32 + 2, 3 * 32)


@pytest.mark.parametrize("spec", SPECS, ids=ids)
def test_slim_members_of_the_averaged_mlp_and_unfuse(spec, tmp_path):
    """One checkpoint, averaged MLP, members splitting every layer's neurons (equal widths); unfuse gives stock
    members that reproduce them."""
    base = spec.stock()
    base.save_pretrained(tmp_path / "base")
    inner = _inner(spec, base)
    neurons = split_neurons(inner)
    masks = HeadMasks(kept_heads=UNEQUAL, num_heads=H, kept_neurons=neurons, intermediate_size=inner)
    model = convert_checkpoint(masks, base=tmp_path / "base")
    batch = inputs(spec, base)
    for attn in ("sdpa", "eager"):
        model.set_attn_implementation(attn)
        with torch.no_grad():
            got = model(**batch).member_logits
        for m in range(3):
            ref = reference(spec, base, UNEQUAL[m], neurons[m])
            ref.set_attn_implementation(attn)
            torch.testing.assert_close(got[:, m], _logits(ref, batch), atol=ATOL, rtol=0)
    family = get_family(spec.name)
    for m, state in enumerate(family.unfuse(model.state_dict(), model.config)):
        stock = family.stock_model(model.config.base_config, num_labels=3).eval()
        missing, unexpected = stock.load_state_dict(state, strict=False)
        assert not unexpected and all("position_ids" in k or "pooler" in k for k in missing), (missing, unexpected)
        torch.testing.assert_close(_logits(stock, batch), got[:, m], atol=ATOL, rtol=0)


# ------------------------------------------------------------------------------ choosing the neurons
def test_select_neurons_top_scores_and_spread():
    scores = torch.tensor([[0.1, 0.9, 0.5, 0.7, 0.2, 0.3]])  # (L=1, I=6)
    assert select_neurons(scores, 2) == [[1, 3]]
    taken = torch.tensor([[0.0, 1.0, 0.0, 1.0, 0.0, 0.0]])  # an earlier member kept 1 and 3
    assert select_neurons(scores, 2, taken) == [[2, 5]]  # the best of the neurons nobody kept
    assert select_neurons(scores, 5, taken) == [[0, 1, 2, 4, 5]]  # then the best of the taken ones


def test_neuron_taylor_scores_are_the_gates_gradients(tiny_bert_dir):
    """|dL/dgate| of the neuron gates == central finite differences of the loss in each gate."""
    from transformers import BertForSequenceClassification

    model = BertForSequenceClassification.from_pretrained(tiny_bert_dir).eval()
    family = get_family("bert")
    g = torch.Generator().manual_seed(0)
    batch = {
        "input_ids": torch.randint(5, 60, (4, 7), generator=g),
        "attention_mask": torch.ones(4, 7, dtype=torch.long),
        "labels": torch.tensor([0, 1, 2, 0]),
    }
    adapter = family.adapter(model)
    heads = {"text": torch.tensor([[1.0, 0, 1, 1], [0, 1, 1, 1], [1, 1, 0, 1]])}  # member heads off
    scores = taylor_neuron_scores(adapter, family, [batch], head_gates=heads)["text"]  # (L, I)
    assert scores.shape == (3, 64) and (scores > 0).all()

    def loss(layer: int, neuron: int, value: float) -> float:
        gates = {"text": torch.ones(3, 64, dtype=torch.float64)}
        gates["text"][layer, neuron] = value
        with HeadGates(model, adapter=adapter) as hg, neuron_gates(model, family, gates), torch.no_grad():
            hg.set(heads)
            model.double()
            out = torch.nn.functional.cross_entropy(
                model(**{k: v for k, v in batch.items() if k != "labels"}).logits, batch["labels"]
            )
            model.float()
        return float(out)

    eps = 1e-4
    for layer, neuron in [(0, 3), (1, 40), (2, 63)]:
        numeric = abs(loss(layer, neuron, 1 + eps) - loss(layer, neuron, 1 - eps)) / (2 * eps)
        assert scores[layer, neuron].item() == pytest.approx(numeric, rel=1e-3, abs=1e-7)


def test_prune_mlp_keep_end_to_end(tiny_bert_dir, tmp_path):
    """`hydra-hf prune --mlp-keep 0.34 --mlp-spread`: a version-2 masks file; every member keeps 22 of 64 neurons
    per layer, members differ and together cover the MLP; the fused model equals its zeroed references."""
    import pandas as pd
    from transformers import BertForSequenceClassification

    from hydra_hf.cli import main

    words = "the a movie film good bad great awful plot actor fun boring".split()
    g = torch.Generator().manual_seed(0)
    texts = [" ".join(words[int(i)] for i in torch.randint(0, len(words), (6,), generator=g)) for _ in range(24)]
    pd.DataFrame({"text": texts, "label": [k % 3 for k in range(24)]}).to_csv(tmp_path / "id.csv", index=False)
    out = tmp_path / "masks.json"
    args = ["prune", "--model", str(tiny_bert_dir), "--id-data", str(tmp_path / "id.csv"), "--output", str(out),
            "--no-progress", "--batch-size", "8", "--method", "taylor", "--members", "3", "--heads-per-layer", "2"]
    assert main([*args, "--mlp-keep", "0.34", "--mlp-spread"]) == 0
    raw = json.loads(out.read_text())
    assert raw["version"] == 2 and raw["intermediate_size"] == 64 and raw["mlp_keep"] == 0.34
    masks = HeadMasks.load(out)
    neurons = masks.kept_neurons()
    assert all(len(n) == 22 for member in neurons for n in member)
    assert neurons[0] != neurons[1] != neurons[2]
    for layer in range(3):
        assert set().union(*(set(neurons[m][layer]) for m in range(3))) == set(range(64))  # spread: all covered
    model = convert_checkpoint(out, base=tiny_bert_dir)
    stock = BertForSequenceClassification.from_pretrained(tiny_bert_dir).eval()
    batch = {
        "input_ids": torch.randint(5, 60, (3, 7), generator=g),
        "attention_mask": torch.ones(3, 7, dtype=torch.long),
    }
    with torch.no_grad():
        got = model(**batch).member_logits
    for m in range(3):
        ref = copy.deepcopy(stock)
        zero_head_columns_(ref, masks.gates(m))
        zero_removed_neurons_(ref, get_family("bert"), {"text": neurons[m]})
        torch.testing.assert_close(got[:, m], _logits(ref, batch), atol=ATOL, rtol=0)
    # without --mlp-spread, a bad fraction, and --mlp-spread alone: one line each
    assert main([*args, "--mlp-keep", "0.5", "--overwrite"]) == 0
    assert all(len(n) == 32 for member in HeadMasks.load(out).kept_neurons() for n in member)
    for bad in (["--mlp-keep", "0"], ["--mlp-keep", "1.5"], ["--mlp-spread"]):
        assert main([*args, *bad, "--overwrite"]) == 2
    with pytest.raises(SystemExit) as info:  # argparse's own refusal of a non-finite flag (cli.finite_float)
        main([*args, "--mlp-keep", "nan", "--overwrite"])
    assert info.value.code == 2


# ------------------------------------------------------------------------------------ masks format
def _slim_file(**changes) -> dict:
    data = {"format": "hydra-head-masks", "version": 2, "num_layers": 2, "num_heads": 4, "intermediate_size": 8,
            "members": [{"kept_heads": [[0], [1, 2]], "kept_neurons": [[0, 5], []]}, {"kept_heads": [[3], []]}]}
    data.update(changes)
    return data


def test_masks_file_version_2_round_trip(tmp_path):
    masks = HeadMasks.from_dict(_slim_file())
    assert masks.slim and masks.intermediate_size() == 8
    assert masks.kept_neurons() == [[[0, 5], []], [list(range(8)), list(range(8))]]  # absent = every neuron
    masks.save(tmp_path / "m.json")
    assert json.loads((tmp_path / "m.json").read_text()) == _slim_file()
    assert HeadMasks.load(tmp_path / "m.json") == masks
    one = masks.select_members([0])
    assert one.slim and one.kept_neurons() == [[[0, 5], []]]
    plain = HeadMasks(kept_heads=[[[0], [1]]], num_heads=4)
    assert plain.to_dict()["version"] == 1 and not plain.slim  # whole MLPs: the version-1 file, as before


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"version": 1}, "version 1"),
        ({"intermediate_size": None}, "intermediate_size"),
        ({"intermediate_size": 4}, "outside [0, 4)"),
        ({"members": [{"kept_heads": [[0], [1]], "kept_neurons": [[5, 0], []]}]}, "sorted"),
        ({"members": [{"kept_heads": [[0], [1]], "kept_neurons": [[1, 1], []]}]}, "once"),
        ({"members": [{"kept_heads": [[0], [1]], "kept_neurons": [[1]]}]}, "one list of neurons per layer"),
        ({"members": [{"kept_heads": [[0], [1]], "kept_neurons": [[-1], []]}]}, "negative"),
        ({"members": [{"kept_heads": [[0], [1]], "kept_neurons": [["1"], []]}]}, "integer neuron indices"),
        ({"version": 3}, "reads versions"),
    ],
)
def test_bad_slim_masks_are_one_line(changes, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace(")", r"\)")) as info:
        HeadMasks.from_dict(_slim_file(**changes))
    assert "\n" not in str(info.value)


def test_two_tower_masks_with_neurons_round_trip():
    data = {
        "format": "hydra-head-masks",
        "version": 2,
        "towers": {
            "vision": {"num_layers": 1, "num_heads": 2, "intermediate_size": 4},
            "text": {"num_layers": 1, "num_heads": 2},
        },
        "members": [
            {"kept_heads": {"vision": [[0]], "text": [[1]]}, "kept_neurons": {"vision": [[1, 3]]}},
            {"kept_heads": {"vision": [[1]], "text": [[0, 1]]}},
        ],
    }
    masks = HeadMasks.from_dict(data)
    assert masks.kept_neurons("vision") == [[[1, 3]], [[0, 1, 2, 3]]] and masks.kept_neurons("text") is None
    assert masks.to_dict() == data


# ------------------------------------------------------------------------------------------ decoders
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_slim_decoder_members_equal_their_references_and_generate(family, tmp_path):
    """Causal LMs (Llama with grouped-query attention and a gated MLP, GPT-2's Conv1D MLP): every slim member's
    next-token logits == the stock model with its removed heads and neurons zeroed; greedy generation with the
    cache == without it."""
    import transformers

    torch.manual_seed(0)
    if family == "llama":
        config = transformers.LlamaConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64,
                                          pad_token_id=0, bos_token_id=1, eos_token_id=2)
        stock = transformers.LlamaForCausalLM(config).eval()
    else:
        config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=99, n_positions=64,
                                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
        stock = transformers.GPT2LMHeadModel(config).eval()
    stock.save_pretrained(tmp_path / "stock")
    fam = get_family(family)
    inner = mlp_shapes(stock, fam)["text"][1]
    neurons = slim_neurons(inner)
    masks = HeadMasks(kept_heads=UNEQUAL, num_heads=H, kept_neurons=neurons, intermediate_size=inner)
    model = convert_checkpoint(masks, base=tmp_path / "stock").eval()
    ids = torch.randint(3, 99, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = model(input_ids=ids).member_logits  # (B, M, T, V)
        for m in range(3):
            ref = copy.deepcopy(stock)
            gates = torch.zeros(2, H)
            for layer, kept in enumerate(UNEQUAL[m]):
                gates[layer, kept] = 1.0
            zero_head_columns_(ref, gates, adapter=fam.adapter(ref))
            zero_removed_neurons_(ref, fam, {"text": neurons[m]})
            torch.testing.assert_close(got[:, m], ref(input_ids=ids).logits, atol=ATOL, rtol=0)
        cached = model.generate(ids, max_new_tokens=5, do_sample=False, use_cache=True, pad_token_id=0)
        uncached = model.generate(ids, max_new_tokens=5, do_sample=False, use_cache=False, pad_token_id=0)
    assert torch.equal(cached, uncached)


# ------------------------------------------------------------------------ a slim folder's every path
def test_slim_folder_remote_code_resave_pipeline_onnx_int8_and_push(tiny_bert_dir, tmp_path):
    """A slim BERT folder: loads as remote code in a fresh process without hydra_hf (same member logits), is
    re-saved there and loads again; its pipeline answers; ONNX fp32 == PyTorch, int8 close; push --dry-run's
    fresh-process check passes; the card states the compute."""
    import pandas as pd
    from conftest import run_fresh_python
    from transformers import AutoTokenizer

    from hydra_hf.cli import main
    from hydra_hf.onnx import OnnxHydraModel
    from hydra_hf.onnx.export import export_onnx

    neurons = split_neurons(64, layers=3)
    masks = HeadMasks(kept_heads=[[[0, 1], [2], [1, 2, 3]], [[2, 3], [0, 1], []], [[0], [3], [0]]], num_heads=H,
                      kept_neurons=neurons, intermediate_size=64)
    folder = tmp_path / "slim"
    model = convert_checkpoint(masks, base=tiny_bert_dir, output_dir=folder)
    config = json.loads((folder / "config.json").read_text())
    assert config["kept_neurons"] == neurons
    tok = AutoTokenizer.from_pretrained(folder)
    batch = tok(["the movie was good", "a bad plot"], padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = model(**batch).member_logits
    out = run_fresh_python(f"""
        import json, torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline
        folder = {str(folder)!r}
        tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
        model = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True).eval()
        batch = tok(["the movie was good", "a bad plot"], padding=True, return_tensors="pt")
        with torch.no_grad():
            first = model(**batch).member_logits
        model.save_pretrained({str(tmp_path / "resaved")!r})
        tok.save_pretrained({str(tmp_path / "resaved")!r})
        resaved = {str(tmp_path / "resaved")!r}
        again = AutoModelForSequenceClassification.from_pretrained(resaved, trust_remote_code=True).eval()
        with torch.no_grad():
            second = again(**batch).member_logits
        pipe = pipeline(model={str(tmp_path / "resaved")!r}, trust_remote_code=True)
        result = {{"first": first.tolist(), "second": second.tolist(), "pipe": pipe("the movie was good")}}
        print("RESULT " + json.dumps(result))
    """)
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert lines, out[-2000:]
    result = json.loads(lines[0][len("RESULT "):])
    torch.testing.assert_close(torch.tensor(result["first"]), expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(torch.tensor(result["second"]), expected, atol=ATOL, rtol=0)
    assert result["pipe"]

    texts = ["the movie was very good", "a boring plot", "i was not fun", "great actor"] * 6
    pd.DataFrame({"text": texts, "label": [i % 3 for i in range(24)]}).to_csv(tmp_path / "id.csv", index=False)
    export_onnx(folder, tmp_path / "onnx", quantize="int8", calibration_data=str(tmp_path / "id.csv"))
    fp32 = OnnxHydraModel.from_pretrained(tmp_path / "onnx" / "model.onnx")
    int8 = OnnxHydraModel.from_pretrained(tmp_path / "onnx")
    torch.testing.assert_close(fp32(**batch).member_logits, expected, atol=1e-4, rtol=0)
    assert float((int8(**batch).member_logits - expected).abs().max()) < 0.3

    assert (
        main(["push", str(folder), "--repo-id", "org/slim", "--dry-run", "--staging", str(tmp_path / "staged")]) == 0
    )
    card = (tmp_path / "staged" / "README.md").read_text()
    assert "MLP neurons kept" in card and "x the multiply-adds per token of the Single" in card


def test_slim_members_fine_tuned_apart_average_over_the_members_that_keep_a_neuron(tmp_path):
    """Members fine-tuned apart export their removed neurons as zeros; the averaged MLP of slim members averages
    each neuron over the members that keep it (a neuron kept by members 0 and 1 is their mean, not 2/3 of it)."""
    from transformers import BertForSequenceClassification

    spec = SPECS[0]  # bert
    base = spec.stock()
    neurons = [
        [list(range(0, 40)), list(range(64))],
        [list(range(20, 64)), list(range(10))],
        [[5], list(range(30, 64))],
    ]
    members = []
    for seed, kept in zip((1, 2, 3), neurons):  # each checkpoint as a slim member exports it: removed neurons zero
        member = perturbed(base, seed)
        zero_removed_neurons_(member, get_family("bert"), {"text": kept})
        member.save_pretrained(tmp_path / f"m{seed}")
        members.append(member)
    masks = HeadMasks(kept_heads=UNEQUAL, num_heads=H, kept_neurons=neurons, intermediate_size=64)
    model = convert_checkpoint(masks, members=[tmp_path / f"m{s}" for s in (1, 2, 3)], mlp_fusion="average")
    assert model.config.mlp_fusion == "average"
    fc2 = model.hydra.layers[0].mlp.fc2_weight  # (d, K), member-major columns
    stock = [m.bert.encoder.layer[0].output.dense.weight for m in members]  # (d, I) each
    for m, kept in enumerate(neurons):
        lo = sum(len(n[0]) for n in neurons[:m])
        for j_pos, j in enumerate(kept[0]):
            keepers = [k for k in range(3) if j in neurons[k][0]]
            expected = sum(stock[k][:, j] for k in keepers) / len(keepers)
            torch.testing.assert_close(fc2[:, lo + j_pos], expected, atol=1e-6, rtol=0)
    assert isinstance(base, BertForSequenceClassification)
