"""transformers' own generation and causal-LM model tests (GenerationTesterMixin, CausalLMModelTest; with the
installed 5.24.0's own ModelTesterMixin from its sdist) run against hydra_hf's fused GPT-2 decoders, the way
transformers tests GPT-2 (tests/models/gpt2/test_modeling_gpt2.py 5.x: `class GPT2ModelTester(CausalLMModelTester)`
with `base_model_class = GPT2Model`, `causal_lm_class = GPT2LMHeadModel`, token type ids among the common inputs).

Not a test of the project's suite: tools/conformance/run_generation.py copies this file into the test tree that the
generation harness's build_tree.py assembles (beside its Llama module, tests/hydra/test_hydra_generation.py) and
runs both. The classes mirror the Llama module's:

  GPT2ControlTest         stock GPT2Model / GPT2LMHeadModel / GPT2ForSequenceClassification (and the question-answering
                          and token-classification heads the tester infers) with the same tester settings: the
                          control (a test failing here is a harness/version artefact, not Hydra's).
  HydraGPT2UnequalTest    M=3 unequal members, member 2 keeps no head in layer 0, per-member MLP.
  HydraGPT2UniformTest    M=2 members of 2 heads in every layer, averaged MLP.
  HydraGPT2SingleTest     M=1 keeping every head (should behave exactly like GPT-2).
  HydraGPT2EquivalenceTest  extra: the M=1 Hydra converted from a stock GPT2LMHeadModel generates what GPT-2 generates.

Tiny GPT-2: n_embd 32, 2 layers, 4 heads, vocab 99 (CausalLMModelTester's defaults, its common names mapped onto
GPT2Config's through its attribute_map). The Hydra config comes from the project's public API: a stock
GPT2LMHeadModel with the tester's GPT2Config is saved and fused with
`hydra_hf.convert_checkpoint(HeadMasks(kept_heads, num_heads=4), base=folder)`; its saved config.json
(HydraEnsembleGPT2Config) is what the tests build the classes from.

Adjustments (as the Llama module's A1-A3):
  A1. "hydra_ensemble_gpt2" is added to MODEL_MAPPING_NAMES, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and
      MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES (transformers reads them by class name).
  A2. pipeline_model_mapping = {} on every class, control included (no tests/pipelines, no hub).
  A3. the Hydra tester sets its classes explicitly and builds its config by the conversion above.
  G1. transformers' GPT2ModelTester also passes a `head_mask` to the common tests; transformers 5.24's GPT-2 takes
      none (head masking was removed), so the common inputs are `input_ids` and `token_type_ids`, as there otherwise.
"""

import copy
import inspect
import tempfile
import unittest

import torch

torch.set_num_threads(1)

from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model  # noqa: E402
from transformers.models.auto.modeling_auto import (  # noqa: E402
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
    MODEL_MAPPING_NAMES,
)

import hydra_hf  # noqa: E402,F401  (registers the Auto classes)
from hydra_hf import HeadMasks, convert_checkpoint  # noqa: E402
from hydra_hf.modeling.configuration_hydra_gpt2 import HydraEnsembleGPT2Config  # noqa: E402
from hydra_hf.modeling.modeling_hydra_gpt2 import (  # noqa: E402
    HydraEnsembleGPT2ForCausalLM,
    HydraEnsembleGPT2ForSequenceClassification,
    HydraEnsembleGPT2Model,
)

from ..causal_lm_tester import CausalLMModelTest, CausalLMModelTester  # noqa: E402

# A1
MODEL_MAPPING_NAMES.setdefault("hydra_ensemble_gpt2", "HydraEnsembleGPT2Model")
MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.setdefault("hydra_ensemble_gpt2", "HydraEnsembleGPT2ForCausalLM")
MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES.setdefault(
    "hydra_ensemble_gpt2", "HydraEnsembleGPT2ForSequenceClassification"
)

# kept_heads[m][l] over 2 layers x 4 heads (the Llama module's layouts; GPT-2 has no grouped-query attention)
UNEQUAL = [[[0, 1, 2, 3], [0, 1]], [[0, 2], [3]], [[], [1, 2, 3]]]
UNIFORM = [[[0, 1], [2, 3]], [[2, 3], [0, 1]]]
SINGLE = [[[0, 1, 2, 3], [0, 1, 2, 3]]]
TESTER_KWARGS = {"num_attention_heads": 4, "use_token_type_ids": True}
_CONFIGS = {}


class GPT2TesterInputs:
    """What transformers' GPT2ModelTester changes in CausalLMModelTester: token type ids among the common inputs
    (G1: without its head_mask)."""

    def prepare_config_and_inputs_for_common(self):
        config, input_ids, token_type_ids, input_mask, _, _, _ = self.prepare_config_and_inputs()
        return config, {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": input_mask}


class GPT2ControlTester(GPT2TesterInputs, CausalLMModelTester):
    base_model_class = GPT2Model
    causal_lm_class = GPT2LMHeadModel

    def __init__(self, parent, **kwargs):
        super().__init__(parent, **{**TESTER_KWARGS, **kwargs})


class HydraGPT2ModelTester(GPT2TesterInputs, CausalLMModelTester):
    # A3
    base_model_class = HydraEnsembleGPT2Model
    config_class = HydraEnsembleGPT2Config
    causal_lm_class = HydraEnsembleGPT2ForCausalLM
    sequence_classification_class = HydraEnsembleGPT2ForSequenceClassification
    kept_heads = UNEQUAL
    mlp_fusion = "per_member"

    def __init__(self, parent, **kwargs):
        super().__init__(parent, **{**TESTER_KWARGS, **kwargs})

    def get_base_config(self):
        """The stock GPT2Config that CausalLMModelTester.get_config builds for GPT2ModelTester."""
        kwargs = {}
        names = list(inspect.signature(GPT2Config.__init__).parameters.keys())
        model_name_to_common_name = {v: k for k, v in GPT2Config.attribute_map.items()}
        for k in names + self.forced_config_args:
            if hasattr(self, k) and k != "self":
                kwargs[k] = getattr(self, k)
            elif k in model_name_to_common_name and hasattr(self, model_name_to_common_name[k]):
                kwargs[k] = getattr(self, model_name_to_common_name[k])
        return GPT2Config(**kwargs)

    def get_config(self):
        key = (repr(self.kept_heads), self.mlp_fusion, repr(sorted(self.get_base_config().to_dict().items(), key=str)))
        if key not in _CONFIGS:
            with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryDirectory() as out:
                torch.manual_seed(0)
                GPT2LMHeadModel(self.get_base_config()).save_pretrained(folder)
                convert_checkpoint(
                    HeadMasks(kept_heads=copy.deepcopy(self.kept_heads), num_heads=self.num_attention_heads),
                    base=folder,
                    mlp_fusion=self.mlp_fusion,
                    output_dir=out,
                    overwrite=True,
                )
                # the saved folder's config.json, as a user loads it
                _CONFIGS[key] = HydraEnsembleGPT2Config.from_pretrained(out)
        return copy.deepcopy(_CONFIGS[key])


class HydraGPT2UniformTester(HydraGPT2ModelTester):
    kept_heads = UNIFORM
    mlp_fusion = "average"


class HydraGPT2SingleTester(HydraGPT2ModelTester):
    kept_heads = SINGLE
    mlp_fusion = "average"


class GPT2ControlTest(CausalLMModelTest, unittest.TestCase):
    model_tester_class = GPT2ControlTester
    pipeline_model_mapping = {}  # A2


class HydraGPT2UnequalTest(CausalLMModelTest, unittest.TestCase):
    model_tester_class = HydraGPT2ModelTester
    pipeline_model_mapping = {}  # A2


class HydraGPT2UniformTest(CausalLMModelTest, unittest.TestCase):
    model_tester_class = HydraGPT2UniformTester
    pipeline_model_mapping = {}  # A2


class HydraGPT2SingleTest(CausalLMModelTest, unittest.TestCase):
    model_tester_class = HydraGPT2SingleTester
    pipeline_model_mapping = {}  # A2


class HydraGPT2EquivalenceTest(unittest.TestCase):
    """Extra (not in transformers): the M=1 all-heads Hydra built by convert_checkpoint from a stock GPT2LMHeadModel
    must generate exactly what the stock model generates (greedy, beam search, sampling with one seed; with and
    without the cache; left-padded batch) and its logits must be log_softmax of GPT-2's."""

    def test_single_member_generates_like_gpt2(self):
        tester = HydraGPT2SingleTester(self)
        torch.manual_seed(0)
        gpt2 = GPT2LMHeadModel(tester.get_base_config()).eval()
        with tempfile.TemporaryDirectory() as folder:
            gpt2.save_pretrained(folder)
            hydra = convert_checkpoint(HeadMasks(kept_heads=SINGLE, num_heads=4), base=folder).eval()
        input_ids = torch.randint(3, 99, (3, 6))
        mask = torch.ones_like(input_ids)
        mask[1, :2] = 0
        mask[2, :1] = 0
        input_ids[mask == 0] = 0
        position_ids = (mask.cumsum(-1) - 1).clamp_min(0)  # GPT-2 reads learned positions: count from the first token
        with torch.no_grad():
            ref = gpt2(input_ids=input_ids, attention_mask=mask, position_ids=position_ids).logits
            out = hydra(input_ids=input_ids, attention_mask=mask, position_ids=position_ids).logits
        keep = mask.bool()
        torch.testing.assert_close(out[keep], torch.log_softmax(ref, -1)[keep], atol=1e-5, rtol=1e-5)
        for kwargs in (
            {"do_sample": False},
            {"do_sample": False, "use_cache": False},
            {"do_sample": False, "num_beams": 3},
            {"do_sample": True, "top_k": 10},
        ):
            with self.subTest(**kwargs):
                torch.manual_seed(1)
                a = gpt2.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=6, pad_token_id=0,
                                  eos_token_id=None, **kwargs)  # fmt: skip
                torch.manual_seed(1)
                b = hydra.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=6, pad_token_id=0,
                                   eos_token_id=None, **kwargs)  # fmt: skip
                self.assertEqual(a.tolist(), b.tolist())
