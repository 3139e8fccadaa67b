# Fresh-machine entry points: `make demo` and `make test` install what they need first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.tputool-installed

.PHONY: install demo test test-all lint docs test-cli-oldest

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[dev,docs,report,tpu-compile]'
	touch $(STAMP)

# Port the bundled CUDA sample repo (diff + report), then run the ported copy for one epoch on the tpu device.
demo: install
	$(VENV)/bin/tputool port fixtures/sample_repo
	rm -rf build/demo && mkdir -p build/demo && cp -r fixtures/sample_repo build/demo/
	$(VENV)/bin/tputool port build/demo/sample_repo --write -q > /dev/null
	@echo "== running the ported train.py on the tpu device (1 epoch) =="
	cd build/demo/sample_repo && RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29533 \
		$(CURDIR)/$(PY) -W ignore::FutureWarning -W ignore::UserWarning train.py --epochs 1

test: install
	$(PY) -m pytest -q

test-all: install
	$(PY) -m pytest -q -m ''

lint: install
	$(VENV)/bin/ruff check tputool tests benchmarks

# The documentation site (docs/, mkdocs.yml) into build/site; --strict: a broken link or a missing page fails.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# The CLI suite under the oldest typer/click that pyproject.toml admits (CI runs the pinned newest via `make test`).
OLD_VENV ?= .venv-oldest
TYPER_OLDEST ?= 0.12.5
CLICK_OLDEST ?= 8.1.7
# Only the subprocess-based CLI tests: the other CLI test files read CliRunner's result.stderr, which click < 8.2
# does not capture separately.
CLI_TESTS := tests/test_cli_errors.py

test-cli-oldest:
	test -x $(OLD_VENV)/bin/python || $(PYTHON) -m venv $(OLD_VENV)
	grep -vE '^(typer|click)==' constraints.txt > $(OLD_VENV)/constraints-oldest.txt
	$(OLD_VENV)/bin/python -m pip install -q -c $(OLD_VENV)/constraints-oldest.txt -e '.[dev]' \
		typer==$(TYPER_OLDEST) click==$(CLICK_OLDEST)
	$(OLD_VENV)/bin/python -m pytest -q $(CLI_TESTS)
