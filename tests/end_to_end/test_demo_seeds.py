"""examples/demo_seeds.py: the seeds of the main job aggregated into one results file (mean ± std of each paired
difference, each seed's difference, the seeds' bootstrap verdicts, a paired t-test over the seeds), and the
view docs/results.md renders from it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _hostile import assert_one_line_error
from scipy import stats

from hydra_hf.errors import HydraInputError
from hydra_hf.metrics import paired_t_over_seeds

REPO = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


demo_seeds = _load("demo_seeds", REPO / "examples" / "demo_seeds.py")
render_docs = _load("render_docs_for_seeds", REPO / "tools" / "render_docs.py")

HYDRA, SINGLE, DEEP = "Hydra (taylor, M=3)", "Single", "Deep Ensemble (M=3)"
METRICS = ("accuracy", "ece", "nll", "guardian.auroc", "hamlet.auroc")


def _results(seed: int, shift: float, verdicts: dict[str, str] | None = None) -> dict:
    """A demo results file: three rows and the two paired comparisons, every difference ``shift`` apart from
    seed to seed."""
    def row(method, accuracy):
        return {"method": method, "accuracy": accuracy, "ece": 0.03, "nll": 0.42, "params_m": 22.7,
                "guardian": {"auroc": 0.70 + shift}, "hamlet": {"auroc": 0.65}}

    def comparison(base):
        return {m: {"difference": base + shift, "ci_low": base + shift - 0.01, "ci_high": base + shift + 0.01,
                    "level": 0.95, "n_boot": 1000, "verdict": (verdicts or {}).get(m, "tie")} for m in METRICS}

    report = {"rows": [row(HYDRA, 0.80 + shift), row(SINGLE, 0.81), row(DEEP, 0.81)],
              "settings": {"seed": seed, "members": 3},
              "comparisons": {f"{HYDRA} − {SINGLE}": comparison(0.02), f"{HYDRA} − {DEEP}": comparison(-0.01)}}
    return {"command": f"python examples/demo.py --seed {seed}", "report": report}


def _write(tmp_path: Path, results: list[dict]) -> list[str]:
    paths = []
    for i, data in enumerate(results):
        path = tmp_path / f"seed{i}.json"
        path.write_text(json.dumps(data))
        paths.append(str(path))
    return paths


def test_aggregate_holds_each_seeds_difference_its_spread_and_the_t_test(tmp_path):
    runs = [_results(0, 0.0, {"hamlet.auroc": "better"}), _results(1, 0.004), _results(2, -0.002)]
    out = tmp_path / "seeds.json"
    assert demo_seeds.main([*_write(tmp_path, runs), "--results", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["seeds"] == [0, 1, 2]
    row = data["comparisons"][f"{HYDRA} − {SINGLE}"]["guardian.auroc"]
    assert row["differences"] == pytest.approx([0.02, 0.024, 0.018])
    assert row["mean"] == pytest.approx(0.020666, abs=1e-5)
    assert row["std"] == pytest.approx(stats.tstd([0.02, 0.024, 0.018]))
    assert row["t_test_p"] == pytest.approx(stats.ttest_1samp([0.02, 0.024, 0.018], 0.0).pvalue)
    assert row["decided"] is True  # 0.02 ± 0.003 over 3 seeds: p = 0.007
    assert (row["better"], row["tie"], row["worse"]) == (0, 3, 0)
    hamlet = data["comparisons"][f"{HYDRA} − {SINGLE}"]["hamlet.auroc"]
    assert (hamlet["better"], hamlet["tie"]) == (1, 2)
    # the rows' mean ± std over the seeds
    assert data["aggregate"]["rows"][0]["accuracy"] == pytest.approx(0.80066, abs=1e-5)
    assert data["command"].startswith("python examples/demo_seeds.py ")


def test_a_difference_that_changes_sign_is_not_decided():
    assert paired_t_over_seeds([0.02, -0.018, 0.001]) == {"p": pytest.approx(
        stats.ttest_1samp([0.02, -0.018, 0.001], 0.0).pvalue), "decided": False}
    assert paired_t_over_seeds([0.01, 0.01, 0.01])["decided"] is True  # the same difference on every seed
    assert paired_t_over_seeds([0.0, 0.0])["decided"] is False


def test_the_view_renders_one_block_of_rows_per_comparison(tmp_path):
    runs = [_results(0, 0.0, {"hamlet.auroc": "better"}), _results(1, 0.004), _results(2, -0.002)]
    data = demo_seeds.aggregate_runs([demo_seeds.read_run(Path(p)) for p in _write(tmp_path, runs)])
    data["command"] = "python examples/demo_seeds.py a b c"
    text = render_docs.VIEWS["seed-comparisons"](data)
    lines = text.splitlines()
    assert lines[0] == "| | accuracy | ECE | NLL | guardian AUROC | hamlet AUROC |"
    assert lines[2].startswith("| Hydra − Single | +0.0207 ± 0.0031 | ")
    assert lines[3] == ("| seeds 0 / 1 / 2 | " + " | ".join(["+0.020 / +0.024 / +0.018"] * 5) + " |")
    assert lines[4].endswith("| 0 / 3 / 0 | 1 / 2 / 0 |")
    assert "**0.007** |" in lines[5]
    assert lines[6].startswith("| Hydra − Deep Ensemble | −0.0093 ± 0.0031 | ")
    p = stats.ttest_1samp([-0.010, -0.006, -0.012], 0.0).pvalue
    assert lines[9].startswith(f"| p (paired t over seeds) | **{p:.3f}** |")
    assert "(`python examples/demo_seeds.py a b c`; p in bold: the seeds decide the sign at the 5 % level.)" in text


@pytest.mark.parametrize("case, message", [
    ("one", "at least 2 seeds"),
    ("same-seed", "seeds [0, 0]"),
    ("other-methods", "different methods"),
    ("twice", "is given twice"),
    ("not-a-run", "holds no 'report'"),
])
def test_bad_inputs_are_one_line(tmp_path, case, message):
    runs = [_results(0, 0.0), _results(1, 0.004)]
    if case == "same-seed":
        runs[1]["report"]["settings"]["seed"] = 0
    if case == "other-methods":
        runs[1]["report"]["rows"][2]["method"] = "MC Dropout"
    if case == "not-a-run":
        runs[1] = {"rows": []}
    paths = _write(tmp_path, runs)
    if case == "one":
        paths = paths[:1]
    if case == "twice":
        paths = [paths[0], paths[0]]
    with pytest.raises(HydraInputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        demo_seeds.main(paths)


def test_the_script_reports_a_missing_file_in_one_line(tmp_path):
    out = tmp_path / "seeds.json"
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "demo_seeds.py"), str(tmp_path / "none.json"),
                           str(tmp_path / "other.json"), "--results", str(out)],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, env=dict(os.environ))
    assert proc.returncode != 0
    assert "does not exist" in assert_one_line_error(proc.stderr)
    assert not out.exists()


compare_demo_runs = _load("compare_demo_runs", REPO / "examples" / "compare_demo_runs.py")


def test_two_runs_of_one_seed_compare_row_by_row_and_render_one_sentence(tmp_path):
    a, b = _results(0, 0.0), _results(0, 0.003)
    a.update(mixed_precision="bf16", timings_s={"1. fine-tune the single model": 60.0, "4. evaluate": 300.0,
                                                "3. fine-tune and fuse the members": 100.0})
    b.update(mixed_precision="no", timings_s={"1. fine-tune the single model": 100.0, "4. evaluate": 290.0,
                                              "3. fine-tune and fuse the members": 150.0})
    b["report"]["rows"][1]["ece"] = 0.0312
    out = tmp_path / "precision.json"
    assert compare_demo_runs.main([*_write(tmp_path, [a, b]), "--results", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["max_abs_accuracy"] == pytest.approx(0.003)
    assert data["max_abs_ece"] == pytest.approx(0.0012)
    assert data["max_abs_auroc"] == pytest.approx(0.003)
    assert data["training_ratio"] == pytest.approx(250 / 160)  # the evaluation's time is not training
    data["command"] = "python examples/compare_demo_runs.py a b"
    assert render_docs.VIEWS["run-differences"](data) == (
        "Against the fp32-trained run of the same seed (`python examples/demo.py --seed 0`; compared by "
        "`python examples/compare_demo_runs.py a b`), bf16 training moved no accuracy by more than 0.3 points, no "
        "ECE by more than 0.0012 and no AUROC by more than 0.0030; the training stages took 1.56x as long in fp32.\n")
    # every number of the rows but latency: 3 rows x (accuracy, ece, nll, params_m, 2 AUROCs)
    # Hydra's accuracy, every row's guardian AUROC and Single's ECE moved
    assert data["numbers"] == 18 and data["identical"] == 18 - 1 - 3 - 1
    assert data["machines"] == [None, None]
    data["machines"][1] = {"cpu": "AMD EPYC", "cpuid": None, "isa": "AVX512", "bf16_products": None}
    assert render_docs.VIEWS["run-agreement"](data) == (
        "Two runs of seed 0 (`python examples/demo.py --seed 0` on a CPU its file does not record; `python "
        "examples/demo.py --seed 0` on AMD EPYC (AVX512; native bf16 products: none); compared by `python "
        "examples/compare_demo_runs.py a b`): 13 of the reports' 18 numbers identical (latency aside); the largest "
        "differences: accuracy 0.30 points, ECE 0.0012, AUROC 0.0030.\n")
    b["report"]["settings"]["seed"] = 1
    with pytest.raises(HydraInputError, match=r"the seeds \[0, 1\]"):
        compare_demo_runs.main(_write(tmp_path, [a, b]))
    b["report"]["settings"]["seed"] = 0
    b["report"]["rows"].pop()
    with pytest.raises(HydraInputError, match="different methods"):
        compare_demo_runs.main(_write(tmp_path, [a, b]))


def test_the_rows_view_puts_each_methods_mean_and_std_over_the_seeds_in_one_row(tmp_path):
    runs = [_results(0, 0.0), _results(1, 0.004), _results(2, -0.002)]
    for run in runs:
        run["report"]["ood_sets"], run["report"]["ood_score"] = ["guardian", "hamlet"], "msp"
    data = demo_seeds.aggregate_runs([demo_seeds.read_run(Path(p)) for p in _write(tmp_path, runs)])
    lines = render_docs.VIEWS["seed-rows"](data).splitlines()
    assert lines[0] == "| method | accuracy | ECE | NLL | guardian AUROC | hamlet AUROC |"
    accuracy, guardian = stats.tstd([0.80, 0.804, 0.798]), stats.tstd([0.70, 0.704, 0.698])
    assert lines[2] == (f"| {HYDRA} | 0.8007 ± {accuracy:.4f} | 0.0300 ± 0.0000 | 0.4200 ± 0.0000 | "
                        f"0.7007 ± {guardian:.4f} | 0.6500 ± 0.0000 |")
    assert lines[3].startswith(f"| {SINGLE} | 0.8100 ± 0.0000 | ")
    assert len(lines) == 2 + 3 + 2 and lines[-1].startswith("Mean ± std over the seeds 0, 1, 2; OOD score: msp")
    data["aggregate"]["rows_std"].reverse()  # rows and their spreads out of step: the view refuses
    with pytest.raises(KeyError, match="rows_std holds"):
        render_docs.VIEWS["seed-rows"](data)
