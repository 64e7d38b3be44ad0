"""The fused Llama-style decoder (Llama, Mistral, Qwen2, Qwen3) against transformers' own models.

Reference: member m = the stock model (member m's own checkpoint) with the W_O column blocks of its removed
query heads zeroed. Checked with eager and SDPA attention, left-padded batches, unequal members and a member
that keeps no head in a layer, averaged and per-member MLPs, with and without the key/value cache, through
``generate()``, after ``convert_checkpoint`` and as remote code in a fresh process without hydra_hf.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
import transformers
from conftest import run_fresh_python

from hydra_hf.assemble import convert_checkpoint
from hydra_hf.convert.hf_llama import decoder_member_from_state_dict, fuse_decoder, unfuse_decoder
from hydra_hf.masks import HeadMasks
from hydra_hf.modeling.configuration_hydra_llama import HydraEnsembleLlamaConfig
from hydra_hf.modeling.hydra_attention import HydraSelfAttention
from hydra_hf.modeling.modeling_hydra_llama import (
    HydraEnsembleLlamaForCausalLM,
    HydraEnsembleLlamaForSequenceClassification,
    token_uncertainty,
)
from hydra_hf.pruning.budget import Budget
from hydra_hf.pruning.lm import causal_lm_adapter, lm_batches_from_ids
from hydra_hf.pruning.taylor import taylor_prune

ATOL = 1e-5
V, H, HKV, L = 64, 4, 2, 2
# unequal members; member 1 keeps no head in layer 1, member 2 keeps one query head of each group in layer 0
UNEQUAL = [[[0, 1, 2, 3], [0, 2]], [[1], []], [[1, 2], [1, 3]]]
KINDS = {
    "llama": (transformers.LlamaConfig, {}),
    "mistral": (transformers.MistralConfig, {"sliding_window": 4}),  # windows shorter than the batch
    "qwen2": (transformers.Qwen2Config, {}),  # Q/K/V biases
    "qwen3": (transformers.Qwen3Config, {"head_dim": 12}),  # head_dim != hidden / heads, per-head q/k norms
}
PREFIX = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3"}


def stock(kind: str, head: str = "ForCausalLM", seed: int = 0, **extra) -> torch.nn.Module:
    cls, special = KINDS[kind]
    torch.manual_seed(seed)
    sizes = dict(vocab_size=V, hidden_size=32, num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=HKV,
                 intermediate_size=48, max_position_embeddings=64, pad_token_id=0, tie_word_embeddings=False,
                 initializer_range=0.1)
    config = cls(**{**sizes, **special, **extra})
    return getattr(transformers, f"{PREFIX[kind]}{head}")(config).eval()


def perturbed(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """A fine-tuned member: every weight moved but the token embeddings (which the members share)."""
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in out.named_parameters():
            if "embed_tokens" not in name:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    return out.eval()


def zeroed(model: torch.nn.Module, kept: list[list[int]]) -> torch.nn.Module:
    """The reference member: ``model`` with the W_O column blocks of the query heads it does not keep zeroed."""
    out = copy.deepcopy(model)
    dk = getattr(out.config, "head_dim", None) or out.config.hidden_size // H
    with torch.no_grad():
        for layer, heads in zip(out.model.layers, kept):
            for h in range(H):
                if h not in heads:
                    layer.self_attn.o_proj.weight[:, h * dk : (h + 1) * dk] = 0
    return out


def fused(members: list[torch.nn.Module], kept, mlp_fusion="average", task="causal_lm", impl="sdpa"):
    base = members[0].config.to_dict()
    canon = [decoder_member_from_state_dict(m.state_dict(), base) for m in members]
    heads = "per_member" if len(members) > 1 and task == "causal_lm" else "shared"
    state = fuse_decoder(canon, kept, mlp_fusion, shared="first", task=task, lm_head_fusion=heads)
    config = HydraEnsembleLlamaConfig(
        base_model_type=base["model_type"],
        base_config=base,
        kept_heads=kept,
        mlp_fusion=mlp_fusion,
        lm_head_fusion=heads,
        num_labels=members[0].config.num_labels,
    )
    cls = HydraEnsembleLlamaForCausalLM if task == "causal_lm" else HydraEnsembleLlamaForSequenceClassification
    model = cls(config)
    model.load_state_dict(state, strict=True)
    model.config._attn_implementation = impl
    return model.eval()


def left_padded(seed: int = 1, batch: int = 3, length: int = 9) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, V, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    if batch > 2:
        mask[2, :6] = 0
    return ids * mask, mask


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_fused_lm_equals_stock_with_zeroed_heads(kind, impl):
    """Identical members (pruned from one checkpoint, averaged MLP == each member's MLP) and, separately,
    three different checkpoints with per-member MLPs and heads: every member's logits at every real token."""
    base = stock(kind)
    ids, mask = left_padded()
    for members, mlp in (([base] * 3, "average"), ([perturbed(base, s) for s in range(3)], "per_member")):
        for m in members:
            m.config._attn_implementation = impl
        model = fused(members, UNEQUAL, mlp, impl=impl)
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask)
            for m, member in enumerate(members):
                ref = zeroed(member, UNEQUAL[m])(input_ids=ids, attention_mask=mask).logits
                torch.testing.assert_close(out.member_logits[:, m][mask.bool()], ref[mask.bool()], atol=ATOL, rtol=0)
        # logits = log of the mean of the members' softmaxes
        mean = out.member_logits.softmax(-1).mean(1)
        torch.testing.assert_close(out.logits.exp(), mean, atol=1e-6, rtol=0)


@pytest.mark.parametrize("kind", list(KINDS))
def test_cache_continuation_equals_full_forward(kind):
    """Prefill part of a left-padded batch, then feed the rest (several tokens, then one at a time) through the
    cache: the same member logits as one pass over the whole batch."""
    members = [perturbed(stock(kind), s) for s in range(3)]
    model = fused(members, UNEQUAL, "per_member")
    ids, mask = left_padded(length=11)
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask).member_logits
        out = model(input_ids=ids[:, :7], attention_mask=mask[:, :7], use_cache=True)
        steps = [out.member_logits]
        out = model(input_ids=ids[:, 7:9], attention_mask=mask[:, :9], cache=out.cache, use_cache=True)
        steps.append(out.member_logits)
        cache = out.cache
        for t in (9, 10):
            out = model(input_ids=ids[:, t : t + 1], attention_mask=mask[:, : t + 1], cache=cache, use_cache=True)
            cache = out.cache
            steps.append(out.member_logits)
    got = torch.cat(steps, dim=2)
    keep = mask.bool()[:, None, :, None].expand_as(full)
    torch.testing.assert_close(got[keep], full[keep], atol=ATOL, rtol=0)


# equal widths in both layers (3 then 2 query heads, 2 then 1 key/value heads per member): in layer 0 the members'
# query heads read their key/value heads in different patterns ([0, 0, 1], [0, 1, 1], [0, 1, 1])
EQUAL = [[[0, 1, 2], [0, 1]], [[0, 2, 3], [2, 3]], [[1, 2, 3], [2, 3]]]


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_equal_widths_fold_the_members_into_the_batch_axis(kind, monkeypatch):
    """SDPA runs the members folded into the batch axis, ``(M*B, k, T, dk)`` (grouped-query key/value heads gathered
    per member), also when it fills an empty cache: the stock members' logits with zeroed heads, eager's (never
    folded) and those of the decoding steps that read the cache (heads in member order)."""
    members = [perturbed(stock(kind), s) for s in range(3)]
    ids, mask = left_padded(length=8)
    shapes = []
    attend = HydraSelfAttention.attend
    def recorded(self, query, *args, **kwargs):
        shapes.append(tuple(query.shape))
        return attend(self, query, *args, **kwargs)

    monkeypatch.setattr(HydraSelfAttention, "attend", recorded)
    with torch.no_grad():
        got = {impl: fused(members, EQUAL, "per_member", impl=impl)(input_ids=ids, attention_mask=mask).member_logits
               for impl in ("sdpa", "eager")}
        dk = 12 if kind == "qwen3" else 8
        assert shapes == [(3 * 3, 3, 8, dk), (3 * 3, 2, 8, dk), (3, 9, 8, dk), (3, 6, 8, dk)]  # (M*B, k, T, dk) folded
        for m, member in enumerate(members):
            ref = zeroed(member, EQUAL[m])(input_ids=ids, attention_mask=mask).logits
            torch.testing.assert_close(got["sdpa"][:, m][mask.bool()], ref[mask.bool()], atol=ATOL, rtol=0)
        real = mask.bool()[:, None, :, None].expand_as(got["sdpa"])  # padded positions attend to nothing
        torch.testing.assert_close(got["sdpa"][real], got["eager"][real], atol=ATOL, rtol=0)
        model = fused(members, EQUAL, "per_member")
        out = model(input_ids=ids[:, :6], attention_mask=mask[:, :6], use_cache=True)
        steps = [out.member_logits]
        for t in (6, 7):
            out = model(input_ids=ids[:, t : t + 1], attention_mask=mask[:, : t + 1], cache=out.cache, use_cache=True)
            steps.append(out.member_logits)
    # prefill folded, steps not
    assert shapes[4:] == [(9, 3, 6, dk), (9, 2, 6, dk)] + [(3, 9, 1, dk), (3, 6, 1, dk)] * 2
    torch.testing.assert_close(torch.cat(steps, dim=2)[real], got["sdpa"][real], atol=ATOL, rtol=0)


def test_cache_holds_each_members_kept_key_value_heads():
    """Grouped-query attention: layer l's cache holds sum_m |kept_kv_heads[m][l]| heads (a key/value head stays
    while one of its query heads is kept), against H_kv per layer in each of M separate caches."""
    model = fused([stock("llama")] * 3, UNEQUAL)
    ids, mask = left_padded()
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, use_cache=True)
    kv = model.config.kept_kv_heads
    assert kv == [[[0, 1], [0, 1]], [[0], []], [[0, 1], [0, 1]]]
    for layer in range(L):
        assert out.cache.layers[layer].keys.shape[1] == sum(len(member[layer]) for member in kv)
    fused_heads = sum(c.keys.shape[1] for c in out.cache.layers)
    assert fused_heads == 9 and 3 * L * HKV == 12  # 0.75 of three separate caches
    saved = json.loads(model.config.to_json_string())
    assert saved["kept_kv_heads"] == kv
    with pytest.raises(
        ValueError, match=r"^kept_kv_heads\[1\]\[0\]=\[1\] but member 1's query heads \[1\] read key/value heads \[0\]"
    ):
        HydraEnsembleLlamaConfig(base_config=model.config.base_config, kept_heads=UNEQUAL,
                                 kept_kv_heads=[kv[0], [[1], []], kv[2]])


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen3"])
def test_generate_of_one_member_with_all_heads_reproduces_the_stock_model(kind):
    base = stock(kind)
    model = fused([base], [[list(range(H))] * L])
    ids, mask = left_padded(batch=2, length=6)  # one unpadded row, one padded row
    common = dict(input_ids=ids, attention_mask=mask, pad_token_id=0, do_sample=False)
    for extra in ({"max_new_tokens": 12}, {"max_new_tokens": 6, "num_beams": 3}):
        assert torch.equal(model.generate(**common, **extra), base.generate(**common, **extra)), extra


def test_generate_with_uncertainty_matches_the_decoding_steps():
    """The per-token entropy, mutual information, token probability and member top tokens of
    ``generate_with_uncertainty`` equal those of the distributions the cached decoding steps produced."""
    members = [perturbed(stock("llama"), s) for s in range(3)]
    model = fused(members, UNEQUAL, "per_member")
    ids, mask = left_padded(batch=2, length=6)
    out = model.generate_with_uncertainty(ids, mask, max_new_tokens=5, do_sample=False, pad_token_id=0, eos_token_id=2)
    assert out.sequences.shape == (2, 11)
    # generated tokens after the first end of sequence (token 2) are masked out
    gen = out.sequences[:, 6:]
    after_eos = torch.cumsum((gen == 2).long(), -1) - (gen == 2).long() > 0
    assert torch.equal(out.generated_mask.bool(), ~after_eos) and out.generated_mask.sum() >= 6
    # the same steps by hand, with the cache
    with torch.no_grad():
        step = model(input_ids=ids, attention_mask=mask, use_cache=True)
        seq, m = ids, mask
        for t in range(5):
            u = token_uncertainty(step.member_logits[:, :, -1])  # (B, M, V) -> per row
            token = u["log_probs"].argmax(-1)
            live = out.generated_mask[:, t].bool()  # rows still generating
            assert torch.equal(token[live], out.sequences[live, 6 + t])
            torch.testing.assert_close(out.token_entropy[live, t], u["entropy"][live], atol=1e-5, rtol=0)
            torch.testing.assert_close(
                out.token_mutual_information[live, t], u["mutual_information"][live], atol=1e-5, rtol=0
            )
            torch.testing.assert_close(
                out.token_probability[live, t], u["log_probs"].max(-1).values.exp()[live], atol=1e-5, rtol=0
            )
            assert torch.equal(out.member_top_tokens[live, t], u["member_top"][live])
            assert not out.token_entropy[~live, t].any()
            seq, m = torch.cat([seq, token[:, None]], 1), torch.cat([m, torch.ones_like(token)[:, None]], 1)
            step = model(input_ids=token[:, None], attention_mask=m, cache=step.cache, use_cache=True)
    w = out.generated_mask.float()
    torch.testing.assert_close(out.sequence_entropy, out.token_entropy.sum(-1) / w.sum(-1), atol=1e-6, rtol=0)
    assert (out.token_mutual_information[w.bool()] > 0).all()  # different members disagree
    # identical members: no disagreement
    same = fused([stock("llama")] * 3, [[list(range(H))] * L] * 3)
    assert (
        same.generate_with_uncertainty(ids, mask, max_new_tokens=3, pad_token_id=0)
        .token_mutual_information.abs()
        .max()
        < 1e-5
    )


def test_hand_computed_uncertainty():
    """Two members p = (0.9, 0.1) and (0.2, 0.8): H(mean) = H(0.55, 0.45), MI = H(mean) - mean H."""
    logits = torch.tensor([[0.9, 0.1], [0.2, 0.8]]).log()[None]  # (1, M=2, V=2)
    u = token_uncertainty(logits)
    h = lambda p: -sum(x * torch.tensor(x).log() for x in p)  # noqa: E731
    torch.testing.assert_close(u["entropy"][0], h([0.55, 0.45]), atol=1e-6, rtol=0)
    torch.testing.assert_close(
        u["mutual_information"][0], h([0.55, 0.45]) - (h([0.9, 0.1]) + h([0.2, 0.8])) / 2, atol=1e-6, rtol=0
    )
    assert u["member_top"].tolist() == [[0, 1]]


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_sequence_classifier_pools_each_members_last_real_token(kind):
    members = [perturbed(stock(kind, "ForSequenceClassification", num_labels=3), s) for s in range(3)]
    model = fused(members, UNEQUAL, "per_member", task="sequence_classification")
    ids, mask = left_padded()
    right = torch.stack([torch.roll(r, -int((r == 0).sum())) for r in ids])  # the same rows right-padded
    for batch in (ids, right):
        with torch.no_grad():
            out = model(input_ids=batch, attention_mask=(batch != 0).long(), labels=torch.tensor([0, 1, 2]))
            for m, member in enumerate(members):
                ref = zeroed(member, UNEQUAL[m])(input_ids=batch, attention_mask=(batch != 0).long()).logits
                torch.testing.assert_close(out.member_logits[:, m], ref, atol=ATOL, rtol=0)
    assert out.loss is not None and out.logits.shape == (3, 3)


def test_unfuse_round_trip():
    """``unfuse_decoder``: member m's stock state dict reproduces the fused model's member m."""
    members = [perturbed(stock("qwen3"), s) for s in range(3)]
    model = fused(members, UNEQUAL, "per_member")
    ids, mask = left_padded()
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask).member_logits
        for m, sd in enumerate(unfuse_decoder(model.state_dict(), model.config)):
            member = stock("qwen3")
            member.load_state_dict(sd, strict=True)
            torch.testing.assert_close(member(input_ids=ids, attention_mask=mask).logits[mask.bool()],
                                       out[:, m][mask.bool()], atol=ATOL, rtol=0)


def test_taylor_pruned_lm_converts_and_loads_as_remote_code(tmp_path):
    """The whole path for a causal LM: Taylor importance on next-token loss keeps 2 query heads per layer for
    each of 3 seeded members; ``convert_checkpoint`` writes a folder; a fresh process without hydra_hf loads
    it with ``AutoModelForCausalLM`` and generates with per-token uncertainty; the numbers equal the local model's."""
    base = stock("llama", tie_word_embeddings=True)
    base.save_pretrained(tmp_path / "base")
    g = torch.Generator().manual_seed(0)
    batches = lm_batches_from_ids([torch.randint(1, V, (10,), generator=g).tolist() for _ in range(8)],
                                  max_length=10, batch_size=4)
    kept = []
    for seed in range(3):
        result = taylor_prune(causal_lm_adapter(base), batches, Budget(heads_per_layer=2), seed=seed, temperature=1.0,
                              progress=False)
        kept.append([[h for h in range(H) if result.gates[layer, h] > 0.5] for layer in range(L)])
    assert all(len(layer) == 2 for member in kept for layer in member)
    model = convert_checkpoint(HeadMasks(kept, num_heads=H), base=tmp_path / "base", output_dir=tmp_path / "hydra")
    assert isinstance(model, HydraEnsembleLlamaForCausalLM)
    assert model.lm_head.weight is model.hydra.embed_tokens.weight  # tied, as the base
    ids, mask = left_padded(batch=2, length=6)
    with torch.no_grad():
        for m in range(3):
            ref = zeroed(base, kept[m])(input_ids=ids, attention_mask=mask).logits
            torch.testing.assert_close(model(input_ids=ids, attention_mask=mask).member_logits[:, m][mask.bool()],
                                       ref[mask.bool()], atol=ATOL, rtol=0)
    local = model.generate_with_uncertainty(ids, mask, max_new_tokens=4, pad_token_id=0)
    torch.save({"ids": ids, "mask": mask}, tmp_path / "inputs.pt")
    code = f"""
    import json, sys, torch
    from transformers import AutoModelForCausalLM
    inputs = torch.load({str(tmp_path / "inputs.pt")!r})
    model = AutoModelForCausalLM.from_pretrained({str(tmp_path / "hydra")!r}, trust_remote_code=True).eval()
    out = model.generate_with_uncertainty(inputs["ids"], inputs["mask"], max_new_tokens=4, pad_token_id=0)
    assert sys.modules.get("hydra_hf") is None
    print(json.dumps({{"module": type(model).__module__, "sequences": out.sequences.tolist(),
                      "mi": out.token_mutual_information.tolist()}}))
    """
    remote = json.loads(
        run_fresh_python(code, env={"HF_MODULES_CACHE": str(tmp_path / "modules")}).strip().splitlines()[-1]
    )
    assert remote["module"].startswith("transformers_modules")
    assert remote["sequences"] == local.sequences.tolist()
    torch.testing.assert_close(torch.tensor(remote["mi"]), local.token_mutual_information, atol=1e-6, rtol=0)


def test_text_generation_pipeline_adds_uncertainty(tmp_path):
    """``pipeline("hydra-text-generation")`` on a converted folder, here and as remote code in a fresh process:
    the stock record plus per-token and per-sequence uncertainty equal to ``generate_with_uncertainty``."""
    from _family_specs import wordpiece

    tokenizer = wordpiece("BertTokenizer")()  # [PAD] = 0, 95 tokens
    base = stock("qwen3", vocab_size=len(tokenizer))
    base.generation_config.eos_token_id = None  # generate all the tokens asked for
    base.save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    convert_checkpoint(HeadMasks(UNEQUAL, num_heads=H), base=tmp_path / "base", output_dir=tmp_path / "hydra")
    pipe = transformers.pipeline("hydra-text-generation", model=str(tmp_path / "hydra"), trust_remote_code=True)
    assert type(pipe).__name__ == "HydraTextGenerationPipeline"
    record = pipe("the movie was good", max_new_tokens=5, do_sample=False)[0]
    ids = tokenizer("the movie was good", return_tensors="pt")
    direct = pipe.model.generate_with_uncertainty(
        ids["input_ids"], ids["attention_mask"], max_new_tokens=5, do_sample=False
    )
    assert record["generated_token_ids"] == direct.sequences[0, ids["input_ids"].shape[1]:].tolist()
    assert record["generated_text"].startswith("the movie was good")
    for key in ("token_entropy", "token_mutual_information", "token_probability"):
        torch.testing.assert_close(torch.tensor(record[key]), getattr(direct, key)[0], atol=1e-6, rtol=0)
    assert record["member_top_tokens"] == direct.member_top_tokens[0].tolist()
    assert record["sequence_mutual_information"] == pytest.approx(
        float(direct.sequence_mutual_information[0]), abs=1e-6
    )
    code = f"""
    import json, sys, transformers
    pipe = transformers.pipeline(model={str(tmp_path / "hydra")!r}, task="hydra-text-generation",
                                 trust_remote_code=True)
    record = pipe("the movie was good", max_new_tokens=5, do_sample=False)[0]
    assert sys.modules.get("hydra_hf") is None
    print(json.dumps({{"cls": type(pipe).__name__, "record": record}}))
    """
    remote = json.loads(
        run_fresh_python(code, env={"HF_MODULES_CACHE": str(tmp_path / "modules")}).strip().splitlines()[-1]
    )
    assert remote["cls"] == "HydraTextGenerationPipeline"
    assert remote["record"]["generated_token_ids"] == record["generated_token_ids"]
    torch.testing.assert_close(torch.tensor(remote["record"]["token_mutual_information"]),
                               torch.tensor(record["token_mutual_information"]), atol=1e-6, rtol=0)


def test_small_products_are_padded_to_four_rows_with_the_same_values():
    """``rows_linear`` pads 2-3-row products to 4 rows in CPU inference (the CPU GEMM's matrix-vector path
    below 4 rows is slow, see bench/bench_decoder.py): the real rows equal ``F.linear``'s to float rounding."""
    from hydra_hf.modeling.hydra_layers import rows_linear

    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(50, 16, generator=g), torch.randn(50, generator=g)
    for shape in ((2, 16), (3, 16), (1, 3, 16), (3, 1, 1, 16), (5, 16), (1, 16)):
        x = torch.randn(*shape, generator=g)
        with torch.no_grad():
            torch.testing.assert_close(rows_linear(x, w, b), torch.nn.functional.linear(x, w, b), atol=1e-6, rtol=1e-6)
    x = torch.randn(3, 16, requires_grad=True)  # training: plain F.linear (gradients flow as usual)
    rows_linear(x, w, b).sum().backward()
    torch.testing.assert_close(x.grad, w.sum(0).expand(3, 16))


def test_masks_record_and_check_the_key_value_heads(tmp_path):
    """Grouped-query attention in the masks format: pruning a GQA decoder writes ``num_key_value_heads`` and
    every member's ``kept_kv_heads``; a file whose ``kept_kv_heads`` break a group's rule, or whose
    ``num_key_value_heads`` is not the model's, is refused with one line (at load, and at convert)."""
    from hydra_hf.errors import HydraInputError
    from hydra_hf.pruning.diversity import grouped_query_heads

    base = stock("llama")
    assert grouped_query_heads(causal_lm_adapter(base)) == HKV
    masks = HeadMasks(UNEQUAL, num_heads=H).with_key_value_heads(HKV)
    data = masks.to_dict()
    assert data["num_key_value_heads"] == 2
    assert [m["kept_kv_heads"] for m in data["members"]] == [[[0, 1], [0, 1]], [[0], []], [[0, 1], [0, 1]]]
    path = tmp_path / "m.json"
    masks.save(path)
    assert HeadMasks.load(path) == masks
    # the fused model's cache layout is the one the file records
    base.save_pretrained(tmp_path / "base")
    model = convert_checkpoint(path, base=tmp_path / "base")
    assert model.config.kept_kv_heads == [m["kept_kv_heads"] for m in data["members"]]
    bad = json.loads(path.read_text())
    bad["members"][1]["kept_kv_heads"] = [[1], []]  # query head 1 reads key/value head 0
    with pytest.raises(
        HydraInputError,
        match=r"members\[1\]\.kept_kv_heads\[0\]=\[1\] but its query heads \[1\] read key/value heads \[0\]",
    ):
        HeadMasks.from_dict(bad)
    other = json.loads(path.read_text())
    other["num_key_value_heads"] = 4
    for member in other["members"]:
        member["kept_kv_heads"] = [list(layer) for layer in member["kept_heads"]]
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(HydraInputError, match=r"^the masks record num_key_value_heads=4 but .* has 2 key/value heads"):
        convert_checkpoint(tmp_path / "other.json", base=tmp_path / "base")
    assert "\n" not in str(pytest.raises(HydraInputError, HeadMasks.from_dict, bad).value)
