"""The fused GPT-2 (``modeling_hydra_gpt2.py``, ``convert/hf_gpt2.py``) against transformers' GPT-2.

The reference for member m is the stock model with the ``c_proj`` rows of m's removed heads set to zero
(GPT-2's ``Conv1D`` stores ``(in, out)``: head h's inputs are rows ``h*dk .. (h+1)*dk``). Checked: the
members' logits of the causal LM (eager and SDPA, left-padded batch, unequal members with a member that
keeps no head of a layer, averaged MLP with identical members and per-member MLP with perturbed members),
the same with the cache (a prefix, then the continuation), greedy and beam ``generate`` of a one-member
Hydra token for token against the stock model, unfuse / re-fuse, the sequence classifier member-wise,
and a save_pretrained / remote-code round trip.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache, GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel

from hydra_hf.convert.hf_gpt2 import fuse_gpt2, gpt2_member_from_state_dict, unfuse_gpt2
from hydra_hf.modeling.configuration_hydra_gpt2 import HydraEnsembleGPT2Config
from hydra_hf.modeling.modeling_hydra_gpt2 import (
    HydraEnsembleGPT2ForCausalLM,
    HydraEnsembleGPT2ForSequenceClassification,
)

V, H, L, PAD = 61, 4, 3, 0
# unequal members; member 1 keeps no head of layer 1, member 0 every head of layer 0
KEPT = [[[0, 1, 2, 3], [1, 3], [0]], [[2], [], [1, 2, 3]], [[0, 3], [0, 1, 2], [2, 3]]]
ATOL = 1e-5


def gpt2_config(**kw) -> GPT2Config:
    args = dict(n_embd=32, n_layer=L, n_head=H, vocab_size=V, n_positions=64, initializer_range=0.2, resid_pdrop=0.0,
                embd_pdrop=0.0, attn_pdrop=0.0, pad_token_id=PAD, bos_token_id=1, eos_token_id=2)
    args.update(kw)
    return GPT2Config(**args)


def perturbed(model, seed: int, scale: float = 0.1, skip: tuple[str, ...] = ()):
    """``model`` with every parameter (biases and LayerNorms too) moved by noise, but those named in ``skip``."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not any(s in name for s in skip):
                p.add_(torch.randn(p.shape, generator=g) * scale)
    return model.eval()


def stock(cls=GPT2LMHeadModel, seed: int = 0, impl: str = "eager", **kw):
    torch.manual_seed(seed)
    config = gpt2_config(**kw)
    config._attn_implementation = impl
    return perturbed(cls(config), seed + 100)


def zeroed(model, kept_member: list[list[int]]):
    """The reference: a copy of the stock model with the removed heads' ``c_proj`` rows zeroed."""
    ref = copy.deepcopy(model)
    dk = ref.config.n_embd // ref.config.n_head
    with torch.no_grad():
        for layer, heads in enumerate(kept_member):
            w = ref.transformer.h[layer].attn.c_proj.weight  # (in = H*dk, out = d)
            for h in range(ref.config.n_head):
                if h not in heads:
                    w[h * dk : (h + 1) * dk] = 0
    return ref.eval()


def fused(stocks, kept, mlp_fusion: str, impl: str = "eager", task: str = "causal_lm", lm_head_fusion: str = "shared"):
    members = [gpt2_member_from_state_dict(s.state_dict(), s.config.to_dict()) for s in stocks]
    state = fuse_gpt2(members, kept, mlp_fusion, task=task, lm_head_fusion=lm_head_fusion)
    base = stocks[0].config.to_dict()
    labels = {"num_labels": stocks[0].config.num_labels} if task != "causal_lm" else {}
    config = HydraEnsembleGPT2Config(base_config=base, kept_heads=kept, mlp_fusion=mlp_fusion,
                                     lm_head_fusion=lm_head_fusion, **labels)
    config._attn_implementation = impl
    cls = HydraEnsembleGPT2ForCausalLM if task == "causal_lm" else HydraEnsembleGPT2ForSequenceClassification
    model = cls(config).eval()
    model.load_state_dict(state, strict=True)
    return model, state


def batch(seed: int = 0, lengths=(9, 6, 4), total: int = 9, left: bool = True):
    """Token ids ``(B, total)`` padded with PAD (left or right), the mask, and generate()'s position ids."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.full((len(lengths), total), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        span = slice(total - n, total) if left else slice(0, n)
        ids[b, span] = torch.randint(3, V, (n,), generator=g)
        mask[b, span] = 1
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    return ids, mask, positions


def members_for(mlp_fusion: str, impl: str):
    """Average: one stock model for every member (identical members); per member: perturbed copies
    sharing the token and position embeddings (the tied LM head with them)."""
    base = stock(impl=impl)
    if mlp_fusion == "average":
        return [base] * len(KEPT)
    return [perturbed(copy.deepcopy(base), 10 + m, skip=("wte", "wpe")) for m in range(len(KEPT))]


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("mlp_fusion", ["average", "per_member"])
def test_causal_lm_equals_stock_with_removed_heads_zeroed_with_and_without_cache(impl, mlp_fusion):
    stocks = members_for(mlp_fusion, impl)
    model, _ = fused(stocks, KEPT, mlp_fusion, impl)
    ids, mask, pos = batch()
    valid = mask.bool()
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
        assert out.member_logits.shape == (3, len(KEPT), 9, V) and out.logits.shape == (3, 9, V)
        for m, s in enumerate(stocks):
            ref = zeroed(s, KEPT[m])(input_ids=ids, attention_mask=mask, position_ids=pos).logits
            torch.testing.assert_close(out.member_logits[:, m][valid], ref[valid], atol=ATOL, rtol=0)
            # no mask, no padding (the first row): still causal
            alone = model(input_ids=ids[:1]).member_logits[:, m]
            torch.testing.assert_close(alone, zeroed(s, KEPT[m])(input_ids=ids[:1]).logits, atol=ATOL, rtol=0)
        # the ensemble's logits: log of the mean of the members' softmaxes
        mean = out.member_logits.softmax(-1).mean(1).log()
        torch.testing.assert_close(out.logits[valid], mean[valid], atol=ATOL, rtol=0)
        # the cache: a prefix, then the continuation (two tokens, then one), one DynamicCache for all members
        cache = DynamicCache(config=stocks[0].config)
        first = model(
            input_ids=ids[:, :6], attention_mask=mask[:, :6], position_ids=pos[:, :6], cache=cache, use_cache=True
        )
        assert first.cache is cache and cache.get_seq_length() == 6
        second = model(input_ids=ids[:, 6:8], attention_mask=mask[:, :8], position_ids=pos[:, 6:8], cache=cache,
                       use_cache=True)
        third = model(input_ids=ids[:, 8:], attention_mask=mask, position_ids=pos[:, 8:], cache=cache,
                      use_cache=True, logits_to_keep=1)
        assert cache.get_seq_length() == 9 and third.member_logits.shape == (3, len(KEPT), 1, V)
        stepped = torch.cat([first.member_logits, second.member_logits, third.member_logits], dim=2)
        full = out.member_logits
        for b in range(3):
            torch.testing.assert_close(stepped[b][:, valid[b]], full[b][:, valid[b]], atol=ATOL, rtol=0)
        # the cache holds every member's kept heads side by side: (B, K_l, S, dk)
        assert [tuple(layer.keys.shape) for layer in cache.layers] == [(3, 7, 9, 8), (3, 5, 9, 8), (3, 6, 9, 8)]
        # next-token loss: the mean of the members' cross-entropies
        labels = ids.masked_fill(mask == 0, -100)
        loss = model(input_ids=ids, attention_mask=mask, position_ids=pos, labels=labels).loss
        ce = torch.nn.functional.cross_entropy
        want = torch.stack(
            [ce(out.member_logits[:, m, :-1].reshape(-1, V), labels[:, 1:].reshape(-1)) for m in range(3)]
        )
        torch.testing.assert_close(loss, want.mean(), atol=ATOL, rtol=0)


def test_a_layer_without_any_head_and_scaling_options():
    """Every member drops every head of layer 1 (the cache still counts its tokens); GPT-2's
    ``scale_attn_by_inverse_layer_idx`` and ``reorder_and_upcast_attn`` are the base's."""
    kept = [[[0, 2], [], [1]], [[3], [], [0, 1, 2, 3]]]
    for impl in ("eager", "sdpa"):
        stocks = [stock(impl=impl, scale_attn_by_inverse_layer_idx=True, reorder_and_upcast_attn=True)] * 2
        model, _ = fused(stocks, kept, "average", impl)
        ids, mask, pos = batch(1, lengths=(7, 5), total=7)
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask, position_ids=pos, output_attentions=impl == "eager")
            for m in range(2):
                ref = zeroed(stocks[m], kept[m])(input_ids=ids, attention_mask=mask, position_ids=pos).logits
                torch.testing.assert_close(out.member_logits[:, m][mask.bool()], ref[mask.bool()], atol=ATOL, rtol=0)
            if impl == "eager":
                assert [tuple(a.shape) for a in out.attentions] == [(2, 3, 7, 7), (2, 0, 7, 7), (2, 5, 7, 7)]
            cache = DynamicCache(config=stocks[0].config)
            model(
                input_ids=ids[:, :4], attention_mask=mask[:, :4], position_ids=pos[:, :4], cache=cache, use_cache=True
            )
            rest = model(
                input_ids=ids[:, 4:], attention_mask=mask, position_ids=pos[:, 4:], cache=cache, use_cache=True
            )
            assert cache.get_seq_length() == 7 and cache.layers[1].keys.shape == (2, 0, 7, 8)
            torch.testing.assert_close(rest.member_logits[:, :, -1], out.member_logits[:, :, -1], atol=ATOL, rtol=0)


def test_one_member_generate_equals_stock_token_for_token():
    """A one-member Hydra keeping every head is GPT-2: greedy and beam search give the stock tokens
    (left-padded prompts, the KV cache), and the members' disagreement is zero."""
    base = stock(impl="sdpa")
    everything = [[list(range(H))] * L]
    model, _ = fused([base], everything, "average", "sdpa")
    ids, mask, _ = batch(2, lengths=(5, 3), total=5)
    kwargs = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=PAD, eos_token_id=None)
    with torch.no_grad():
        greedy = base.generate(ids, **kwargs)
        for extra in ({}, {"num_beams": 2}):
            want = base.generate(ids, **kwargs, **extra)
            got = model.generate(ids, **kwargs, **extra)
            assert got.shape == (2, 13) and torch.equal(got, want), extra
        scored = model.generate_with_uncertainty(ids, **kwargs)
        # the base's end-of-sequence and padding tokens are the generation config's
        assert (model.generation_config.eos_token_id, model.generation_config.pad_token_id) == (2, PAD)
        assert torch.equal(model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False),
                           base.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False))
    assert torch.equal(scored.sequences, greedy)
    assert scored.token_entropy.shape == (2, 8) and float(scored.token_mutual_information.abs().max()) < 1e-5


def test_ensemble_generate_with_uncertainty_runs_on_the_shared_cache():
    stocks = members_for("per_member", "sdpa")
    model, _ = fused(stocks, KEPT, "per_member", "sdpa")
    ids, mask, _ = batch(3, lengths=(5, 3), total=5)
    with torch.no_grad():
        beams = model.generate(
            ids, attention_mask=mask, max_new_tokens=4, num_beams=2, do_sample=False, pad_token_id=PAD
        )
        out = model.generate_with_uncertainty(ids, attention_mask=mask, max_new_tokens=6, do_sample=False,
                                              pad_token_id=PAD, eos_token_id=None)
    assert beams.shape == (2, 9)
    assert out.member_top_tokens.shape == (2, 6, 3) and bool((out.token_mutual_information > 0).any())
    # greedy decoding picks the ensemble's most likely token: its probability is the step's largest
    assert bool((out.token_probability > 0).all())


@pytest.mark.parametrize("mlp_fusion", ["average", "per_member"])
def test_unfuse_round_trip(mlp_fusion):
    """unfuse -> stock GPT2LMHeadModel per member reproduces member_logits; re-fusing gives the same tensors."""
    stocks = members_for(mlp_fusion, "eager")
    model, state = fused(stocks, KEPT, mlp_fusion)
    dicts = unfuse_gpt2(model.state_dict(), model.config)
    ids, mask, pos = batch(4)
    with torch.no_grad():
        member_logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).member_logits
        again = []
        for m, sd in enumerate(dicts):
            one = GPT2LMHeadModel(stocks[0].config).eval()
            one.load_state_dict(sd, strict=True)
            got = one(input_ids=ids, attention_mask=mask, position_ids=pos).logits
            torch.testing.assert_close(got[mask.bool()], member_logits[:, m][mask.bool()], atol=ATOL, rtol=0)
            again.append(gpt2_member_from_state_dict(sd, stocks[0].config.to_dict(), source=f"member {m}"))
    refused = fuse_gpt2(again, KEPT, mlp_fusion)
    assert refused.keys() == state.keys()
    for key in state:
        torch.testing.assert_close(refused[key], state[key], atol=1e-7, rtol=0, msg=key)


@pytest.mark.parametrize("left", [True, False])
def test_sequence_classification_member_wise(left):
    """Every member's own GPT2ForSequenceClassification (perturbed, own score), the last non-padding token."""
    base = stock(GPT2ForSequenceClassification, num_labels=3)
    stocks = [perturbed(copy.deepcopy(base), 20 + m, skip=("wte", "wpe")) for m in range(len(KEPT))]
    model, _ = fused(stocks, KEPT, "per_member", task="sequence_classification")
    ids, mask, _ = batch(5, left=left)
    labels = torch.tensor([0, 2, 1])
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        assert out.member_logits.shape == (3, len(KEPT), 3)
        losses = []
        for m, s in enumerate(stocks):
            ref = zeroed(s, KEPT[m])(input_ids=ids, attention_mask=mask, labels=labels)
            torch.testing.assert_close(out.member_logits[:, m], ref.logits, atol=ATOL, rtol=0)
            losses.append(ref.loss)
    torch.testing.assert_close(out.loss, torch.stack(losses).mean(), atol=ATOL, rtol=0)
    # unfuse: stock classifiers
    for m, sd in enumerate(unfuse_gpt2(model.state_dict(), model.config, task="sequence_classification")):
        one = GPT2ForSequenceClassification(stocks[0].config).eval()
        one.load_state_dict(sd, strict=True)
        with torch.no_grad():
            torch.testing.assert_close(one(input_ids=ids, attention_mask=mask).logits, out.member_logits[:, m],
                                       atol=ATOL, rtol=0)


def test_save_pretrained_and_remote_code_round_trip(tmp_path):
    """save_pretrained writes the weights and the shipped files; the folder loads with this tree's class and,
    in a fresh process without hydra_hf, as remote code (the same member logits, greedy generate works)."""
    from conftest import run_fresh_python

    from hydra_hf.families import get_family

    stocks = members_for("per_member", "sdpa")
    ids, mask, pos = batch(6)
    cases = {}
    for lm_head_fusion in ("shared", "per_member"):
        model, _ = fused(stocks, KEPT, "per_member", "sdpa", lm_head_fusion=lm_head_fusion)
        if lm_head_fusion == "shared":  # tied to the token embeddings, as GPT-2's
            assert model.lm_head.weight is model.hydra.wte.weight
        with torch.no_grad():
            want = model(input_ids=ids, attention_mask=mask, position_ids=pos).member_logits
        folder = tmp_path / lm_head_fusion
        model.save_pretrained(folder)
        # save_pretrained writes the code the model imports; handler.py, the servers' entry point, is added by push
        imported = set(get_family("gpt2").shipped_files) - {"handler.py"}
        assert sorted(p.name for p in folder.glob("*.py")) == sorted(imported)
        local = HydraEnsembleGPT2ForCausalLM.from_pretrained(folder).eval()
        assert local.config.kept_heads == KEPT and local.config.lm_head_fusion == lm_head_fusion
        with torch.no_grad():
            torch.testing.assert_close(local(input_ids=ids, attention_mask=mask, position_ids=pos).member_logits, want,
                                       atol=ATOL, rtol=0)
        if lm_head_fusion == "shared":
            assert local.lm_head.weight.data_ptr() == local.hydra.wte.weight.data_ptr()
        torch.save({"ids": ids, "mask": mask, "pos": pos, "want": want}, folder / "case.pt")
        cases[lm_head_fusion] = str(folder)
    code = f"""
    import json, torch, transformers
    out = {{}}
    for name, folder in {cases!r}.items():
        case = torch.load(folder + "/case.pt")
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
        with torch.no_grad():
            got = model(input_ids=case["ids"], attention_mask=case["mask"], position_ids=case["pos"]).member_logits
            seq = model.generate(case["ids"], attention_mask=case["mask"], max_new_tokens=3, do_sample=False,
                                 pad_token_id=0)
        out[name] = [type(model).__module__, float((got - case["want"]).abs().max()), list(seq.shape)]
    print(json.dumps(out))
    """
    result = json.loads(
        run_fresh_python(code, env={"HF_MODULES_CACHE": str(tmp_path / "modules")}).strip().splitlines()[-1]
    )
    for name, (module, diff, shape) in result.items():
        assert module.startswith("transformers_modules") and module.endswith("modeling_hydra_gpt2"), name
        assert diff <= ATOL and shape == [3, 12], name


def test_config_reads_gpt2_names_and_refuses_bad_fields():
    base = gpt2_config().to_dict()
    config = HydraEnsembleGPT2Config(base_config=base, kept_heads=KEPT)
    assert (config.num_hidden_layers, config.num_attention_heads, config.hidden_size, config.head_dim) == (L, H, 32, 8)
    assert config.n_positions == 64 and config.lm_head_fusion == "shared"
    with pytest.raises(ValueError, match="lm_head_fusion"):
        HydraEnsembleGPT2Config(base_config=base, kept_heads=KEPT, lm_head_fusion="tied")
    with pytest.raises(ValueError, match="kept_heads\\[0\\]"):
        HydraEnsembleGPT2Config(base_config=base, kept_heads=[[[0]] * 2])
    with pytest.raises(Exception, match="no n_layer"):  # transformers' own validation calls it first
        HydraEnsembleGPT2Config(base_config={k: v for k, v in base.items() if k != "n_layer"}, kept_heads=KEPT)
    with pytest.raises(ValueError, match="no tensor"):
        gpt2_member_from_state_dict({}, base)


@pytest.mark.parametrize("head", ["causal_lm", "sequence_classification"])
def test_family_converts_a_folder_and_the_output_loads(tmp_path, head):
    """``convert_checkpoint`` detects family 'gpt2' in a stock folder (a GPT2LMHeadModel: a causal LM; a
    GPT2ForSequenceClassification: a classifier) and writes a folder with the family's shipped files that
    loads through the Auto classes; the family unfuses the model into stock members."""
    from transformers import AutoModelForSequenceClassification

    from hydra_hf.assemble import convert_checkpoint
    from hydra_hf.families import detect_family, get_family
    from hydra_hf.masks import HeadMasks

    cls = GPT2LMHeadModel if head == "causal_lm" else GPT2ForSequenceClassification
    base = stock(cls, num_labels=2)
    base.save_pretrained(tmp_path / "base")
    family = get_family("gpt2")
    assert detect_family(tmp_path / "base") is family
    out = tmp_path / "hydra"
    model = convert_checkpoint(HeadMasks(kept_heads=KEPT, num_heads=H), base=tmp_path / "base", output_dir=out,
                               mlp_fusion="per_member")
    assert sorted(p.name for p in out.glob("*.py")) == sorted(family.shipped_files)
    auto = AutoModelForCausalLM if head == "causal_lm" else AutoModelForSequenceClassification
    loaded = auto.from_pretrained(out, trust_remote_code=True).eval()
    ids, mask, pos = batch(7)
    with torch.no_grad():
        got = loaded(input_ids=ids, attention_mask=mask, position_ids=pos).member_logits
        want = model(input_ids=ids, attention_mask=mask, position_ids=pos).member_logits
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
        for m in range(len(KEPT)):
            ref = zeroed(base, KEPT[m])(input_ids=ids, attention_mask=mask, position_ids=pos).logits
            mine = want[:, m][mask.bool()] if head == "causal_lm" else want[:, m]
            torch.testing.assert_close(mine, ref[mask.bool()] if head == "causal_lm" else ref, atol=ATOL, rtol=0)
    # unfuse through the family: stock members
    for m, sd in enumerate(family.unfuse(model.state_dict(), model.config)):
        one = family.stock_model(model.config.base_config, num_labels=None if head == "causal_lm" else 2).eval()
        one.load_state_dict(sd, strict=True)
