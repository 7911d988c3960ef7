# Shipyard: `make demo` and `make test` set everything up themselves on a fresh machine.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "Python 3.11 is required ($(PYTHON) not found)"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,torch]'
	@touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py $(DEMO_ARGS)

test: $(STAMP)
	@bash tests/system_deps.sh
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=30 tests

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) -m pip install -q -e '.[bench]'
	@for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .state
