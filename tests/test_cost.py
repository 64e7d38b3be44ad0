"""hydra_hf.cost: multiply-adds from the config == PyTorch's FLOP counter on the models themselves."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import BertConfig, BertModel

from hydra_hf.assemble import convert_checkpoint
from hydra_hf.cost import layer_multiply_adds, model_cost, relative_cost, single_config
from hydra_hf.masks import HeadMasks
from hydra_hf.modeling.configuration_hydra import HydraEnsembleConfig

T = 16


def _counted_macs(model: torch.nn.Module, **inputs) -> float:
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(**inputs)
    return counter.get_total_flops() / 2


@pytest.fixture
def bert_dir(tmp_path):
    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256, vocab_size=99
    )
    BertModel(config).eval().save_pretrained(tmp_path / "bert")
    return tmp_path / "bert"


@pytest.mark.parametrize("slim", [False, True], ids=["whole-mlps", "slim"])
def test_multiply_adds_match_the_flop_counter(bert_dir, slim):
    """The count from the config == the FLOP counter / 2 on the stock Single and on the fused model (the
    counter also sees the pooler: within 1 %); the ratio is the two counts' ratio."""
    ids = torch.randint(5, 90, (1, T))
    # eager attention: its matrix products are what the counter sees (CPU SDPA kernels are not counted)
    stock = BertModel.from_pretrained(bert_dir, attn_implementation="eager").eval()
    kept = [[[0, 1], [2]], [[2, 3], [0, 1, 3]], [[1], []]]
    neurons = [
        [list(range(0, 256, 3)), list(range(100))],
        [list(range(1, 256, 3)), []],
        [list(range(64)), list(range(256))],
    ]
    masks = HeadMasks(kept_heads=kept, num_heads=4, kept_neurons=neurons if slim else None, intermediate_size=256)
    hydra = convert_checkpoint(masks, base=bert_dir).eval()
    hydra.set_attn_implementation("eager")
    single = single_config(hydra.config)
    assert single.num_members == 1 and single.kept_heads == [[[0, 1, 2, 3]] * 2] and not single.slim
    counted_single = _counted_macs(stock, input_ids=ids)
    counted_hydra = _counted_macs(hydra.hydra if hasattr(hydra, "hydra") else hydra, input_ids=ids)
    assert model_cost(single, T).multiply_adds == pytest.approx(counted_single, rel=0.01)
    assert layer_multiply_adds(hydra, T) == pytest.approx(counted_hydra, rel=0.01)
    ratio = relative_cost(hydra.config, T)["macs_ratio"]
    assert ratio == pytest.approx(counted_hydra / counted_single, rel=0.02)
    assert ratio < 1.5 if slim else ratio > 1.9  # 5 / 4 of the neurons kept; 3 whole MLPs


def test_bert_base_shapes_split_between_three_members():
    """BERT-base sizes, 3 members splitting every layer's heads (4 of 12) and neurons (1,024 of 3,072): one
    Single's multiply-adds and about its parameters; the paper's members (6 of 12 heads, whole averaged MLP)
    cost 2.5x."""
    base = BertConfig().to_dict()
    heads = [[list(range(4 * m, 4 * m + 4))] * 12 for m in range(3)]
    neurons = [[list(range(1024 * m, 1024 * m + 1024))] * 12 for m in range(3)]
    slim = HydraEnsembleConfig(base_config=base, kept_heads=heads, kept_neurons=neurons, num_labels=2)
    cost = relative_cost(slim)
    assert cost["macs_ratio"] == pytest.approx(1.0, abs=1e-9)  # the members' work adds up to one model's
    assert cost["params_ratio"] <= 1.1
    paper = HydraEnsembleConfig(
        base_config=base, kept_heads=[[list(range(6 * (m % 2), 6 * (m % 2) + 6))] * 12 for m in range(3)]
    )
    assert relative_cost(paper)["macs_ratio"] == pytest.approx(2.5, abs=0.1)
    # the values docs/slim.md's cost table states (T = 128)
    assert [round(relative_cost(c, 128)[key], 2) for c in (paper, slim) for key in ("macs_ratio", "params_ratio")] == [
        2.47, 1.14, 1.00, 1.01]
