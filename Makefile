# Two entry points on a fresh clone:
#   make repro   set up .venv from pinned dependencies, then run the pipeline (dvc repro)
#   make test    same set-up, then the test suite (unit + one end-to-end dvc repro)
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: setup repro test test-unit bench clean-venv

setup: $(STAMP)

# torch==2.13.0 resolves to the CPU build on CPU hosts and the CUDA build on GPU hosts.
# speculators/hs-connectors go in with --no-deps: they declare torchvision and torchaudio, which
# they never import; their real runtime dependencies are pinned in pyproject.toml.
$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	$(BIN)/pip install --quiet --no-deps speculators==0.9.0 hs-connectors==0.9.0
	touch $(STAMP)

repro: setup
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/dvc repro

test: setup
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-unit: setup
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m pytest -q -m "not e2e" $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
