# Two commands on a fresh machine:  `make book` builds the HTML book, `make test` runs every test.
# Both create and fill the project-local virtual environment .venv first.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed
# Chapters are MyST text notebooks (book/**/*.md with a kernelspec); their executed twins live in notebooks/.
CHAPTERS = $(shell grep -rl --include='*.md' '^kernelspec:' book)

export HF_HUB_OFFLINE = 1
export TRANSFORMERS_OFFLINE = 1
export HF_DATASETS_OFFLINE = 1
export PYTHONHASHSEED = 0

.PHONY: install book test test-portability test-planted-bugs notebooks checkpoints bench clean

install: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $@

book: install  ## build the rendered book into _build/html (shows the stored, validated notebook outputs)
	$(BIN)/jupyter-book build . -W -n --keep-going
	@echo "Open _build/html/index.html"

test: install  ## unit tests, nbval on every notebook, source/notebook sync, strict book build
	PATH="$(abspath $(BIN)):$$PATH" bash scripts/run_tests.sh

# SETTINGS="avx2" picks some of: native avx2 sse42 (default all). About 4 minutes a setting on 2 cores.
test-portability: install  ## unit tests and nbval under this CPU's kernels and two emulated ones (other CPUs round differently)
	PATH="$(abspath $(BIN)):$$PATH" bash scripts/test_portability.sh $(SETTINGS)

test-planted-bugs: install  ## a test of the tests: plant known bugs one at a time and check that the suite fails
	$(BIN)/python scripts/check_planted_bugs.py

notebooks: install  ## re-execute every chapter and write its outputs into the paired notebook
	@for f in $(CHAPTERS); do echo "== $$f"; $(BIN)/jupytext --sync --execute "$$f" || exit 1; done

checkpoints: install  ## retrain the shipped base policies from their seeds (bit for bit), then verify them
	$(BIN)/python -m rlbook.checkpoints build
	$(BIN)/python -m rlbook.checkpoints verify

bench: install  ## rollout and log-prob throughput, ours vs model.generate (prints a table; not a test)
	$(BIN)/python bench/rollout_bench.py

clean:
	rm -rf _build
