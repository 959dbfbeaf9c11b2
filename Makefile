VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install demo test lint unit inprocess integration docs figures

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

install: $(PY)
	$(PY) -m pip install --quiet -e ".[dev]"

demo: install
	$(VENV)/bin/fsm-celery demo

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

unit: install
	$(PY) -m pytest tests/unit -q

inprocess: install
	$(PY) -m pytest tests/inprocess -q

integration: install
	$(PY) -m pytest tests/integration -q

test: lint
	$(PY) -m pytest -q

docs: install
	$(PY) -m fsm_celery.config > /dev/null

figures: install  # the current figures' table in README.md and docs/performance.md
	$(PY) -m bench.figures
