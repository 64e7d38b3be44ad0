"""The README's Quickstart is rendered from examples/quickstart.py's results file: the commands it ran as
printed, each step's time, what the run gave against the README's table, and which uncertainty to use."""

from __future__ import annotations

import importlib.util

from conftest import REPO

spec = importlib.util.spec_from_file_location("render_docs", REPO / "tools" / "render_docs.py")
render_docs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(render_docs)


def _step(key, section, seconds, title="", commands=(), python=""):
    return {"key": key, "section": section, "title": title, "commands": list(commands), "python": python,
            "seconds": seconds}


def _scores(mi_ood):
    rows = []
    for model, scores in (("Hydra", ("msp", "entropy", "mutual_information", "energy")),
                          ("Single", ("msp", "entropy", "energy"))):
        for score in scores:
            ood = {"msp": 0.7297, "entropy": 0.7297, "energy": 0.7525, "mutual_information": mi_ood}[score]
            rows.append({"model": model, "score": score, "ood_auroc": ood, "error_auroc": 0.81 if score != "energy"
                         else 0.79})
    return rows


RESULTS = {
    "command": "python examples/quickstart.py --output outputs/quickstart --results docs/results/quickstart.json",
    "machine": {"cpu": "AMD EPYC", "cpuid": None, "isa": "AVX512", "bf16_products": "avx512_bf16"},
    "threads": {"torch_threads": 2}, "load_average": [1.5, 1.0, 1.0],
    "steps": [_step("setup", "quickstart", 0.2, commands=["MINILM=$(python -c \"...\")"]),
              _step("single", "quickstart", 145.2, "0. the Single\n#    (demo-single)", ["hydra-hf finetune ..."]),
              _step("prune", "quickstart", 12.4, "1. the heads", ["hydra-hf prune ..."]),
              _step("python", "python", 9.0, python="print('hi')\n"),
              _step("calibrate", "calibrate", 95.0, commands=["hydra-hf calibrate hydra-rt ..."]),
              _step("slim-prune", "slim", 30.0, commands=["hydra-hf prune --mlp-keep 0.33 ..."]),
              _step("slim-members", "slim", 720.0, commands=["hydra-hf finetune --recipe demo-slim-members ..."]),
              _step("export", "export", 200.0, commands=["hydra-hf export hydra-rt ..."])],
    "rows": {"Hydra": {"accuracy": 0.8025}, "Single": {"accuracy": 0.8064}},
    "comparison": {"accuracy": {"difference": -0.0039, "ci_low": -0.012, "ci_high": 0.004, "verdict": "tie"}},
    "near_chance": {"levels": {}, "rows": {}},
    "single": {"steps": 180, "best_eval_accuracy": 0.81},
    "members": [{"best_eval_accuracy": 0.80}, {"best_eval_accuracy": 0.79}, {"best_eval_accuracy": 0.805}],
    "demo": {"single_accuracy": 0.8064, "hydra_accuracy": 0.8025},
    "calibration": {"n": 4201, "alpha": 0.1, "q_hat": 0.7076, "score": "msp", "threshold": 0.0806, "risk": 0.05,
                    "delta": 0.1, "answered_fraction": 0.37, "calibration_selective_error": 0.036},
    "slim": {"compute_x": 1.17, "hydra_compute_x": 2.45},
    "scores": _scores(0.25),
}


def test_the_quickstart_block_prints_each_steps_commands_and_time():
    text = render_docs.VIEWS["quickstart"](RESULTS)
    assert text.startswith("```bash\nMINILM=$(python -c")  # the setup line has no comment and no time
    assert "# 0. the Single\n#    (demo-single) (2.4 min)\nhydra-hf finetune ...\n" in text
    assert "# 1. the heads (12 s)\nhydra-hf prune ...\n" in text
    assert text.endswith("```\n\n```python\nprint('hi')\n```\n")


def test_the_run_sentence_compares_with_the_readme_table():
    text = render_docs.VIEWS["quickstart-run"](RESULTS)
    assert "Single reached **0.8064**" in text and "Hydra **0.8025**" in text and "(the table below: 0.8064" in text
    assert "2.8 min on AMD EPYC" in text and "Hydra − Single accuracy −0.0039 [−0.0120, +0.0040]: tie" in text


def test_the_calibrate_slim_and_export_paragraphs_carry_their_commands_and_times():
    calibrate = render_docs.VIEWS["quickstart-calibrate"](RESULTS)
    assert "`hydra-hf calibrate hydra-rt ...` (95 s)" in calibrate and "the 4201 training reviews" in calibrate
    assert "answered 37.0 % of the calibration reviews with 3.6 % errors" in calibrate
    slim = render_docs.VIEWS["quickstart-slim"](RESULTS)
    assert "(30 s)" in slim and "(12.0 min)" in slim and "1.17x a Single's multiply-adds, against 2.45x" in slim
    assert "no `--mlp-spread`" in slim
    assert render_docs.VIEWS["quickstart-export"](RESULTS).startswith("`hydra-hf export hydra-rt ...` (3.3 min here)")


def test_which_uncertainty_to_use_follows_the_measured_rows():
    wrong_way = render_docs.VIEWS["uncertainty-scores"](RESULTS)
    assert "| Hydra | `mutual_information` | 0.2500 | 0.8100 |" in wrong_way
    assert "the best score here is `energy`" in wrong_way and "below chance: it points the wrong way" in wrong_way
    weak = render_docs.VIEWS["uncertainty-scores"]({**RESULTS, "scores": _scores(0.55)})
    assert "far below MSP" in weak and "points the wrong way" not in weak
