"""Decode speed side by side (hydra_hf.evaluation.decoding): the greedy loop decodes what ``generate()`` decodes, a
fused Hydra and its members run one by one decode the same tokens, and the measurement reports every group at
every batch size."""

from __future__ import annotations

import pytest
import torch
from _tiny_decoders import MASKS, save_llama
from transformers import AutoModelForCausalLM

import hydra_hf  # noqa: F401  (registers the Auto classes)
from hydra_hf.assemble import convert_checkpoint
from hydra_hf.evaluation.decoding import decode_speed, ensemble_step_log_probs, greedy_decode
from hydra_hf.masks import HeadMasks


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = save_llama(tmp_path_factory.mktemp("decode") / "llama", head="ForCausalLM")
    stock = AutoModelForCausalLM.from_pretrained(folder).eval()
    masks = HeadMasks(kept_heads=MASKS, num_heads=4).with_key_value_heads(2)
    fused = convert_checkpoint(masks, base=folder).eval()
    members = [convert_checkpoint(masks.select_members([m]), base=folder).eval() for m in range(2)]
    prompts = torch.randint(2, 16, (3, 5), generator=torch.Generator().manual_seed(0))
    return {"stock": stock, "fused": fused, "members": members, "prompts": prompts}


def test_greedy_decode_equals_generate(models):
    ids = models["prompts"]
    with torch.no_grad():
        want = models["stock"].generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
                                        min_new_tokens=6, do_sample=False, pad_token_id=1)[:, ids.shape[1]:]
    run = greedy_decode(models["stock"], ids, 6)
    assert torch.equal(run["tokens"], want)
    assert run["prefill_s"] > 0 and run["decode_s"] > 0


def test_fused_hydra_and_its_members_one_by_one_decode_the_same_tokens(models):
    """The members (one-member Hydras of the same masks) run one by one, averaging their softmaxes every step,
    compute the fused model's distribution: the same greedy tokens, and the same first-step log-probabilities."""
    ids = models["prompts"]
    fused, members = greedy_decode(models["fused"], ids, 8), greedy_decode(models["members"], ids, 8)
    assert torch.equal(fused["tokens"], members["tokens"])
    with torch.no_grad():
        want = ensemble_step_log_probs([m(input_ids=ids).logits[:, -1] for m in models["members"]])
        got = models["fused"](input_ids=ids).logits[:, -1]
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.equal(greedy_decode(models["members"][0], ids, 8)["tokens"], members["tokens"])  # members differ


def test_decode_speed_reports_every_group_at_every_batch_size(models):
    groups = {"Single": models["stock"], "Hydra": models["fused"], "one by one": models["members"]}
    speed = decode_speed(groups, models["prompts"], batch_sizes=(1, 3), new_tokens=4, rounds=2, warmup=0)
    assert list(speed) == ["1", "3"]
    for batch, by_group in speed.items():
        assert list(by_group) == list(groups)
        for entry in by_group.values():
            assert entry["decode_tokens_per_s"] == pytest.approx(int(batch) * 3 / entry["decode_s"])
            assert len(entry["tokens"]) == int(batch) and len(entry["tokens"][0]) == 4
        assert by_group["Hydra"]["tokens"] == by_group["one by one"]["tokens"]
    for call, match in [
        (lambda: decode_speed(groups, models["prompts"], batch_sizes=(4,)), r"batch size 4 must be an int in \[1,"),
        (lambda: greedy_decode(models["stock"], models["prompts"], 1), "new_tokens must be an int >= 2"),
        (lambda: decode_speed({}, models["prompts"]), "no group"),
        (lambda: decode_speed(groups, models["prompts"].float()), "integer token ids"),
    ]:
        with pytest.raises(ValueError, match=match):
            call()
