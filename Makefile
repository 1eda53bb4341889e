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

NOTEBOOKS := $(sort $(wildcard chapters/*.ipynb))
EXECUTED := $(addprefix $(STAGE)/,$(NOTEBOOKS))
STATIC := _toc.yml intro.md $(sort $(wildcard chapters/*.md) $(wildcard chapters/*.png) $(wildcard chapters/*.py))
STAGED_STATIC := $(addprefix $(STAGE)/,$(STATIC)) $(STAGE)/_config.yml
HELPERS := $(sort $(wildcard helpers/*.py helpers/bench/*.py results/*.json))

.PHONY: book test venv data lint unit notebooks html browser-deps clean distclean bench

## Set-up ------------------------------------------------------------------------------
venv: $(VENV)/.installed
$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $@

data: venv
	$(PY) -m helpers.data fetch

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
# reuses these outputs instead of running every chapter a second time.
$(STAGE)/chapters/%.ipynb: chapters/%.ipynb $(HELPERS) | venv data
	@mkdir -p $(@D)
	cp $< $@
	$(PY) -m pytest -p no:cacheprovider -q --nbmake --overwrite \
	  --nbmake-timeout=$(NB_TIMEOUT) $@
	$(PY) scripts/notebook.py trim-errors $@

notebooks: $(EXECUTED)

$(HTML)/.built: $(STAGED_STATIC) $(EXECUTED)
	rm -rf $(HTML)
	$(VENV)/bin/jupyter-book build $(STAGE) --path-output . -W --keep-going
	touch $@

html: $(HTML)/.built
book: venv data html
	@echo "The book is in $(HTML)/index.html"

## Tests -------------------------------------------------------------------------------
lint: venv
	$(VENV)/bin/ruff check helpers tests scripts chapters

unit: venv data
	$(PY) -m pytest -m "not book"

test: lint book browser-deps
	$(PY) -m pytest --require-book

## The book's benchmark: figures for results/<machine>.json -------------------------
bench: venv data
	$(PY) -m helpers.bench

clean:
	rm -rf _build $(STAGE)

distclean: clean
	rm -rf $(VENV) data
