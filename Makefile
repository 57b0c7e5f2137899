# One-command set-up: `make run` (the main job) and `make test` create .venv on first use.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: run test lint fmt

# PyTorch's CPU wheels (the image takes torch from the same index).
TORCH_INDEX_URL ?= https://download.pytorch.org/whl/cpu
TORCH_PIN := torch==2.13.0
OS_NAME ?= $(shell uname -s)

# torch goes in first, on its own: PyPI's Linux torch wheel bundles CUDA (several GB), so on
# Linux only the +cpu build of the pin is accepted. A +cpu wheel pip's configured sources
# already hold (find-links, an offline mirror) is taken without asking any index; otherwise it
# comes from PyTorch's CPU index. pip fails rather than fall back to a CUDA build. PyPI's macOS
# and Windows wheels are CPU builds.
ifeq ($(OS_NAME),Linux)
define INSTALL_TORCH
	if $(VENV)/bin/pip install -q --no-index --no-deps '$(TORCH_PIN)+cpu' 2>/dev/null; then \
		$(VENV)/bin/pip install -q '$(TORCH_PIN)+cpu'; \
	else \
		$(VENV)/bin/pip install -q --index-url '$(TORCH_INDEX_URL)' $(TORCH_PIN); \
	fi
endef
else
INSTALL_TORCH = $(VENV)/bin/pip install -q $(TORCH_PIN)
endif

# Azurite, Azure Blob's emulator for the az:// tests, from npm into the venv (tests/conftest.py
# looks there; on CI a missing azurite fails those tests rather than skipping them).
AZURITE_PIN := azurite@3.37.0
AZURITE := $(VENV)/azurite/node_modules/.bin/azurite-blob

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(INSTALL_TORCH)
	$(VENV)/bin/pip install -q -e '.[all,dev]'
	touch $(STAMP)

# npm comes from Debian's packages where it is missing and we may install them (CI runs as root).
$(AZURITE):
	@if ! command -v npm >/dev/null; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -qq && apt-get install -y -qq nodejs npm; \
		else echo "npm is needed for azurite: install nodejs and npm (e.g. apt-get install -y npm)"; exit 1; fi; \
	fi
	@# The registry's index can name a dependency version before it serves it (seen: ETARGET for
	@# @azure/msal-common): a failed install is tried again, three times in all.
	for try in 1 2 3; do \
		npm install --prefix $(VENV)/azurite --no-audit --no-fund --loglevel=error $(AZURITE_PIN) && exit 0; \
		echo "npm install failed (try $$try of 3)"; sleep 10; \
	done; exit 1

run: $(STAMP)
	$(VENV)/bin/ckptflow run pipeline --local

test: $(STAMP) $(AZURITE)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest -q -n auto --dist loadscope

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

fmt: $(STAMP)
	$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .

# --- Running it on a cluster (needs Docker, k3d and kubectl; see README "Run it on a cluster")
IMAGE ?= ckptflow-steps:0.1.0
CLUSTER ?= ckptflow

.PHONY: image image-cuda cluster cluster-down e2e

image:
	docker build -f images/step.Dockerfile --build-arg TORCH_INDEX_URL=$(TORCH_INDEX_URL) -t $(IMAGE) .

# PyPI's Linux torch wheels bundle CUDA: the same image with GPU support (several GB larger).
image-cuda:
	$(MAKE) image TORCH_INDEX_URL=https://pypi.org/simple IMAGE=$(IMAGE)-cuda

cluster: image
	CLUSTER=$(CLUSTER) IMAGE=$(IMAGE) deploy/cluster-up.sh

cluster-down:
	CLUSTER=$(CLUSTER) deploy/cluster-down.sh

# The cluster-marked tests, against the cluster `make cluster` made; a missing cluster fails.
e2e: $(STAMP)
	CKPTFLOW_E2E_REQUIRE=1 CKPTFLOW_E2E_IMAGE=$(IMAGE) CKPTFLOW_E2E_CONTEXT=k3d-$(CLUSTER) \
		$(VENV)/bin/python -m pytest -m cluster tests/e2e -v
