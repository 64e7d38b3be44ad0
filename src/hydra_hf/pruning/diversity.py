"""M different members: seeds, criteria and user masks, and how different the members are.

The paper finds the pruning *seed* to be the main source of useful diversity (its Table 9). What the
seed of member ``m`` (``seed + m``) changes, per method:

- ``taylor`` / ``taylor-gate``: (1) the calibration data is a seeded random subset
  (``data_fraction`` of the ID data, in a seeded order) and (2) the kept heads are *sampled* from the
  importance ranking with seeded Gumbel-top-k at ``temperature`` (Plackett–Luce ∝ score^(1/T));
  ``temperature=0`` and ``data_fraction=1`` make every member identical.
- ``circuit-acc`` / ``circuit-ood`` / ``circuit-avg``: the ID and OOD validation data are seeded
  random subsets (``data_fraction`` of each) and exact ties between candidates are broken at random
  (seeded).
- ``random``: which heads are removed (uniformly at random within the budget).

Members from different criteria: ``methods=["circuit-acc", "circuit-ood", "circuit-avg"]`` gives one
member per method (cycled, with the next seed, when ``members`` is larger): the paper's **Hydra
(Circ)** (appendix B.2.3), whose diversity comes from the criteria. With ``data_fraction=1`` the
circuit members see the same selection data, so their searches run in lockstep on one evaluator and
share every step's evaluations while their removals agree
(:func:`~hydra_hf.pruning.circuits.circuit_prune_criteria`; the masks are the same as member by member). Members from
user masks: ``include`` (a :class:`~hydra_hf.masks.HeadMasks`) adds its members, unchanged, after the computed ones.

:func:`HeadMasks.jaccard <hydra_hf.masks.HeadMasks.jaccard>` gives the pairwise overlap of the
members' kept heads; :func:`prune_members` stores it in the masks metadata and logs the summary.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import HydraInputError
from ..families.adapters import ModelAdapter
from ..lazy import lazy_module
from ..masks import HeadMasks
from .budget import Budget
from .circuits import as_metadata, circuit_prune, circuit_prune_criteria
from .layout import HeadLayout
from .neurons import check_included_widths, check_mlp_keep, choose_neurons
from .taylor import PruneResult, taylor_prune

# heavy (datasets, pandas, pyarrow: ~2 s): imported on first use, so that `import hydra_hf` stays light (lazy.py)
datasets = lazy_module("datasets")

logger = logging.getLogger(__name__)

Batches = list[dict[str, torch.Tensor]]


@dataclass(frozen=True)
class MemberContext:
    """Everything a pruning method may read to build one member (one per :func:`prune_members` call)."""

    adapter: ModelAdapter
    layout: HeadLayout
    budget: Budget
    make_batches: Callable[[datasets.Dataset, int], Batches]
    id_data: datasets.Dataset
    ood_data: datasets.Dataset | None
    tower: str
    temperature: float
    data_fraction: float
    heads_per_step: int
    taylor_rounds: int | None
    random_ties: bool
    fast: bool
    precision: str
    progress: bool


@dataclass(frozen=True)
class PruningMethod:
    """A way of choosing one member's heads, registered by name (:data:`PRUNING_METHODS`).

    Attributes:
        name: the registry key (``--method NAME``, the masks' ``method``).
        prune: ``(context, member_seed) -> PruneResult``.
        uses_ood: whether it needs OOD validation data.
        needs_labels: whether it needs labelled ID data.
        circuit_score: for greedy circuit searches, the score (:data:`~hydra_hf.pruning.scoring.CIRCUIT_SCORES`):
            members of such methods that see the same data run in lockstep (:func:`circuit_prune_criteria`).
        help: one line for ``--help`` and the docs.
    """

    name: str
    prune: Callable[[MemberContext, int], PruneResult]
    uses_ood: bool = False
    needs_labels: bool = True
    circuit_score: str | None = None
    help: str = ""


PRUNING_METHODS: dict[str, PruningMethod] = {}
"""The registered pruning methods, by name (:func:`register_pruning_method`); ``hydra-hf prune`` and
the study read their choices from it."""


def register_pruning_method(method: PruningMethod) -> PruningMethod:
    """Add ``method`` to :data:`PRUNING_METHODS` (adding a method is one function plus this call)."""
    if method.name in PRUNING_METHODS:
        raise ValueError(f"a pruning method named {method.name!r} is already registered")
    PRUNING_METHODS[method.name] = method
    return method


def uses_ood(methods: str | Sequence[str]) -> bool:
    """Whether any of ``methods`` (a comma-separated string or a list) needs OOD validation data."""
    return any(PRUNING_METHODS[m].uses_ood for m in parse_methods(methods))


def random_prune(num_layers: int, num_heads: int, budget: Budget, *, seed: int = 0) -> PruneResult:
    """Remove heads uniformly at random within the budget (a baseline and a diversity check)."""
    return random_prune_layout(HeadLayout((("model", num_layers, num_heads),)), budget, seed=seed)


def random_prune_layout(layout: HeadLayout, budget: Budget, *, seed: int = 0) -> PruneResult:
    """:func:`random_prune` over a :class:`~hydra_hf.pruning.layout.HeadLayout` (one tower or both:
    with ``Budget(remove=N)`` the ``N`` heads are drawn uniformly from the heads of all its towers)."""
    layout.check(budget)
    generator = torch.Generator().manual_seed(seed)
    gates = layout.ones()  # (R, H_max)
    removal: list[Any] = []
    if budget.heads_per_layer is not None:
        for row, H in enumerate(layout.heads_in_row()):
            perm = torch.randperm(H, generator=generator).tolist()
            for h in perm[: H - budget.heads_per_layer]:
                gates[row, h] = 0.0
                removal.append(layout.label(row, h))
    else:
        cells = torch.nonzero(gates > 0.5).tolist()  # existing heads, row-major
        perm = torch.randperm(len(cells), generator=generator).tolist()
        for i in perm[: int(budget.remove)]:  # type: ignore[arg-type]
            row, h = cells[i]
            gates[row, h] = 0.0
            removal.append(layout.label(row, h))
    return PruneResult(
        gates=layout.unstack(gates),
        scores=layout.unstack(torch.full(gates.shape, float("nan"))),
        removal_order=removal,
        metadata={"method": "random", "seed": seed, **({"tower": "joint"} if layout.joint else {})},
    )


def _subset(dataset: datasets.Dataset | None, fraction: float, seed: int) -> datasets.Dataset | None:
    if dataset is None or fraction >= 1.0:
        return dataset
    n = max(1, round(len(dataset) * fraction))
    idx = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))[:n].sort().values.tolist()
    return dataset.select(idx)


def parse_methods(methods: str | Sequence[str]) -> list[str]:
    """``"circuit-acc,circuit-ood"`` or a list -> validated list of method names."""
    items = [m.strip() for m in methods.split(",")] if isinstance(methods, str) else [str(m).strip() for m in methods]
    items = [m for m in items if m]
    if not items:
        raise ValueError(f"no pruning method given; choose from {list(PRUNING_METHODS)}")
    bad = [m for m in items if m not in PRUNING_METHODS]
    if bad:
        raise ValueError(
            f"unknown pruning method(s) {bad}; choose from {list(PRUNING_METHODS)} (comma-separated for several)"
        )
    return items


def _prune_random(ctx: MemberContext, member_seed: int) -> PruneResult:
    return random_prune_layout(ctx.layout, ctx.budget, seed=member_seed)


def _taylor(criterion: str) -> Callable[[MemberContext, int], PruneResult]:
    def prune(ctx: MemberContext, member_seed: int) -> PruneResult:
        batches = ctx.make_batches(_subset(ctx.id_data, ctx.data_fraction, member_seed), member_seed)
        return taylor_prune(ctx.adapter, batches, ctx.budget, criterion=criterion, tower=ctx.tower, seed=member_seed,
                            temperature=ctx.temperature, rounds=ctx.taylor_rounds, progress=ctx.progress)
    return prune


def _circuit(score: str) -> Callable[[MemberContext, int], PruneResult]:
    def prune(ctx: MemberContext, member_seed: int) -> PruneResult:
        id_batches = ctx.make_batches(_subset(ctx.id_data, ctx.data_fraction, member_seed), member_seed)
        ood_subset = _subset(ctx.ood_data, ctx.data_fraction, member_seed + 7919) if ctx.ood_data is not None else None
        ood_batches = ctx.make_batches(ood_subset, member_seed) if ood_subset is not None else None
        return circuit_prune(ctx.adapter, id_batches, ood_batches, ctx.budget, score=score, tower=ctx.tower,
                             heads_per_step=ctx.heads_per_step, seed=member_seed, random_ties=ctx.random_ties,
                             fast=ctx.fast, precision=ctx.precision, progress=ctx.progress)
    return prune


register_pruning_method(
    PruningMethod("taylor", _taylor("weight"), help="Taylor importance |W * dL/dW| of Q/K/V rows (Molchanov)")
)
register_pruning_method(
    PruningMethod("taylor-gate", _taylor("gate"), help="Taylor importance |dL/dgate| (Michel et al.)")
)
register_pruning_method(PruningMethod("circuit-acc", _circuit("acc"), circuit_score="acc",
                                      help="greedy circuit search on ID accuracy (CircAcc)"))
register_pruning_method(PruningMethod("circuit-ood", _circuit("ood"), uses_ood=True, circuit_score="ood",
                                      help="greedy circuit search on MSP-AUROC between ID and OOD data (CircOOD)"))
register_pruning_method(PruningMethod("circuit-avg", _circuit("avg"), uses_ood=True, circuit_score="avg",
                                      help="greedy circuit search on the mean of the two (CircAvg)"))
register_pruning_method(
    PruningMethod("random", _prune_random, needs_labels=False, help="heads removed at random (a control)")
)
METHODS = tuple(PRUNING_METHODS)
"""The registered method names (the keys of :data:`PRUNING_METHODS`)."""


def grouped_query_heads(adapter: ModelAdapter) -> int | None:
    """The key/value heads per layer of a one-tower model with grouped-query attention (fewer key/value
    heads than query heads), else None."""
    if len(adapter.towers) != 1:
        return None
    layer = next(iter(adapter.towers.values()))[0]
    kv = layer.num_key_value_heads
    return kv if kv is not None and kv != layer.num_heads else None


def prune_members(
    adapter: ModelAdapter,
    *,
    methods: str | Sequence[str],
    budget: Budget,
    make_batches: Callable[[datasets.Dataset, int], Batches],
    id_data: datasets.Dataset,
    ood_data: datasets.Dataset | None = None,
    members: int = 3,
    seed: int = 0,
    tower: str | None = None,
    temperature: float | None = None,
    data_fraction: float | None = None,
    heads_per_step: int = 1,
    taylor_rounds: int | None = None,
    include: HeadMasks | None = None,
    fast: bool = True,
    precision: str = "fp32",
    progress: bool = True,
    metadata: dict[str, Any] | None = None,
    mlp_keep: float | None = None,
    mlp_spread: bool = False,
    heads: HeadMasks | None = None,
) -> HeadMasks:
    """Compute ``members`` pruning masks and return them as :class:`~hydra_hf.masks.HeadMasks`: the
    one-tower file shape for a one-tower model, named towers (the pruned ones) for CLIP-like models.

    Args:
        adapter: adapter of the model to prune: a classifier, or a causal LM (``task="causal_lm"``,
            :func:`~hydra_hf.pruning.lm.causal_lm_adapter`) whose ID data needs no labels (the batches
            carry the next tokens).
        methods: one method or several (one member per method, cycled); see :data:`METHODS`.
        budget: the pruning budget of every member.
        make_batches: ``(dataset, seed) -> list of batches`` (tokenize / transform; the seed may
            shuffle).
        id_data: labelled ID data (calibration for Taylor, validation for circuits).
        ood_data: OOD validation data (circuit-ood / circuit-avg).
        members: number of members to compute.
        seed: seed of member 0; member ``m`` uses ``seed + m``.
        tower: the tower to prune (``None``: the only one); ``"joint"`` selects every member's heads
            over both towers of a CLIP model at once (``Budget(remove=N)``: ``N`` heads over both
            towers; ``Budget(heads_per_layer=K)``: ``K`` in every layer of each tower).
        temperature: Taylor sampling temperature (default: 1.0 with several members, else 0).
        data_fraction: fraction of the data each member sees (default: 0.8 with several members,
            else 1.0).
        heads_per_step: circuit heads removed per greedy step (1 = exact).
        taylor_rounds: Taylor's recomputes (:func:`~hydra_hf.pruning.taylor.taylor_prune`'s ``rounds``; None: the
            paper's schedule, one per layer of a per-layer budget, one ranking of a global one).
        include: user masks whose members are appended unchanged (masks for this model: named
            towers for a two-tower model, where a tower they do not list keeps all its heads).
        fast: circuits: use the cached evaluator where the architecture has one.
        precision: circuits on BERT: the cached evaluator's arithmetic (``"fp32"``,
            ``"screened"``, ``"bf16"``; see :func:`~hydra_hf.pruning.circuits.make_evaluator`).
        metadata: extra top-level metadata (e.g. the base model path).
        mlp_keep: slim members (an extension beyond the paper): the fraction of each layer's MLP neurons every
            member keeps, chosen by Taylor importance inside the member (its heads removed) on the member's own
            data sample (:func:`~hydra_hf.pruning.neurons.choose_neurons`); None or 1: whole MLPs (the paper).
        mlp_spread: slim members prefer the neurons earlier members left, so that they cover the MLP.
        heads: the members' heads, already chosen by an earlier call with the same ``seed`` and data (its
            masks, without MLP neurons): only the slim members' neurons are chosen (``mlp_keep``), as that call
            with ``mlp_keep`` would have chosen them -- one head selection serves a paper Hydra and a slim one.

    Returns:
        The masks; ``member_metadata[m]`` holds ``method``, ``seed``, ``scores``, ``ranking``, ...;
        ``metadata`` holds ``method``, ``seed``, ``budget`` and ``pairwise_jaccard``. With
        ``tower="joint"``: both towers in the masks (the same members), ``scores`` per tower, the
        ``ranking`` as ``[tower, layer, head]`` triples and the Jaccard overlap over the union of the
        kept heads of both towers.
    """
    method_list = parse_methods(methods)
    if isinstance(members, bool) or not isinstance(members, int) or members < 0:
        raise ValueError(f"members must be a non-negative integer, got {members!r}")
    if members == 0 and include is None:
        raise ValueError("members is 0 and no masks are included; ask for at least one member")
    layout = HeadLayout.of(adapter, tower)
    tower = "joint" if layout.joint else layout.names[0]
    layout.check(budget)
    needing_ood = [m for m in method_list if PRUNING_METHODS[m].uses_ood]
    if needing_ood and ood_data is None:
        raise ValueError(f"{' and '.join(dict.fromkeys(needing_ood))} need OOD validation data; give --ood-data")
    causal_lm = adapter.task == "causal_lm"  # its labels are the next tokens of the texts
    if (
        not causal_lm
        and "label" not in id_data.column_names
        and any(PRUNING_METHODS[m].needs_labels for m in method_list)
    ):
        raise ValueError(
            "the ID data has no labels; Taylor and circuit pruning need labelled ID data (--label-column)"
        )
    if len(id_data) == 0:
        raise ValueError("the ID data is empty; give at least one " + ("text" if causal_lm else "labelled example"))
    several = members > 1
    temperature = (1.0 if several else 0.0) if temperature is None else float(temperature)
    data_fraction = (0.8 if several else 1.0) if data_fraction is None else float(data_fraction)
    if not 0.0 < data_fraction <= 1.0:
        raise ValueError(f"data_fraction must be in (0, 1], got {data_fraction}")
    if not math.isfinite(temperature) or temperature < 0:  # nan passes `< 0`
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    if include is not None and heads is not None:
        raise ValueError("include= adds members to a new selection, heads= reuses one; give one of them")
    if include is not None:
        include.check_towers(adapter.tower_names, model=f"the {adapter.kind} model being pruned")
        model_shapes = {t: adapter.shape(t) for t in adapter.tower_names}
        included = include.kept_heads_by_tower(model_shapes, model="the model being pruned")  # {tower: (M, L, list)}
        outside = [t for t in include.tower_names if include.named and t not in layout.names]
        if outside:  # its members would lose what they prune there: they are added unchanged or not at all
            raise HydraInputError(
                f"the included masks prune the {outside[0]} tower, which this run leaves whole (tower {tower!r}); "
                "prune with --tower joint, or include masks of the pruned towers only"
            )
        check_included_widths(include, adapter)

    if heads is not None:
        masks = _reused_heads(heads, members, mlp_keep, adapter, metadata)
    else:
        ctx = MemberContext(adapter=adapter, layout=layout, budget=budget, make_batches=make_batches, id_data=id_data,
                            ood_data=ood_data, tower=tower, temperature=temperature, data_fraction=data_fraction,
                            heads_per_step=heads_per_step, taylor_rounds=taylor_rounds, random_ties=several,
                            fast=fast, precision=precision, progress=progress)
        masks = _choose_heads(ctx, method_list, members, seed, include, included if include is not None else None,
                              metadata)
    computed = None  # the computed members, slim: MLP neurons too (an extension)
    if mlp_keep is not None and check_mlp_keep(mlp_keep) < 1 and members:
        computed = choose_neurons(
            adapter, masks.select_members(range(members)),
            lambda m: make_batches(_subset(id_data, data_fraction, seed + m), seed + m),
            mlp_keep=mlp_keep, spread=mlp_spread, progress=progress,
        )
        masks.metadata.update(mlp_keep=computed.metadata["mlp_keep"], mlp_spread=mlp_spread)
    if computed is not None or (include is not None and include.slim):
        masks = _with_member_neurons(masks, computed, include)
    grouped = grouped_query_heads(adapter)
    if grouped is not None and not masks.named:  # a decoder with grouped-query attention: say which KV heads stay
        masks = masks.with_key_value_heads(grouped)
    logger.info("%s", masks.summary())
    for i, j in masks.identical_members():
        logger.warning(
            "members %d and %d keep the same heads%s (Jaccard 1.0): converted from one base they are one model "
            "counted twice; give them other seeds or methods, or a smaller data fraction",
            i,
            j,
            " and the same MLP neurons" if masks.slim else "",
        )
    return masks


def _reused_heads(heads: HeadMasks, members: int, mlp_keep: float | None, adapter: ModelAdapter,
                  metadata: dict[str, Any] | None) -> HeadMasks:
    """``heads`` (an earlier selection's masks) as the members whose MLP neurons :func:`prune_members` chooses."""
    if mlp_keep is None or check_mlp_keep(mlp_keep) >= 1:
        raise ValueError("heads= reuses chosen heads for slim members: give mlp_keep (the MLP share they keep)")
    if heads.num_members != members:
        raise ValueError(f"heads= holds {heads.num_members} members but members={members}; give the masks of this "
                         "selection")
    if heads.kept_neurons():
        raise ValueError("heads= already keeps MLP neurons; give the masks of a selection without mlp_keep")
    heads.check_towers(adapter.tower_names, model=f"the {adapter.kind} model being pruned")
    return HeadMasks.from_dict({**heads.to_dict(), "metadata": {**heads.metadata, **(metadata or {})}})


def _choose_heads(ctx: MemberContext, method_list: list[str], members: int, seed: int, include: HeadMasks | None,
                  included: dict[str, Any] | None, metadata: dict[str, Any] | None) -> HeadMasks:
    """Every member's heads (:func:`prune_members` before its slim members' neurons), in the masks' file shape:
    the computed members, then ``include``'s (``included``: their kept heads per tower)."""
    adapter, layout = ctx.adapter, ctx.layout
    kept: list[dict[str, list[list[int]]]] = []  # per member: {tower: [[heads] per layer]}, the layout's towers
    member_meta: list[dict[str, Any]] = []
    shared = _shared_circuit_members(ctx, method_list, members, seed=seed)
    for m in range(members):
        method = method_list[m % len(method_list)]
        member_seed = seed + m
        logger.info("member %d/%d: %s, seed %d", m + 1, members, method, member_seed)
        result = shared[m] if m in shared else PRUNING_METHODS[method].prune(ctx, member_seed)
        meta = as_metadata(result)
        meta.update({"method": method, "seed": member_seed, "data_fraction": ctx.data_fraction})
        kept.append({t: _kept_heads(g) for t, g in layout.per_tower(result.gates).items()})
        member_meta.append(meta)
    if include is not None:
        for m, meta in enumerate(include.member_metadata):
            kept.append({t: [list(h) for h in included[t][m]] for t in layout.names})
            member_meta.append({**meta, "source": "included"})
    # the file shape the model reads: unnamed for one tower, the pruned towers by name for several
    masks = HeadMasks.for_model(
        adapter.tower_names,
        {t: [k[t] for k in kept] for t in layout.names},
        {t: H for t, _, H in layout.towers},
        member_metadata=member_meta,
    )
    masks.metadata = {
        **(metadata or {}),
        "method": ",".join(method_list),
        "seed": seed,
        "budget": ctx.budget.to_dict(),
        "tower": ctx.tower,
        "pairwise_jaccard": [[round(v, 4) for v in row] for row in masks.jaccard().tolist()],
    }
    return masks


def _with_member_neurons(masks: HeadMasks, computed: HeadMasks | None, include: HeadMasks | None) -> HeadMasks:
    """``masks`` (the computed members, then the included ones) with the computed members' chosen neurons and
    the included members' own, unchanged (None where a member keeps every neuron)."""
    n_computed = masks.num_members - (include.num_members if include is not None else 0)
    neurons, widths = {}, {}
    for key in masks.tower_names if masks.named else [None]:
        ours = computed.member_neurons(key) if computed is not None else None
        theirs = include.member_neurons(key) if include is not None else None
        if ours is None and theirs is None:
            continue
        neurons[key] = (ours or [None] * n_computed) + (theirs or [None] * (masks.num_members - n_computed))
        widths[key] = (computed.intermediate_size(key) if ours is not None else None) or include.intermediate_size(key)
    return masks.with_neurons(neurons, widths)


def _shared_circuit_members(
    ctx: MemberContext, method_list: list[str], members: int, *, seed: int
) -> dict[int, PruneResult]:
    """``{member: result}`` of the circuit members, searched in lockstep when they see the same data
    (``data_fraction=1``: every member's subset is the whole set); ``{}`` otherwise."""
    scores = {m: PRUNING_METHODS[method_list[m % len(method_list)]].circuit_score for m in range(members)}
    circuit = [m for m, score in scores.items() if score is not None]
    if len(circuit) < 2 or ctx.data_fraction < 1.0:
        return {}
    logger.info("members %s: circuit searches in lockstep on the same selection data", [m + 1 for m in circuit])
    results = circuit_prune_criteria(
        ctx.adapter,
        ctx.make_batches(ctx.id_data, seed),
        ctx.make_batches(ctx.ood_data, seed) if ctx.ood_data is not None else None,
        ctx.budget,
        scores=[scores[m] for m in circuit],
        seeds=[seed + m for m in circuit],
        tower=ctx.tower,
        heads_per_step=ctx.heads_per_step,
        random_ties=ctx.random_ties,
        fast=ctx.fast,
        precision=ctx.precision,
        progress=ctx.progress,
    )
    return dict(zip(circuit, results))


def _kept_heads(gates: torch.Tensor) -> list[list[int]]:
    """0/1 gates ``(L, H)`` -> kept head lists per layer."""
    return [torch.nonzero(row > 0.5).flatten().tolist() for row in gates]
