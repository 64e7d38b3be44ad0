# The two entry points. Both set up .venv idempotently first (tools/bootstrap.sh).
VENV ?= .venv
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
export TRANSFORMERS_NO_ADVISORY_WARNINGS ?= 1
# pytest-xdist workers: the tests run one torch thread each (tests/conftest.py), so one per core; files
# in collection order (tests/conftest.py starts the minutes-long training test first)
TEST_WORKERS ?= 2

.PHONY: setup demo docs docs-check test lint bench study clean

setup:
	@./tools/bootstrap.sh

# writes docs/results/demo.json, the file the README's results table is rendered from (`make docs`)
demo: setup
	$(PY) examples/demo.py --output outputs/demo --results docs/results/demo.json

# re-render the result tables of README.md and docs/*.md from their results files (tools/render_docs.py);
# docs-check changes nothing and fails where a table differs from its file, or where prose types a measured number
# no table prints outside a section marked `<!-- typed: WHY -->` (tests/repo/test_docs_results.py runs it)
docs: setup
	$(PY) tools/render_docs.py

docs-check: setup
	$(PY) tools/render_docs.py --check

# the selection protocol (docs/study.md): validation splits only, leave-one-OOD-kind-out; every
# candidate on the first seed, the ones close to the best replicated on the others; resumes
STUDY_SEEDS ?= 0 1 2
study: setup
	$(PY) examples/study_text.py --output outputs/study --seeds $(STUDY_SEEDS) --screen

test: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=30 $(PYTEST_ARGS)

# the lint `make test` runs too (tests/repo/test_lint.py; settings in pyproject.toml [tool.ruff])
lint: setup
	$(PY) -m ruff check src tests examples bench tools

# the CPU benchmarks of docs/benchmarks.md, one after another (run nothing else meanwhile): each writes its
# results file, then the page is rendered from them. bench/bench_circuits.py (about 40 minutes) runs alone.
BENCH_OUT := docs/results/bench
bench: setup
	mkdir -p $(BENCH_OUT)
	$(PY) bench/bench_bert.py --json $(BENCH_OUT)/bert.json
	$(PY) bench/bench_vit.py --json $(BENCH_OUT)/vit.json
	$(PY) bench/bench_families.py --family roberta --json $(BENCH_OUT)/roberta.json
	$(PY) bench/bench_families.py --family deit --keep 8 --json $(BENCH_OUT)/deit.json
	$(PY) bench/bench_cost.py --json $(BENCH_OUT)/cost.json
	$(PY) bench/bench_onnx.py --json $(BENCH_OUT)/onnx.json
	$(PY) bench/bench_decoder.py --json $(BENCH_OUT)/decoder.json
	$(PY) bench/bench_import.py --json $(BENCH_OUT)/import.json
	$(PY) tools/render_docs.py

clean:
	rm -rf outputs .pytest_cache
