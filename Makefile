# Fresh-machine entry points: `make demo` and `make test` install what they need first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.tputool-installed

.PHONY: install demo test test-all lint

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: install
	$(VENV)/bin/tputool port fixtures/sample_repo

test: install
	$(PY) -m pytest -q

test-all: install
	$(PY) -m pytest -q -m ''

lint: install
	$(VENV)/bin/ruff check tputool tests benchmarks
