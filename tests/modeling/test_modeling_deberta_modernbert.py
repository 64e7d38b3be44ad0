"""DeBERTa-v2/v3 and ModernBERT Hydra Ensembles against stock transformers: every member equals the stock
model with its removed heads' W_O column blocks zeroed (fp32, 1e-5), with padding, in eager and SDPA;
gradients too. Tiny random configs; numbers, not shapes."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable

import pytest
import torch
from transformers import (
    DebertaV2Config,
    DebertaV2ForSequenceClassification,
    ModernBertConfig,
    ModernBertForSequenceClassification,
)

from hydra_hf.convert.build import base_config_dict
from hydra_hf.convert.hf_deberta_v2 import deberta_v2_member_from_state_dict, fuse_deberta_v2, unfuse_deberta_v2
from hydra_hf.convert.hf_modernbert import fuse_modernbert, modernbert_member_from_state_dict, unfuse_modernbert
from hydra_hf.modeling.configuration_hydra_deberta_v2 import HydraEnsembleDebertaV2Config
from hydra_hf.modeling.configuration_hydra_modernbert import HydraEnsembleModernBertConfig
from hydra_hf.modeling.modeling_hydra_deberta_v2 import HydraEnsembleDebertaV2ForSequenceClassification
from hydra_hf.modeling.modeling_hydra_modernbert import (
    HydraEnsembleModernBertForSequenceClassification,
    HydraGatedMLP,
)

ATOL = 1e-5
H, DK, T = 4, 8, 13
FULL = [[[0, 1, 2, 3]] * 3] * 3
UNIFORM = [[[0, 1], [2, 3], [1, 2]], [[1, 3], [0, 1], [0, 3]], [[2, 3], [1, 2], [0, 1]]]
UNEQUAL = [  # 3 members x 3 layers, unequal widths, member 1 keeps no head in layer 2
    [[0, 1], [2, 3], [1]],
    [[1, 2, 3], [0], []],
    [[0], [0, 1, 2, 3], [0, 2]],
]
TINY = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, vocab_size=99, max_position_embeddings=64,
            num_labels=3, initializer_range=0.2, pad_token_id=0)
# DeBERTa-v3 layout: log-bucketed relative positions (8 buckets < 13 tokens), LayerNorm on the table,
# position projections shared with Q/K, no absolute positions, no token types
DEBERTA_V3 = dict(intermediate_size=64, relative_attention=True, position_buckets=8, max_relative_positions=64,
                  norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type="p2c|c2p", position_biased_input=False,
                  type_vocab_size=0)
# DeBERTa-v2 variants: own pos_key_proj / pos_query_proj, clamped (un-bucketed) positions, absolute
# positions and token types, the convolution after layer 0 (xlarge / xxlarge)
DEBERTA_V2 = dict(intermediate_size=64, relative_attention=True, max_relative_positions=6, share_att_key=False,
                  pos_att_type="p2c|c2p", position_biased_input=True, type_vocab_size=2, conv_kernel_size=3,
                  conv_act="gelu")
# ModernBERT: a 4-token window (each token sees +-2) in layer 1, global layers 0 and 2, no biases
MODERNBERT = dict(intermediate_size=48, local_attention=4, global_attn_every_n_layers=2, bos_token_id=2,
                  eos_token_id=3, cls_token_id=2, sep_token_id=3)


@dataclass
class Family:
    stock_class: type
    config_class: type
    reader: Callable
    fuse: Callable
    unfuse: Callable
    hydra_config: type
    hydra_model: type
    prefix: str  # the stock encoder attribute
    attn: tuple[str, ...]  # attention implementations of the stock model

    def stock(self, seed: int = 0, attn: str = "eager", **overrides: Any):
        cfg = self.config_class(**{**TINY, **overrides})
        cfg._attn_implementation = attn
        torch.manual_seed(seed)
        model = self.stock_class(cfg).eval()
        with torch.no_grad():  # non-trivial LayerNorms and biases
            for name, p in model.named_parameters():
                if "norm" in name.lower():
                    p.add_(0.1 * torch.randn_like(p))
        return model

    def out_proj(self, model, layer: int) -> torch.nn.Linear:
        encoder = getattr(model, self.prefix)
        if self.prefix == "deberta":
            return encoder.encoder.layer[layer].attention.output.dense
        return encoder.layers[layer].attn.Wo

    def zeroed(self, model, kept_member: list[list[int]]):
        """The reference: a copy of ``model`` with each removed head's block of W_O columns zeroed."""
        ref = copy.deepcopy(model).eval()
        with torch.no_grad():
            for layer, heads in enumerate(kept_member):
                w = self.out_proj(ref, layer).weight  # (d, H*dk)
                for h in range(H):
                    if h not in heads:
                        w[:, h * DK : (h + 1) * DK] = 0
        return ref

    def fused(self, stocks: list, kept, mlp_fusion: str = "per_member"):
        members = [self.reader(s.state_dict(), s.config.to_dict(), source=f"member {i}") for i, s in enumerate(stocks)]
        state = self.fuse(members * (3 if len(members) == 1 else 1), kept, mlp_fusion)
        config = self.hydra_config(
            base_config=base_config_dict(stocks[0].config.to_dict()),
            kept_heads=kept,
            mlp_fusion=mlp_fusion,
            num_labels=3,
        )
        model = self.hydra_model(config).eval()
        model.load_state_dict(state, strict=True)
        return model


DEBERTA = Family(
    DebertaV2ForSequenceClassification, DebertaV2Config, deberta_v2_member_from_state_dict, fuse_deberta_v2,
    unfuse_deberta_v2, HydraEnsembleDebertaV2Config, HydraEnsembleDebertaV2ForSequenceClassification, "deberta",
    ("eager",),  # transformers' DeBERTa-v2 has its own attention only
)
MODERN = Family(
    ModernBertForSequenceClassification, ModernBertConfig, modernbert_member_from_state_dict, fuse_modernbert,
    unfuse_modernbert, HydraEnsembleModernBertConfig, HydraEnsembleModernBertForSequenceClassification, "model",
    ("eager", "sdpa"),
)
CASES = {
    "deberta_v3": (DEBERTA, DEBERTA_V3),
    "deberta_v2": (DEBERTA, DEBERTA_V2),
    "modernbert_cls": (MODERN, MODERNBERT),
    "modernbert_mean": (MODERN, {**MODERNBERT, "classifier_pooling": "mean"}),
}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models: one intra-op thread (measured: a 39x32 @ 32x96 product takes 17 us on 1 thread and
    3.5 ms on 2 threads of a busy 2-core machine, where the second thread waits for a core)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _batch(batch_size: int = 3, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 99, (batch_size, T), generator=g)
    mask = torch.ones(batch_size, T, dtype=torch.long)
    for i in range(1, batch_size):  # real padding: rows of 13, 9 and 5 tokens
        mask[i, T - 4 * i :] = 0
        ids[i, T - 4 * i :] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _perturbed(family: Family, model, seed: int):
    """A member 'fine-tuned' differently: every weight but the shared embeddings (and DeBERTa's shared
    relative-position table; its LayerNorm is per member) perturbed."""
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in out.named_parameters():
            if "embeddings" in name:
                continue
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return out


def _reference(family: Family, stocks: list, kept, batch) -> torch.Tensor:
    with torch.no_grad():
        return torch.stack([family.zeroed(s, k)(**batch).logits for s, k in zip(stocks, kept)], dim=1)  # (B, M, C)


@pytest.mark.parametrize("case", list(CASES))
def test_all_heads_equal_stock(case):
    """Every member keeping every head is the stock model, whatever the stock attention (eager, SDPA)
    and the fused one."""
    family, overrides = CASES[case]
    batch = _batch()
    for stock_attn in family.attn:
        stock = family.stock(attn=stock_attn, **overrides)
        with torch.no_grad():
            expected = stock(**batch).logits  # (B, C)
        model = family.fused([stock], FULL)
        for attn in ("eager", "sdpa"):
            model.set_attn_implementation(attn)
            with torch.no_grad():
                out = model(**batch)
            for m in range(3):
                torch.testing.assert_close(out.member_logits[:, m], expected, atol=ATOL, rtol=0)
            torch.testing.assert_close(out.logits, torch.log_softmax(expected, -1), atol=ATOL, rtol=0)


@pytest.mark.parametrize("kept", [UNIFORM, UNEQUAL], ids=["uniform", "unequal"])
@pytest.mark.parametrize("case", list(CASES))
def test_pruned_members_equal_zeroed_stock(case, kept):
    """Distinct members keeping different heads (one keeps none in layer 2) equal their stock models with
    the removed heads' W_O blocks zeroed; the pruning and the members really change the outputs."""
    family, overrides = CASES[case]
    base = family.stock(**overrides)
    stocks = [_perturbed(family, base, seed) for seed in (1, 2, 3)]
    batch = _batch()
    ref = _reference(family, stocks, kept, batch)
    model = family.fused(stocks, kept, "per_member")
    for attn in ("eager", "sdpa"):
        model.set_attn_implementation(attn)
        with torch.no_grad():
            out = model(**batch).member_logits
        torch.testing.assert_close(out, ref, atol=ATOL, rtol=0)
    with torch.no_grad():
        unpruned = torch.stack([s(**batch).logits for s in stocks], dim=1)
    assert (unpruned - ref).abs().max() > 1e-2  # the masks matter
    assert (ref[:, 0] - ref[:, 1]).abs().max() > 1e-2  # the members differ
    # unfuse is the inverse of fuse: member m's stock dict reproduces member_logits[:, m]
    for m, sd in enumerate(family.unfuse(model.state_dict(), model.config)):
        stock = family.stock_class(base.config).eval()
        stock.load_state_dict(sd, strict=True)
        with torch.no_grad():
            torch.testing.assert_close(stock(**batch).logits, out[:, m], atol=ATOL, rtol=0)


@pytest.mark.parametrize("case", ["deberta_v3", "deberta_v2", "modernbert_cls"])
def test_gradients_equal_reference(case):
    """Training the fused model is training the members: the gradients of the mean member loss w.r.t.
    member m's kept rows of Q/K/V (and DeBERTa's position projections), its W_O columns and its MLP
    equal the stock reference's, and the shared embeddings get the sum of the references' gradients."""
    family, overrides = CASES[case]
    base = family.stock(**overrides)
    stocks = [_perturbed(family, base, seed) for seed in (4, 5, 6)]
    kept = UNEQUAL
    model = family.fused(stocks, kept, "per_member")  # eval: dropout off, gradients on
    model.set_attn_implementation("eager")
    batch, labels = _batch(), torch.tensor([0, 2, 1])
    model(**batch, labels=labels).loss.backward()
    refs = [family.zeroed(s, k) for s, k in zip(stocks, kept)]
    for ref in refs:
        (torch.nn.functional.cross_entropy(ref(**batch).logits, labels) / 3).backward()
    layer = 1
    widths = [len(k[layer]) for k in kept]
    for m, ref in enumerate(refs):
        start, heads = sum(widths[:m]), kept[m][layer]
        rows = torch.cat([torch.arange(h * DK, (h + 1) * DK) for h in heads])
        n = len(heads) * DK
        fused = model.hydra.layers[layer]
        qkv_grad = fused.attention.qkv_weight.grad[3 * DK * start : 3 * DK * start + 3 * n]  # (3*k*dk, d)
        o_grad = fused.attention.o_weight.grad[DK * start : DK * start + n]  # (k*dk, d)
        if family is DEBERTA:
            att = ref.deberta.encoder.layer[layer].attention
            ref_qkv = [att.self.query_proj.weight.grad, att.self.key_proj.weight.grad, att.self.value_proj.weight.grad]
            ref_o = att.output.dense.weight.grad
            ref_fc1 = ref.deberta.encoder.layer[layer].intermediate.dense.weight.grad
            if hasattr(att.self, "pos_key_proj"):
                torch.testing.assert_close(
                    fused.attention.pos_key_weight.grad[DK * start : DK * start + n],
                    att.self.pos_key_proj.weight.grad[rows], atol=1e-6, rtol=1e-4,
                )
        else:
            att = ref.model.layers[layer].attn
            ref_qkv = list(att.Wqkv.weight.grad.chunk(3))
            ref_o = att.Wo.weight.grad
            ref_fc1 = ref.model.layers[layer].mlp.Wi.weight.grad
        torch.testing.assert_close(qkv_grad, torch.cat([g[rows] for g in ref_qkv]), atol=1e-6, rtol=1e-4)
        torch.testing.assert_close(o_grad, ref_o[:, rows].T, atol=1e-6, rtol=1e-4)
        torch.testing.assert_close(fused.mlp.fc1_weight.grad[m], ref_fc1, atol=1e-6, rtol=1e-4)
    embedding = model.get_input_embeddings().weight.grad
    ref_embedding = sum(r.get_input_embeddings().weight.grad for r in refs)
    torch.testing.assert_close(embedding, ref_embedding, atol=1e-6, rtol=1e-4)


def test_sliding_window_and_relative_positions_matter():
    """The references above exercise what they claim: ModernBERT's 4-token window changes the stock
    outputs at 13 tokens (so the fused band mask is tested), and DeBERTa's c2p/p2c terms are not
    negligible (so slicing them per head is tested)."""
    batch = _batch()
    stock = MODERN.stock(**MODERNBERT)
    wide = MODERN.stock_class(MODERN.config_class(**{**TINY, **MODERNBERT, "local_attention": 64})).eval()
    wide.load_state_dict(stock.state_dict())
    with torch.no_grad():
        assert (stock(**batch).logits - wide(**batch).logits).abs().max() > 1e-3
    stock = DEBERTA.stock(**DEBERTA_V3)
    flat = copy.deepcopy(stock)
    with torch.no_grad():
        flat.deberta.encoder.rel_embeddings.weight.normal_()
        assert (stock(**batch).logits - flat(**batch).logits).abs().max() > 1e-3


@pytest.mark.parametrize("fusion", ["average", "per_member"])
def test_chunked_gated_mlp_equals_one_pass(fusion, monkeypatch):
    stock = MODERN.stock(**MODERNBERT)
    model = MODERN.fused([stock], UNEQUAL, fusion)
    batch = _batch()
    with torch.no_grad():
        whole = model(**batch).member_logits
        monkeypatch.setattr(HydraGatedMLP, "chunk_rows", 5)  # 3 x 13 tokens: several partial chunks
        chunked = model(**batch).member_logits
    torch.testing.assert_close(chunked, whole, atol=1e-6, rtol=0)


def test_attention_maps_are_the_members_heads():
    """Eager attention maps of the fused DeBERTa (c2p/p2c included) and ModernBERT (sliding window
    included): layer l's map k belongs to (member, head) in member order and equals the reference's."""
    batch = _batch()
    for family, overrides in (CASES["deberta_v3"], CASES["modernbert_cls"]):
        stock = family.stock(**overrides)
        model = family.fused([stock], UNIFORM)
        model.set_attn_implementation("eager")
        with torch.no_grad():
            maps = model(**batch, output_attentions=True).attentions
            for m in range(3):
                ref = family.zeroed(stock, UNIFORM[m])(**batch, output_attentions=True).attentions
                for layer in range(3):
                    start, heads = 2 * m, UNIFORM[m][layer]
                    torch.testing.assert_close(
                        maps[layer][:, start : start + 2], ref[layer][:, heads], atol=1e-6, rtol=0
                    )


@pytest.mark.parametrize(
    "family, overrides, change, message",
    [
        (DEBERTA, DEBERTA_V3, lambda sd: sd.pop("deberta.encoder.layer.1.attention.self.key_proj.weight"), "missing"),
        (DEBERTA, DEBERTA_V3, lambda sd: sd.update({"deberta.encoder.layer.3.output.dense.weight": torch.zeros(1)}),
         "does not have"),
        (MODERN, MODERNBERT, lambda sd: sd.pop("model.layers.2.attn_norm.weight"), "missing"),
        (MODERN, MODERNBERT, lambda sd: sd.update({"model.layers.0.attn.Wo.bias": torch.zeros(32)}), "does not have"),
        (MODERN, MODERNBERT, lambda sd: sd.update({"model.layers.1.attn.Wqkv.weight": torch.zeros(64, 32)}), "Wqkv"),
    ],
)
def test_readers_check_key_counts_and_shapes(family, overrides, change, message):
    stock = family.stock(**overrides)
    sd = dict(stock.state_dict())
    change(sd)
    with pytest.raises(ValueError, match=message):
        family.reader(sd, stock.config.to_dict(), source="ckpt")


@pytest.mark.parametrize("family, overrides, arch", [(DEBERTA, DEBERTA_V3, "DebertaV2ForTokenClassification"),
                                                     (MODERN, MODERNBERT, "ModernBertForQuestionAnswering")])
def test_other_task_heads_are_refused(family, overrides, arch, tmp_path):
    """A token-classification / QA checkpoint is never converted into a sequence classifier: one line
    naming its architecture."""
    import json

    from hydra_hf.assemble import convert_checkpoint
    from hydra_hf.masks import HeadMasks

    family.stock(**overrides).save_pretrained(tmp_path / "ckpt")
    config_file = tmp_path / "ckpt" / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "architectures": [arch]}))
    with pytest.raises(ValueError, match=arch):
        convert_checkpoint(HeadMasks(kept_heads=FULL, num_heads=H), base=tmp_path / "ckpt")


# ------------------------------------------------------------------ through the family registry
SENTENCES = ["the movie was very good", "a boring plot and awful actor", "i was not fun"]
WORDS = "the a movie film good bad great awful plot actor fun boring i it was is and not very".split()
END_TO_END = ("deberta_v3", "modernbert_cls")


@pytest.fixture(scope="module")
def stock_dirs(tmp_path_factory):
    """Saved stock classifiers (DeBERTa-v3 layout, ModernBERT) with a WordPiece tokenizer."""
    from conftest import write_tiny_tokenizer

    root = tmp_path_factory.mktemp("stock")
    out = {}
    for case in END_TO_END:
        family, overrides = CASES[case]
        folder = root / case
        family.stock(**overrides).save_pretrained(folder)
        write_tiny_tokenizer(folder)
        out[case] = folder
    return out


@pytest.fixture(scope="module")
def csv_files(tmp_path_factory):
    import pandas as pd

    root = tmp_path_factory.mktemp("data")
    g = torch.Generator().manual_seed(0)

    def texts(n: int) -> list[str]:
        lengths = torch.randint(2, 9, (n,), generator=g)
        return [" ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (int(k),), generator=g)) for k in lengths]

    pd.DataFrame({"review": texts(8), "stars": [k % 3 for k in range(8)]}).to_csv(root / "id.csv", index=False)
    pd.DataFrame({"text": texts(8)}).to_csv(root / "ood.csv", index=False)
    return root / "id.csv", root / "ood.csv"


@pytest.mark.parametrize("case", END_TO_END)
def test_registry_detects_and_gates_equal_zeroed_reference(stock_dirs, case):
    """The registry finds the family from the folder; its pruning adapter's gates (W_O column blocks
    scaled by 0/1) give exactly the zeroed-W_O reference."""
    from hydra_hf.families import detect_family, get_adapter
    from hydra_hf.pruning.gates import HeadGates

    family, overrides = CASES[case]
    assert detect_family(stock_dirs[case]).name == {"deberta_v3": "deberta_v2", "modernbert_cls": "modernbert"}[case]
    stock = family.stock_class.from_pretrained(stock_dirs[case]).eval()
    adapter = get_adapter(stock)
    assert adapter.shape(None) == (3, H)
    gates = torch.tensor([[1.0, 1, 0, 0], [0, 0, 1, 1], [0, 0, 0, 0]])
    kept = [[h for h in range(H) if gates[l, h]] for l in range(3)]
    batch = _batch()
    with torch.no_grad():
        expected = family.zeroed(stock, kept)(**batch).logits
        with HeadGates(stock, adapter=adapter) as hg:
            hg.set(gates)
            gated = stock(**batch).logits
        restored = stock(**batch).logits
    torch.testing.assert_close(gated, expected, atol=ATOL, rtol=0)
    assert (restored - expected).abs().max() > 1e-3  # the gates are gone after the block


def test_prune_convert_remote_code_and_pipeline(stock_dirs, csv_files, tmp_path):
    """`hydra-hf prune` (Taylor, circuit-avg) -> convert_checkpoint -> a fresh process without hydra_hf
    loads both folders through remote code: same logits, and the text-classification pipeline's scores
    are the ensemble mean of the members' softmaxes."""
    import json

    from conftest import run_fresh_python
    from transformers import AutoTokenizer

    from hydra_hf.assemble import convert_checkpoint
    from hydra_hf.cli import main
    from hydra_hf.masks import HeadMasks

    id_csv, ood_csv = csv_files
    expected, outs = {}, {}
    for case in END_TO_END:
        common = ["prune", "--model", str(stock_dirs[case]), "--id-data", str(id_csv), "--text-column", "review",
                  "--label-column", "stars", "--no-progress", "--batch-size", "8"]
        taylor, circuit = tmp_path / f"{case}-taylor.json", tmp_path / f"{case}-circuit.json"
        assert (
            main([*common, "--output", str(taylor), "--method", "taylor", "--members", "2", "--heads-per-layer", "2"])
            == 0
        )
        assert main([*common, "--output", str(circuit), "--method", "circuit-avg", "--members", "1", "--remove", "2",
                     "--ood-data", str(ood_csv), "--ood-text-column", "text"]) == 0
        assert all(len(h) == 2 for m in HeadMasks.load(taylor).kept_heads for h in m)
        masks = HeadMasks.load(circuit)
        assert masks.num_members == 1 and masks.num_kept(0) == 10
        out = tmp_path / f"hydra-{case}"
        model = convert_checkpoint(taylor, base=stock_dirs[case], output_dir=out)
        config = json.loads((out / "config.json").read_text())
        family = CASES[case][0]
        assert config["auto_map"]["AutoModelForSequenceClassification"].endswith(family.hydra_model.__name__)
        enc = AutoTokenizer.from_pretrained(stock_dirs[case])(SENTENCES, padding=True, return_tensors="pt")
        with torch.no_grad():
            expected[case] = model(**enc).logits
        outs[case] = str(out)
    code = f"""
        import json, sys, torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline
        result = {{}}
        for case, out in {outs!r}.items():
            model = AutoModelForSequenceClassification.from_pretrained(out, trust_remote_code=True).eval()
            tokenizer = AutoTokenizer.from_pretrained(out, trust_remote_code=True)
            enc = tokenizer({SENTENCES!r}, padding=True, return_tensors="pt")
            with torch.no_grad():
                logits = model(**enc).logits
            pipe = pipeline("text-classification", model=out, trust_remote_code=True, top_k=None)
            scores = [{{d["label"]: d["score"] for d in p}} for p in pipe({SENTENCES!r})]
            result[case] = {{"logits": logits.tolist(), "module": type(model).__module__, "scores": scores,
                            "labels": [model.config.id2label[c] for c in range(3)]}}
        assert sys.modules.get("hydra_hf") is None
        print(json.dumps(result))
    """
    env = {"HF_MODULES_CACHE": str(tmp_path / "modules"), "OMP_NUM_THREADS": "1"}  # tiny models: one thread
    stdout = run_fresh_python(code, env=env)
    result = json.loads(stdout.strip().splitlines()[-1])
    for case in END_TO_END:
        got = result[case]
        assert got["module"].startswith("transformers_modules"), got["module"]
        torch.testing.assert_close(torch.tensor(got["logits"]), expected[case], atol=ATOL, rtol=0)
        mean_probs = torch.softmax(expected[case], -1)  # logits = log of the members' mean softmax
        for i, scores in enumerate(got["scores"]):
            torch.testing.assert_close(
                torch.tensor([scores[l] for l in got["labels"]]), mean_probs[i], atol=ATOL, rtol=0
            )


def test_pretrained_masked_lm_checkpoints_convert(tmp_path):
    """A pre-trained masked-LM checkpoint (DeBERTa's legacy and new LM heads, ModernBERT's decoder) converts
    into a classifier whose encoder is the stock encoder; the LM head is ignored by name (ModernBERT's
    prediction head is reused, as transformers does), the classifier is new."""
    from transformers import DebertaV2ForMaskedLM, ModernBertForMaskedLM

    from hydra_hf.assemble import convert_checkpoint
    from hydra_hf.masks import HeadMasks

    batch = _batch()
    keep = batch["attention_mask"].bool()
    masks = HeadMasks(kept_heads=FULL, num_heads=H)
    for name, cls, family, overrides in [
        ("legacy", DebertaV2ForMaskedLM, DEBERTA, DEBERTA_V3),
        ("new-head", DebertaV2ForMaskedLM, DEBERTA, {**DEBERTA_V3, "legacy": False}),
        ("modernbert", ModernBertForMaskedLM, MODERN, MODERNBERT),
    ]:
        torch.manual_seed(0)
        stock = cls(family.config_class(**{**TINY, **overrides})).eval()
        stock.save_pretrained(tmp_path / name)
        model = convert_checkpoint(masks, base=tmp_path / name)
        encoder = getattr(stock, family.prefix)
        with torch.no_grad():
            expected = encoder(**batch).last_hidden_state  # (B, T, d)
            got = model.hydra(**batch).member_last_hidden_state  # (B, M, T, d)
        for m in range(3):
            torch.testing.assert_close(got[:, m][keep], expected[keep], atol=ATOL, rtol=0)
    sd = dict(DEBERTA.stock(**DEBERTA_V3).state_dict())
    sd["deberta.embeddings.position_ids"] = torch.arange(64)[None]  # saved by old transformers versions
    DEBERTA.reader(sd, DEBERTA.stock(**DEBERTA_V3).config.to_dict())
