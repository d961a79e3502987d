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

.PHONY: install book test check-plans test-browser test-portability test-planted-bugs notebooks reader lab student checkpoints bench gpu-check clean

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

check-plans: install  ## every stored result against git: was its plan committed before the run? (one line a file)
	$(BIN)/python scripts/check_plans.py

# Rebuilds the book first when a source is newer than the last build; screenshots go to _build/screenshots.
test-browser: install  ## the rendered book in headless Chromium: math, images, links, console, network, phone width, CJK
	@bash scripts/install_chromium.sh
	@if [ ! -f _build/.html-stamp ] || [ -n "$$(find book notebooks _static src references.bib _config.yml _toc.yml -newer _build/.html-stamp -print -quit)" ]; then \
	    $(BIN)/jupyter-book build . -W -n --keep-going --quiet && touch _build/.html-stamp \
	    || echo "test-browser: the strict build failed (make test reports it); checking the HTML it wrote"; fi
	$(BIN)/python -m pytest tests/browser -q -p no:cacheprovider
	$(BIN)/python scripts/check_browser.py _build/html --screenshots _build/screenshots

# SETTINGS="default" picks some of: native avx2 sse42 default (default all). About 4-6 minutes a setting on 2 cores.
test-portability: install  ## unit tests and nbval under this CPU's kernels and two emulated ones (other CPUs round differently)
	PATH="$(abspath $(BIN)):$$PATH" bash scripts/test_portability.sh $(SETTINGS)

test-planted-bugs: install  ## a test of the tests: plant known bugs one at a time and check that the suite fails
	$(BIN)/python scripts/check_planted_bugs.py

notebooks: install  ## re-execute every chapter and write its outputs into the paired notebook
	@for f in $(CHAPTERS); do echo "== $$f"; $(BIN)/jupytext --sync --execute "$$f" || exit 1; done

# JupyterLab with jupyterlab-myst renders the chapters' MyST (math, admonitions, proofs, exercises); it runs offline:
# no news, no update check, a read-only extension manager (settings in scripts/jupyterlab/overrides.json).
# It serves the reader copy (`make reader`): glued numbers, figures with captions and the package's code written in,
# which jupyterlab-myst cannot resolve itself. `make lab LAB_DIR=_build/student` opens the student edition instead.
LAB_DIR ?= _build/reader
LAB_PORT ?= 8888
$(VENV)/.notebooks-installed: $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[notebooks]'
	touch $@

reader: install  ## the reader copy of the notebooks in _build/reader: numbers, figures, captions and code in place of MyST-NB roles
	$(BIN)/python scripts/make_reader.py --out _build/reader

lab: $(VENV)/.notebooks-installed reader  ## install the [notebooks] extra and serve JupyterLab on the reader copy (open the URL it prints)
	$(if $(filter _build/student,$(LAB_DIR)),$(BIN)/python scripts/make_student.py --source _build/reader --out _build/student)
	$(BIN)/jupyter lab --no-browser $(if $(filter 0,$(shell id -u)),--allow-root) \
	    --ServerApp.ip=127.0.0.1 --ServerApp.port=$(LAB_PORT) --ServerApp.root_dir=$(LAB_DIR) \
	    --LabApp.news_url=None --LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate \
	    --LabApp.extension_manager=readonly --LabApp.app_settings_dir=$(CURDIR)/scripts/jupyterlab

student: reader  ## the student edition, from the reader copy: each solution replaced by a stub and its checker call, in _build/student/
	$(BIN)/python scripts/make_student.py --source _build/reader --out _build/student

checkpoints: install  ## retrain the shipped base policies (SFT until the held-out accuracy target), then verify: shipped hashes and accuracy, first 40 SFT losses within 1e-5, target reached, accuracy in band
	$(BIN)/python -m rlbook.checkpoints build
	$(BIN)/python -m rlbook.checkpoints verify

bench: install  ## rollout and log-prob throughput, ours vs model.generate (prints a table; not a test)
	$(BIN)/python bench/rollout_bench.py

# Needs a CUDA build of torch (requirements.txt pins the CPU wheel; the script prints the pip command for a CUDA one).
gpu-check: install  ## on a machine with a CUDA GPU: the CUDA tests, then 20 GRPO steps (tokens/s, s/step, peak memory, the update's TFLOP/s against the GPU's bf16 peak; fails unless the first step's ratios are 1 within 1e-3) into _build/gpu_check.json
	$(BIN)/python scripts/gpu_check.py

clean:
	rm -rf _build
