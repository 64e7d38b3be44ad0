"""The fused BERT Hydra model against its reference: stock transformers BERT where each member's
removed heads are zeroed in W_O. Numbers, not shapes."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_bert_config, write_masks, zero_removed_heads
from transformers import BertForSequenceClassification

from hydra_hf.assemble import convert_checkpoint
from hydra_hf.convert import bert_member_from_state_dict, fuse_bert, unfuse_bert
from hydra_hf.masks import HeadMasks
from hydra_hf.modeling.configuration_hydra import HydraEnsembleConfig
from hydra_hf.modeling.modeling_hydra_bert import HydraEnsembleForSequenceClassification, HydraEnsembleModel

ATOL = 1e-5
H = 4
UNEQUAL = [  # 3 members x 3 layers, unequal widths, member 1 keeps 0 heads in layer 2
    [[0, 1], [2, 3], [1]],
    [[1, 2, 3], [0], []],
    [[0], [0, 1, 2, 3], [0, 2]],
]
UNIFORM = [[[0, 1], [2, 3], [1, 2]], [[1, 3], [0, 1], [0, 3]], [[2, 3], [1, 2], [0, 1]]]


def _batch(batch_size: int, seq: int = 11, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 99, (batch_size, seq), generator=g)
    mask = torch.ones(batch_size, seq, dtype=torch.long)
    if batch_size > 1:  # real padding: different lengths per row
        for i in range(1, batch_size):
            mask[i, seq - 2 * i :] = 0
            ids[i, seq - 2 * i :] = 0
    types = torch.zeros_like(ids)
    types[:, seq // 2 :] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def _perturbed(model, seed: int, keep_embeddings: bool = True):
    """A member 'fine-tuned' differently: every non-embedding weight perturbed."""
    g = torch.Generator().manual_seed(seed)
    out = BertForSequenceClassification(model.config).eval()
    out.load_state_dict(model.state_dict())
    with torch.no_grad():
        for name, p in out.named_parameters():
            if keep_embeddings and "embeddings" in name:
                continue
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return out


def _average_mlp(models):
    """Copies of ``models`` whose MLP weights are replaced by the members' average (reference for
    ``mlp_fusion="average"``)."""
    out = [BertForSequenceClassification(m.config).eval() for m in models]
    for o, m in zip(out, models):
        o.load_state_dict(m.state_dict())
    with torch.no_grad():
        for i in range(models[0].config.num_hidden_layers):
            for path in ("intermediate.dense", "output.dense"):
                for p in ("weight", "bias"):
                    tensors = [m.bert.encoder.layer[i].get_submodule(path).get_parameter(p) for m in models]
                    mean = torch.stack(tensors).double().mean(0).float()
                    for o in out:
                        o.bert.encoder.layer[i].get_submodule(path).get_parameter(p).copy_(mean)
    return out


def _save(model, folder):
    model.save_pretrained(folder)
    return folder


def _reference_member_logits(models, kept_heads, batch):
    with torch.no_grad():
        return torch.stack(
            [zero_removed_heads(m, k)(**batch).logits for m, k in zip(models, kept_heads)], dim=1
        )  # (B, M, C)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("kept", [UNIFORM, UNEQUAL], ids=["uniform", "unequal"])
@pytest.mark.parametrize("batch_size", [1, 4])
def test_shared_base_matches_reference(tmp_path, tiny_bert_dir, attn, kept, batch_size):
    base = BertForSequenceClassification.from_pretrained(tiny_bert_dir, attn_implementation="eager").eval()
    masks = HeadMasks(kept_heads=kept, num_heads=H)
    batch = _batch(batch_size)
    ref = _reference_member_logits([base] * 3, kept, batch)
    for fusion in ("average", "per_member"):  # identical members: both fusions are exact
        model = convert_checkpoint(masks, base=tiny_bert_dir, mlp_fusion=fusion)
        model.set_attn_implementation(attn)
        with torch.no_grad():
            out = model(**batch)
        torch.testing.assert_close(out.member_logits, ref, atol=ATOL, rtol=0)
        expected = torch.log(torch.softmax(ref, -1).mean(1))
        torch.testing.assert_close(out.logits, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("fusion", ["per_member", "average"])
@pytest.mark.parametrize("kept", [UNIFORM, UNEQUAL], ids=["uniform", "unequal"])
def test_distinct_members_match_reference(tmp_path, tiny_bert_dir, fusion, kept):
    base = BertForSequenceClassification.from_pretrained(tiny_bert_dir).eval()
    members = [_perturbed(base, seed) for seed in (1, 2, 3)]
    dirs = [_save(m, tmp_path / f"member{i}") for i, m in enumerate(members)]
    masks = HeadMasks(kept_heads=kept, num_heads=H)
    model = convert_checkpoint(masks, members=dirs, mlp_fusion=fusion)
    batch = _batch(3)
    refs = members if fusion == "per_member" else _average_mlp(members)
    ref = _reference_member_logits(refs, kept, batch)
    with torch.no_grad():
        out = model(**batch)
    torch.testing.assert_close(out.member_logits, ref, atol=ATOL, rtol=0)
    if fusion == "average":  # the averaged MLP really changes the members
        exact = _reference_member_logits(members, kept, batch)
        assert (exact - ref).abs().max() > 1e-3


def test_eager_and_sdpa_agree_and_attentions(tiny_bert_dir):
    masks = HeadMasks(kept_heads=UNEQUAL, num_heads=H)
    model = convert_checkpoint(masks, base=tiny_bert_dir)
    batch = _batch(3)
    with torch.no_grad():
        sdpa = model(**batch).member_logits
        model.set_attn_implementation("eager")
        out = model(**batch, output_attentions=True, output_hidden_states=True, output_member_hidden_states=True)
    torch.testing.assert_close(out.member_logits, sdpa, atol=ATOL, rtol=0)
    # one attention map per layer over all members' kept heads: K_l = sum of widths
    assert [a.shape[1] for a in out.attentions] == [6, 7, 3]
    att = out.attentions[0]
    # padded keys get no attention; rows are distributions
    assert float(att[1, :, :, -2:].abs().max()) == 0.0
    torch.testing.assert_close(att.sum(-1), torch.ones_like(att.sum(-1)))
    assert len(out.hidden_states) == 4 and out.hidden_states[-1].shape == (3, 11, 32)  # the members' mean
    assert len(out.member_hidden_states) == 4 and out.member_hidden_states[-1].shape == (3, 3, 11, 32)


def test_masks_are_not_ignored(tiny_bert_dir):
    """The pruned ensemble differs from the unpruned model (so the tests above can fail)."""
    base = BertForSequenceClassification.from_pretrained(tiny_bert_dir).eval()
    batch = _batch(2)
    full = HeadMasks(kept_heads=[[list(range(H))] * 3] * 3, num_heads=H)
    pruned = HeadMasks(kept_heads=UNIFORM, num_heads=H)
    with torch.no_grad():
        stock = base(**batch).logits
        full_out = convert_checkpoint(full, base=tiny_bert_dir)(**batch).member_logits
        pruned_out = convert_checkpoint(pruned, base=tiny_bert_dir)(**batch).member_logits
    for m in range(3):
        torch.testing.assert_close(full_out[:, m], stock, atol=ATOL, rtol=0)
        assert (pruned_out[:, m] - stock).abs().max() > 1e-3
    # members keeping different heads really differ from each other
    assert (pruned_out[:, 0] - pruned_out[:, 1]).abs().max() > 1e-3


def test_unfuse_is_inverse_of_fuse(tiny_bert_dir, tmp_path):
    base = BertForSequenceClassification.from_pretrained(tiny_bert_dir).eval()
    members = [_perturbed(base, s) for s in (4, 5, 6)]
    dirs = [_save(m, tmp_path / f"m{i}") for i, m in enumerate(members)]
    model = convert_checkpoint(HeadMasks(kept_heads=UNEQUAL, num_heads=H), members=dirs, mlp_fusion="per_member")
    batch = _batch(2)
    with torch.no_grad():
        fused = model(**batch).member_logits
        for m, sd in enumerate(unfuse_bert(model.state_dict(), model.config)):
            stock = BertForSequenceClassification(base.config).eval()
            stock.load_state_dict(sd, strict=False)
            torch.testing.assert_close(stock(**batch).logits, fused[:, m], atol=ATOL, rtol=0)


def test_fused_state_dict_shapes_follow_widths(tiny_bert_dir):
    from hydra_hf.convert import read_config, read_state_dict

    cfg = read_config(tiny_bert_dir)
    member = bert_member_from_state_dict(read_state_dict(tiny_bert_dir), cfg)
    state = fuse_bert([member] * 3, UNEQUAL, "average")
    dk = 8
    assert state["hydra.layers.0.attention.qkv_weight"].shape == (3 * 6 * dk, 32)
    assert state["hydra.layers.2.attention.o_weight"].shape == (3 * dk, 32)
    assert state["hydra.layers.0.mlp.fc1_weight"].shape == (64, 32)
    assert fuse_bert([member] * 3, UNEQUAL, "per_member")["hydra.layers.0.mlp.fc1_weight"].shape == (3, 64, 32)


def test_tf_converted_layer_norm_names_read_as_today(tiny_bert_dir):
    """Old TF-converted BERT checkpoints name LayerNorm parameters gamma / beta: they fuse to the same tensors."""
    from hydra_hf.convert import read_config, read_state_dict

    cfg, state = read_config(tiny_bert_dir), read_state_dict(tiny_bert_dir)
    legacy = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
              for k, v in state.items()}  # fmt: skip
    assert sum(k.endswith("LayerNorm.gamma") for k in legacy) == 2 * cfg["num_hidden_layers"] + 1
    fused = fuse_bert([bert_member_from_state_dict(state, cfg)] * 3, UNEQUAL, "average")
    from_legacy = fuse_bert([bert_member_from_state_dict(legacy, cfg)] * 3, UNEQUAL, "average")
    assert fused.keys() == from_legacy.keys() and all(torch.equal(fused[k], from_legacy[k]) for k in fused)


def test_loss_is_mean_member_cross_entropy_and_gradients_flow(tiny_bert_dir):
    model = convert_checkpoint(HeadMasks(kept_heads=UNEQUAL, num_heads=H), base=tiny_bert_dir).train()
    torch.manual_seed(0)
    batch = _batch(4)
    labels = torch.tensor([0, 1, 2, 1])
    model.eval()  # deterministic for the value check
    out = model(**batch, labels=labels)
    expected = sum(
        torch.nn.functional.cross_entropy(out.member_logits[:, m], labels) for m in range(3)
    ) / 3
    torch.testing.assert_close(out.loss, expected)
    out.loss.backward()
    for name in ("hydra.layers.0.attention.qkv_weight", "hydra.layers.1.attention.o_weight", "classifier.weight",
                 "hydra.layers.0.mlp.fc1_weight", "hydra.embeddings.word_embeddings.weight"):
        grad = model.get_parameter(name).grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0, name


def test_fused_gradient_matches_reference_gradient(tiny_bert_dir):
    """Training the fused model is training the members: the gradient of the summed member losses
    w.r.t. a kept head's W_O block equals the stock reference's."""
    base = BertForSequenceClassification.from_pretrained(tiny_bert_dir, attn_implementation="eager").eval()
    kept = UNIFORM
    model = convert_checkpoint(HeadMasks(kept_heads=kept, num_heads=H), base=tiny_bert_dir, mlp_fusion="per_member")
    batch, labels = _batch(2), torch.tensor([0, 2])
    model(**batch, labels=labels).loss.backward()
    dk = 8
    for m in range(3):
        ref = zero_removed_heads(base, kept[m])
        loss = torch.nn.functional.cross_entropy(ref(**batch).logits, labels) / 3
        loss.backward()
        ref_grad = ref.bert.encoder.layer[1].attention.output.dense.weight.grad  # (d, H*dk)
        cols = torch.cat([torch.arange(h * dk, (h + 1) * dk) for h in kept[m][1]])
        fused_grad = model.hydra.layers[1].attention.o_weight.grad[m * 2 * dk : (m + 1) * 2 * dk]  # (k*dk, d)
        torch.testing.assert_close(fused_grad, ref_grad[:, cols].T, atol=1e-6, rtol=1e-4)


def test_base_model_outputs(tiny_bert_dir):
    model = convert_checkpoint(HeadMasks(kept_heads=UNEQUAL, num_heads=H), base=tiny_bert_dir)
    encoder = HydraEnsembleModel(model.config)
    encoder.load_state_dict(model.hydra.state_dict())
    encoder.eval()
    batch = _batch(2)
    base = BertForSequenceClassification.from_pretrained(tiny_bert_dir).eval()
    with torch.no_grad():
        out = encoder(**batch)
        for m in range(3):
            ref = zero_removed_heads(base, UNEQUAL[m]).bert(**batch)
            torch.testing.assert_close(out.member_last_hidden_state[:, m], ref.last_hidden_state, atol=ATOL, rtol=0)
            torch.testing.assert_close(out.member_pooler_output[:, m], ref.pooler_output, atol=ATOL, rtol=0)


def test_regression_and_multilabel_heads(tiny_bert_dir):
    cfg = HydraEnsembleConfig(base_config=tiny_bert_config().to_dict(), kept_heads=UNIFORM, num_labels=1)
    model = HydraEnsembleForSequenceClassification(cfg).eval()
    out = model(**_batch(2), labels=torch.tensor([0.5, -1.0]))
    torch.testing.assert_close(out.logits, out.member_logits.mean(1))
    cfg = HydraEnsembleConfig(
        base_config=tiny_bert_config().to_dict(),
        kept_heads=UNIFORM,
        num_labels=3,
        problem_type="multi_label_classification",
    )
    model = HydraEnsembleForSequenceClassification(cfg).eval()
    out = model(**_batch(2), labels=torch.tensor([[1.0, 0, 1], [0, 0, 1]]))
    torch.testing.assert_close(torch.sigmoid(out.logits), torch.sigmoid(out.member_logits).mean(1), atol=1e-6, rtol=0)
    assert math.isfinite(out.loss.item())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(kept_heads=[[[0, 9], [0], [0]]]), r"outside \[0, 4\)"),
        (dict(kept_heads=[[[1, 1], [0], [0]]]), "lists a head twice"),
        (dict(kept_heads=[[[2, 1], [0], [0]]]), "must be sorted"),
        (dict(kept_heads=[[[0], [0]]]), "one list of heads per layer"),
        (dict(kept_heads=[[[0], [0], [0]]], num_members=2), "num_members=2"),
        (dict(kept_heads=[[[0], [0], [0]]], mlp_fusion="median"), "mlp_fusion='median'"),
        (dict(kept_heads=[[[0], [0], [0]]], base_model_type="gpt2"), "base_model_type='gpt2'"),
    ],
)
def test_config_validates_itself(kwargs, message):
    with pytest.raises(ValueError, match=message):
        HydraEnsembleConfig(base_config=tiny_bert_config().to_dict(), **kwargs)


def test_masks_file_roundtrip_and_errors(tmp_path):
    masks = HeadMasks(kept_heads=UNEQUAL, num_heads=H, metadata={"method": "manual"})
    masks.save(tmp_path / "m.json")
    back = HeadMasks.load(tmp_path / "m.json")
    assert back.kept_heads == UNEQUAL and back.metadata["method"] == "manual"
    jac = back.jaccard()
    assert jac.shape == (3, 3) and float(jac[0, 0]) == 1.0
    # member 0 keeps {(0,0),(0,1),(1,2),(1,3),(2,1)}, member 1 {(0,1),(0,2),(0,3),(1,0)}: 1 shared of 8
    assert abs(float(jac[0, 1]) - 1 / 8) < 1e-6
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        HeadMasks.load(tmp_path / "bad.json")
    write_masks(tmp_path / "range.json", [[[0, 7], [0], [0]]], num_heads=4)
    with pytest.raises(ValueError, match="outside"):
        HeadMasks.load(tmp_path / "range.json")
    with pytest.raises(ValueError, match="does not exist"):
        HeadMasks.load(tmp_path / "missing.json")


@pytest.mark.parametrize("kept", [UNIFORM, UNEQUAL], ids=["uniform", "unequal"])
def test_attention_maps_are_the_members_heads(tiny_bert_dir, kept):
    """Eager attention maps: layer l's map k belongs to (member, head) in member order and equals the
    stock reference's map of that head."""
    base = BertForSequenceClassification.from_pretrained(tiny_bert_dir, attn_implementation="eager").eval()
    model = convert_checkpoint(HeadMasks(kept_heads=kept, num_heads=H), base=tiny_bert_dir)
    model.set_attn_implementation("eager")
    batch = _batch(3)
    with torch.no_grad():
        maps = model(**batch, output_attentions=True).attentions
        for m in range(3):
            ref = zero_removed_heads(base, kept[m])(**batch, output_attentions=True).attentions
            for layer in range(3):
                start = sum(len(kept[j][layer]) for j in range(m))
                heads = kept[m][layer]
                got = maps[layer][:, start : start + len(heads)]
                torch.testing.assert_close(got, ref[layer][:, heads], atol=1e-6, rtol=0)


@pytest.mark.parametrize("fusion", ["average", "per_member"])
def test_chunked_mlp_equals_one_pass(tiny_bert_dir, fusion, monkeypatch):
    from hydra_hf.modeling.hydra_layers import HydraMLP

    model = convert_checkpoint(HeadMasks(kept_heads=UNIFORM, num_heads=H), base=tiny_bert_dir, mlp_fusion=fusion)
    batch = _batch(4)
    with torch.no_grad():
        whole = model(**batch).member_logits
        monkeypatch.setattr(HydraMLP, "chunk_rows", 5)  # 4 x 11 tokens (x 3 members): several partial chunks
        chunked = model(**batch).member_logits
    torch.testing.assert_close(chunked, whole, atol=1e-6, rtol=0)


@pytest.mark.parametrize("kept", [UNEQUAL, UNIFORM], ids=["unequal", "uniform"])
def test_bf16_autocast_on_cpu(tiny_bert_dir, kept):
    """Mixed precision (``torch.autocast("cpu", bfloat16)``, as ``mixed_precision="bf16"`` fine-tuning
    runs): inference and training run and stay within bf16 rounding of the fp32 model, with unequal
    widths and a member keeping 0 heads in a layer."""
    model = convert_checkpoint(HeadMasks(kept_heads=kept, num_heads=H), base=tiny_bert_dir).eval()
    batch = _batch(4)
    with torch.no_grad():
        ref = model(**batch).member_logits
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(**batch).member_logits
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), ref, atol=0.05, rtol=0.05)
    assert (low.float() - ref).abs().max() > 0  # bf16 did act
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(**batch, labels=torch.tensor([0, 1, 2, 1])).loss
    loss.backward()
    grad = model.get_parameter("hydra.layers.1.attention.o_weight").grad
    assert grad is not None and grad.dtype == torch.float32 and torch.isfinite(grad).all() and grad.abs().sum() > 0
