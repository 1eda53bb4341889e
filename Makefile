# PyTorch on the GPU: the two commands a reader needs.
#   make book   set everything up, execute every chapter once, build _build/html
#   make test   everything `make book` does, then lint and every test (unit, notebook
#               conventions, executed outputs, the Colab-like install, the browser test)
# Re-running either is fast when nothing changed: each chapter is re-executed only when
# it, or the helpers package, changed since its last run.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DELETE_ON_ERROR:
.DEFAULT_GOAL := book

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAGE := _executed
HTML := _build/html
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# Generous: the slowest chapter takes a few minutes on a 2-core CPU.
NB_TIMEOUT ?= 1800
# Python writes the compiled form of each module it imports (__pycache__), whatever the shell
# says: uv installs without compiling, so with PYTHONDONTWRITEBYTECODE set every process
# compiled torch, pandas, matplotlib and the rest from source again (a notebook kernel's
# imports: 19.5 CPU-s instead of 8 in the oldest-torch environment; chapter 1 there 18.4 CPU-s
# instead of 10.0). Only what some process imports is compiled, once.
unexport PYTHONDONTWRITEBYTECODE
# Hardware-dependent claims of the pages (helpers.checks.expect) fail the run here; in a
# reader's session they only warn.
export BOOK_STRICT := 1

# The chapters that take longest on a CPU come first (CI's timings, a 2-core machine): with
# several jobs at once (`make -j`), the jobs started last are then short ones, so the lanes end
# together. A chapter not named here comes after them, in name order.
LONGEST_FIRST := 07_data_parallel 10_trainers 12_performance 03_matmul 05_mnist 06_image_folder
NOTEBOOKS := $(foreach c,$(LONGEST_FIRST),$(wildcard chapters/$(c).ipynb)) \
             $(filter-out $(foreach c,$(LONGEST_FIRST),chapters/$(c).ipynb),$(sort $(wildcard chapters/*.ipynb)))
EXECUTED := $(addprefix $(STAGE)/,$(NOTEBOOKS))
STATIC := _toc.yml intro.md $(wildcard _ext/*.py) $(wildcard _static/*) $(sort $(wildcard chapters/*.md) $(wildcard chapters/*.png) $(wildcard chapters/*.py))
STAGED_STATIC := $(addprefix $(STAGE)/,$(STATIC)) $(STAGE)/_config.yml
# What the chapters run and show: the reader's library and the committed result files (the
# benchmark is not among them, so changing it re-executes no chapter).
HELPERS := $(sort $(wildcard helpers/*.py results/*.json))

.PHONY: book test unit-tests venv data lint unit notebooks html browser-deps clean distclean bench \
        oldest oldest-venv gpu-report wheelhouse

## Set-up ------------------------------------------------------------------------------
venv: $(VENV)/.installed
# The installs go through uv (pinned in requirements.txt, bootstrapped with pip): it downloads
# in parallel and does not byte-compile every file of torch up front, which took pip three
# times the CPU time on a 2-core machine. pip stays in the environment for the wheelhouse.
UV_PIN := $(shell grep -E '^uv==' requirements.txt)
$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$(UV_PIN)"
	$(VENV)/bin/uv pip install --quiet --python $(PY) -r requirements.txt
	$(VENV)/bin/uv pip install --quiet --python $(PY) --no-deps -e .
	@# matplotlib builds its font cache at its first import and says so on stderr: build it
	@# here, not in the first chapter that plots (whose page would show the notice).
	$(PY) -c "import matplotlib.font_manager"
	touch $@

data: venv
	$(PY) tools/fetch_mnist.py fetch

browser-deps:
	@command -v chromium >/dev/null || { \
	  echo "Installing Debian's chromium for the browser test"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium >/dev/null; }

## Executing the chapters (once) and building the book ----------------------------------
$(STAGE)/_config.yml: _config.yml
	@mkdir -p $(@D)
	sed 's/^\(  execute_notebooks:\).*/\1 "off"/' $< > $@

$(STAGE)/%: %
	@mkdir -p $(@D)
	cp $< $@

# A notebook is executed in a scratch copy under _executed/ (nbmake skips paths containing
# "_build"), in place (nbmake --overwrite), so the book build
# reuses these outputs instead of running every chapter a second time. Its kernel is a reader's
# (tools/nbmake_kernel.py): what C++ code writes to stderr shows, as in Jupyter, and the kernel
# is killed after the last cell rather than left 2-3 s to tear torch down.
NBMAKE := -p no:cacheprovider -p tools.nbmake_kernel -q --nbmake --overwrite \
  --nbmake-timeout=$(NB_TIMEOUT)
$(STAGE)/chapters/%.ipynb: chapters/%.ipynb $(HELPERS) tools/nbmake_kernel.py | venv data
	@mkdir -p $(@D)
	cp $< $@
	$(PY) -m pytest $(NBMAKE) $@
	$(PY) tools/notebook.py trim-errors $@

notebooks: $(EXECUTED)

# The pages the book shows: a chapter's recorded GPU run (results/pages/<machine>/) where its
# code matches the chapter's current code, else the CPU outputs above, saying so.
PAGES := _build/pages
RECORDED := $(sort $(wildcard results/pages/*/*.ipynb))
$(PAGES)/.staged: $(STAGED_STATIC) $(EXECUTED) $(RECORDED) tools/gpu_report.py
	rm -rf $(PAGES)
	mkdir -p $(PAGES)
	cp -r $(STAGE)/. $(PAGES)/
	$(PY) tools/gpu_report.py stage --executed $(STAGE)/chapters --out $(PAGES)/chapters
	touch $@

$(HTML)/.built: $(PAGES)/.staged
	rm -rf $(HTML)
	$(VENV)/bin/jupyter-book build $(PAGES) --path-output . -W --keep-going
	touch $@

html: $(HTML)/.built
book: venv data html
	@echo "The book is in $(HTML)/index.html"

## The oldest supported torch ----------------------------------------------------------
# Colab and GPU servers keep their own torch, usually older than the pinned one. The book
# supports the torch and torchvision named as lower bounds in pyproject.toml (their one
# definition), and `make oldest` proves it: every chapter is executed again in a second
# environment with the newest patch release of those versions, into _oldest/chapters/. That run
# also reads a fake GPU result file next to the committed ones, so the tests can check that
# each chapter really shows the committed GPU figures (tests/book/test_committed_figures.py).
OLDEST_TORCH := $(shell sed -nE 's/^ *"torch>=([0-9.]+)",?$$/\1/p' pyproject.toml)
OLDEST_TORCHVISION := $(shell sed -nE 's/^ *"torchvision>=([0-9.]+)",?$$/\1/p' pyproject.toml)
OLDEST_VENV := .venv-oldest
OLDEST := _oldest
OLDEST_PY := $(OLDEST_VENV)/bin/python

oldest-venv: $(OLDEST_VENV)/.installed
$(OLDEST_VENV)/.requirements: requirements.txt pyproject.toml
	test -x $(OLDEST_PY) || $(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_PY) -m pip install --quiet "$(UV_PIN)"
	# The pinned environment with the oldest torch pair; the book-building tools are not needed.
	sed -E -e 's/^torch==.*/torch==$(OLDEST_TORCH).*/' \
	  -e 's/^torchvision==.*/torchvision==$(OLDEST_TORCHVISION).*/' \
	  -e '/^(jupyter-book|ruff|playwright)==/d' requirements.txt > $(OLDEST_VENV)/requirements.txt
	$(OLDEST_VENV)/bin/uv pip install --quiet --python $(OLDEST_PY) -r $(OLDEST_VENV)/requirements.txt
	touch $@

# An editable install writes the package's metadata into the checkout
# (pytorch_on_the_gpu_helpers.egg-info/): the two environments may install side by side
# (`make -j3 venv oldest-venv data`, as CI does), but never write that folder at the same time.
$(OLDEST_VENV)/.installed: $(OLDEST_VENV)/.requirements | $(VENV)/.installed
	$(OLDEST_VENV)/bin/uv pip install --quiet --python $(OLDEST_PY) --no-deps -e .
	$(OLDEST_PY) -c "import matplotlib.font_manager"  # its font cache, as for .venv
	$(OLDEST_PY) -c "import torch, torchvision; assert torch.__version__.startswith('$(OLDEST_TORCH).'), torch.__version__"
	touch $@

# Each chapter is its own target, as for the pinned torch, so `make -j2 book oldest` runs
# chapters of both environments side by side, and a re-run executes only what changed.
OLDEST_EXECUTED := $(addprefix $(OLDEST)/,$(NOTEBOOKS))
OLDEST_RESULTS := $(wildcard results/*.json) tests/fixtures/fake-gpu-result.json

$(OLDEST)/results/.copied: $(OLDEST_RESULTS)
	rm -rf $(@D)
	mkdir -p $(@D)
	cp $(OLDEST_RESULTS) $(@D)/
	touch $@

$(OLDEST)/chapters/%.ipynb: chapters/%.ipynb $(HELPERS) tools/nbmake_kernel.py \
                           $(OLDEST)/results/.copied | oldest-venv data
	@mkdir -p $(@D)
	cp $< $@
	BOOK_RESULTS_DIR=$(CURDIR)/$(OLDEST)/results $(OLDEST_PY) -m pytest $(NBMAKE) $@
	$(OLDEST_PY) tools/notebook.py trim-errors $@

$(OLDEST)/.done: $(OLDEST_EXECUTED)
	@# a chapter the book no longer has must not stay behind to be tested
	@for f in $(OLDEST)/chapters/*.ipynb; do \
	  case " $(OLDEST_EXECUTED) " in *" $$f "*) ;; *) echo "removing stale $$f"; rm -f "$$f";; esac; \
	done
	touch $@

oldest: $(OLDEST)/.done

## Tests -------------------------------------------------------------------------------
lint: venv
	$(VENV)/bin/ruff check helpers bench tools tests chapters _ext

unit: venv data
	$(PY) -m pytest -m "not book"

# `make test` runs every test once, in two parts: the tests that need no executed chapter
# (pytest -m "not book": the library, the benchmark, the tools, the troubleshooting entries,
# the Colab-like installs) and, once both torches executed every chapter and the book is
# built, the tests of the executed outputs and the built pages (-m book). With several jobs
# (`make -j3 test`, as CI on a machine without a GPU) the first part runs while the chapters
# execute: both keep the cores busy where either alone leaves them waiting (on kernels,
# subprocesses, torchrun). Where a GPU is, run `make test` as it is: the chapters then run one
# at a time and alone, so their timings are their own.
# The unit tests run on two workers (pytest-xdist): many wait on subprocesses or disk.
# OpenMP threads that wait sleep instead of spinning: with several workers (each torch using
# every core) spinning threads took the cores from the ones with work (on 2 cores, two
# chapters side by side used half the CPU time and half the wall time with it).
TEST_WORKERS ?= 2
# The unit tests' workers: beside the chapters (make -j3) more than two only take turns on the
# cores, and load the machine the chapters time their CPU steps on.
UNIT_WORKERS ?= $(TEST_WORKERS)
# The tests of the built book run in one process (0: no workers): it reads each page in
# Chromium once, however many tests check it, and searches from one search page; each worker
# would start its own browser and read them again. On 2 idle cores: 108 s and 181 busy core-s
# in one process, 126 s and 250 on two workers, 154 s and 306 on three.
# They run once both torches are done, alone: beside the oldest torch's chapters, the whole
# CI took more busy core-s (1795 against 1728) and longer (920 s against 900 s).
BOOK_TEST_WORKERS ?= 0
test: lint browser-deps unit-tests book oldest
	OMP_WAIT_POLICY=PASSIVE $(PY) -m pytest -m book --require-book -n $(BOOK_TEST_WORKERS)

# --require-book: a test that needs the oldest-torch environment fails without it, not skips.
unit-tests: venv data oldest-venv
	OMP_WAIT_POLICY=PASSIVE $(PY) -m pytest -m "not book" --require-book -n $(UNIT_WORKERS)

## The book's benchmark: figures for results/<machine>.json -------------------------
bench: venv data
	$(PY) -m bench

## The GPU report: every chapter and the benchmark on this machine's GPU, recorded under
## results/ (README: "Add your GPU to the book"). It uses the machine's own Python and torch
## (REPORT_PY=.venv/bin/python for the book's pinned torch, where the driver supports it).
REPORT_PY ?= $(PYTHON)
REPORT_ARGS ?=
gpu-report:
	@# matplotlib's font cache built before any recorded page plots (where matplotlib is
	@# already there; a bare server gets it from the wheelhouse the report installs)
	@$(REPORT_PY) -c "import matplotlib.font_manager" 2>/dev/null || true
	$(REPORT_PY) tools/gpu_report.py $(REPORT_ARGS)

# Wheels for an offline GPU server: WHEEL_PYTHON, the server's Python (3.12 by default, the
# H200 image's, whose package listing the default kind uses), and WHEEL_PLATFORM="tag ..." to
# replace the default platform tags (every manylinux x86-64 tag from 2_28 down to 2014).
# By default only what a server image with torch and the scientific stack lacks (at most
# 35 MB, MNIST included; WHEEL_SERVER_HAS=server.txt, that server's `pip list
# --format=freeze`, for another image than the H200's); WHEEL_FULL=1 for a bare server.
WHEEL_PYTHON ?= 3.12
WHEEL_PLATFORM ?=
WHEEL_SERVER_HAS ?=
WHEEL_FULL ?=
wheelhouse: venv
	$(PY) tools/wheelhouse.py --out _build/wheelhouse --python $(WHEEL_PYTHON) \
	  $(foreach p,$(WHEEL_PLATFORM),--platform $(p)) $(if $(WHEEL_FULL),--full) \
	  $(if $(WHEEL_SERVER_HAS),--server-has $(WHEEL_SERVER_HAS))

clean:
	# build/ is where setuptools leaves a wheel's files; stale ones would ship in the next wheel.
	rm -rf _build $(STAGE) $(OLDEST) build dist

distclean: clean
	rm -rf $(VENV) $(OLDEST_VENV) data
