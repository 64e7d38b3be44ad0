"""Render the result tables of README.md and docs/*.md from the results files the scripts write.

A rendered region is delimited by two HTML comments, invisible on GitHub::

    <!-- results: docs/results/demo.json view=methods -->
    | Method | Acc ↑ | ... |
    <!-- /results -->

``docs/results/demo.json`` (a path from the repository root) is the results file a command wrote
(``make demo`` writes that one); ``view`` names one of :data:`VIEWS`, a function from the file's JSON
to the markdown between the markers. Nothing between the markers is typed by hand.

    python tools/render_docs.py            # re-render every region in place (make docs)
    python tools/render_docs.py --check    # exit 1, one line per problem (make docs-check)
    python tools/render_docs.py --typed    # list the sections still typed by hand, and why

The check also reads the prose around the regions: a measured number (two decimals or more, a unit such as
``x``, ``%``, ``ms`` or ``points``, or a sign) outside every rendered region must be one of the numbers its
document's rendered regions print (prose quoting its table: when the file changes, the quote no longer
matches and the check says so), or sit in a section marked as typed, with the reason it has no results file::

    <!-- typed: one H100 run; no GPU on the machines the results files are written on -->
    ...
    <!-- /typed -->
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))  # render with this checkout's hydra_hf, installed or not

from hydra_hf.evaluation.report import render_markdown_table  # noqa: E402
from hydra_hf.outputs import write_text_atomic  # noqa: E402
from hydra_hf.recipes.ceiling import render_ceiling  # noqa: E402
from hydra_hf.recipes.study import render_selection_noise  # noqa: E402

DOCUMENTS = ("README.md", "docs/*.md")
"""Where regions are looked for (globs from the repository root)."""

REGION = re.compile(
    r"(?P<open><!-- results: (?P<file>\S+) view=(?P<view>[\w-]+) -->\n)(?P<body>.*?)(?P<close><!-- /results -->)",
    re.DOTALL,
)
OPENING = re.compile(r"<!-- results:")
TYPED = re.compile(r"<!-- typed:(?P<why>[^\n]*?)-->\n(?P<body>.*?)<!-- /typed -->", re.DOTALL)
TYPED_OPENING = re.compile(r"<!-- typed:")
NUMBER = re.compile(
    r"(?<![\w.])(?P<sign>[+\-−±])?(?P<value>\d+\.(?P<decimals>\d+))(?![\w.]*\d|e[-+])"
    r"(?:\s?(?P<unit>x|×|%|points?|ms|s|min|GiB|GB|MB)(?!\w))?"
)
"""A number with a decimal point (not a version's ``1.2.3``, not ``1.2e-7``), with its sign and unit."""
NOT_MEASURED = re.compile(
    r"\[\d+\.\d+\]\(https://arxiv\.org[^)]*\)"  # the paper's arXiv number
    r"|\b(?:arXiv|transformers|torch|torchvision|torch-uncertainty|optimum|optimum-onnx|Runtime|onnx|Python|peft"
    r"|accelerate|sentence-transformers)[ =]+\d+(?:\.\d+)+"  # versions
)
SETTINGS = frozenset({"0.01", "0.05", "0.005", "0.95", "0.88", "0.92"})
"""Values the docs state as settings, never as measurements: the protocol's margins (0.01, ECE 0.005), the
risk and significance levels (0.05), the default MSP threshold (0.95) and the coverage band of 90 % conformal
sets (0.88-0.92)."""


def _methods_table(results: Mapping[str, Any]) -> str:
    """The demo's methods table: accuracy, NLL, ECE, MSP/energy AUROC per OOD set, score, latency, size."""
    return _rows_table(results["report"]["rows"])


def _lora_rows(results: Mapping[str, Any]) -> str:
    """examples/demo.py --lora: the LoRA stage's seconds, then the LoRA rows in the methods table's columns."""
    rows = [row for row in results["report"]["rows"] if row["method"].startswith("LoRA")]
    stages = [seconds for name, seconds in results["timings_s"].items() if "LoRA" in name]
    if not rows or not stages:
        raise KeyError("no LoRA rows (run examples/demo.py with --lora)")
    settings = results["report"]["settings"]
    return (f"`{results['command']}` (seed {settings['seed']}, training precision {results['mixed_precision']}): "
            f"the LoRA stage took {sum(stages):.0f} s for {settings['ensemble_heads']} adapters of rank "
            f"{settings['lora_rank']} (learning rate {settings['lora_learning_rate']:g}, {settings['single_steps']} "
            "steps).\n\n" + _rows_table(rows))


def _rows_table(rows: list[Mapping[str, Any]]) -> str:
    # the OOD sets in the order the pipeline scored them (report["ood_sets"] is sorted by name)
    ood_sets = [key for key, value in rows[0].items() if isinstance(value, Mapping) and "auroc" in value]
    columns = [
        ("method", "Method", ""),
        ("accuracy", "Acc ↑", ".4f"),
        ("nll", "NLL ↓", ".4f"),
        ("ece", "ECE ↓", ".4f"),
    ]
    columns += [(f"{name}/auroc", f"{name} AUROC ↑", ".4f") for name in ood_sets]
    columns += [
        ("ood_score", "OOD score", ""),
        ("latency_ms", "latency (ms)", ".0f"),
        ("params_m", "params (M)", ".1f"),
    ]
    return render_markdown_table(rows, columns)


def _machine(machine: Mapping[str, Any] | None) -> str:
    """The CPU a results file records (hydra_hf.reproducibility.describe_machine), in words."""
    if not machine:
        return "a CPU its file does not record"
    bf16 = machine.get("bf16_products") or "none"
    cpuid = f", {machine['cpuid']}" if machine.get("cpuid") else ""
    return f"{machine['cpu']} ({machine['isa']}{cpuid}; native bf16 products: {bf16})"


def _demo_run(results: Mapping[str, Any]) -> str:
    """examples/demo.py's run: its wall time, each stage's seconds, the machine and threads it ran with, the
    fresh-process check, and the int8 row against fp32 Hydra (latency ratio, accuracy and ECE differences)."""
    minutes = results["wall_s"] / 60
    stages = ", ".join(f"{name.split('. ', 1)[-1]} {seconds:.0f} s" for name, seconds in results["timings_s"].items())
    text = (f"`{results['command']}` ran in **{minutes:.1f} min** (on {_machine(results.get('machine'))}; "
            f"torch {results['torch']}; torch threads: "
            f"{results['threads']['torch_threads']}, cores: {results['cpu_count']}; load average when it ended: "
            f"{results['load_average'][0]:g}; training precision: {results['mixed_precision']}): {stages}. The "
            f"fresh-process check's largest probability difference: {results['hub_check']['max_abs_prob_diff']:.1e}.")
    return text + "\n"


def _demo_time(results: Mapping[str, Any]) -> str:
    """examples/demo.py's wall time in one sentence, for the README's `make demo` line."""
    return (f"`make demo` ran in **{results['wall_s'] / 60:.1f} min** on {results['cpu_count']} cores of "
            f"{_machine(results.get('machine'))} (load average {results['load_average'][0]:g} when it ended; "
            "[docs/results.md](docs/results.md) has each stage's time).\n")


def _int8_summary(results: Mapping[str, Any]) -> str:
    """The int8 ONNX row against fp32 Hydra (the first row): accuracy, ECE, the largest AUROC difference and
    the latency ratio, beside the targets (0.5 points, 0.01)."""
    rows = results["report"]["rows"]
    hydra = rows[0]
    int8 = next((row for row in rows if "int8" in row["method"]), None)
    if int8 is None:  # a demo run without the onnx packages writes no int8 row
        raise KeyError("no int8 row (install the onnx extras and run make demo again)")
    ood_sets = [key for key, value in hydra.items() if isinstance(value, Mapping) and "auroc" in value]
    auroc = max(abs(int8[k]["auroc"] - hydra[k]["auroc"]) for k in ood_sets)
    accuracy = 100 * (int8["accuracy"] - hydra["accuracy"])
    met = abs(accuracy) <= 0.5 and auroc <= 0.01
    return (f"The int8 graph (ONNX Runtime) against fp32 Hydra: accuracy {_signed(accuracy, 1)} points, ECE "
            f"{_signed(int8['ece'] - hydra['ece'])}, every AUROC within {auroc:.4f} (targets: 0.5 points and "
            f"0.01: {'met' if met else 'MISSED'}), at {int8['latency_ms'] / hydra['latency_ms']:.2f}x its "
            "latency.\n")


def _signed(value: float, digits: int = 4) -> str:
    return format(value, f"+.{digits}f").replace("-", "−")  # a typographic minus, as the text around the tables


def _versus_single_table(results: Mapping[str, Any]) -> str:
    """The paired bootstrap of the first row (Hydra) minus Single: difference, interval, verdict per metric."""
    return _versus_table(results, "Single")


def _versus_deep_ensemble_table(results: Mapping[str, Any]) -> str:
    """The paired bootstrap of the first row (Hydra) minus the Deep Ensemble."""
    other = next(row["method"] for row in results["report"]["rows"] if row["method"].startswith("Deep Ensemble ("))
    return _versus_table(results, other)


def _versus_table(results: Mapping[str, Any], other: str) -> str:
    report = results["report"]
    rows = report["rows"]
    name = f"{rows[0]['method']} − {other}"
    comparison = report["comparisons"][name]
    ood_sets = [key for key, value in rows[0].items() if isinstance(value, Mapping) and "auroc" in value]
    metrics = [("accuracy", "accuracy"), ("ece", "ECE"), ("nll", "NLL")]
    metrics += [(f"{ood}.auroc", f"{ood} AUROC") for ood in ood_sets]
    lines = [f"| {name.split(' (')[0]} − {other.split(' (')[0]} | difference | interval | verdict |",
             "|---|---:|:---:|---|"]
    for key, label in metrics:
        c = comparison[key]
        verdict = c["verdict"] if c["verdict"] == "tie" else f"**{c['verdict']}**"
        lines.append(
            f"| {label} | {_signed(c['difference'])} | [{_signed(c['ci_low'])}, {_signed(c['ci_high'])}] | {verdict} |"
        )
    return "\n".join(lines) + "\n"


def _seed_comparisons(results: Mapping[str, Any]) -> str:
    """examples/demo_seeds.py: per paired comparison (Hydra − Single, Hydra − Deep Ensemble) and metric, the mean
    ± std over the seeds of each seed's difference, each seed's difference, how many seeds' bootstrap intervals
    said better / tie / worse, and the paired t-test over the seeds (p; decided when below the level)."""
    comparisons = results["comparisons"]
    first = next(iter(comparisons.values()))
    ood_sets = [key.split(".")[0] for key in first if key.endswith(".auroc")]
    metrics = [("accuracy", "accuracy"), ("ece", "ECE"), ("nll", "NLL")]
    metrics += [(f"{ood}.auroc", f"{ood} AUROC") for ood in ood_sets]
    seeds = " / ".join(str(seed) for seed in results["seeds"])
    lines = ["| | " + " | ".join(label for _, label in metrics) + " |", "|---|" + "---:|" * len(metrics)]
    for name, rows in comparisons.items():
        short = " − ".join(part.split(" (")[0] for part in name.split(" − "))
        cells = [rows[key] for key, _ in metrics]
        lines += [
            f"| {short} | " + " | ".join(f"{_signed(c['mean'])} ± {c['std']:.4f}" for c in cells) + " |",
            f"| seeds {seeds} | " + " | ".join(" / ".join(_signed(d, 3) for d in c["differences"]) for c in cells)
            + " |",
            "| better / tie / worse | " + " | ".join(f"{c['better']} / {c['tie']} / {c['worse']}" for c in cells)
            + " |",
            "| p (paired t over seeds) | " + " | ".join(
                f"**{c['t_test_p']:.3f}**" if c["decided"] else f"{c['t_test_p']:.3f}" for c in cells) + " |",
        ]
    return "\n".join(lines) + f"\n\n(`{results['command']}`; p in bold: the seeds decide the sign at the " \
        f"{100 * results['level']:g} % level.)\n"


def _seed_rows(results: Mapping[str, Any]) -> str:
    """examples/demo_seeds.py: every method's accuracy, ECE, NLL and AUROC per OOD test set, mean ± std over the
    seeds (the aggregate's rows; latency left out: it depends on what else ran on the cores)."""
    aggregate = results["aggregate"]
    kinds = aggregate["ood_sets"]
    lines = ["| method | accuracy | ECE | NLL | " + " | ".join(f"{kind} AUROC" for kind in kinds) + " |",
             "|---|" + "---:|" * (3 + len(kinds))]
    for row, std in zip(aggregate["rows"], aggregate["rows_std"], strict=True):
        if row["method"] != std["method"]:
            raise KeyError(f"rows_std holds {std['method']!r} where rows hold {row['method']!r}")
        cells = [f"{row[key]:.4f} ± {std[key]:.4f}" for key in ("accuracy", "ece", "nll")]
        cells += [f"{row[kind]['auroc']:.4f} ± {std[kind]['auroc']:.4f}" for kind in kinds]
        lines.append(f"| {row['method']} | " + " | ".join(cells) + " |")
    seeds = ", ".join(str(seed) for seed in results["seeds"])
    return "\n".join(lines) + f"\n\nMean ± std over the seeds {seeds}; OOD score: {aggregate['ood_score']}" \
        " (the rows marked [energy]: energy).\n"


def _run_differences(results: Mapping[str, Any]) -> str:
    """examples/compare_demo_runs.py: what the second run's training precision moves against the first's (the
    largest accuracy, ECE and AUROC differences over the methods) and the training stages' time ratio."""
    a, b = ("fp32" if p == "no" else p for p in results["precisions"])  # --mixed-precision no: fp32
    return (f"Against the {b}-trained run of the same seed (`{results['commands'][1]}`; compared by "
            f"`{results['command']}`), {a} training moved no accuracy by more than "
            f"{100 * results['max_abs_accuracy']:.1f} points, no ECE by more than {results['max_abs_ece']:.4f} and "
            f"no AUROC by more than {results['max_abs_auroc']:.4f}; the training stages took "
            f"{results['training_ratio']:.2f}x as long in {b}.\n")


def _selection_noise(results: Mapping[str, Any]) -> str:
    """examples/study_text.py --selection-noise: per OOD kind, size and circuit score, how far two disjoint
    selection sets agree on the greedy search's first step, with the command and threads it ran with."""
    threads = results["threads"]
    return (render_selection_noise(results["rows"]) + f"\n(`{results['command']}`; the Single of seed "
            f"{results['seed']}, {results['rows'][0]['repeats']} pairs of disjoint sets per size; torch threads: "
            f"{threads['torch_threads']}.)\n")


def _run_agreement(results: Mapping[str, Any]) -> str:
    """examples/compare_demo_runs.py on two runs of one seed, e.g. on two CPUs: how many of the report's numbers
    are identical, the largest differences, and each run's CPU."""
    runs = "; ".join(f"`{command}` on {_machine(machine)}"
                     for command, machine in zip(results["commands"], results["machines"], strict=True))
    return (f"Two runs of seed {results['seed']} ({runs}; compared by `{results['command']}`): "
            f"{results['identical']} of the reports' {results['numbers']} numbers identical (latency aside); the "
            f"largest differences: accuracy {100 * results['max_abs_accuracy']:.2f} points, ECE "
            f"{results['max_abs_ece']:.4f}, AUROC {results['max_abs_auroc']:.4f}.\n")


def _cost_from_masks(results: Mapping[str, Any]) -> str:
    """bench/bench_slim.py: per geometry, every ensemble's multiply-adds (from the masks) and parameters relative
    to the Single (the first batch size's rows: neither depends on the batch)."""
    lines = ["| geometry | model | multiply-adds (x Single) | parameters (x Single) |", "|---|---|---:|---:|"]
    first_batch: dict[str, Any] = {}
    singles = {}
    for row in results["rows"]:
        if first_batch.setdefault(row["geometry"], row["batch"]) != row["batch"]:
            continue
        if row["model"].endswith(" Single"):
            singles[row["geometry"]] = row
            continue
        lines.append(f"| {row['geometry']} | {row['model'].removeprefix('eager ')} | {row['compute_x']:.2f}x | "
                     f"{row['params_M'] / singles[row['geometry']]['params_M']:.2f}x |")
    return "\n".join(lines) + "\n"


def _common_tests_table(results: Mapping[str, Any]) -> str:
    """tools/transformers_common_tests.py: passed / failed / skipped per layout, expected failures marked."""
    lines = [f"Last run (transformers {results['transformers']}, CPU; `{results['command']}`):", "",
             "| layout | passed | failed | skipped |", "|---|---|---|---|"]
    for layout, counts in results["layouts"].items():
        failures = [f for f in results["failures"] if f["layout"] == layout]
        failed = str(counts["failed"])
        if failures:
            unexpected = sum(not f["expected"] for f in failures)
            failed += f" ({unexpected} unexpected)" if unexpected else " (expected)"
        lines.append(f"| {layout} | {counts['passed']} | {failed} | {counts['skipped']} |")
    return "\n".join(lines) + "\n"


def _generation_conformance_tables(results: Mapping[str, Any]) -> str:
    """tools/conformance/run_generation.py: passed / failed / skipped per family and layout (each failure's kind:
    control-shared, head-axis or real), then every failing test with the layouts it fails in and why."""
    lines = [f"Last run (transformers {results['transformers']}, CPU; `{results['command']}`):", "",
             "| family | layout | passed | failed | skipped |", "|---|---|---|---|---|"]
    for family, layouts in results["counts"].items():
        for layout, counts in layouts.items():
            kinds: dict[str, int] = {}
            for f in results["failures"]:
                if f["family"] == family and f["layout"] == layout:
                    kinds[f["kind"]] = kinds.get(f["kind"], 0) + 1
            failed = str(counts["failed"]) + (f" ({', '.join(f'{n} {k}' for k, n in kinds.items())})" if kinds else "")
            lines.append(f"| {family} | {layout} | {counts['passed']} | {failed} | {counts['skipped']} |")
    by_test: dict[tuple[str, str], list[str]] = {}
    for f in results["failures"]:
        by_test.setdefault((f["test"], f"{f['kind']}: {f['reason']}"), []).append(f"{f['family']} {f['layout']}")
    if by_test:
        lines += ["", "| failing test | where | why |", "|---|---|---|"]
        lines += [f"| `{test}` | {', '.join(where)} | {why} |" for (test, why), where in by_test.items()]
    return "\n".join(lines) + "\n"


def _bench_slim_table(results: Mapping[str, Any]) -> str:
    """bench/bench_slim.py: latency per model and batch, relative to the Single and the Deep Ensemble, with the
    compute from the masks, the parameters and the targets' verdicts."""
    columns = [("geometry", "geometry", ""), ("batch", "batch", ""), ("model", "model", ""),
               ("latency_ms", "latency (ms)", ".1f"), ("x Single", "x Single", ".2f"),
               ("x Deep Ensemble", "x Deep Ensemble", ".2f"), ("compute_x", "compute (x Single)", ".2f"),
               ("params_M", "params (M)", ".1f")]
    threads = results["threads"]  # pin_bench_threads' record (torch_threads ...) or a count
    count = threads.get("torch_threads", threads.get("torch")) if isinstance(threads, Mapping) else threads
    head = f"{count} threads, T = {results['seq_len']}:\n\n"
    return (
        head + render_markdown_table(results["rows"], columns) + "\n" + "".join(f"- {t}\n" for t in results["targets"])
    )


def _slim_pareto_table(results: Mapping[str, Any]) -> str:
    """examples/slim_pareto.py: compute, parameters and the MSP gain over the mean Single (mean ± std over seeds),
    accuracy, ECE, NLL; then the paired decisions and the issue's bar."""
    lines = [f"{len(results['seeds'])} seeds; gain = mean over the OOD kinds of the MSP AUROC minus the mean Single's "
             "(points), ± the seeds' standard deviation.", "",
             "| model | compute (x Single) | params (x Single) | mean OOD gain | accuracy (%) | ECE | NLL |",
             "|:---|---:|---:|---:|---:|---:|---:|"]
    for r in results["rows"]:
        lines.append(
            f"| {r['label']} | {r['compute_x']:.2f} | {r['params_x']:.2f} | {r['gain']:+.1f} ± {r['gain_std']:.1f} | "
            f"{r['accuracy']:.1f} ± {r['accuracy_std']:.1f} | {r['ece']:.3f} | {r['nll']:.3f} |"
        )
    counted = [r for r in results["rows"] if "counted_x" in r]
    if counted:
        pairs = ", ".join(f"{r['label']} {r['counted_x']:.2f}x (masks {r['compute_x']:.2f}x)" for r in counted)
        lines += ["", "PyTorch's FLOP counter on one image (the whole forward pass, embeddings and classifiers "
                  f"included) against the masks' count of the layers: {pairs}."]
    lines += [
        "",
        "| pair (seed by seed) | difference of the gain | seeds | p (paired t) | decided |",
        "|:---|---:|---:|---:|:---|",
    ]
    for d in results["decisions"]:
        lines.append(f"| {d['a']} - {d['b']} | {d['difference']:+.2f} ± {d['difference_std']:.2f} | {d['seeds']} | "
                     f"{d['p']:.3f} | {'yes' if d['decided'] else 'no'} |")
    return "\n".join(lines) + "\n\n" + "".join(f"- {m}\n" for m in results["must"])


def _ceiling_tables(results: Mapping[str, Any]) -> str:
    """examples/ceiling_text.py --results: the ceiling's AUROC table and the gains over the mean Single, then the
    command."""
    text = render_ceiling(results["table"]).split("\n", 2)[2]  # without the heading: the document has its own
    return f"{text}\n(`{results['command']}`; torch threads: {results['threads']['torch_threads']})\n"


def _int8_recipes_table(results: Mapping[str, Any]) -> str:
    """examples/int8_recipes.py: per int8 recipe, int8 minus fp32 on the ID and OOD validation splits (labels
    changed, accuracy, ECE, the worst OOD AUROC under MSP and mutual information), its int8 products, and the
    SmoothQuant alpha chosen with the member-logit error of each alpha tried."""
    counts = next(iter(results["recipes"].values()))["num_examples"]
    ood = ", ".join(f"{kind} {counts[kind]}" for kind in results["ood_data"])
    lines = [f"`{results['model']}`, int8 minus fp32 on {counts['calibration']} texts of `{results['id_data']}` "
             f"and the OOD validation splits ({ood} texts; worst = the lowest difference over the kinds):", "",
             "| recipe | labels changed | accuracy | ECE | worst OOD AUROC (MSP) | worst OOD AUROC (MI) | "
             "`MatMulInteger` |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in results["recipes"].items():
        worst = {s: min(v[s] for v in r["ood_auroc"].values()) for s in ("msp", "mutual_information")}
        label = f"{name} (α = {r['alpha']:g} chosen)" if r.get("alpha") is not None else name
        lines.append(f"| {label} | {100 * r['labels_changed']:.1f} % | {_signed(r['accuracy'], 3)} | "
                     f"{_signed(r['ece'], 3)} | {_signed(worst['msp'], 3)} | "
                     f"{_signed(worst['mutual_information'], 3)} | {r['matmul_integer']} |")
    tried = [(name, r["alphas_tried"]) for name, r in results["recipes"].items() if r.get("alphas_tried")]
    lines.append("")
    for name, alphas in tried:
        errors = ", ".join(f"{a} {v['member_logit_mse']:.4f}" for a, v in alphas.items())
        lines.append(f"{name}: mean squared member-logit error against fp32 per alpha tried: {errors}.")
    first = next(iter(results["recipes"].values()))
    lines.append(f"fp32 accuracy on these texts: {100 * first['fp32_accuracy']:.1f} %. "
                 f"(`{results['command']}`; torch threads: {results['threads']['torch_threads']})")
    return "\n".join(lines) + "\n"


def _calibration_tables(results: Mapping[str, Any]) -> str:
    """examples/calibration_study.py: per model and method the 90 % sets' coverage and size and the OOD inputs given
    more than one label; per model and target risk the abstention; each cell one value per seed (seed order); the
    coverage over many random re-splits; the Must's lines."""
    seeds, kinds = results["seeds"], results["ood_kinds"]

    def per_seed(rows: list[Mapping[str, Any]], value: Callable[[Mapping[str, Any]], Any], fmt: str) -> str:
        by_seed = {r["seed"]: value(r) for r in rows}
        return " / ".join("–" if by_seed.get(s) is None else format(by_seed[s], fmt) for s in seeds)

    def pct(value: Any) -> Any:
        return None if value is None else 100 * value

    head = (f"Seeds {', '.join(map(str, seeds))} (each cell: one value per seed); fitted on "
            f"{results['sets'][0]['n_calibration']} held-out training reviews, scored on the "
            f"{results['sets'][0]['n_scored']} test reviews; α = {results['alpha']:g}.\n\n")
    lines = ["| model | sets | coverage | mean set size | " + " | ".join(f"{k}: set > 1 (%)" for k in kinds) + " |",
             "|:---|:---|:---|:---|" + "---|" * len(kinds)]
    for model in dict.fromkeys(r["model"] for r in results["sets"]):
        for method in dict.fromkeys(r["method"] for r in results["sets"]):
            rows = [r for r in results["sets"] if r["model"] == model and r["method"] == method]
            cells = [
                model,
                method,
                per_seed(rows, lambda r: r["coverage"], ".3f"),
                per_seed(rows, lambda r: r["set_size"], ".2f"),
            ]
            cells += [per_seed(rows, lambda r, k=k: pct(r["ood_set_gt1"][k]), ".0f") for k in kinds]
            lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Abstention on MSP, Learn then Test at δ = {results['delta']:g} (– : no threshold certified at that risk; "
        "`hydra-hf calibrate` refuses it, every input would be refused):",
        "",
        "| model | risk | answered (%) | error among answered (%) | AURC | "
        + " | ".join(f"{k}: refused (%)" for k in kinds)
        + " |",
        "|:---|:---|:---|:---|:---|" + "---|" * len(kinds),
    ]
    for risk in results["risks"]:
        for model in dict.fromkeys(r["model"] for r in results["abstention"]):
            rows = [r for r in results["abstention"] if r["model"] == model and r["risk"] == risk]
            cells = [
                model,
                f"{risk:g}",
                per_seed(rows, lambda r: pct(r["answered"]), ".1f"),
                per_seed(rows, lambda r: pct(r["selective_error"]), ".1f"),
                per_seed(rows, lambda r: r["aurc"], ".3f"),
            ]
            cells += [per_seed(rows, lambda r, k=k: pct(r["ood_refused"][k]), ".0f") for k in kinds]
            lines.append("| " + " | ".join(cells) + " |")
    if results["splits"]:
        lines += ["", f"Coverage over {results['splits'][0]['splits']} random re-splits of the held-out and test "
                  f"reviews together into parts of those sizes (split seeds 0–{results['splits'][0]['splits'] - 1}; "
                  "the Single of seed 0):", "",
                  "| model | sets | mean coverage ± sd | splits in [0.88, 0.92] (%) |", "|:---|:---|---:|---:|"]
        lines += [f"| {r['model']} | {r['method']} | {r['mean']:.4f} ± {r['std']:.4f} | {100 * r['in_band']:.0f} |"
                  for r in results["splits"]]
    return head + "\n".join(lines) + "\n\n" + "".join(f"- {m}\n" for m in results["must"])
def _slim_text_table(results: Mapping[str, Any]) -> str:
    """examples/slim_text.py: compute and the MSP gain over the mean Single per OOD kind (mean ± std over seeds),
    accuracy, ECE; then each slim recipe against the reference Hydra, kind by kind, and the issue's bar."""
    kinds = results["kinds"]
    lines = [f"{len(results['seeds'])} seeds; MSP AUROC minus the mean Single's per OOD kind (points), ± the seeds' "
             "standard deviation.", "",
             "| model | compute (x Single) | " + " | ".join(kinds) + " | accuracy (%) | ECE |",
             "|:---|---:|" + "---:|" * len(kinds) + "---:|---:|"]
    for r in results["rows"]:
        gains = " | ".join(f"{r['gain_per_kind'][k][0]:+.1f} ± {r['gain_per_kind'][k][1]:.1f}" for k in kinds)
        lines.append(
            f"| {r['label']} | {r['compute_x']:.2f} | {gains} | {r['accuracy']:.1f} ± "
            f"{r['accuracy_std']:.1f} | {r['ece']:.3f} |"
        )
    lines += ["", f"| slim - reference, per kind (seed by seed) | difference | p (paired t) | decided | within "
                  f"{results['bar_points']:g} point |", "|:---|---:|---:|:---|:---|"]
    for d in results["decisions"]:
        lines.append(f"| {d['a']} - {d['b']}: {d['kind']} | {d['difference']:+.2f} ± {d['difference_std']:.2f} | "
                     f"{d['p']:.3f} | {'yes' if d['decided'] else 'no'} | {'yes' if d['within_bar'] else 'no'} |")
    return "\n".join(lines) + "\n"


def _slim_text_summary(results: Mapping[str, Any]) -> str:
    """examples/slim_text.py, one line per slim recipe: its compute, its difference from the reference Hydra per
    OOD kind (the range), how many kinds the seeds decide and how many stay within the bar, its accuracy and ECE
    against the Single's; then whether any recipe meets the bar on every kind."""
    by = {r["model"]: r for r in results["rows"]}
    single = by["Single"]
    lines = []
    for model in dict.fromkeys(d["a"] for d in results["decisions"]):
        rows = [d for d in results["decisions"] if d["a"] == model]
        r, reference = by[model], by[rows[0]["b"]]
        low, high = min(d["difference"] for d in rows), max(d["difference"] for d in rows)
        decided = sum(d["decided"] for d in rows)
        within = sum(d["within_bar"] for d in rows)
        lines.append(f"- **{model}** ({r['compute_x']:.2f}x a Single's compute; {reference['model']}: "
                     f"{reference['compute_x']:.2f}x): {low:+.1f} to {high:+.1f} points per OOD kind against "
                     f"{reference['model']}, decided by the seeds on {decided} of {len(rows)} kinds, within "
                     f"{results['bar_points']:g} point on {within}; accuracy {r['accuracy']:.1f} % (Single "
                     f"{single['accuracy']:.1f} %), ECE {r['ece']:.3f} (Single {single['ece']:.3f}).")
    meets = [m for m in dict.fromkeys(d["a"] for d in results["decisions"])
             if all(d["within_bar"] for d in results["decisions"] if d["a"] == m)]
    verdict = (f"Within {results['bar_points']:g} point of the reference on every kind: "
               + (", ".join(meets) if meets else "none of these budgets") + ".")
    return "\n".join(lines) + "\n\n" + verdict + "\n"


def _slim_text_readme(results: Mapping[str, Any]) -> str:
    """examples/slim_text.py, one paragraph for the README: the slim budgets at the reference's member fine-tuning
    (their range of differences from the reference Hydra per OOD kind), then the closest slim recipe (the one
    whose worst kind is least below the reference): its compute, member steps, range, the kinds within the bar
    and decided by the seeds; and whether any slim recipe gains over the mean Single on some kind."""
    slim = list(dict.fromkeys(d["a"] for d in results["decisions"]))
    by = {r["model"]: r for r in results["rows"]}
    reference = results["decisions"][0]["b"]
    steps = by[reference].get("member_steps")

    def of(model: str) -> list[Mapping[str, Any]]:
        return [d for d in results["decisions"] if d["a"] == model]

    def span(rows: list[Mapping[str, Any]]) -> str:
        return f"{min(d['difference'] for d in rows):+.1f} to {max(d['difference'] for d in rows):+.1f}"

    text = (f"On the pretrained MiniLM text testbed ({len(results['seeds'])} seeds), against today's Hydra "
            f"({reference}, {by[reference]['compute_x']:.2f}x a Single's compute, members fine-tuned {steps} steps)")
    same = [m for m in slim if by[m].get("member_steps") == steps]
    if same:
        rows = [d for m in same for d in of(m)]
        text += (f": with the same member fine-tuning, the slim budgets measured ({len(same)}, up to "
                 f"{max(by[m]['compute_x'] for m in same):.2f}x) are {span(rows)} points of MSP AUROC per OOD kind "
                 f"(decided by the seeds in {sum(d['decided'] for d in rows)} of {len(rows)} comparisons)")
    best = max(slim, key=lambda m: min(d["difference"] for d in of(m)))
    rows = of(best)
    text += (f"; the closest, {best} ({by[best]['compute_x']:.2f}x, members fine-tuned {by[best].get('member_steps')}"
             f" steps), is {span(rows)} points per kind, within {results['bar_points']:g} point on "
             f"{sum(d['within_bar'] for d in rows)} of {len(rows)} kinds (differences decided by the seeds on "
             f"{sum(d['decided'] for d in rows)})")
    gains = [by[m]["gain_per_kind"][k][0] for m in slim for k in results["kinds"]]
    if max(gains) < 0:
        text += ", and every slim recipe stays below the mean Single on every kind"
    return text + f" (`{results['command']}`).\n"


def _image_kinds_table(results: Mapping[str, Any]) -> str:
    """examples/slim_pareto.py, per OOD kind: every model's MSP AUROC gain over the mean Single (points, mean over
    the seeds), the mean over the kinds ± the seeds' standard deviation, compute, accuracy and ECE."""
    kinds = results["kinds"]
    lines = ["| model | seeds | compute (x Single) | " + " | ".join(kinds) + " | mean ± std | accuracy (%) | ECE |",
             "|:---|---:|---:|" + "---:|" * len(kinds) + "---:|---:|---:|"]
    for r in results["rows"]:
        gains = " | ".join(f"{r['gain_per_kind'][k]:+.1f}" for k in kinds)
        lines.append(f"| {r['label']} | {r['seeds']} | {r['compute_x']:.2f} | {gains} | {r['gain']:+.1f} ± "
                     f"{r['gain_std']:.1f} | {r['accuracy']:.1f} | {r['ece']:.3f} |")
    return "\n".join(lines) + "\n"


def _slim_bench_summary(results: Mapping[str, Any]) -> str:
    """bench/bench_slim.py, one sentence for the README: BERT-base slim Hydra's and the paper's Hydra's compute and
    eager time relative to the Single at the batch sizes the file holds."""
    rows = [r for r in results["rows"] if r["geometry"] == "bert"]
    batches = sorted({r["batch"] for r in rows})

    def of(model: str, key: str) -> str:
        return " / ".join(f"{next(r[key] for r in rows if r['batch'] == b and r['model'] == model):.2f}x"
                          for b in batches)

    slim = next(r for r in rows if r["model"] == "eager slim Hydra (3)")
    hydra = next(r for r in rows if r["model"] == "eager Hydra (3)")
    # the command the file names (bench/_common.write_results); files written before it named none
    command = results.get("command") or ("python bench/bench_slim.py --geometries bert vit --batch-sizes "
                                         f"{' '.join(map(str, batches))} --no-onnx --json "
                                         "docs/results/bench_slim_eager.json")
    return (f"3 such BERT-base members cost {slim['compute_x']:.2f}x a Single's multiply-adds (the paper's members: "
            f"{hydra['compute_x']:.2f}x) and {of('eager slim Hydra (3)', 'x Single')} its eager CPU time at batch "
            f"{' / '.join(map(str, batches))} (the paper's Hydra: {of('eager Hydra (3)', 'x Single')}; "
            f"sequence length {results['seq_len']}, `{command}`).\n")


def _slim_image_summary(results: Mapping[str, Any]) -> str:
    """examples/slim_pareto.py, one sentence for the README: the slim members' mean OOD gain and compute on the
    image testbed beside Hydra (Taylor)'s and Packed-Ensembles', and whether the seeds decide the difference."""
    by = {r["model"]: r for r in results["rows"]}
    slim, taylor, packed = by["slim per_member"], by["taylor per_member"], by.get("Packed-Ensembles")
    compared = ("slim per_member", "taylor per_member")
    pair = next((d for d in results["decisions"] if (d["a"], d["b"]) == compared), None)
    text = (f"On the image testbed ({len(results['seeds'])} seeds) they gain {slim['gain']:+.1f} ± "
            f"{slim['gain_std']:.1f} points of mean MSP AUROC over the mean Single at {slim['compute_x']:.2f}x its "
            f"compute, against Hydra (Taylor)'s {taylor['gain']:+.1f} ± {taylor['gain_std']:.1f} at "
            f"{taylor['compute_x']:.2f}x")
    if pair is not None:
        text += f" (paired over seeds p = {pair['p']:.2f}: {'decided' if pair['decided'] else 'not decided'})"
    if packed is not None:
        text += f", beside Packed-Ensembles' {packed['gain']:+.1f} at {packed['compute_x']:.2f}x"
    return text + f" (`{results['command']}`).\n"


# ------------------------------------------------------------------------------- SmolLM2 classification studies
_POINTS = ("accuracy",)  # metrics shown in points (x 100), besides the AUROCs


def _metric_label(metric: str) -> str:
    kind, _, name = metric.rpartition(".")
    return f"{kind} AUROC" if name == "auroc" else {"nll": "NLL", "ece": "ECE"}.get(metric, metric)


def _in_points(metric: str) -> bool:
    return metric in _POINTS or metric.endswith(".auroc")


def _mean_pm(mean: float, std: float, seeds: int, spec: str, scale: float = 1.0) -> str:
    return f"{scale * mean:{spec}}" + (f" ± {scale * std:{spec.lstrip('+')}}" if seeds > 1 else "")


def _smollm2_rows(results: Mapping[str, Any]) -> str:
    """The studies' rows: compute, seeds, accuracy, NLL, ECE and the MSP AUROC per OOD kind (mean ± std over the
    seeds where a model has several)."""
    kinds = results["kinds"]
    lines = ["| model | compute (x Single) | members | seeds | accuracy (%) | NLL | ECE | "
             + " | ".join(f"{k} AUROC" for k in kinds) + " |", "|:---|---:|---:|---:|---:|---:|---:|"
             + "---:|" * len(kinds)]
    for r in results["rows"]:
        n = r["seeds"]
        aurocs = " | ".join(_mean_pm(*r["auroc"][k], n, ".3f") for k in kinds)
        lines.append(f"| {r['model']} | {r['compute_x']:.2f} | {r['members']} | {n} | "
                     f"{_mean_pm(r['accuracy'], r['accuracy_std'], n, '.1f', 100)} | "
                     f"{_mean_pm(r['nll'], r['nll_std'], n, '.3f')} | "
                     f"{_mean_pm(r['ece'], r['ece_std'], n, '.3f')} | {aurocs} |")
    return "\n".join(lines) + "\n"


def _comparison_cell(c: Mapping[str, Any], metric: str) -> str:
    scale = 100 if _in_points(metric) else 1
    spec = "+.1f" if scale == 100 else "+.3f"
    if c["p"] is None:  # two models without seeds: the bootstrap interval
        lo, hi = c["intervals"][0]
        text = f"{scale * c['mean']:{spec}} [{scale * lo:{spec}}, {scale * hi:{spec}}]"
    else:
        text = f"{scale * c['mean']:{spec}} ± {scale * c['std']:.1f}" if scale == 100 else \
            f"{c['mean']:{spec}} ± {c['std']:.3f}"
        text += f", p {c['p']:.2f}"
    return f"**{text}**" if c["decided"] else text


def _smollm2_comparisons(results: Mapping[str, Any]) -> str:
    """Every comparison of the studies, metric by metric: the mean difference A - B over the seeds ± its standard
    deviation and the p-value of the paired t-test (deterministic pairs: the bootstrap interval), in bold where
    the seeds decide it (p < 0.05 and every seed's paired bootstrap interval on the same side of 0)."""
    metrics = list(next(iter(results["comparisons"].values())))
    lines = ["| A - B | " + " | ".join(_metric_label(m) + (" (points)" if _in_points(m) else "") for m in metrics)
             + " |", "|:---|" + "---:|" * len(metrics)]
    for name, comparison in results["comparisons"].items():
        lines.append(f"| {name} | " + " | ".join(_comparison_cell(comparison[m], m) for m in metrics) + " |")
    return "\n".join(lines) + "\n"


def _decided_sentences(results: Mapping[str, Any]) -> str:
    """What the seeds decide, one clause per comparison: the metrics whose sign they decide, with the difference."""
    parts = []
    for name, comparison in results["comparisons"].items():
        decided = [(m, c) for m, c in comparison.items() if c["decided"]]
        if not decided:
            parts.append(f"{name}: nothing decided")
            continue
        words = []
        for m, c in decided:
            scale, unit = (100, " points") if _in_points(m) else (1, "")
            words.append(f"{c['direction']} {_metric_label(m)} ({scale * c['mean']:+.{1 if scale == 100 else 3}f}"
                         f"{unit})")
        parts.append(f"{name}: " + ", ".join(words))
    return "; ".join(parts)


def _run_line(results: Mapping[str, Any]) -> str:
    sizes = ", ".join(f"{name} {n}" for name, n in results["test_sizes"].items())
    precision = "bf16 autocast" if results["settings"].get("bf16") else "fp32"
    took = ("written from the cache of a run that stopped early" if results.get("missing") else
            f"its fine-tuning cells took {results['cells_cpu_s'] / 3600:.1f} h of CPU time, the run that collected "
            f"them {results['wall_s'] / 60:.0f} min" if "cells_cpu_s" in results else
            "written from the cells of its cache, which an earlier run computed (`--from-cache`; the cells' own "
            "compute is not timed here)" if "--from-cache" in results.get("command", "") else
            f"the run took {results['wall_s'] / 3600:.1f} h of wall time and {results['cpu_s'] / 3600:.1f} h of CPU "
            "time")
    return (f"Test sets: {sizes} texts. Seeds {', '.join(map(str, results['seeds']))}; {precision}; "
            f"{results['threads']['torch_threads']} torch thread on {_machine(results.get('machine'))}; {took} "
            f"(`{results['command']}`).")


def _smollm2_zero_shot(results: Mapping[str, Any]) -> str:
    """examples/smollm2_zero_shot.py: the rows, the comparisons, and each prompt of the ensemble alone."""
    prompts = ["| prompt | label words (rotten / fresh) | answer starts with | accuracy (%) | NLL | ECE |",
               "|:---|:---|:---|---:|---:|---:|"]
    for p in results["prompts"]:
        words = " / ".join("|".join(repr(w) for w in ws) for ws in p["label_words"])
        prompts.append(f"| {p['name']} | {words} | {p['answer_prefix']!r} | {100 * p['accuracy']:.1f} | "
                       f"{p['nll']:.3f} | {p['ece']:.3f} |")
    missing = results.get("missing") or []
    stopped = (f" The run stopped before these cells: {'; '.join(missing)} (a Hydra with fewer than 2 seeds is "
               "compared with nothing)." if missing else "")
    return (_smollm2_rows(results) + "\n" + _smollm2_comparisons(results) + "\nThe Single's prompt alone and each "
            "prompt of the ensemble (the stock model):\n\n" + "\n".join(prompts) + "\n\n" + _run_line(results)
            + stopped + "\n")


def _smollm2_classify(results: Mapping[str, Any]) -> str:
    """examples/smollm2_classify.py: the rows, the comparisons, whether every Single learned, and what one
    fine-tuning step costs."""
    checks = ["| Single | training loss, first tenth of its steps | last tenth | best validation accuracy (%) | "
              "test accuracy (%) | majority class (%) | learned |", "|:---|---:|---:|---:|---:|---:|:---|"]
    for seed, c in results["single_checks"].items():
        checks.append(f"| seed {seed} | {c['loss_first_tenth']:.3f} | {c['loss_last_tenth']:.3f} | "
                      f"{100 * c['best_validation_accuracy']:.1f} | {100 * c['test_accuracy']:.1f} | "
                      f"{100 * c['majority']:.1f} | {'yes' if c['learned'] else 'no'} |")
    members = ["| members of | seed | training loss, first tenth → last tenth (per member) | best validation accuracy "
               "(%, per member) |", "|:---|---:|:---|:---|"]
    for cell, member_list in results.get("member_checks", {}).items():
        recipe, seed = cell.rsplit("_seed", 1)
        losses = ", ".join(f"{m['loss_first_tenth']:.3f} → {m['loss_last_tenth']:.3f}" for m in member_list)
        best = ", ".join(f"{100 * max(a for a in m['validation_accuracy'] if a is not None):.1f}"
                         for m in member_list)
        members.append(f"| {results.get('recipe_names', {}).get(recipe, recipe)} | {seed} | {losses} | {best} |")
    rate = results["single_steps_per_s"]
    settings = results["settings"]
    cost = (f"One fine-tuning step of the Single (batch {settings['batch_size']}, up to {settings['max_length']} "
            f"tokens per review) ran at {rate:.3f} steps/s ({1 / rate:.0f} s per step) here, on a core other jobs "
            "shared.")
    missing = results.get("missing") or []
    stopped = (f" The run stopped before these cells: {'; '.join(missing)} (a recipe with fewer than 2 seeds is "
               "compared with nothing)." if missing else "")
    return (_smollm2_rows(results) + "\n" + _smollm2_comparisons(results) + "\n" + "\n".join(checks) + "\n\n"
            + ("\n".join(members) + "\n\n" if len(members) > 2 else "")
            + cost + " " + _run_line(results) + stopped + "\n")


def _smollm2_classify_cost(results: Mapping[str, Any]) -> str:
    """examples/smollm2_classify.py --estimate-only: one fine-tuning step of the Single in bf16 autocast and fp32,
    and the study's core-hours at the rate of the precision it runs in, part by part."""
    settings, measured = results["settings"], results["measured"]
    steps = [f"{name} {m['train_step_s']:.1f} s ({m['steps_per_s']:.2f} steps/s; a forward pass "
             f"{m['forward_s']:.2f} s)" for name, m in measured.items()]
    parts = ", ".join(f"{name} {minutes / 60:.1f}" for name, minutes in results["core_minutes"].items()
                      if name != "total")
    return (f"One fine-tuning step of the Single (batch {settings['batch_size']}, {settings['max_length']} tokens "
            f"per review, embeddings frozen, AdamW): {'; '.join(steps)}, each the median of "
            f"{results['steps_measured']} steps after a warm-up, {results['threads']['torch_threads']} torch thread "
            f"on {_machine(results.get('machine'))}. From the {results['precision']} rate, the whole study "
            f"({len(settings['seeds'])} seeds) is estimated at {results['core_hours']:.1f} core-hours ({parts}) "
            f"(`{results['command']}`).\n")


def _smollm2_readme(results: Mapping[str, Any], what: str) -> str:
    kinds = results["kinds"]
    lines = [f"| {what} | compute (x Single) | accuracy (%) | ECE | " + " | ".join(f"{k} AUROC" for k in kinds)
             + " |", "|:---|---:|---:|---:|" + "---:|" * len(kinds)]
    for r in results["rows"]:
        n = r["seeds"]
        lines.append(f"| {r['model']} | {r['compute_x']:.2f} | "
                     f"{_mean_pm(r['accuracy'], r['accuracy_std'], n, '.1f', 100)}"
                     f" | {_mean_pm(r['ece'], r['ece_std'], n, '.3f')} | "
                     + " | ".join(_mean_pm(*r["auroc"][k], n, ".3f") for k in kinds) + " |")
    return ("\n".join(lines) + f"\n\nWhat the {len(results['seeds'])} seeds decide (p < 0.05 over the seeds and every "
            f"seed's paired bootstrap interval on one side of 0): {_decided_sentences(results)} "
            f"(`{results['command']}`).\n")


def _smollm2_zero_shot_readme(results: Mapping[str, Any]) -> str:
    """examples/smollm2_zero_shot.py for the README: the three models' headline rows and what the seeds decide."""
    return _smollm2_readme(results, "zero-shot")


def _smollm2_classify_readme(results: Mapping[str, Any]) -> str:
    """examples/smollm2_classify.py for the README: the four models' headline rows and what the seeds decide."""
    return _smollm2_readme(results, "fine-tuned")


def _bench_number(value: Any) -> str:
    """A benchmark cell as bench/_common.table prints it: 3 significant digits below 100, whole numbers above."""
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return "–" if value is None else str(value)


def _bench_table(results: Mapping[str, Any]) -> str:
    """Any benchmark's results file (bench/_common.write_results): its rows in its columns, the lines it printed
    under them (ratios, targets met or missed), and the command, torch and threads it ran with."""
    columns = results["columns"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_bench_number(row.get(c)) for c in columns) + " |" for row in results["rows"]]
    lines.append("")
    lines += [f"- {line}" for line in results.get("summary", [])]
    threads = results["threads"]
    load = results["load_average"]
    lines += ["", f"`{results['command']}` (torch {results['torch']}; torch threads: {threads['torch_threads']}, "
                  f"cores: {results['cpu_count']}; load average when it ended: {load[0]:g})"]
    return "\n".join(lines) + "\n"



# ------------------------------------------------------------------------- the language-model study
LM_KIND_NAMES = {"code": "code", "chinese": "Chinese", "headlines": "headlines", "hamlet": "Hamlet"}
LM_SCORE_NAMES = {"likelihood": "likelihood", "entropy": "entropy", "msp": "MSP", "mutual_information": "MI"}
LM_BASELINES = ("Single", "Single + ft", "LoRA-Ensemble")
LM_BELOW_CHANCE = ("¹ below 0.5: in its registry direction (higher = more ID) the score ranks this kind as MORE "
                   "in-distribution than the ID text (e.g. code is more predictable than reviews).")


def _pm(value: list[float] | None, digits: int = 3, scale: float = 1.0) -> str:
    """``mean ± std`` of a ``[mean, std]`` pair (— where undefined)."""
    if value is None or value[0] is None:
        return "—"
    return f"{scale * value[0]:.{digits}f} ± {scale * (value[1] or 0.0):.{digits}f}"


def _lm_auroc(value: list[float] | None, spread: bool = True) -> str:
    """An AUROC (``± std`` when ``spread``), marked ¹ below chance."""
    if value is None or value[0] is None:
        return "—"
    text = _pm(value) if spread else f"{value[0]:.3f}"
    return text + ("¹" if value[0] < 0.5 else "")


def _lm_label(results: Mapping[str, Any], model: str) -> str:
    """A row's name with its budget: ``Hydra H7`` -> ``Hydra 7/9 heads``, ``Hydra slim`` -> ``Hydra slim (3/9
    heads, 33 % MLP)``, ``H7 members one by one`` -> ``Hydra 7/9 heads: its members one by one``."""
    if model.endswith(" members one by one"):  # a decode group
        return f"{_lm_label(results, 'Hydra ' + model.split()[0])}: its members one by one"
    if model.startswith("Hydra "):
        name, _, ft = model.removeprefix("Hydra ").partition(" + ")
        b = results["budgets"][name]
        heads = f"{b['kept_query_heads']}/{b['query_heads_per_layer']} heads"
        label = f"Hydra slim ({heads}, {100 * b['mlp_keep']:.0f} % MLP)" if b["mlp_keep"] < 1 else f"Hydra {heads}"
        return label + (f" + {ft}" if ft else "")
    return model.replace("LoRA-Ensemble", f"LoRA-Ensemble ({results['members']})")


def _lm_decode_group(model: str) -> str:
    """The decode group that times ``model``: a fine-tuned Hydra's architecture, a merged LoRA adapter or the
    fine-tuned Single have their measured shapes (a LoRA adapter and the Single + ft: the Single's)."""
    return "Single" if model in ("LoRA-Single", "Single + ft") else model


def _lm_pending(results: Mapping[str, Any]) -> str:
    """The note under an interim results file's views: which cells are still pending."""
    if results["complete"]:
        return ""
    return (f"\nINTERIM: the study's cells {', '.join(results['pending_cells'])} are pending; every row is over the "
            "cells that exist and every comparison over the seeds both models have (its n).\n")


def _lm_over(row: Mapping[str, Any]) -> str:
    """What a row averages: ``3 seeds``, ``3 adapters``, or ``1 (baseline)`` (the same on every seed)."""
    if row["over"] == "adapters":
        return f"{row['seeds']} adapters"
    return "1 (baseline)" if row["baseline"] else f"{row['seeds']} seed{'s' if row['seeds'] > 1 else ''}"


def _lm_study_table(results: Mapping[str, Any]) -> str:
    """examples/lm_study.py: per model the ID numbers, error detection and per OOD kind its best sequence score's
    test AUROC (the score chosen on the validation windows; mean ± std over the seeds); then the decode cost of the
    Single, each Hydra and its members one by one."""
    kinds = results["kinds"]
    lines = ["| model | over | PPL ↓ | next-token acc ↑ | token ECE ↓ | wrong tokens: entropy AUROC ↑ | "
             "wrong tokens: MI AUROC ↑ | " + " | ".join(f"{LM_KIND_NAMES[k]} AUROC ↑ (best score)" for k in kinds)
             + " |", "|:---|---:|---:|---:|---:|---:|---:|" + "---:|" * len(kinds)]
    for row in results["rows"]:
        spread = row["seeds"] > 1  # one cell has no spread to show

        def pm(value: list[float] | None, digits: int = 3) -> str:
            return _pm(value, digits) if spread or value is None or value[0] is None else f"{value[0]:.{digits}f}"

        best = " | ".join(f"{_lm_auroc(row['auroc'][k][row['best'][k]], spread)} ({LM_SCORE_NAMES[row['best'][k]]})"
                          for k in kinds)
        detection = row["error_detection"]
        lines.append(f"| {_lm_label(results, row['model'])} | {_lm_over(row)} | {pm(row['perplexity'], 1)} | "
                     f"{pm(row['accuracy'])} | {pm(row['ece'])} | {pm(detection['entropy'])} | "
                     f"{pm(detection.get('mutual_information'))} | {best} |")
    lines += ["", LM_BELOW_CHANCE]
    decode = results["decode"]
    if decode:
        batches = [b for b in decode if b != "fused_equals_members_tokens"]
        lines += ["", f"| decoding (greedy, {results['settings']['new_tokens']} new tokens after "
                  f"{results['settings']['prompt_tokens']}) | "
                  + " | ".join(f"tokens/s, batch {b} | cost x Single, batch {b} | cost x its members one by one, "
                               f"batch {b}" for b in batches) + " |", "|:---|" + "---:|---:|---:|" * len(batches)]
        for group in decode[batches[0]]:
            cells = " | ".join(f"{decode[b][group]['tokens_per_s'][0]:.1f} | "
                               f"{_pm(decode[b][group]['cost_x_single'], 2)} | "
                               f"{_pm(decode[b][group].get('cost_x_members'), 2)}" for b in batches)
            lines.append(f"| {_lm_label(results, group)} | {cells} |")
        agree = decode["fused_equals_members_tokens"]
        n = len(results["decode_seeds"])
        lines += ["", f"Decode speeds: mean ± std over {n} seed{'s' if n > 1 else ''}' measurements. Greedy "
                  f"tokens of every fused Hydra equal to its members' run one by one: {100 * min(agree.values()):.0f} "
                  f"% at least ({len(agree)} model and batch pairs)."]
    return "\n".join(lines) + "\n" + _lm_pending(results)


def _lm_study_scores(results: Mapping[str, Any]) -> str:
    """examples/lm_study.py: every sequence score of every model per OOD kind, test AUROC (mean ± std over the
    seeds) and, in brackets, the validation AUROC that chose the best score (bold)."""
    kinds = results["kinds"]
    signs = results["score_directions"]
    lines = ["| model | score | " + " | ".join(f"{LM_KIND_NAMES[k]}: test AUROC (validation)" for k in kinds) + " |",
             "|:---|:---|" + "---:|" * len(kinds)]
    for row in results["rows"]:
        for score in results["scores"]:
            if score not in row["auroc"][kinds[0]]:
                continue
            cells = []
            for k in kinds:
                text = f"{_lm_auroc(row['auroc'][k][score], row['seeds'] > 1)} ({row['val_auroc'][k][score][0]:.3f})"
                cells.append(f"**{text}**" if row["best"][k] == score else text)
            lines.append(f"| {_lm_label(results, row['model'])} | {LM_SCORE_NAMES[score]} | {' | '.join(cells)} |")
    directions = "; ".join(f"{LM_SCORE_NAMES[name]} = {s['help']}" for name, s in signs.items())
    lines += ["", LM_BELOW_CHANCE, "", f"Directions (the score registry's, fixed before any data): {directions}; a "
              "window's score is the mean over its tokens."]
    return "\n".join(lines) + "\n"


def _lm_study_training(results: Mapping[str, Any]) -> str:
    """examples/lm_study.py: every fine-tuned model's training loss along its steps (each step's batch is new text:
    a held-out curve; mean over its members and the seeds) and its ID test perplexity against before training."""
    rows = {r["model"]: r for r in results["rows"]}
    steps = results["settings"]["steps"]
    marks = sorted({1, max(1, steps // 4), max(1, steps // 2), max(1, 3 * steps // 4), steps})
    lines = ["| model | " + " | ".join(f"loss at step {m}" for m in marks) + " | ID PPL before | ID PPL after | "
             "ID NLL change ↓ |", "|:---|" + "---:|" * (len(marks) + 3)]
    for model, runs in results["training_losses"].items():
        curves = [member["curve"] for seed in runs for member in seed]
        loss = [sum(c[m - 1] for c in curves) / len(curves) for m in marks]
        before = results["untrained"][model]
        change = results["heldout_nll_change"][model] or [float("nan")]
        mean = sum(change) / len(change)
        lines.append(f"| {_lm_label(results, model)} | " + " | ".join(f"{v:.2f}" for v in loss)
                     + f" | {_pm(rows[before]['perplexity'], 1)} | {_pm(rows[model]['perplexity'], 1)} | "
                     f"{_signed(mean, 3)} |")
    if not results["training_losses"]:
        lines += ["", "No fine-tuned model is evaluated yet."]
    return "\n".join(lines) + "\n" + _lm_pending(results)


def _lm_comparison(results: Mapping[str, Any], a: str, b: str, metric: str) -> Mapping[str, Any] | None:
    return next((c for c in results["comparisons"] if (c["a"], c["b"], c["metric"]) == (a, b, metric)), None)


def _lm_study_comparisons(results: Mapping[str, Any]) -> str:
    """examples/lm_study.py: every Hydra (and the LoRA-Ensemble) against the baselines, paired seed by seed: per OOD
    kind the difference of the best scores' AUROCs, the ID perplexity and the error detection of the MI against
    the other's entropy; mean over the seeds, the paired t-test's p, bold where the seeds decide (p < 0.05), and
    how many seeds' paired bootstraps over the test windows call it better / worse."""
    kinds = results["kinds"]
    metrics = [f"{k} AUROC" for k in kinds] + ["perplexity", "error detection: mutual_information vs entropy"]
    names = [f"{LM_KIND_NAMES[k]} AUROC" for k in kinds] + ["ID PPL", "wrong tokens: MI − other's entropy"]
    lines = ["| model − baseline | seeds | " + " | ".join(names) + " |", "|:---|---:|" + "---:|" * len(names)]
    pairs = list(dict.fromkeys((c["a"], c["b"]) for c in results["comparisons"]))
    for a, b in pairs:
        cells = [str(_lm_comparison(results, a, b, "perplexity")["n"])]
        for metric in metrics:
            c = _lm_comparison(results, a, b, metric)
            if c is None or c["difference"][0] is None:
                cells.append("—")
                continue
            text = f"{_signed(c['difference'][0], 1 if metric == 'perplexity' else 3)} (p {c['p']:.2f})"
            if "bootstrap" in c:
                text += f" {c['bootstrap'].count('better')}/{c['bootstrap'].count('worse')}"
            cells.append(f"**{text}**" if c["decided"] else text)
        lines.append(f"| {_lm_label(results, a)} − {_lm_label(results, b)} | {' | '.join(cells)} |")
    lines += ["", "Each model's best score (chosen on validation) against the baseline's, paired over the seeds both "
              "have (a baseline is the same on every seed); after the p, the number of seeds whose paired bootstrap "
              "over the test windows (95 %) calls the difference better / worse."]
    return "\n".join(lines) + "\n" + _lm_pending(results)


def _lm_verdicts(results: Mapping[str, Any], hydra: str, other: str) -> tuple[list[str], list[str]]:
    """The OOD kinds on which the seeds decide that ``hydra``'s best score beats / trails ``other``'s."""
    rows = [c for c in results["comparisons"] if c["a"] == hydra and c["b"] == other and "score_a" in c]
    better = [LM_KIND_NAMES[c["metric"].split(" ")[0]] for c in rows if c["decided"] and c["difference"][0] > 0]
    worse = [LM_KIND_NAMES[c["metric"].split(" ")[0]] for c in rows if c["decided"] and c["difference"][0] < 0]
    return better, worse


def _lm_seeds(results: Mapping[str, Any], a: str, b: str) -> int:
    """How many seeds the comparison of ``a`` with ``b`` is paired over."""
    return _lm_comparison(results, a, b, "perplexity")["n"]


def _lm_cost(results: Mapping[str, Any], model: str) -> str:
    decode = results["decode"]
    if not decode:
        return "decode cost not measured yet"
    batches = [b for b in decode if b != "fused_equals_members_tokens"]
    group = _lm_decode_group(model)
    return ", ".join(f"{decode[b][group]['cost_x_single'][0]:.2f}x the Single's decode cost at batch {b}"
                     for b in batches)


def _lm_study_summary(results: Mapping[str, Any]) -> str:
    """examples/lm_study.py, one line per ensemble: the kinds on which the seeds decide it beats or trails each
    baseline (best score against best score), its decode cost, whether its token MI flags wrong tokens better than
    the Single's entropy, and its ID perplexity against the Single's; then whether every trained model's NLL fell."""
    n = len(results["kinds"])
    lines = []
    ensembles = [r["model"] for r in results["rows"] if r["model"].startswith("Hydra ")]
    ensembles += ["LoRA-Ensemble"] if any(c["a"] == "LoRA-Ensemble" for c in results["comparisons"]) else []
    for model in ensembles:
        parts = []
        for other in LM_BASELINES:
            if _lm_comparison(results, model, other, "perplexity") is None:
                continue
            better, worse = _lm_verdicts(results, model, other)
            if _lm_seeds(results, model, other) < 2:
                parts.append(f"against the {_lm_label(results, other)}: undecided on every kind (n = 1 seed: one "
                             "seed decides nothing)")
                continue
            parts.append(f"against the {_lm_label(results, other)} (n = {_lm_seeds(results, model, other)} seeds): "
                         f"better on {len(better)} of {n} OOD kinds"
                         + (f" ({', '.join(better)})" if better else "")
                         + f", worse on {len(worse)}" + (f" ({', '.join(worse)})" if worse else "")
                         + f", undecided on {n - len(better) - len(worse)}")
        mi = _lm_comparison(results, model, "Single", "error detection: mutual_information vs entropy")
        if mi is None or mi["difference"][0] is None:
            flag = "undefined here"
        else:
            verdict = ("better than" if mi["decided"] and mi["difference"][0] > 0 else
                       "worse than" if mi["decided"] else "not distinguishably by the seeds from")
            flag = f"{verdict} the Single's entropy ({_signed(mi['difference'][0], 3)} AUROC, n = {mi['n']})"
        ppl = _lm_comparison(results, model, "Single", "perplexity")
        ppl_text = (f"ID perplexity {_signed(ppl['difference'][0], 1)} against the Single's"
                    + (" (decided)" if ppl["decided"] else " (undecided)"))
        lines.append(f"- **{_lm_label(results, model)}** ({_lm_cost(results, model)}; {ppl_text}): "
                     f"{'; '.join(parts)}. Its token MI flags wrong tokens {flag}.")
    trained = ("no fine-tuned model is evaluated yet" if not results["heldout_nll_change"] else
               "every fine-tuned model's ID test NLL fell below its untrained counterpart's"
               if results["every_heldout_nll_fell"] else
               "NOT every fine-tuned model's ID test NLL fell below its untrained counterpart's")
    lines.append(f"\nOver up to {len(results['seeds'])} member-selection seeds ({_lm_sizes(results)}; the Single, "
                 f"the Single + ft and the LoRA-Ensemble are trained once, the same anchor on every seed); {trained}; "
                 f"decided = paired t-test over the n seeds a comparison has, p < 0.05.")
    return "\n".join(lines) + "\n" + _lm_pending(results)


def _lm_sizes(results: Mapping[str, Any]) -> str:
    sizes = results["sizes"]
    return (f"windows of {results['tokens']} tokens: {sizes['id_test']} ID test windows, "
            f"{sizes[results['kinds'][0]]} per OOD kind")


def _lm_study_data(results: Mapping[str, Any]) -> str:
    """examples/lm_study.py: every text source with its windows, the budgets and the settings, and the core time of
    each part of the run."""
    lines = ["| part | windows | source |", "|:---|---:|:---|"]
    sources, shown = results["sources"], set()
    for part, count in results["sizes"].items():
        kind = part.removesuffix("_val") if part.removesuffix("_val") in sources else "id"
        lines.append(f"| {part} | {count} | {'the same' if kind in shown else sources[kind]} |")
        shown.add(kind)
    s = results["settings"]
    budgets = "; ".join(
        f"{_lm_label(results, 'Hydra ' + name)}: on average {b['kept_kv_heads_mean']:.2f} of the "
        f"{b['key_value_heads_per_layer']} key/value heads of a layer kept, mean pairwise Jaccard overlap of the "
        f"members' heads {b['pairwise_jaccard_mean']:.2f}"
        + (", also fine-tuned" if b["finetune"] else "") for name, b in results["budgets"].items())
    seconds = results["seconds"]

    def total(*prefixes: str) -> float:  # a prefix ending in "$" is a whole cell name
        return sum(v for name, v in seconds.items() if v and (name.startswith(prefixes) or f"{name}$" in prefixes)
                   ) / 60

    trained = tuple(f"{name}-ft" for name in results["budgets"])
    pruned = tuple(f"{name}_seed" for name in results["budgets"])
    lines += ["", f"Windows of {results['tokens']} tokens; each seed draws {s['selection']} selection windows from "
              f"the pool. {results['members']} members per Hydra, Taylor importance on the next-token loss. "
              f"{budgets}. Fine-tuning: {s['steps']} steps of {s['batch_size']} windows (the members and the "
              f"Single + ft: learning rate {s['member_lr']:g}, embeddings frozen; LoRA rank {s['lora_r']} on q_proj / "
              f"v_proj, learning rate {s['lora_lr']:g}).",
              "", "Wall time of each part on one pinned core, shared with other work "
              f"({results['threads']['torch_threads']} torch thread; on "
              f"{_machine(results.get('machine'))}): member selection {total('selection'):.0f} min, the Single "
              f"{total('single$'):.0f} min, the Hydras without fine-tuning {total(*pruned):.0f} "
              f"min, with fine-tuning {total(*trained):.0f} min, the Single + ft {total('single-ft'):.0f} min, the "
              f"LoRA-Ensemble {total('lora'):.0f} min, decoding {total('decode'):.0f} min; "
              f"{results['total_core_hours']:.2f} hours in all."]
    return "\n".join(lines) + "\n" + _lm_pending(results)


def _lm_study_readme(results: Mapping[str, Any]) -> str:
    """examples/lm_study.py, the README's headline rows: per model the ID perplexity, per OOD kind its best score's
    test AUROC (chosen on validation) and the decode cost against the Single at batch 1 and 8; then the verdicts."""
    kinds = results["kinds"]
    decode = results["decode"]
    batches = [b for b in decode if b != "fused_equals_members_tokens"]
    lines = ["| SmolLM2-135M | PPL ↓ | " + " | ".join(f"{LM_KIND_NAMES[k]} AUROC ↑" for k in kinds)
             + "".join(f" | decode cost (x Single, batch {b})" for b in batches) + " |",
             "|:---|---:|" + "---:|" * (len(kinds) + len(batches))]
    for row in results["rows"]:
        model = row["model"]
        if model == "LoRA-Single":
            continue
        group = _lm_decode_group(model)
        cost = "".join(f" | {decode[b][group]['cost_x_single'][0]:.2f}" for b in batches)
        lines.append(f"| {_lm_label(results, model)} | {row['perplexity'][0]:.1f} | "
                     + " | ".join(f"{_lm_auroc(row['auroc'][k][row['best'][k]], spread=False)} "
                                  f"({LM_SCORE_NAMES[row['best'][k]]})" for k in kinds) + f"{cost} |")
    lines += ["", LM_BELOW_CHANCE, "",
              "Decided by the member-selection seeds (paired t-test over the n seeds a comparison has, p < 0.05; the "
              "baselines are trained once, the same on every seed), best score against best score per OOD kind:", ""]
    for model in [r["model"] for r in results["rows"] if r["model"].startswith("Hydra ")]:
        verdicts = []
        for other in LM_BASELINES:
            if _lm_comparison(results, model, other, "perplexity") is None:
                continue
            better, worse = _lm_verdicts(results, model, other)
            if _lm_seeds(results, model, other) < 2:
                verdicts.append(f"against the {_lm_label(results, other)} undecided (n = 1: one seed decides nothing)")
                continue
            verdicts.append(f"against the {_lm_label(results, other)} (n = {_lm_seeds(results, model, other)}) "
                            f"better on {', '.join(better) or 'no kind'}, worse on {', '.join(worse) or 'no kind'}")
        lines.append(f"- {_lm_label(results, model)}: {'; '.join(verdicts)}.")
    return "\n".join(lines) + "\n" + _lm_pending(results)


def _duration(seconds: float) -> str:
    """A step's wall time as the Quickstart prints it: seconds below two minutes, else minutes."""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _quickstart_steps(results: Mapping[str, Any], section: str) -> list[Mapping[str, Any]]:
    steps = [step for step in results["steps"] if step["section"] == section]
    if not steps:
        raise KeyError(f"no {section!r} step")
    return steps


def _quickstart_block(results: Mapping[str, Any]) -> str:
    """examples/quickstart.py: the README's Quickstart, the commands it ran as printed, each step's comment with
    that step's wall time, then the python block it ran."""
    lines = ["```bash"]
    for step in _quickstart_steps(results, "quickstart"):
        if step["title"]:
            title = f"# {step['title']} ({_duration(step['seconds'])})"
            lines += title.split("\n")
        lines += step["commands"]
    python = _quickstart_steps(results, "python")[0]["python"]
    return "\n".join(lines) + "\n```\n\n```python\n" + python + "```\n"


def _quickstart_run(results: Mapping[str, Any]) -> str:
    """examples/quickstart.py: what the Quickstart's run gave against the README's table (demo.json), the paired
    comparison evaluate wrote, and where and how it ran."""
    rows, demo, c = results["rows"], results["demo"], results["comparison"]["accuracy"]
    single, members = results["single"], results["members"]
    threads = results["threads"]["torch_threads"]
    verdict = c["verdict"] if not results["near_chance"]["rows"] else "marked: a row is near chance"
    quick = sum(s["seconds"] for s in results["steps"] if s["section"] in ("quickstart", "python"))
    return (
        f"Run as printed in a fresh folder (`{results['command']}`: these steps took {_duration(quick)} on "
        f"{_machine(results.get('machine'))}, {threads} torch thread{'s' * (threads != 1)}, load average "
        f"{results['load_average'][0]:g} when the run ended, so the times above are a shared machine's), the "
        f"Single reached **{rows['Single']['accuracy']:.4f}** test accuracy and the Hydra **"
        f"{rows['Hydra']['accuracy']:.4f}** (the table below: {demo['single_accuracy']:.4f} and "
        f"{demo['hydra_accuracy']:.4f}); `evaluate` found Hydra − Single accuracy {_signed(c['difference'])} "
        f"[{_signed(c['ci_low'])}, {_signed(c['ci_high'])}]: {verdict}. The Single's validation accuracy was "
        f"{single['best_eval_accuracy']:.4f} after {single['steps']} steps, the members' "
        + " / ".join(f"{m['best_eval_accuracy']:.4f}" for m in members)
        + ". A run that barely learns (a learning rate too small for its steps) says so in one warning, and "
        "`evaluate` and the model card mark a comparison with a baseline near chance instead of reporting a "
        "win.\n")


def _quickstart_calibrate(results: Mapping[str, Any]) -> str:
    """examples/quickstart.py: the README's calibrate command with its time and what it fitted."""
    step = _quickstart_steps(results, "calibrate")[0]
    cal = results["calibration"]
    return (f"**Calibrated decisions**: `{step['commands'][0]}` ({_duration(step['seconds'])}) writes a copy whose "
            "pipeline adds conformal prediction sets and abstention ([docs/hub.md](docs/hub.md)). It calibrates on "
            f"data no step above saw: the {cal['n']} training reviews after the first 6,000 (the recipes train on "
            "the first 6,000; pruning and early stopping read the validation split). Here the "
            f"{100 * (1 - cal['alpha']):g} % sets use q_hat = {cal['q_hat']:.4f}, and the model abstains when its "
            f"{cal['score']} uncertainty is above {cal['threshold']:.4f}: it answered "
            f"{100 * cal['answered_fraction']:.1f} % of the calibration reviews with "
            f"{100 * cal['calibration_selective_error']:.1f} % errors among them, certified at most "
            f"{100 * cal['risk']:g} % with confidence {100 * (1 - cal['delta']):g} %.\n")


def _quickstart_slim(results: Mapping[str, Any]) -> str:
    """examples/quickstart.py: the README's slim commands with their times and the compute they give."""
    prune, members = _quickstart_steps(results, "slim")
    slim = results["slim"]
    return (f"**Slim members** (beyond the paper; [docs/slim.md](docs/slim.md)): `{prune['commands'][0]}` "
            f"({_duration(prune['seconds'])}) keeps 6 heads per layer and each member's own top third of every MLP's "
            f"neurons (no `--mlp-spread`: spreading the members over the MLP loses the OOD detection, below); "
            f"`{members['commands'][0]}` ({_duration(members['seconds'])}) fine-tunes them four times as long as "
            f"the Quickstart's members, the recipe that keeps the gain. The fused model costs "
            f"{slim['compute_x']:.2f}x a Single's multiply-adds, against {slim['hydra_compute_x']:.2f}x for the "
            "Quickstart's `hydra-rt`.\n")


def _quickstart_export(results: Mapping[str, Any]) -> str:
    """examples/quickstart.py: the README's export command with its time."""
    step = _quickstart_steps(results, "export")[0]
    return (f"`{step['commands'][0]}` ({_duration(step['seconds'])} here) writes one ONNX graph returning `logits` "
            "and `member_logits` (dynamic batch and sequence axes), its int8 version (per-channel weights, the "
            "`smoothquant` recipe) and a report comparing int8 with fp32; run it with `hydra-hf evaluate`, "
            "`hydra_hf.onnx.pipeline(folder)` or plain `onnxruntime.InferenceSession`. optimum cannot export Hydra "
            "folders (it does not import with transformers 5): [docs/deploy.md](docs/deploy.md).\n")


def _uncertainty_scores(results: Mapping[str, Any]) -> str:
    """examples/quickstart.py: the Quickstart's Hydra and Single under every OOD score (the Guardian headlines'
    AUROC against the test reviews, and the wrong answers' AUROC against the right ones: error detection), then
    which score to use for which, read from those rows."""
    rows = results["scores"]
    lines = ["| model | score | OOD: Guardian vs reviews (AUROC) | errors vs right answers (AUROC) |",
             "|---|---|---:|---:|"]
    lines += [f"| {r['model']} | `{r['score']}` | {r['ood_auroc']:.4f} | {r['error_auroc']:.4f} |" for r in rows]
    hydra = {r["score"]: r for r in rows if r["model"] == "Hydra"}
    best = max(hydra.values(), key=lambda r: r["ood_auroc"])
    mi = hydra["mutual_information"]
    worse = "below chance: it points the wrong way" if mi["ood_auroc"] < 0.5 else "far below MSP"
    msp, energy = hydra["msp"], hydra["energy"]
    text = (
        "\nTo flag out-of-distribution text, use MSP (the pipeline's `score`: low = unsure; "
        f"{msp['ood_auroc']:.4f} here) or energy (`logits.logsumexp(-1)`, {energy['ood_auroc']:.4f}; the best "
        f"score here is `{best['score']}`); with two classes `predictive_entropy` ranks texts exactly as MSP "
        "does. Not `mutual_information`: the members disagree *less* on these headlines than on reviews, so "
        f"ranking by their disagreement gives AUROC {mi['ood_auroc']:.4f}, {worse} for this kind of shift "
        "(docs/study.md finds the same on four OOD kinds and three seeds). ")
    if mi["error_auroc"] >= 0.6:
        text += ("The members' disagreement measures something else: where the ensemble is likely wrong on "
                 f"in-distribution text (error AUROC {mi['error_auroc']:.4f}, against MSP's "
                 f"{msp['error_auroc']:.4f}); it is what `hydra-hf calibrate --score mi` abstains on. ")
    else:
        text += (f"Nor does it rank the ensemble's own mistakes on reviews (error AUROC {mi['error_auroc']:.4f}, "
                 f"against MSP's {msp['error_auroc']:.4f}): abstain on MSP too (`hydra-hf calibrate --score msp`, "
                 "the default). ")
    text += "The model card and the pipeline's docstring say the same.\n"
    return "\n".join(lines) + "\n" + text


VIEWS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "methods": _methods_table,
    "demo-run": _demo_run,
    "hydra-vs-single": _versus_single_table,
    "hydra-vs-deep-ensemble": _versus_deep_ensemble_table,
    "int8": _int8_summary,
    "transformers-common-tests": _common_tests_table,
    "generation-conformance": _generation_conformance_tables,
    "bench-slim": _bench_slim_table,
    "slim-pareto": _slim_pareto_table,
    "calibration": _calibration_tables,
    "ceiling": _ceiling_tables,
    "int8-recipes": _int8_recipes_table,
    "slim-text": _slim_text_table,
    "slim-text-summary": _slim_text_summary,
    "slim-text-readme": _slim_text_readme,
    "image-kinds": _image_kinds_table,
    "slim-bench-summary": _slim_bench_summary,
    "slim-image-summary": _slim_image_summary,
    "bench": _bench_table,
    "lora-rows": _lora_rows,
    "seed-comparisons": _seed_comparisons,
    "seed-rows": _seed_rows,
    "cost-from-masks": _cost_from_masks,
    "run-differences": _run_differences,
    "run-agreement": _run_agreement,
    "selection-noise": _selection_noise,
    "lm-study": _lm_study_table,
    "lm-study-comparisons": _lm_study_comparisons,
    "lm-study-scores": _lm_study_scores,
    "lm-study-training": _lm_study_training,
    "lm-study-summary": _lm_study_summary,
    "lm-study-data": _lm_study_data,
    "lm-study-readme": _lm_study_readme,
    "quickstart": _quickstart_block,
    "quickstart-run": _quickstart_run,
    "quickstart-calibrate": _quickstart_calibrate,
    "quickstart-slim": _quickstart_slim,
    "quickstart-export": _quickstart_export,
    "uncertainty-scores": _uncertainty_scores,
    "demo-time": _demo_time,
    "smollm2-zero-shot": _smollm2_zero_shot,
    "smollm2-zero-shot-readme": _smollm2_zero_shot_readme,
    "smollm2-classify": _smollm2_classify,
    "smollm2-classify-readme": _smollm2_classify_readme,
    "smollm2-classify-cost": _smollm2_classify_cost,
}
"""view name -> markdown of a results file (ending with a newline)."""


def render_region(file: str, view: str, root: Path = REPO) -> str:
    """The markdown that belongs between the markers naming ``file`` and ``view``."""
    if view not in VIEWS:
        raise ValueError(f"unknown view {view!r} in a results marker; use one of {sorted(VIEWS)}")
    path = root / file
    if not path.is_file():
        raise FileNotFoundError(f"{file} is missing: run the command named beside its table (it writes the file), "
                                "then `make docs`")
    try:
        return VIEWS[view](json.loads(path.read_text(encoding="utf-8")))
    except (KeyError, TypeError, json.JSONDecodeError) as error:  # a file of another kind, or edited by hand
        raise ValueError(f"{file} does not hold what view {view} reads ({type(error).__name__}: {error}); "
                         "write it again with the command named beside its table") from None


def render_document(text: str, root: Path = REPO) -> str:
    """``text`` with every region re-rendered from its results file."""
    if len(OPENING.findall(text)) != len(REGION.findall(text)):
        raise ValueError("a `<!-- results: FILE view=VIEW -->` marker has no matching `<!-- /results -->` "
                         "on a later line, or its syntax is wrong; fix the markers")
    return REGION.sub(lambda m: m["open"] + render_region(m["file"], m["view"], root) + m["close"], text)


def documents(root: Path = REPO) -> list[Path]:
    """The markdown files that may hold regions."""
    return sorted({path for pattern in DOCUMENTS for path in root.glob(pattern)})


def stale_regions(paths: Iterable[Path], root: Path = REPO) -> list[str]:
    """One line per region whose text differs from its results file (or whose file is missing)."""
    problems = []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        if len(OPENING.findall(text)) != len(REGION.findall(text)):
            problems.append(f"{path.relative_to(root)}: a results marker is unmatched or malformed; fix the markers")
        for match in REGION.finditer(text):
            name = f"{path.relative_to(root)} [{match['file']} view={match['view']}]"
            try:
                expected = render_region(match["file"], match["view"], root)
            except (OSError, ValueError) as error:
                problems.append(f"{name}: {error}")
                continue
            if match["body"] != expected:
                problems.append(f"{name}: differs from its results file; run `make docs`")
    return problems


def _blank(match: re.Match) -> str:
    return "\n" * match.group().count("\n")  # keeps the line numbers of what follows


def _measured(text: str, printed: frozenset[str] = frozenset()) -> list[tuple[int, str]]:
    """``(line, number)`` of the measured numbers of ``text`` (code blocks, inline code, versions and
    :data:`SETTINGS` are not read) that are not in ``printed``."""
    prose = re.sub(r"```.*?```", _blank, text, flags=re.DOTALL)
    prose = NOT_MEASURED.sub("", re.sub(r"`[^`]*`", _blank, prose))
    found = []
    for match in NUMBER.finditer(prose):
        measured = len(match["decimals"]) >= 2 or match["unit"] or match["sign"]
        if measured and match["value"] not in printed and match["value"] not in SETTINGS:
            found.append((prose.count("\n", 0, match.start()) + 1, match.group().strip()))
    return found


def typed_numbers(text: str) -> list[tuple[int, str]]:
    """``(line, number)`` for every measured number of ``text`` outside its rendered regions and typed
    sections that none of its rendered regions prints."""
    printed = frozenset(re.findall(r"\d+\.\d+", "".join(match["body"] for match in REGION.finditer(text))))
    return _measured(TYPED.sub(_blank, REGION.sub(_blank, text)), printed)


def typed_sections(text: str) -> list[tuple[int, str, int]]:
    """``(line, reason, measured numbers)`` of every section marked as typed."""
    return [(text.count("\n", 0, match.start()) + 1, match["why"].strip(), len(_measured(match["body"])))
            for match in TYPED.finditer(text)]


def typed_problems(paths: Iterable[Path], root: Path = REPO) -> list[str]:
    """One line per measured number typed outside a rendered region and outside a marked section, and per
    marked section without a reason."""
    problems = []
    for path in paths:
        text, name = path.read_text(encoding="utf-8"), path.relative_to(root)
        if len(TYPED_OPENING.findall(text)) != len(TYPED.findall(text)):
            problems.append(f"{name}: a `<!-- typed: WHY -->` marker has no `<!-- /typed -->` on a later line; "
                            "fix the markers")
        for line, reason, _ in typed_sections(text):
            if not reason:
                problems.append(f"{name}:{line}: a typed section without a reason; say why it has no results file "
                                "(`<!-- typed: WHY -->`)")
        for line, number in typed_numbers(text):
            problems.append(f"{name}:{line}: {number!r} is typed outside a rendered region; render it from a "
                            "results file, quote a number this document's tables print, or mark the section "
                            "`<!-- typed: WHY -->`")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 where a region differs from its file"
    )
    parser.add_argument("--typed", action="store_true", help="list the sections still typed by hand, and why")
    args = parser.parse_args(argv)
    paths = documents()
    if args.typed:
        total = 0
        for path in paths:
            for line, reason, count in typed_sections(path.read_text(encoding="utf-8")):
                print(f"{path.relative_to(REPO)}:{line}: {count} typed numbers: {reason}")
                total += count
        print(f"{total} typed numbers in marked sections; every other measured number is rendered or quotes one")
        return 0
    if args.check:
        problems = stale_regions(paths) + typed_problems(paths)
        for line in problems:
            print(line, file=sys.stderr)
        return 1 if problems else 0
    rendered = {path: render_document(path.read_text(encoding="utf-8")) for path in paths}  # all, before writing any
    for path, text in rendered.items():
        if text != path.read_text(encoding="utf-8"):
            write_text_atomic(path, text)
            print(f"rendered {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (OSError, ValueError) as error:
        sys.exit(f"render_docs: {error}")
