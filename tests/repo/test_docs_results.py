"""Result tables in README.md and docs/*.md are rendered from results files (tools/render_docs.py).

- every `<!-- results: FILE view=VIEW -->` region of the repository equals what its file renders to
  (`make docs-check`), so a number typed into a table, or a results file changed without `make docs`,
  fails here;
- the check sees an edited cell, a missing file, an unknown view and an unmatched marker, and
  rendering repairs an edited region, leaving the text around it as it was.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from conftest import REPO

from hydra_hf import evaluation as ev

spec = importlib.util.spec_from_file_location("render_docs", REPO / "tools" / "render_docs.py")
render_docs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(render_docs)


def _row(method: str, acc: float, score: str, latency: float, params: float) -> dict:
    ood = {name: {"auroc": 0.6 + i / 100 + acc / 1000, "fpr95": 0.9} for i, name in enumerate(("guardian", "debates"))}
    return {"method": method, "accuracy": acc, "nll": 0.41912, "ece": 0.03291, "brier": 0.3, **ood, "ood_score": score,
            "latency_ms": latency, "params_m": params, "members": 3}


def _interval(difference: float, low: float, high: float, verdict: str) -> dict:
    return {
        "difference": difference,
        "ci_low": low,
        "ci_high": high,
        "level": 0.95,
        "n_boot": 1000,
        "verdict": verdict,
    }


COMPARISON = {
    "accuracy": _interval(-0.00392, -0.01961, 0.01021, "tie"),
    "nll": _interval(-0.0015, -0.0144, 0.0109, "tie"),
    "ece": _interval(0.01161, -0.0079, 0.027, "tie"),
    "brier": _interval(0.0, -0.1, 0.1, "tie"),
    "debates.auroc": _interval(-0.0262, -0.0415, -0.011, "worse"),
    "guardian.auroc": _interval(0.05151, 0.0326, 0.0722, "better"),
}
RESULTS = {"command": "python examples/demo.py", "threads": {"torch_threads": 2},
           "report": {"rows": [_row("Hydra (taylor, M=3)", 0.80251, "msp", 1139.4, 24.84),
                               _row("Single", 0.80643, "energy", 423.6, 22.71)],
                      "comparisons": {"Hydra (taylor, M=3) − Single": COMPARISON}}}
TABLE = """\
| Method | Acc ↑ | NLL ↓ | ECE ↓ | guardian AUROC ↑ | debates AUROC ↑ | OOD score | latency (ms) | params (M) |
|:---|---:|---:|---:|---:|---:|---:|---:|---:|
| Hydra (taylor, M=3) | 0.8025 | 0.4191 | 0.0329 | 0.6008 | 0.6108 | msp | 1139 | 24.8 |
| Single | 0.8064 | 0.4191 | 0.0329 | 0.6008 | 0.6108 | energy | 424 | 22.7 |
"""
VERSUS = """\
| Hydra − Single | difference | interval | verdict |
|---|---:|:---:|---|
| accuracy | −0.0039 | [−0.0196, +0.0102] | tie |
| ECE | +0.0116 | [−0.0079, +0.0270] | tie |
| NLL | −0.0015 | [−0.0144, +0.0109] | tie |
| guardian AUROC | +0.0515 | [+0.0326, +0.0722] | **better** |
| debates AUROC | −0.0262 | [−0.0415, −0.0110] | **worse** |
"""
OPEN, CLOSE = "<!-- results: docs/results/run.json view=methods -->\n", "<!-- /results -->"


def _tree(tmp_path: Path, body: str) -> Path:
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "run.json").write_text(json.dumps(RESULTS))
    (tmp_path / "README.md").write_text(f"# Title\n\nBefore.\n\n{OPEN}{body}{CLOSE}\n\nAfter: 0.1234.\n")
    return tmp_path / "README.md"


def test_every_rendered_region_matches_its_results_file():
    paths = render_docs.documents()
    assert REPO / "README.md" in paths
    assert any(render_docs.REGION.search(p.read_text(encoding="utf-8")) for p in paths)  # the check checks something
    assert render_docs.stale_regions(paths) == []
    assert render_docs.typed_problems(paths) == []  # every measured number of the prose is rendered, quoted or marked


def test_methods_view_renders_the_readme_layout(tmp_path):
    readme = _tree(tmp_path, TABLE)
    assert render_docs.render_region("docs/results/run.json", "methods", tmp_path) == TABLE
    assert render_docs.render_region("docs/results/run.json", "hydra-vs-single", tmp_path) == VERSUS
    assert render_docs.stale_regions([readme], tmp_path) == []


def test_an_edited_cell_fails_the_check_and_rendering_repairs_it(tmp_path):
    readme = _tree(tmp_path, TABLE.replace("0.8064", "0.8065"))
    problems = render_docs.stale_regions([readme], tmp_path)
    assert len(problems) == 1 and "differs from its results file" in problems[0] and "README.md" in problems[0]
    fixed = render_docs.render_document(readme.read_text(), tmp_path)
    assert fixed == f"# Title\n\nBefore.\n\n{OPEN}{TABLE}{CLOSE}\n\nAfter: 0.1234.\n"  # text around it kept
    readme.write_text(fixed)
    assert render_docs.stale_regions([readme], tmp_path) == []


class _Fixed(ev.Predictor):
    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = logits  # (N, M, C)

    def member_logits(self, batch):
        return self.logits[batch["index"]]


def test_the_views_read_the_report_the_evaluation_writes(tmp_path):
    """The demo's results file holds the evaluation's report.json as it is: render it with both views."""
    g = torch.Generator().manual_seed(0)
    hydra, single = torch.randn(60, 3, 2, generator=g) * 2, torch.randn(60, 1, 2, generator=g) * 2
    id_batches = [{"index": torch.arange(0, 20), "labels": torch.randint(0, 2, (20,), generator=g)}]
    oods = {"zeta": [{"index": torch.arange(20, 40)}], "alpha": [{"index": torch.arange(40, 60)}]}  # not sorted
    predictors = {"Hydra (taylor, M=3)": _Fixed(hydra), "Single": _Fixed(single)}
    result = ev.evaluate_predictors(predictors, id_batches, oods, latency_batch={"index": torch.arange(0, 20)})
    comparisons = {
        "Hydra (taylor, M=3) − Single": ev.compare_predictions(result, "Hydra (taylor, M=3)", "Single", n_boot=50)
    }
    ev.write_evaluation_report(result, tmp_path, comparisons=comparisons)
    results = {"report": json.loads((tmp_path / "report.json").read_text())}

    lines = render_docs.VIEWS["methods"](results).splitlines()
    assert lines[0].split(" | ")[4:6] == ["zeta AUROC ↑", "alpha AUROC ↑"]  # the order the OOD sets were scored in
    rows = {r["method"]: r for r in result.rows}
    cells = lines[2].strip("| ").split(" | ")
    assert cells[:2] == ["Hydra (taylor, M=3)", f"{rows['Hydra (taylor, M=3)']['accuracy']:.4f}"]
    assert cells[4] == f"{rows['Hydra (taylor, M=3)']['zeta']['auroc']:.4f}" and cells[6] == "msp"
    assert "–" not in lines[2] + lines[3]  # every column found in the rows

    versus = render_docs.VIEWS["hydra-vs-single"](results).splitlines()
    assert [line.split(" | ")[0] for line in versus[2:]] == [
        "| accuracy",
        "| ECE",
        "| NLL",
        "| zeta AUROC",
        "| alpha AUROC",
    ]
    accuracy = comparisons["Hydra (taylor, M=3) − Single"]["accuracy"]["difference"]
    assert versus[2].split(" | ")[1] == f"{accuracy:+.4f}".replace("-", "−")


def test_common_tests_view_marks_expected_and_unexpected_failures():
    results = {"command": "python tools/transformers_common_tests.py", "transformers": "5.24.0",
               "layouts": {"unequal": {"passed": 103, "failed": 1, "skipped": 60},
                           "uniform": {"passed": 102, "failed": 2, "skipped": 60},
                           "single": {"passed": 104, "failed": 0, "skipped": 60}},
               "failures": [{"layout": "unequal", "test": "test_attention_outputs", "expected": True},
                            {"layout": "uniform", "test": "test_a", "expected": True},
                            {"layout": "uniform", "test": "test_b", "expected": False}]}
    assert render_docs.VIEWS["transformers-common-tests"](results).splitlines()[2:] == [
        "| layout | passed | failed | skipped |", "|---|---|---|---|", "| unequal | 103 | 1 (expected) | 60 |",
        "| uniform | 102 | 2 (1 unexpected) | 60 |", "| single | 104 | 0 | 60 |",
    ]


def test_generation_conformance_view_counts_each_kind_of_failure():
    results = {"command": "python tools/conformance/run_generation.py", "transformers": "5.24.0",
               "counts": {"llama": {"control": {"passed": 9, "failed": 0, "skipped": 1},
                                    "unequal": {"passed": 7, "failed": 2, "skipped": 1}}},
               "failures": [{"family": "llama", "layout": "unequal", "test": "test_a", "kind": "head-axis",
                             "reason": "K_l != H"},
                            {"family": "llama", "layout": "unequal", "test": "test_b", "kind": "real",
                             "reason": "a defect to fix"}]}
    lines = render_docs.VIEWS["generation-conformance"](results).splitlines()
    assert lines[2:6] == ["| family | layout | passed | failed | skipped |", "|---|---|---|---|---|",
                          "| llama | control | 9 | 0 | 1 |", "| llama | unequal | 7 | 2 (1 head-axis, 1 real) | 1 |"]
    assert lines[-2:] == ["| `test_a` | llama unequal | head-axis: K_l != H |",
                          "| `test_b` | llama unequal | real: a defect to fix |"]


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda t, root: (root / "docs" / "results" / "run.json").unlink(), "run.json is missing"),
        (lambda t, root: t.write_text(t.read_text().replace("view=methods", "view=nope")), "unknown view 'nope'"),
        (lambda t, root: t.write_text(t.read_text().replace(CLOSE, "")), "unmatched or malformed"),
        (
            lambda t, root: (root / "docs" / "results" / "run.json").write_text('{"rows": []}'),
            "does not hold what view",
        ),
    ],
)
def test_the_check_names_a_broken_region(tmp_path, damage, message):
    readme = _tree(tmp_path, TABLE)
    damage(readme, tmp_path)
    problems = render_docs.stale_regions([readme], tmp_path)
    assert problems and message in problems[0] and all("\n" not in p for p in problems)


def test_slim_views_render_their_results_files():
    """The two slim-members views (bench/bench_slim.py's rows, examples/slim_pareto.py's Pareto) put every number
    of the file into the table, formatted, and the targets / decisions below it."""
    bench = {
        "threads": {"torch_threads": 2, "interop_threads": 1},
        "seq_len": 128,
        "targets": ["bert batch 8: x = 1.05 (target <= 1.3: met)"],
        "rows": [
            {
                "geometry": "bert",
                "batch": 8,
                "model": "eager slim Hydra (3)",
                "latency_ms": 512.345,
                "x Single": 1.047,
                "x Deep Ensemble": 0.351,
                "compute_x": 1.0,
                "params_M": 113.2,
            }
        ],
    }
    text = render_docs.VIEWS["bench-slim"](bench)
    assert "| bert | 8 | eager slim Hydra (3) | 512.3 | 1.05 | 0.35 | 1.00 | 113.2 |" in text
    assert text.startswith("2 threads, T = 128") and "- bert batch 8: x = 1.05 (target <= 1.3: met)" in text
    pareto = {"seeds": ["0", "1", "2"], "must": ["slim: met"],
              "rows": [{"label": "slim Hydra", "compute_x": 1.21, "params_x": 1.05, "gain": 3.14, "gain_std": 1.2,
                        "accuracy": 95.5, "accuracy_std": 0.4, "ece": 0.021, "nll": 0.15}],
              "decisions": [{"a": "slim", "b": "taylor", "difference": -0.52, "difference_std": 0.9, "seeds": 3,
                             "p": 0.41, "decided": False}]}
    text = render_docs.VIEWS["slim-pareto"](pareto)
    assert "| slim Hydra | 1.21 | 1.05 | +3.1 ± 1.2 | 95.5 ± 0.4 | 0.021 | 0.150 |" in text
    assert "| slim - taylor | -0.52 ± 0.90 | 3 | 0.410 | no |" in text and "- slim: met" in text


def test_slim_summary_views_write_the_files_numbers_into_one_sentence():
    """The README's slim sentences: compute and eager time per batch size from the bench file; the slim and Taylor
    gains, their paired decision and Packed-Ensembles' from the Pareto file, with the command that wrote it."""
    rows = [{"geometry": g, "batch": b, "model": m, "x Single": x + b / 1000, "compute_x": c}
            for g in ("bert", "vit") for b in (8, 32)
            for m, x, c in (("eager slim Hydra (3)", 1.1, 1.0), ("eager Hydra (3)", 2.7, 2.47))]  # fmt: skip
    text = render_docs.VIEWS["slim-bench-summary"]({"seq_len": 128, "rows": rows})
    assert "cost 1.00x a Single's multiply-adds (the paper's members: 2.47x) and 1.11x / 1.13x its eager CPU" in text
    assert "(the paper's Hydra: 2.71x / 2.73x; sequence length 128" in text and "--batch-sizes 8 32" in text
    row = {"gain_std": 1.0, "compute_x": 1.0}
    pareto = {"seeds": ["0", "1", "2", "3", "4"], "command": "python examples/slim_pareto.py --ceiling X",
              "rows": [{**row, "model": "slim per_member", "gain": 7.46, "compute_x": 1.28},
                       {**row, "model": "taylor per_member", "gain": 7.52, "compute_x": 2.13},
                       {**row, "model": "Packed-Ensembles", "gain": 8.41, "compute_x": 1.1}],
              "decisions": [{"a": "slim per_member", "b": "taylor per_member", "p": 0.961, "decided": False}]}
    hydra = {"label": "Hydra", "seeds": 5, "compute_x": 2.13, "gain": 7.46, "gain_std": 1.31,
             "gain_per_kind": {"digits": 5.04, "noise": -0.26}, "accuracy": 95.88, "ece": 0.0213}
    table = render_docs.VIEWS["image-kinds"]({"kinds": ["digits", "noise"], "rows": [hydra]})
    assert table.splitlines()[2] == "| Hydra | 5 | 2.13 | +5.0 | -0.3 | +7.5 ± 1.3 | 95.9 | 0.021 |"
    text = render_docs.VIEWS["slim-image-summary"](pareto)
    assert text == ("On the image testbed (5 seeds) they gain +7.5 ± 1.0 points of mean MSP AUROC over the mean "
                    "Single at 1.28x its compute, against Hydra (Taylor)'s +7.5 ± 1.0 at 2.13x (paired over seeds "
                    "p = 0.96: not decided), beside Packed-Ensembles' +8.4 at 1.10x "
                    "(`python examples/slim_pareto.py --ceiling X`).\n")


def test_calibration_view_puts_one_value_per_seed_in_every_cell():
    """examples/calibration_study.py's file: the sets' and the abstention's cells list the seeds' values in seed
    order ('–' where no threshold was certified), the re-splits' table and the Must's lines follow."""
    def sets(seed, coverage):
        return {"model": "Hydra", "seed": seed, "method": "LAC", "coverage": coverage, "set_size": 1.214,
                "n_calibration": 4208, "n_scored": 1276, "ood_set_gt1": {"guardian": 0.471}}

    def abstain(seed, error):
        return {"model": "Hydra", "seed": seed, "risk": 0.05, "answered": None if error is None else 0.074,
                "selective_error": error, "aurc": 0.0783, "ood_refused": {"guardian": None if error is None else 1.0}}

    results = {
        "seeds": [1, 0],
        "ood_kinds": ["guardian"],
        "n_test": 1276,
        "alpha": 0.1,
        "delta": 0.1,
        "risks": [0.05],
        "sets": [sets(0, 0.9012), sets(1, 0.928)],
        "abstention": [abstain(0, 0.021), abstain(1, None)],
        "splits": [
            {"model": "Hydra", "method": "LAC", "splits": 200, "mean": 0.90171, "std": 0.0164, "in_band": 0.77}
        ],
        "must": ["LAC: missed"],
    }
    text = render_docs.VIEWS["calibration"](results)
    assert "| Hydra | LAC | 0.928 / 0.901 | 1.21 / 1.21 | 47 / 47 |" in text
    assert "| Hydra | 0.05 | – / 7.4 | – / 2.1 | 0.078 / 0.078 | – / 100 |" in text
    assert "| Hydra | LAC | 0.9017 ± 0.0164 | 77 |" in text and text.endswith("- LAC: missed\n")
    assert text.startswith("Seeds 1, 0 (each cell: one value per seed); fitted on 4208 held-out training reviews, "
                           "scored on the 1276 test reviews")


def test_bench_view_renders_every_row_and_line_of_a_results_file():
    results = {
        "command": "python bench/bench_bert.py --json docs/results/bench/bert.json",
        "torch": "2.13.0+cpu",
        "cpu_count": 2,
        "load_average": [1.12, 0.9, 0.5],
        "threads": {"torch_threads": 2},
        "columns": ["batch", "model", "latency_ms", "x Single"],
        "rows": [{"batch": 1, "model": "Single", "latency_ms": 101.4, "x Single": 1.0},
                 {"batch": 1, "model": "Hydra fused (3)", "latency_ms": 245.6, "x Single": 2.4219}],
        "summary": ["batch 1: Hydra/Single = 2.42"],
    }
    text = render_docs.VIEWS["bench"](results)
    assert text.splitlines()[:4] == ["| batch | model | latency_ms | x Single |", "|---|---|---|---|",
                                     "| 1 | Single | 101 | 1 |", "| 1 | Hydra fused (3) | 246 | 2.42 |"]
    assert "- batch 1: Hydra/Single = 2.42" in text
    assert text.endswith("`python bench/bench_bert.py --json docs/results/bench/bert.json` (torch 2.13.0+cpu; torch "
                         "threads: 2, cores: 2; load average when it ended: 1.12)\n")


def test_slim_text_summary_names_each_recipe_its_range_and_the_bar():
    def row(model, compute, accuracy, ece):
        return {"model": model, "label": model, "compute_x": compute, "accuracy": accuracy, "ece": ece}

    def decision(a, kind, difference, decided, within):
        return {"a": a, "b": "taylor-k6", "kind": kind, "difference": difference, "decided": decided,
                "within_bar": within}

    results = {
        "bar_points": 1.0,
        "rows": [row("Single", 1.0, 81.33, 0.0306), row("taylor-k6", 2.4796, 82.25, 0.023),
                 row("slim-a", 0.9936, 78.5, 0.0607), row("slim-b", 1.5, 82.0, 0.025)],
        "decisions": [decision("slim-a", "guardian", -3.5, True, False),
                      decision("slim-a", "debates", -8.23, True, False),
                      decision("slim-b", "guardian", -0.4, False, True),
                      decision("slim-b", "debates", 0.6, False, True)],
    }
    text = render_docs.VIEWS["slim-text-summary"](results)
    assert text.splitlines()[0] == (
        "- **slim-a** (0.99x a Single's compute; taylor-k6: 2.48x): -8.2 to -3.5 points per OOD kind against "
        "taylor-k6, decided by the seeds on 2 of 2 kinds, within 1 point on 0; accuracy 78.5 % (Single 81.3 %), "
        "ECE 0.061 (Single 0.031).")
    assert "-0.4 to +0.6 points" in text and text.endswith("Within 1 point of the reference on every kind: slim-b.\n")
    results["decisions"][-1]["within_bar"] = False
    assert render_docs.VIEWS["slim-text-summary"](results).endswith("every kind: none of these budgets.\n")


def test_demo_run_and_int8_views_state_the_run_and_the_int8_row_against_fp32_hydra():
    def row(method, latency, accuracy, ece, aurocs):
        return {"method": method, "latency_ms": latency, "accuracy": accuracy, "ece": ece,
                **{k: {"auroc": a} for k, a in zip(("guardian", "hamlet"), aurocs, strict=True)}}

    results = {
        "command": "python examples/demo.py --output outputs/demo --results docs/results/demo.json",
        "torch": "2.13.0+cpu", "threads": {"torch_threads": 2}, "cpu_count": 2, "load_average": [1.5, 1.2, 1.0],
        "mixed_precision": "bf16", "wall_s": 882.0,
        "timings_s": {"1. fine-tune the single model": 96.4, "4. evaluate": 367.2},
        "hub_check": {"texts": 8, "max_abs_prob_diff": 3.7e-9, "labels": "identical"},
        "report": {"rows": [row("Hydra (taylor, M=3)", 1000.0, 0.8025, 0.0329, (0.7297, 0.7077)),
                            row("Hydra int8 (ONNX Runtime, M=3)", 440.0, 0.8002, 0.0314, (0.7234, 0.7080))]},
    }
    assert render_docs.VIEWS["demo-run"](results) == (
        "`python examples/demo.py --output outputs/demo --results docs/results/demo.json` ran in "
        "**14.7 min** (on a CPU its file does not record; torch 2.13.0+cpu; torch threads: 2, cores: 2; load "
        "average when it ended: 1.5; training precision: bf16): fine-tune the single model 96 s, evaluate 367 s. "
        "The fresh-process check's largest probability difference: 3.7e-09.\n")
    results["machine"] = {"cpu": "AMD EPYC", "cpuid": "AuthenticAMD family 25 model 17", "isa": "AVX512",
                          "bf16_products": "avx512_bf16"}
    assert ("(on AMD EPYC (AVX512, AuthenticAMD family 25 model 17; native bf16 products: avx512_bf16); torch "
            in render_docs.VIEWS["demo-run"](results))
    assert render_docs.VIEWS["int8"](results) == (
        "The int8 graph (ONNX Runtime) against fp32 Hydra: accuracy −0.2 points, ECE −0.0015, every AUROC within "
        "0.0063 (targets: 0.5 points and 0.01: met), at 0.44x its latency.\n")
    results["report"]["rows"][1]["guardian"]["auroc"] = 0.7100  # 0.0197 below fp32: over the 0.01 target
    assert "every AUROC within 0.0197 (targets: 0.5 points and 0.01: MISSED)" in render_docs.VIEWS["int8"](results)
    results["report"]["rows"].pop()  # no int8 row: the check names the file and the view in one line
    with pytest.raises(KeyError, match="no int8 row"):
        render_docs.VIEWS["int8"](results)


def test_the_check_finds_a_measured_number_typed_outside_a_rendered_region(tmp_path):
    """Prose may quote a number its document's tables print; any other measured number (two decimals, a unit,
    a sign) must be rendered or sit in a section marked as typed, with its reason."""
    readme = _tree(tmp_path, TABLE)
    text = readme.read_text()
    assert render_docs.typed_numbers(text) == [(12, "0.1234")]  # "After: 0.1234." under the region
    quoted = text.replace("After: 0.1234.", "After: Hydra's accuracy 0.8025 and latency 1139 ms.")
    assert render_docs.typed_numbers(quoted) == []  # the table prints both
    prose = ("Gain +7.5 points at 1.28x, 95.8 %, 12.8 min, -0.2, p = 0.419.\n"
             "Settings and versions: margin 0.01, risk 0.05, transformers 5.24, torch 2.13.0, 1.2e-7, lr 0.9.\n"
             "Code: `--mlp-keep 0.33` and\n```bash\npython x.py --alpha 0.65\n```\n")
    assert [n for _, n in render_docs.typed_numbers(prose)] == [
        "+7.5 points", "1.28x", "95.8 %", "12.8 min", "-0.2", "0.419"]
    marked = f"<!-- typed: one run, no results file -->\n{prose}<!-- /typed -->\nAfter.\n"
    assert render_docs.typed_numbers(marked) == []
    assert render_docs.typed_sections(marked) == [(1, "one run, no results file", 6)]

    readme.write_text(text.replace("After: 0.1234.", "<!-- typed: -->\nAfter: 0.1234.\n<!-- /typed -->"))
    problems = render_docs.typed_problems([readme], tmp_path)
    assert problems == ["README.md:12: a typed section without a reason; say why it has no results file "
                        "(`<!-- typed: WHY -->`)"]
    readme.write_text(text.replace("After: 0.1234.", "<!-- typed: one run -->\nAfter: 0.1234."))
    assert "has no `<!-- /typed -->`" in render_docs.typed_problems([readme], tmp_path)[0]
    readme.write_text(text)
    assert render_docs.typed_problems([readme], tmp_path) == [
        "README.md:12: '0.1234' is typed outside a rendered region; render it from a results file, quote a "
        "number this document's tables print, or mark the section `<!-- typed: WHY -->`"]


def test_slim_text_readme_sentence_says_whether_any_slim_budget_gains_over_the_single():
    def row(model, compute, gains, steps):
        return {"model": model, "compute_x": compute, "member_steps": steps,
                "gain_per_kind": {k: [g, 1.0] for k, g in gains.items()}}

    def decision(model, kind, difference, decided):
        return {"a": model, "b": "taylor-k6", "kind": kind, "difference": difference, "decided": decided,
                "within_bar": difference >= -1.0}

    results = {
        "command": "python examples/slim_text.py --hydra taylor-k6 slim-a slim-b --reference taylor-k6",
        "seeds": ["0", "1", "2"], "kinds": ["guardian", "debates"], "bar_points": 1.0,
        "rows": [row("taylor-k6", 2.4796, {"guardian": -1.6, "debates": 0.3}, 120),
                 row("slim-a", 0.9936, {"guardian": -5.1, "debates": -7.9}, 120),
                 row("slim-b", 1.5, {"guardian": -2.4, "debates": -0.5}, 480)],
        "decisions": [decision("slim-a", "guardian", -3.5, True), decision("slim-a", "debates", -8.23, False),
                      decision("slim-b", "guardian", -0.8, False), decision("slim-b", "debates", -1.3, True)],
    }
    text = render_docs.VIEWS["slim-text-readme"](results)
    assert text == ("On the pretrained MiniLM text testbed (3 seeds), against today's Hydra (taylor-k6, 2.48x a "
                    "Single's compute, members fine-tuned 120 steps): with the same member fine-tuning, the slim "
                    "budgets measured (1, up to 0.99x) are -8.2 to -3.5 points of MSP AUROC per OOD kind (decided by "
                    "the seeds in 1 of 2 comparisons); the closest, slim-b (1.50x, members fine-tuned 480 steps), is "
                    "-1.3 to -0.8 points per kind, within 1 point on 1 of 2 kinds (differences decided by the seeds "
                    "on 1), and every slim recipe stays below the mean Single on every kind "
                    "(`python examples/slim_text.py --hydra taylor-k6 slim-a slim-b --reference taylor-k6`).\n")
    results["rows"][2]["gain_per_kind"]["debates"][0] = 0.2
    assert "stays below" not in render_docs.VIEWS["slim-text-readme"](results)


def test_int8_recipes_view_puts_each_recipes_worst_kind_and_alpha_in_one_row():
    def recipe(changed, accuracy, msp, mi, products, alpha=None, tried=None):
        return {"labels_changed": changed, "accuracy": accuracy, "ece": 0.002, "nll": 0.0, "fp32_accuracy": 0.805,
                "ood_auroc": {"guardian": {"msp": msp, "mutual_information": 0.01},
                              "debates": {"msp": 0.001, "mutual_information": mi}},
                "matmul_integer": products, "alpha": alpha, "alphas_tried": tried,
                "num_examples": {"calibration": 400, "guardian": 300, "debates": 200}}

    results = {"model": "outputs/demo/hydra", "id_data": "rt:validation", "ood_data": {"guardian": "g:ood",
                                                                                      "debates": "d:ood"},
               "command": "python examples/int8_recipes.py", "threads": {"torch_threads": 1},
               "recipes": {"smoothquant": recipe(0.004, 0.004, -0.002, -0.009, 46, 0.8,
                                                 {"0.5": {"member_logit_mse": 0.0316},
                                                  "0.8": {"member_logit_mse": 0.01}}),
                           "all": recipe(0.038, -0.0078, 0.005, 0.018, 15)}}
    lines = render_docs.VIEWS["int8-recipes"](results).splitlines()
    assert lines[0].startswith("`outputs/demo/hydra`, int8 minus fp32 on 400 texts of `rt:validation` and the OOD "
                               "validation splits (guardian 300, debates 200 texts;")
    assert lines[4] == "| smoothquant (α = 0.8 chosen) | 0.4 % | +0.004 | +0.002 | −0.002 | −0.009 | 46 |"
    assert lines[5] == "| all | 3.8 % | −0.008 | +0.002 | +0.001 | +0.010 | 15 |"  # the worst kind of each score
    assert lines[7] == ("smoothquant: mean squared member-logit error against fp32 per alpha tried: 0.5 0.0316, "
                        "0.8 0.0100.")
    assert lines[8].startswith("fp32 accuracy on these texts: 80.5 %.")


def test_lora_and_cost_views_render_only_their_rows():
    rows = [_row("Hydra (taylor, M=3)", 0.80251, "msp", 1139.4, 24.84), _row("LoRA-Single", 0.79, "msp", 420.2, 22.71),
            _row("LoRA-Ensemble (M=3)", 0.8072, "msp", 1307.0, 68.1)]
    results = {"command": "python examples/demo.py --lora", "mixed_precision": "bf16",
               "timings_s": {"1. fine-tune the single model": 60.0, "1c. LoRA baselines": 374.4},
               "report": {"rows": rows, "settings": {"seed": 0, "ensemble_heads": 3, "lora_rank": 8,
                                                     "lora_learning_rate": 0.002, "single_steps": 180}}}
    text = render_docs.VIEWS["lora-rows"](results)
    assert text.startswith("`python examples/demo.py --lora` (seed 0, training precision bf16): the LoRA stage took "
                           "374 s for 3 adapters of rank 8 (learning rate 0.002, 180 steps).\n\n| Method |")
    assert "| LoRA-Single | 0.7900 |" in text and "| LoRA-Ensemble (M=3) | 0.8072 |" in text
    assert "Hydra" not in text
    results["timings_s"].pop("1c. LoRA baselines")
    with pytest.raises(KeyError, match="no LoRA rows"):
        render_docs.VIEWS["lora-rows"](results)

    def bench(geometry, batch, model, compute, params):
        return {"geometry": geometry, "batch": batch, "model": model, "compute_x": compute, "params_M": params}

    cost = {"rows": [bench("bert", 8, "eager Single", 1.0, 100.0),
                     bench("bert", 8, "eager slim Hydra (3)", 1.0, 101.2),
                     bench("bert", 32, "eager Single", 1.0, 100.0), bench("bert", 32, "eager Hydra (3)", 2.47, 114.0),
                     bench("vit", 8, "eager Single", 1.0, 80.0), bench("vit", 8, "eager Hydra (3)", 2.473, 94.4)]}
    assert render_docs.VIEWS["cost-from-masks"](cost) == (
        "| geometry | model | multiply-adds (x Single) | parameters (x Single) |\n|---|---|---:|---:|\n"
        "| bert | slim Hydra (3) | 1.00x | 1.01x |\n| vit | Hydra (3) | 2.47x | 1.18x |\n")
