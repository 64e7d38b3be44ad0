"""Head pruning of stock transformers decoders (Llama, Mistral, Qwen2, Qwen3, GPT-2; issue 28 item 3).

Values are checked against hand computations on tiny random models: gates == zeroing W_O's input
blocks (columns of ``o_proj``, rows of GPT-2's ``Conv1D`` ``c_proj``), exact restore, next-token
logits/labels at the valid positions, Taylor weight and gate scores (grouped-query attention:
a query head takes its group's K/V rows), the sequence-level MSP AUROC of the LM circuit evaluator,
and per-layer / global budgets of Taylor and circuit search on a causal LM.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from transformers import (
    GPT2Config,
    GPT2ForSequenceClassification,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForSequenceClassification,
    LlamaModel,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from hydra_hf.errors import HydraInputError
from hydra_hf.families.adapters import decoder_adapter, gpt2_adapter, llama_like_adapter, next_token_mask
from hydra_hf.masks import kept_kv_heads
from hydra_hf.metrics import ood_auroc
from hydra_hf.pruning.budget import Budget
from hydra_hf.pruning.circuits import circuit_prune, circuit_prune_criteria, make_evaluator
from hydra_hf.pruning.gates import HeadGates, zero_head_columns_
from hydra_hf.pruning.lm import (
    LMGatedEvaluator,
    causal_lm_adapter,
    lm_batches,
    lm_batches_from_ids,
    sequence_mean,
)
from hydra_hf.pruning.taylor import taylor_prune, taylor_scores

V = 64
COMMON = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
              max_position_embeddings=64, initializer_range=0.2, pad_token_id=0)


def tiny_llama(cls=LlamaForCausalLM, seed=0, **kw):
    torch.manual_seed(seed)
    return cls(LlamaConfig(**{**COMMON, "num_key_value_heads": 2, **kw})).eval()


def tiny_mistral(seed=0):
    torch.manual_seed(seed)
    return MistralForCausalLM(MistralConfig(**COMMON, num_key_value_heads=2, sliding_window=None)).eval()


def tiny_qwen2(seed=0):  # Qwen2: bias on q/k/v, none on o_proj; no GQA here
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(**COMMON, num_key_value_heads=4)).eval()


def tiny_qwen3(seed=0):  # head_dim 16: H * head_dim = 64 != hidden 32; GQA 4 -> 1
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(Qwen3Config(**COMMON, num_key_value_heads=1, head_dim=16)).eval()


def tiny_gpt2(cls=GPT2LMHeadModel, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=V, n_positions=64, initializer_range=0.2,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, pad_token_id=0, **kw)
    return cls(cfg).eval()


CAUSAL = {"llama": tiny_llama, "mistral": tiny_mistral, "qwen2": tiny_qwen2, "qwen3": tiny_qwen3, "gpt2": tiny_gpt2}


def id_lists(n, seed, lo=1, hi=V, min_len=3, max_len=9):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=g).tolist()
    return [torch.randint(lo, hi, (k,), generator=g).tolist() for k in lengths]


def batches(n=6, seed=0, batch_size=3, **kw):
    return lm_batches_from_ids(id_lists(n, seed, **kw), max_length=16, batch_size=batch_size)


def inputs(batch):
    return {k: batch[k] for k in ("input_ids", "attention_mask")}


def hand_zeroed(model, adapter, gates):
    """A copy of ``model`` with the gated-off heads' W_O input blocks zeroed by hand."""
    ref = copy.deepcopy(model)
    ref_adapter = decoder_adapter(ref)
    with torch.no_grad():
        for index, layer in enumerate(ref_adapter.towers["text"]):
            dk = layer.head_dim
            for h in range(layer.num_heads):
                if gates[index, h] == 0:
                    if isinstance(ref_adapter.towers["text"][0].out_proj, torch.nn.Linear):
                        layer.out_proj.weight[:, h * dk : (h + 1) * dk] = 0.0  # nn.Linear (out, in)
                    else:
                        layer.out_proj.weight[h * dk : (h + 1) * dk, :] = 0.0  # Conv1D (in, out)
    return ref


# --------------------------------------------------------------------------------------- GQA rule
def test_kept_kv_heads_examples():
    assert kept_kv_heads([0, 5], 8, 2) == [0, 1]
    assert kept_kv_heads([0, 1, 2, 3], 8, 2) == [0]
    assert kept_kv_heads([7, 4], 8, 2) == [1]
    assert kept_kv_heads([], 8, 2) == []
    assert kept_kv_heads([3, 1], 4, 4) == [1, 3]  # plain multi-head attention: the query heads
    assert kept_kv_heads([2, 3], 4, 1) == [0]  # multi-query attention
    with pytest.raises(HydraInputError):
        kept_kv_heads([0], 6, 4)
    with pytest.raises(HydraInputError):
        kept_kv_heads([8], 8, 2)


# ------------------------------------------------------------------------------------ adapters
def test_adapters_read_the_layouts():
    a = causal_lm_adapter(tiny_llama())
    layer = a.towers["text"][0]
    assert (a.kind, a.task, a.shape(None)) == ("hf_llama", "causal_lm", (2, 4))
    assert (layer.num_heads, layer.head_dim, layer.num_key_value_heads, layer.transposed) == (4, 8, 2, False)
    assert [layer.proj_heads(i) for i in range(3)] == [4, 2, 2]
    q3 = causal_lm_adapter(tiny_qwen3()).towers["text"][0]
    assert (q3.head_dim, q3.num_key_value_heads, q3.out_proj.in_features) == (16, 1, 64)
    assert causal_lm_adapter(tiny_qwen2()).towers["text"][0].num_key_value_heads is None
    g = causal_lm_adapter(tiny_gpt2())
    gl = g.towers["text"][1]
    assert (g.kind, g.task, gl.num_heads, gl.head_dim, gl.transposed) == ("hf_gpt2", "causal_lm", 4, 8, True)
    assert [off for _, off in gl.qkv] == [0, 32, 64]
    # classifiers keep class logits; bare base models have gates but no logits
    cls = llama_like_adapter(tiny_llama(LlamaForSequenceClassification, num_labels=3))
    assert cls.task == "classification"
    b = batches(3)[0]
    assert cls.logits(b).shape == (3, 3)
    assert gpt2_adapter(tiny_gpt2(GPT2ForSequenceClassification, num_labels=2)).logits(b).shape == (3, 2)
    bare = llama_like_adapter(tiny_llama(LlamaModel))
    assert bare.shape(None) == (2, 4)
    with pytest.raises(TypeError, match="no head"):
        bare.logits(b)
    with pytest.raises(TypeError, match="not a causal LM"):
        causal_lm_adapter(tiny_llama(LlamaForSequenceClassification, num_labels=3))


def test_lm_batches_and_logits_at_valid_positions():
    seqs = [[5, 6, 7, 8, 9], [10, 11], [12], [13, 14, 15, 16, 17, 18, 19]]
    (b,) = lm_batches_from_ids(seqs, max_length=6, batch_size=4, pad_token_id=0)
    # [12] predicts nothing and is dropped; the last row is cut to 6 tokens; right padding
    assert b["input_ids"].tolist() == [[5, 6, 7, 8, 9, 0], [10, 11, 0, 0, 0, 0], [13, 14, 15, 16, 17, 18]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0], [1] * 6]
    assert b["labels"].tolist() == [6, 7, 8, 9, 11, 14, 15, 16, 17, 18]
    for name, build in [("llama", tiny_llama), ("gpt2", tiny_gpt2)]:
        model = build()
        adapter = causal_lm_adapter(model)
        with torch.no_grad():
            full = model(**inputs(b)).logits  # (B, T, V)
            got = adapter.logits(b)  # (N_valid, V)
        lengths = b["attention_mask"].sum(1).tolist()
        rows = [full[r, t] for r in range(3) for t in range(lengths[r] - 1)]
        labels = [int(b["input_ids"][r, t + 1]) for r in range(3) for t in range(lengths[r] - 1)]
        torch.testing.assert_close(got, torch.stack(rows), rtol=0, atol=0, msg=name)
        assert b["labels"].tolist() == labels
        # right padding does not change the real positions: each row alone, unpadded, gives the same logits
        with torch.no_grad():
            alone = [model(input_ids=b["input_ids"][r : r + 1, : lengths[r]]).logits[0, :-1] for r in range(3)]
        torch.testing.assert_close(got, torch.cat(alone), rtol=1e-5, atol=1e-5, msg=name)


def test_lm_batches_with_a_tokenizer():
    class CharTokenizer:  # a stand-in: one id per character, offline
        pad_token_id, eos_token_id = None, 2

        def __call__(self, texts, truncation, max_length, add_special_tokens):
            ids = [[1] * add_special_tokens + [3 + ord(c) % 50 for c in t] for t in texts]
            return {"input_ids": [s[:max_length] if truncation else s for s in ids]}

    out = lm_batches(CharTokenizer(), ["abc", "de", "fghijkl"], max_length=5, batch_size=2)
    assert [x["input_ids"].shape for x in out] == [(2, 4), (1, 5)]
    assert out[0]["input_ids"][1].tolist() == [1, 3 + ord("d") % 50, 3 + ord("e") % 50, 2]  # EOS pads
    assert out[0]["labels"].tolist() == [3 + ord(c) % 50 for c in "abc"] + [3 + ord(c) % 50 for c in "de"]


# ------------------------------------------------------------------------------------------ gates
@pytest.mark.parametrize("name", list(CAUSAL))
def test_gates_equal_zeroed_output_blocks_and_restore_exactly(name):
    model = CAUSAL[name]()
    adapter = causal_lm_adapter(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    keys = list(model.state_dict())
    b = batches(4, seed=1, batch_size=4)[0]
    gates = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    with torch.no_grad():
        with HeadGates(model, adapter=adapter) as hg:
            hg.set(gates)
            gated = adapter.logits(b)
        ref = hand_zeroed(model, adapter, gates)
        expected = causal_lm_adapter(ref).logits(b)
        torch.testing.assert_close(gated, expected, rtol=0, atol=1e-6)
        assert (gated - adapter.logits(b)).abs().max() > 1e-3  # the gates did remove something
        # zero_head_columns_ (the reference pruning) zeroes the same blocks as the hand copy
        m3 = copy.deepcopy(model)
        zero_head_columns_(m3, gates, adapter=causal_lm_adapter(m3))
        for k, v in ref.state_dict().items():
            assert torch.equal(m3.state_dict()[k], v), k
    after = model.state_dict()
    assert list(after) == keys
    assert all(torch.equal(before[k], after[k]) for k in keys)


def test_gpt2_gate_gradient_is_the_sum_over_c_proj_rows():
    """dL/dg_h = sum over head h's rows of c_proj.weight (Conv1D: (in, out)) of W * dL/dW."""
    model = tiny_gpt2()
    adapter = causal_lm_adapter(model)
    b = batches(4, seed=2, batch_size=4)[0]
    with HeadGates(model, adapter=adapter, requires_grad=True) as hg:
        F.cross_entropy(adapter.logits(b), b["labels"]).backward()
        gate_grad = hg.gates.grad.clone()
    model.zero_grad()
    F.cross_entropy(adapter.logits(b), b["labels"]).backward()
    for index, block in enumerate(model.transformer.h):
        w, g = block.attn.c_proj.weight, block.attn.c_proj.weight.grad
        hand = (w * g).reshape(4, 8, 32).sum(dim=(1, 2))
        torch.testing.assert_close(gate_grad[index], hand, rtol=1e-4, atol=1e-7)
    model.zero_grad()


# ----------------------------------------------------------------------------------------- Taylor
def _grads(model, adapter, b, weights):
    model.zero_grad()
    for w in weights:
        w.requires_grad_(True)
    F.cross_entropy(adapter.logits(b), b["labels"]).backward()
    out = [w.grad.clone() for w in weights]
    model.zero_grad()
    return out


def test_taylor_weight_scores_by_hand_llama_gqa():
    """Query head h: mean of (mean |Wq*Gq| over its Q rows, same over K rows of group h//2, V rows of group h//2)."""
    model = tiny_llama()
    adapter = causal_lm_adapter(model)
    b = batches(4, seed=3, batch_size=4)[0]
    scores = taylor_scores(adapter, [b], criterion="weight")
    att = model.model.layers[1].self_attn
    ws = [att.q_proj.weight, att.k_proj.weight, att.v_proj.weight]
    gq, gk, gv = _grads(model, adapter, b, ws)
    q = (ws[0] * gq).abs().reshape(4, 8, 32).mean(dim=(1, 2))
    k = (ws[1] * gk).abs().reshape(2, 8, 32).mean(dim=(1, 2))
    v = (ws[2] * gv).abs().reshape(2, 8, 32).mean(dim=(1, 2))
    hand = torch.stack([(q[h] + k[h // 2] + v[h // 2]) / 3 for h in range(4)])
    torch.testing.assert_close(scores[1], hand.detach(), rtol=1e-5, atol=1e-9)
    assert scores.shape == (2, 4) and (scores > 0).all()


def test_taylor_weight_scores_by_hand_gpt2_conv1d():
    """GPT-2: head h's Q/K/V 'rows' are columns h*dk, d + h*dk, 2d + h*dk (+dk) of c_attn.weight (in, out)."""
    model = tiny_gpt2()
    adapter = causal_lm_adapter(model)
    b = batches(4, seed=4, batch_size=4)[0]
    scores = taylor_scores(adapter, [b], criterion="weight")
    w = model.transformer.h[0].attn.c_attn.weight  # (32, 96)
    (g,) = _grads(model, adapter, b, [w])
    imp = (w * g).abs().detach()
    hand = torch.stack([
        torch.stack([imp[:, p * 32 + h * 8 : p * 32 + (h + 1) * 8].mean() for p in range(3)]).mean() for h in range(4)
    ])
    torch.testing.assert_close(scores[0], hand, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("name", ["llama", "gpt2", "qwen3"])
def test_taylor_prune_budgets_on_a_causal_lm(name):
    adapter = causal_lm_adapter(CAUSAL[name]())
    data = batches(4, seed=5, batch_size=2)
    per_layer = taylor_prune(adapter, data, Budget(heads_per_layer=1), progress=False)
    assert per_layer.gates.sum(dim=1).tolist() == [1.0, 1.0]
    glob = taylor_prune(adapter, data, Budget(remove=3), progress=False, criterion="gate")
    assert int(glob.gates.sum()) == 5 and len(glob.removal_order) == 3


def test_taylor_per_layer_budget_in_one_round_keeps_each_layers_top_heads_of_one_pass():
    """rounds=1: one scoring pass with every head present, each layer keeping its top K of those
    scores; with rescoring the first layer is chosen from the same pass and the later layers from rescored ones."""
    model = CAUSAL["llama"]()
    adapter = causal_lm_adapter(model)
    data = batches(4, seed=6, batch_size=2)
    once = taylor_scores(adapter, data, criterion="weight")  # (L, H), every head present
    fast = taylor_prune(adapter, data, Budget(heads_per_layer=2), rounds=1, progress=False)
    want = torch.zeros_like(once)
    for layer, row in enumerate(once):
        want[layer, torch.sort(-row, stable=True).indices[:2]] = 1.0
    assert torch.equal(fast.gates, want) and fast.metadata["rounds"] == 1
    torch.testing.assert_close(fast.scores, once)
    slow = taylor_prune(adapter, data, Budget(heads_per_layer=2), progress=False)
    assert torch.equal(slow.gates[0], want[0]) and "rounds" not in slow.metadata
    torch.testing.assert_close(slow.scores[0], once[0])
    assert not torch.allclose(slow.scores[1], once[1])  # layer 1 was rescored with layer 0 pruned


# --------------------------------------------------------------------------------------- circuits
def _hand_scores(model, adapter, gates, id_b, ood_b):
    """Next-token accuracy and the AUROC of per-sequence mean MSPs, from a hand-zeroed copy."""
    ref = hand_zeroed(model, adapter, gates)
    hits, total = 0, 0

    def msps(bs, count):
        nonlocal hits, total
        out = []
        for b in bs:
            with torch.no_grad():
                full = ref(**inputs(b)).logits.double()
            for r, n in enumerate(b["attention_mask"].sum(1).tolist()):
                p = full[r, : n - 1].softmax(-1)
                out.append(p.amax(-1).mean())
                if count:
                    hits += int((p.argmax(-1) == b["input_ids"][r, 1:n]).sum())
                    total += n - 1
        return torch.stack(out)

    ood = ood_auroc(msps(id_b, True), msps(ood_b, False))
    acc = hits / total
    return {"acc": acc, "ood": ood, "avg": (acc + ood) / 2}


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_lm_evaluator_scores_by_hand(name):
    model = CAUSAL[name]()
    adapter = causal_lm_adapter(model)
    id_b = batches(6, seed=6, batch_size=3, hi=V // 2)
    ood_b = batches(5, seed=7, batch_size=2, lo=V // 2)
    ev = make_evaluator(adapter, id_b, ood_b)
    assert isinstance(ev, LMGatedEvaluator)
    gates = torch.tensor([[1.0, 1.0, 0.0, 1.0], [1.0, 0.0, 1.0, 1.0]])
    hand = _hand_scores(model, adapter, gates, id_b, ood_b)
    for score in ("acc", "ood", "avg"):
        assert ev.score_of(gates, score) == pytest.approx(hand[score], abs=1e-9), score
    # evaluate: candidate (0, 0) also off == score_of those gates
    many = ev.evaluate_many(gates, [(0, 0), (1, 3)], ("acc", "ood", "avg"))
    g2 = gates.clone()
    g2[1, 3] = 0.0
    hand2 = _hand_scores(model, adapter, g2, id_b, ood_b)
    for score in ("acc", "ood", "avg"):
        assert float(many[score][1]) == pytest.approx(hand2[score], abs=1e-9)
    assert float(ev.evaluate(gates, [(1, 3)], "ood")[0]) == pytest.approx(hand2["ood"], abs=1e-12)


def test_sequence_mean():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0]])  # 2, 0, 1 valid positions
    values = torch.tensor([1.0, 3.0, 5.0], dtype=torch.float64)
    assert sequence_mean(values, mask).tolist() == [2.0, 5.0]
    assert next_token_mask(mask).sum().item() == 3
    with pytest.raises(ValueError):
        sequence_mean(values[:2], mask)


def test_circuit_search_on_a_causal_lm_keeps_the_budget():
    model = tiny_llama()
    adapter = causal_lm_adapter(model)
    id_b = batches(4, seed=8, batch_size=2, hi=V // 2)
    ood_b = batches(4, seed=9, batch_size=2, lo=V // 2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = circuit_prune(adapter, id_b, ood_b, Budget(heads_per_layer=2), score="avg", progress=False)
    assert result.gates.sum(dim=1).tolist() == [2.0, 2.0]
    assert len(result.removal_order) == 4
    history = result.metadata["score_history"]
    assert len(history) == 5
    # the first removal is the best single ablation, and the history's last value is the final model's score
    ev = LMGatedEvaluator(adapter, id_b, ood_b)
    assert history[-1] == pytest.approx(ev.score_of(result.gates, "avg"), abs=1e-12)
    first = ev.evaluate(torch.ones(2, 4), [(l, h) for l in range(2) for h in range(4)], "avg")
    assert history[1] == pytest.approx(float(first.max()), abs=1e-12)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    # lockstep criteria: one result per score, each what circuit_prune gives alone
    acc, ood = circuit_prune_criteria(adapter, id_b, ood_b, Budget(remove=3), scores=["acc", "ood"], progress=False)
    alone = circuit_prune(adapter, id_b, ood_b, Budget(remove=3), score="ood", progress=False)
    assert int(acc.gates.sum()) == 5 and ood.removal_order == alone.removal_order
