"""What a Hydra Ensemble costs to run, computed from its config (the members' kept heads and neurons).

:func:`multiply_adds` counts the multiply-adds of one forward pass over a sequence of ``tokens`` tokens through
the transformer layers: every member's Q/K/V and output projections over its kept heads, the attention over
them (scores and weighted values), and the MLP each member runs (the whole MLP per member in the paper's
Hydra, averaged or not; its kept neurons for slim members). Output heads, poolers, norms and embeddings are
left out: they are the same order for every model compared and small beside the layers.
:func:`relative_cost` divides by the Single's count (the base model: one member keeping every head and every
neuron), read off the same code, so a report row can say "2.5x a Single's compute" from the masks alone.
``tests/test_cost.py`` checks the counts against PyTorch's FLOP counter on stock and fused models.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .families import family_of_config
from .modeling.hydra_attention import HydraGroupedQueryAttention, HydraSelfAttention
from .modeling.hydra_layers import HydraMLPBase

DEFAULT_TOKENS = 128  # the benches' sequence length


@dataclass(frozen=True)
class Cost:
    """The cost of a model, relative to its Single where ``relative`` says so.

    Attributes:
        multiply_adds: per forward pass over one sequence of ``tokens`` tokens (transformer layers).
        parameters: every parameter of the model (embeddings, heads included).
        tokens: the sequence length counted.
    """

    multiply_adds: int
    parameters: int
    tokens: int

    def per_token(self) -> float:
        return self.multiply_adds / self.tokens


def _attention_macs(module: nn.Module, tokens: int) -> int:
    """Projections over every member's kept heads and attention over them (T x T per kept head)."""
    if isinstance(module, HydraGroupedQueryAttention):  # q, k, v, o weights of its own (grouped-query)
        projections = sum(w.numel() for w in (module.q_weight, module.k_weight, module.v_weight, module.o_weight))
    else:
        projections = module.qkv_weight.numel() + module.o_weight.numel()
    heads, dk = module.total_heads, module.head_dim
    return tokens * projections + 2 * tokens * tokens * heads * dk


def _mlp_macs(module: HydraMLPBase, num_members: int, tokens: int) -> int:
    """Every member's MLP: its kept neurons (slim), its own MLP, or the shared averaged one run on its stream."""
    weights = module.fc1_weight.numel() + module.fc2_weight.numel()
    shared = not module.slim and not module.per_member
    return tokens * weights * (num_members if shared else 1)


def layer_multiply_adds(model: nn.Module, tokens: int = DEFAULT_TOKENS) -> int:
    """Multiply-adds of ``model``'s fused transformer layers for one sequence of ``tokens`` tokens."""
    total = 0
    num_members = int(model.config.num_members)
    for name, module in model.named_modules():
        if isinstance(module, HydraMLPBase):
            if not name.endswith("head.mlp"):  # SigLIP's pooling head runs its MLP once per member, not per token
                total += _mlp_macs(module, num_members, tokens)
        elif isinstance(module, HydraSelfAttention):
            total += _attention_macs(module, tokens)
    return total


def single_config(config: Any) -> Any:
    """The config of the Single a Hydra config was built from: one member keeping every head and every neuron
    of every tower, whole MLPs."""
    data = copy.deepcopy(config.to_dict())
    for field in [k for k in data if k == "kept_heads" or k.endswith("_kept_heads")]:
        towers = config._pruned_towers()
        if field not in towers:
            continue
        _, num_layers, num_heads = towers[field]
        data[field] = [[list(range(num_heads)) for _ in range(num_layers)]]
    for key in ("kept_neurons", "vision_kept_neurons", "text_kept_neurons", "kept_kv_heads", "member_metadata"):
        data.pop(key, None)
    data.update(num_members=1, mlp_fusion="average")
    if "lm_head_fusion" in data:
        data["lm_head_fusion"] = "shared"
    return type(config).from_dict(data)


def _meta_model(config: Any) -> nn.Module:
    """The fused encoder of ``config``, built on the meta device (no memory, no initialisation cost)."""
    family = family_of_config(config)
    with torch.device("meta"):
        return family.model_class("AutoModel")(config)


def model_cost(config: Any, tokens: int = DEFAULT_TOKENS) -> Cost:
    """The :class:`Cost` of the fused encoder of a Hydra ``config`` (built on the meta device)."""
    model = _meta_model(config)
    return Cost(layer_multiply_adds(model, tokens), sum(p.numel() for p in model.parameters()), tokens)


def relative_cost(config: Any, tokens: int = DEFAULT_TOKENS) -> dict[str, float]:
    """``{"macs_ratio": ..., "params_ratio": ...}``: the Hydra's multiply-adds per token (transformer layers) and
    parameters over its Single's (:func:`single_config`), from the config alone."""
    hydra, single = model_cost(config, tokens), model_cost(single_config(config), tokens)
    return {
        "macs_ratio": hydra.multiply_adds / single.multiply_adds,
        "params_ratio": hydra.parameters / single.parameters,
    }
