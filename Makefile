# One-command set-up: `make run` (the main job) and `make test` create .venv on first use.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: run test lint fmt

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	# torch==2.13.0 is pinned in pyproject: pip takes the CPU wheel, never a CUDA build.
	$(VENV)/bin/pip install -q -e '.[all,dev]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/ckptflow run pipeline --local

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

fmt: $(STAMP)
	$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .
