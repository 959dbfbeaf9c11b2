VENV ?= .venv
PY := $(VENV)/bin/python
# The suite's processes (pytest-xdist; 0: one, as plain pytest): most of its time is spent
# waiting on the servers, workers, bridges and browsers it starts, so four keep two cores busy.
# A file's tests stay in one process (--dist loadfile): its deployment starts once. Files are
# handed out in the order collected (--no-loadscope-reorder; xdist's default puts the files with
# the most tests first): the long ones of few tests (acceptance, browser, faults, replay) start
# early, and the many short unit files end the run instead of a 5-minute file begun last.
TEST_PROCESSES ?= 4
PARALLEL := -n $(TEST_PROCESSES) --dist loadfile --no-loadscope-reorder

.PHONY: install demo test lint unit inprocess integration browser docs figures

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
	$(PY) -m pytest tests/integration -q $(PARALLEL)

browser: install  # the dashboard in Debian's chromium (/usr/bin/chromium), driven by Playwright
	$(PY) -m pytest tests/browser -q $(PARALLEL)

test: lint
	$(PY) -m pytest -q $(PARALLEL)

docs: install
	$(PY) -m fsm_celery.settings_reference > /dev/null
	$(PY) -m fsm_celery.definition_reference
	$(PY) -m fsm_celery.metrics.reference  # docs/operations.md's table of every metric
	FSM_WRITE_DOCS=1 $(PY) -m pytest tests/inprocess/test_trace.py -q -p no:cacheprovider -n 0  # README's path of one ack
	FSM_WRITE_DOCS=1 $(PY) -m pytest tests/unit/test_layers.py -q -p no:cacheprovider -n 0  # docs/architecture.md's graph

figures: install  # the current figures' table in README.md and docs/performance.md
	$(PY) -m bench.figures
