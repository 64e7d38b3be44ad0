"""Causal-LM evaluation (issue 28 item 4): next-token metrics checked against hand computations and
:mod:`hydra_hf.metrics`, and :func:`evaluate_causal_lm` end to end on a tiny Llama and a fake 3-member
Hydra LM (pre-tokenized input: no tokenizer download)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from hydra_hf import metrics as M
from hydra_hf.evaluation import causal_lm as LE
from hydra_hf.metrics import causal_lm as LM


def _entropy(p: list[float]) -> float:
    return -sum(x * math.log(x) for x in p if x > 0)


def test_uniform_distribution_has_perplexity_v_and_no_mutual_information() -> None:
    v = 7
    logits = torch.zeros(2, 3, 4, v)  # (B, M, T, V): every member uniform
    targets = torch.randint(0, v, (2, 4), generator=torch.Generator().manual_seed(0))
    tokens = LM.next_token_uncertainty(logits, targets)
    assert LM.perplexity(tokens["nll"], tokens["mask"]) == pytest.approx(v, rel=1e-6)
    assert torch.allclose(tokens["predictive_entropy"], torch.full((2, 4), math.log(v)))
    assert torch.allclose(tokens["expected_entropy"], torch.full((2, 4), math.log(v)))
    assert tokens["mutual_information"].abs().max() < 1e-6
    assert torch.allclose(tokens["msp"], torch.full((2, 4), 1 / v))


def test_members_that_agree_have_zero_mutual_information_and_disagreement() -> None:
    g = torch.Generator().manual_seed(1)
    one = torch.randn(3, 1, 5, 11, generator=g)
    tokens = LM.next_token_uncertainty(one.expand(3, 4, 5, 11), torch.randint(0, 11, (3, 5), generator=g))
    assert tokens["mutual_information"].abs().max() < 1e-6
    assert torch.equal(tokens["disagreement"], torch.zeros(3, 5))
    assert torch.allclose(tokens["predictive_entropy"], tokens["expected_entropy"], atol=1e-6)
    # a stock model's (B, T, V) logits are one member: the same numbers
    single = LM.next_token_uncertainty(one[:, 0], tokens["prediction"])
    assert torch.allclose(single["predictive_entropy"], tokens["predictive_entropy"], atol=1e-6)
    assert bool(single["correct"].all())


def test_two_members_by_hand() -> None:
    p1, p2 = [0.9, 0.1], [0.2, 0.8]
    logits = torch.log(torch.tensor([[p1], [p2]], dtype=torch.float64))[None]  # (B=1, M=2, T=1, V=2)
    tokens = LM.next_token_uncertainty(logits, torch.tensor([[1]]))
    mean = [0.55, 0.45]
    assert float(tokens["predictive_entropy"]) == pytest.approx(_entropy(mean), abs=1e-12)
    assert float(tokens["expected_entropy"]) == pytest.approx((_entropy(p1) + _entropy(p2)) / 2, abs=1e-12)
    assert float(tokens["mutual_information"]) == pytest.approx(
        _entropy(mean) - (_entropy(p1) + _entropy(p2)) / 2, abs=1e-12
    )
    assert float(tokens["nll"]) == pytest.approx(-math.log(0.45), abs=1e-12)
    assert float(tokens["msp"]) == pytest.approx(0.55, abs=1e-12)
    assert tokens["prediction"].tolist() == [[0]] and not bool(tokens["correct"])
    assert tokens["member_predictions"].tolist() == [[[0], [1]]]
    assert float(tokens["disagreement"]) == 0.5  # member 2's top token differs from the ensemble's


def _random_batch(seed: int = 2, b: int = 4, m: int = 3, t: int = 6, v: int = 9):
    g = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(b, m, t, v, generator=g, dtype=torch.float64)
    targets = torch.randint(0, v, (b, t), generator=g)
    lengths = torch.tensor([6, 3, 0, 5])[:b]
    mask = torch.arange(t)[None] < lengths[:, None]  # right padding; sequence 2 has no prediction
    return logits, targets, mask


def test_token_metrics_equal_the_classification_metrics_on_the_valid_tokens() -> None:
    logits, targets, mask = _random_batch()
    tokens = LM.next_token_uncertainty(logits, targets, mask)
    member_probs = logits.softmax(-1).permute(0, 2, 1, 3)[mask]  # (N, M, V) valid tokens only
    probs, labels = member_probs.mean(1), targets[mask]
    assert LM.token_ece(tokens["msp"], tokens["correct"], mask) == pytest.approx(M.ece(probs, labels, 15), abs=1e-12)
    assert LM.token_ece(tokens["msp"], tokens["correct"], mask, 5) == pytest.approx(M.ece(probs, labels, 5), abs=1e-12)
    assert LM.next_token_accuracy(tokens["correct"], mask) == pytest.approx(M.accuracy(probs, labels))
    assert LM.perplexity(tokens["nll"], mask) == pytest.approx(math.exp(M.nll(probs, labels)), rel=1e-10)
    for name, fn in [("predictive_entropy", M.predictive_entropy), ("expected_entropy", M.expected_entropy),
                     ("mutual_information", M.mutual_information), ("disagreement", M.disagreement)]:
        assert torch.allclose(tokens[name][mask], fn(member_probs), atol=1e-10), name
    assert torch.allclose(tokens["msp"][mask], M.msp(probs))
    assert torch.equal(tokens["member_predictions"].permute(0, 2, 1)[mask], member_probs.argmax(-1))
    # padding positions are left at 0 / -1, and one position per chunk changes nothing
    assert float(tokens["nll"][~mask].abs().sum()) == 0 and bool((tokens["prediction"][~mask] == -1).all())
    small = LM.next_token_uncertainty(logits, targets, mask, chunk_elements=1)
    for k in (*LM.TOKEN_QUANTITIES, "correct", "member_predictions"):
        assert torch.allclose(small[k].double(), tokens[k].double(), atol=1e-12), k


def test_padding_positions_are_ignored_whatever_they_hold() -> None:
    logits, targets, mask = _random_batch()
    dirty = logits.clone()
    dirty.masked_fill_(~mask[:, None, :, None], float("nan"))  # padded positions: garbage logits and -100 targets
    dirty_targets = targets.masked_fill(~mask, -100)
    a = LM.next_token_uncertainty(dirty, dirty_targets, mask)
    b = LM.next_token_uncertainty(logits, targets, mask)
    for k in LM.TOKEN_QUANTITIES:
        assert torch.equal(a[k], b[k]), k
    # the default mask is targets >= 0
    assert torch.equal(LM.next_token_uncertainty(dirty, dirty_targets)["nll"], b["nll"])


def test_sequence_means_and_scores_by_hand() -> None:
    values = torch.tensor([[1.0, 2.0, 6.0], [4.0, 100.0, 100.0], [5.0, 5.0, 5.0]])
    mask = torch.tensor([[True, True, True], [True, False, False], [False, False, False]])
    means = LM.sequence_means(values, mask)
    assert means[:2].tolist() == [3.0, 4.0] and math.isnan(float(means[2]))
    logits, targets, mask = _random_batch()
    tokens = LM.next_token_uncertainty(logits, targets, mask)
    scores = LM.sequence_scores(tokens, 3)
    assert set(scores) == {"msp", "entropy", "mutual_information", "likelihood"}
    row = 1  # 3 valid tokens
    assert float(scores["msp"][row]) == pytest.approx(float(tokens["msp"][row, :3].mean()))
    assert float(scores["entropy"][row]) == pytest.approx(-float(tokens["predictive_entropy"][row, :3].mean()))
    assert float(scores["mutual_information"][row]) == pytest.approx(
        -float(tokens["mutual_information"][row, :3].mean())
    )
    assert float(scores["likelihood"][row]) == pytest.approx(-float(tokens["nll"][row, :3].mean()))
    assert math.isnan(float(scores["msp"][2]))
    assert "mutual_information" not in LM.sequence_scores(tokens, 1)


def test_shift_for_next_token_right_and_left_padding() -> None:
    ids = torch.tensor([[5, 6, 7, 0], [0, 0, 8, 9]])
    attention = torch.tensor([[1, 1, 1, 0], [0, 0, 1, 1]])
    logits, targets, mask = LM.shift_for_next_token(torch.zeros(2, 4, 10), ids, attention)
    assert logits.shape == (2, 1, 3, 10)
    assert targets.tolist() == [[6, 7, 0], [0, 8, 9]]
    assert mask.tolist() == [[True, True, False], [False, False, True]]


def test_accumulator_over_batches_equals_one_batch() -> None:
    logits, targets, mask = _random_batch()
    acc = LM.CausalLMAccumulator()
    acc.update(logits[:2], targets[:2], mask[:2])
    acc.update(logits[2:], targets[2:], mask[2:])
    tokens = LM.next_token_uncertainty(logits, targets, mask)
    summary = acc.summary()
    assert summary["perplexity"] == pytest.approx(LM.perplexity(tokens["nll"], mask), rel=1e-12)
    assert summary["ece"] == pytest.approx(LM.token_ece(tokens["msp"], tokens["correct"], mask), abs=1e-12)
    assert summary["num_tokens"] == int(mask.sum()) and summary["num_sequences"] == 4 and summary["num_members"] == 3
    seq = acc.sequence_scores()
    assert torch.allclose(seq["msp"], LM.sequence_scores(tokens, 3)["msp"], equal_nan=True)
    with pytest.raises(ValueError, match="M=1 members"):
        acc.update(logits[:, 0], targets, mask)


def test_user_errors_are_one_line() -> None:
    logits, targets, mask = _random_batch()
    for call, match in [
        (lambda: LM.next_token_uncertainty(logits, targets.masked_fill(mask, 9), mask), r"token ids in \[0, 9\)"),
        (lambda: LM.next_token_uncertainty(logits, targets[:, 1:], mask), "targets has shape"),
        (lambda: LM.next_token_uncertainty(logits[0, 0], targets), r"\(B, M, T, V\) or \(B, T, V\)"),
        (lambda: LM.perplexity(torch.ones(2, 2), torch.zeros(2, 2, dtype=torch.bool)), "no valid token"),
        (lambda: LE.evaluate_causal_lm(nn.Linear(1, 1), ["some text"]), "tokenizer is None"),
    ]:
        with pytest.raises((ValueError, TypeError), match=match) as info:
            call()
        assert "\n" not in str(info.value)


class _FakeTokenizer:
    """No pad token (like Llama / GPT-2 tokenizers): EOS pads. One token per character."""

    pad_token_id = None
    eos_token_id = 2

    def __call__(self, texts, truncation, max_length, padding):
        return {"input_ids": [[1] + [3 + ord(c) % 10 for c in t][: max_length - 1] for t in texts]}


def test_tokenize_texts_right_pads_with_eos() -> None:
    batches = LE.tokenize_texts(_FakeTokenizer(), ["abc", "a", "abcdefgh"], max_length=5, batch_size=2)
    assert [b["input_ids"].shape for b in batches] == [(2, 4), (1, 5)]
    assert batches[0]["input_ids"][1].tolist() == [1, 3 + ord("a") % 10, 2, 2]
    assert batches[0]["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]


# ------------------------------------------------------------------------------------ end to end
def _sequences(seed: int, n: int, low: int, high: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(low, high, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n)
    ]


def _direct_token_nll(model: nn.Module, sequences: list[list[int]]) -> torch.Tensor:
    """Each sequence alone (no padding): the NLL of every next token, pooled. (N_tokens,) float64."""
    out = []
    with torch.no_grad():
        for s in sequences:
            ids = torch.tensor([s])
            logits = model(input_ids=ids).logits[0, :-1].double()
            out.append(F.cross_entropy(logits, ids[0, 1:], reduction="none"))
    return torch.cat(out)


def test_evaluate_causal_lm_on_a_tiny_llama() -> None:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64)
    model = LlamaForCausalLM(config).eval()
    id_data, ood_data = _sequences(0, 10, 0, 64), _sequences(1, 7, 50, 64)
    report = LE.evaluate_causal_lm(model, id_data, {"narrow": ood_data}, batch_size=3, progress=False,
                                   return_sequence_scores=True)
    token_nll = _direct_token_nll(model, id_data)
    assert report["num_members"] == 1 and report["num_sequences"] == 10
    assert report["num_tokens"] == sum(len(s) - 1 for s in id_data) == token_nll.numel()
    assert report["perplexity"] == pytest.approx(math.exp(float(token_nll.mean())), rel=1e-4)
    assert report["ood"]["narrow"]["perplexity"] == pytest.approx(
        math.exp(float(_direct_token_nll(model, ood_data).mean())), rel=1e-4)
    scores = report["ood"]["narrow"]["scores"]
    assert set(scores) == {"msp", "entropy", "likelihood"}  # no mutual information for one model
    seq = report["sequence_scores"]
    for name in scores:
        assert scores[name]["auroc"] == M.ood_auroc(seq["id"][name], seq["narrow"][name])
        assert scores[name]["fpr95"] == M.fpr_at_95_tpr(seq["id"][name], seq["narrow"][name])
    # batches (right padding) and one sequence at a time agree; a ready batch iterable works too
    one = LE.evaluate_causal_lm(model, LE.batch_token_ids(id_data, 1), progress=False)
    assert one["perplexity"] == pytest.approx(report["perplexity"], rel=1e-5)
    assert one["ece"] == pytest.approx(report["ece"], abs=1e-5)
    assert 0 <= report["ece"] <= 1 and 0 <= report["accuracy"] <= 1


class _FakeHydraLM(nn.Module):
    """Three members over a shared embedding; returns member_logits (B, 3, T, V) and their log mean softmax."""

    def __init__(self, v: int = 16, d: int = 8, m: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(v, d)
        self.heads = nn.Parameter(torch.randn(m, d, v) * 2)

    def forward(self, input_ids, attention_mask=None):
        h = self.embed(input_ids)  # (B, T, d)
        member_logits = torch.einsum("btd,mdv->bmtv", h, self.heads)  # (B, M, T, V)
        logits = torch.logsumexp(member_logits.log_softmax(-1), dim=1) - math.log(self.heads.shape[0])
        return SimpleNamespace(member_logits=member_logits, logits=logits)


def test_evaluate_causal_lm_on_a_fake_three_member_model_equals_a_direct_computation() -> None:
    torch.manual_seed(3)
    model = _FakeHydraLM().train()
    id_data, ood_data = _sequences(2, 9, 0, 16), _sequences(3, 6, 0, 4)
    report = LE.evaluate_causal_lm(model, id_data, {"low": ood_data}, batch_size=4, progress=False)
    assert model.training  # restored

    def direct(sequences):
        """Per sequence: the members' probabilities (T-1, M, V) of each next token, float64."""
        with torch.no_grad():
            return [
                model(torch.tensor([s])).member_logits[0, :, :-1].double().softmax(-1).transpose(0, 1)
                for s in sequences
            ]

    id_probs, ood_probs = direct(id_data), direct(ood_data)
    flat = torch.cat(id_probs)  # (N_tokens, M, V)
    labels = torch.cat([torch.tensor(s[1:]) for s in id_data])
    assert report["num_members"] == 3
    assert report["perplexity"] == pytest.approx(math.exp(M.nll(flat.mean(1), labels)), rel=1e-5)
    assert report["nll"] == pytest.approx(M.nll(flat.mean(1), labels), rel=1e-5)
    assert report["accuracy"] == pytest.approx(M.accuracy(flat.mean(1), labels))
    assert report["ece"] == pytest.approx(M.ece(flat.mean(1), labels, 15), abs=1e-5)
    assert report["mutual_information"] == pytest.approx(float(M.mutual_information(flat).mean()), rel=1e-4)
    assert report["disagreement"] == pytest.approx(float(M.disagreement(flat).mean()), abs=1e-6)

    def seq_scores(per_sequence):
        return {
            "msp": torch.stack([M.msp(p.mean(1)).mean() for p in per_sequence]),
            "entropy": torch.stack([-M.predictive_entropy(p).mean() for p in per_sequence]),
            "mutual_information": torch.stack([-M.mutual_information(p).mean() for p in per_sequence]),
        }

    s_id, s_ood = seq_scores(id_probs), seq_scores(ood_probs)
    scores = report["ood"]["low"]["scores"]
    assert set(scores) == {"msp", "entropy", "mutual_information", "likelihood"}
    for name in s_id:
        assert scores[name]["auroc"] == pytest.approx(M.ood_auroc(s_id[name], s_ood[name]), abs=1e-12), name
        assert scores[name]["fpr95"] == pytest.approx(M.fpr_at_95_tpr(s_id[name], s_ood[name]), abs=1e-12), name


def test_token_error_detection_is_the_auroc_of_correct_against_wrong_tokens_by_hand() -> None:
    """Four tokens, two wrong: the AUROC with which each score ranks the correct tokens above the wrong ones,
    counted pair by pair; mutual information only with members; NaN when no token is wrong."""
    tokens = {
        "correct": torch.tensor([True, False, True, False]),
        "msp": torch.tensor([0.9, 0.2, 0.4, 0.5]),  # correct (0.9, 0.4) vs wrong (0.2, 0.5): 3 of 4 pairs
        "predictive_entropy": torch.tensor([0.1, 2.0, 1.0, 1.0]),  # -entropy: (-0.1, -1) vs (-2, -1): 3.5 of 4 (a tie)
        "mutual_information": torch.tensor([0.0, 0.3, 0.1, 0.2]),  # -MI: (0, -0.1) vs (-0.3, -0.2): 4 of 4
    }
    assert LM.token_error_detection(tokens, num_members=3) == {
        "msp": pytest.approx(0.75), "entropy": pytest.approx(0.875), "mutual_information": pytest.approx(1.0)}
    assert set(LM.token_error_detection(tokens)) == {"msp", "entropy"}  # one model has no mutual information
    assert "likelihood" not in LM.ERROR_DETECTION_SCORES  # it reads the very token it would judge
    every = {**tokens, "correct": torch.ones(4, dtype=torch.bool)}
    assert all(math.isnan(v) for v in LM.token_error_detection(every).values())
    masked = LM.token_error_detection(tokens, mask=torch.tensor([True, True, True, False]))
    assert masked["msp"] == pytest.approx(1.0)  # correct (0.9, 0.4) vs wrong (0.2)


def test_accumulator_error_detection_equals_the_function_on_every_token() -> None:
    logits, targets, mask = _random_batch()
    acc = LM.CausalLMAccumulator()
    acc.update(logits[:2], targets[:2], mask[:2])
    acc.update(logits[2:], targets[2:], mask[2:])
    tokens = LM.next_token_uncertainty(logits, targets, mask)
    want = LM.token_error_detection(tokens, num_members=3)
    got = acc.summary()["error_detection"]
    assert got.keys() == want.keys() == {"msp", "entropy", "mutual_information"}
    assert all(got[k] == pytest.approx(want[k], abs=1e-6) for k in want)
    assert 0.0 < got["entropy"] < 1.0 and got["entropy"] != 0.5


def test_causal_lm_ensemble_stacks_its_members_logits_and_evaluates_as_a_hydra() -> None:
    """CausalLMEnsemble = the members' logits side by side; evaluate_causal_lm of it equals the metrics of those
    stacked logits computed by hand (the mean of the members' softmaxes)."""
    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        models.append(LlamaForCausalLM(LlamaConfig(
            vocab_size=13, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
            intermediate_size=24, max_position_embeddings=32)).eval())
    ensemble = LE.CausalLMEnsemble(models)
    ids = torch.randint(0, 13, (3, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        stacked = torch.stack([m(input_ids=ids).logits for m in models], dim=1)  # (B, 2, T, V)
        got = LE.causal_lm_member_logits(ensemble, ids, torch.ones_like(ids))
    assert got.shape == (3, 2, 6, 13) and torch.equal(got, stacked)
    report = LE.evaluate_causal_lm(ensemble, [ids], progress=False)
    tokens = LM.next_token_uncertainty(*LM.shift_for_next_token(stacked, ids))
    assert report["num_members"] == 2
    assert report["perplexity"] == pytest.approx(LM.perplexity(tokens["nll"], tokens["mask"]), rel=1e-6)
    assert report["mutual_information"] > 0  # two different models disagree
    with pytest.raises(ValueError, match="at least one model"):
        LE.CausalLMEnsemble([])
