# batchserve: every command a developer or CI needs. `make test` and `make serve`
# work on a fresh clone: they create .venv and install what they use.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
MODEL_REPO ?= model_repo
PYTEST_ARGS ?=

.PHONY: help venv serve test lint format bytecode unit integration gpu-contract gpu-check models protos dashboards prometheus bench soak fuzz clean

help:
	@echo "make serve    serve ./$(MODEL_REPO) on ports 8000 (HTTP), 8001 (gRPC), 8002 (metrics)"
	@echo "make test     lint, type-check and run the whole test suite"
	@echo "make gpu-contract  the GPU code through the real GPU packages over stub libraries (no GPU needed)"
	@echo "make gpu-check     check this machine's GPU setup (scripts/gpu_check.sh)"
	@echo "make fuzz     fuzz the request decoders, FUZZ_EXAMPLES per target (default 20000: ~10 min; FUZZ_ARGS for pytest)"
	@echo "make models   retrain and re-export the example models into ./$(MODEL_REPO)"
	@echo "make protos   regenerate the protobuf/gRPC modules"
	@echo "make dashboards  regenerate deploy/grafana/batchserve.json from its generator"
	@echo "make bench    ceiling, floors and batchserve in one run -> bench/RESULTS.md (~45 min; BENCH_ARGS=--quick)"
	@echo "make soak     10 min of mixed good/bad load, PASS/FAIL on errors, RSS growth, p99 drift -> bench/SOAK.md (SOAK_ARGS='--duration 120', --leaky)"

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# One stamp per set of extras, remade when pyproject.toml changes. pip byte-compiles what it
# installs one file at a time (68 s of 129 s on 2 cores); compileall does it on every core.
# It exits 1 on the files packages ship for newer Pythons, which pip passes over too.
$(VENV)/.stamp-%: pyproject.toml clients/python/pyproject.toml | $(VENV)/bin/python
	$(PIP) install --quiet --no-compile -e ".[$(subst +,$(comma),$*)]" -e clients/python
	$(PY) -m compileall -q -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null 2>&1 || true
	touch $@

comma := ,
SERVE_EXTRAS := cpu
DEV_EXTRAS := cpu+export+tracing+test

venv: $(VENV)/.stamp-$(DEV_EXTRAS)

serve: $(VENV)/.stamp-$(SERVE_EXTRAS)
	$(VENV)/bin/batchserve serve --model-repository $(MODEL_REPO)

LINTED := server tests scripts bench deploy clients

lint: $(VENV)/.stamp-$(DEV_EXTRAS)
	$(PY) -m ruff format --check $(LINTED)
	$(PY) -m ruff check $(LINTED)
	$(PY) -m mypy
	cd clients/python && $(abspath $(PY)) -m mypy
	$(VENV)/bin/lint-imports --no-logo --no-cache
	$(PY) scripts/gen_protos.py --check
	$(PY) clients/python/scripts/gen_protos.py --check

format: $(VENV)/.stamp-$(DEV_EXTRAS)
	$(PY) -m ruff format $(LINTED)
	$(PY) -m ruff check --fix $(LINTED)

# Unit and integration suites run in separate processes: the integration tests
# load tritonclient's generated protobuf modules, which define the same
# `inference.*` message names as batchserve's own and cannot share a process.
# Test processes run side by side (pytest-xdist), one module to a process at a time, so a
# module's server starts once. Integration tests marked `alone` measure the machine or time a
# deadline tightly: they run after the others, with the cores to themselves.
TEST_PROCESSES ?= 2

# The project's own sources byte-compiled once, up front: the integration suite starts about
# two hundred servers (and their workers), and where PYTHONDONTWRITEBYTECODE is set each would
# compile the package's modules again (0.15-0.2 s of a 1.3 s start). Up-to-date files are
# skipped, so this costs nothing the second time.
bytecode: $(VENV)/.stamp-$(DEV_EXTRAS)
	$(PY) -m compileall -q -j 0 server clients/python/src >/dev/null

unit: $(VENV)/.stamp-$(DEV_EXTRAS) bytecode
	$(PY) -m pytest tests/unit -n $(TEST_PROCESSES) $(PYTEST_ARGS)

# NVIDIA's perf_analyzer binary (tritonclient 2.50.0 wheel) for the protocol tests.
$(VENV)/bin/perf_analyzer: | $(VENV)/.stamp-$(DEV_EXTRAS)
	bash scripts/install_perf_analyzer.sh $(VENV)

# prometheus and promtool (Debian's prometheus package) for the metrics tests.
prometheus:
	bash scripts/install_prometheus.sh

# @grpc/grpc-js for the Node.js example's test (skipped where there is no npm).
NODE_EXAMPLE := clients/examples/node
$(NODE_EXAMPLE)/node_modules/.package-lock.json: $(NODE_EXAMPLE)/package-lock.json
	@if command -v npm >/dev/null; then npm ci --prefix $(NODE_EXAMPLE) --silent --no-audit --no-fund; \
	else echo "npm not found: the Node.js example's test will be skipped"; fi

integration: $(VENV)/.stamp-$(DEV_EXTRAS) bytecode $(VENV)/bin/perf_analyzer prometheus $(NODE_EXAMPLE)/node_modules/.package-lock.json
	$(PY) -m pytest tests/integration -n $(TEST_PROCESSES) --dist loadscope -m "not alone" $(PYTEST_ARGS) $(none_left)
	$(PY) -m pytest tests/integration -m alone $(PYTEST_ARGS) $(none_left)

# pytest exits 5 when it collects nothing: a filter in PYTEST_ARGS (-k) may leave a pass empty.
none_left := || [ $$? -eq 5 ]

# The GPU code (ONNX Runtime providers, cuda-python, NVML, TensorRT 10 and 11) driven through
# the real GPU packages, loaded over stub C libraries built from what those packages link, so
# it runs without a GPU. Its virtualenv is remade when its requirements, the project's or the
# stubs change. One pass with TensorRT 10's Python API on the path, one with 11's.
GPU_CONTRACT_VENV := .venv-gpu-contract
GPU_CONTRACT_STUBS := $(abspath $(GPU_CONTRACT_VENV))/stubs
GPU_CONTRACT_INPUTS := pyproject.toml scripts/gpu_contract_venv.sh \
	$(wildcard tests/gpu_contract/requirements*.txt tests/stubs/*.c tests/stubs/*.py tests/stubs/templates/*)
gpu_contract_pytest = GPU_CONTRACT_STUBS=$(GPU_CONTRACT_STUBS) GPU_CONTRACT_TENSORRT=$(1) \
	LD_LIBRARY_PATH=$(GPU_CONTRACT_STUBS)$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH} \
	PYTHONPATH=$(abspath $(GPU_CONTRACT_VENV))/tensorrt-$(1) $(GPU_CONTRACT_VENV)/bin/python -m pytest

$(GPU_CONTRACT_VENV)/.stamp: $(GPU_CONTRACT_INPUTS)
	bash scripts/gpu_contract_venv.sh $(GPU_CONTRACT_VENV)

gpu-contract: $(GPU_CONTRACT_VENV)/.stamp
	$(call gpu_contract_pytest,10) tests/gpu_contract $(PYTEST_ARGS)
	$(call gpu_contract_pytest,11) tests/gpu_contract/tensorrt $(PYTEST_ARGS)

gpu-check:
	bash scripts/gpu_check.sh

# The GPU contract's virtualenv (about a minute of downloads and unpacking) is built while lint
# type-checks (a minute on one core): on 2 cores neither slows the other much. The project's
# own virtualenv comes first: both install this checkout in editable mode.
test: $(VENV)/.stamp-$(DEV_EXTRAS)
	$(MAKE) --no-print-directory -j2 --output-sync=target lint $(GPU_CONTRACT_VENV)/.stamp
	$(MAKE) --no-print-directory unit integration gpu-contract

# The request decoders (REST, gRPC, binary tensors, validation) fed many generated, mostly
# near-valid requests: each must decode or be refused with a client error. The unit suite
# runs the same targets at a low count; this is the long run, to do before resolving.
FUZZ_EXAMPLES ?= 20000
FUZZ_ARGS ?=
fuzz: $(VENV)/.stamp-$(DEV_EXTRAS)
	FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest tests/fuzz -v $(FUZZ_ARGS)

models: $(VENV)/.stamp-$(DEV_EXTRAS)
	$(PY) -m batchserve.zoo --model-repository $(MODEL_REPO)

protos: $(VENV)/.stamp-$(DEV_EXTRAS)
	$(PY) scripts/gen_protos.py
	$(PY) clients/python/scripts/gen_protos.py

BENCH_ARGS ?=
bench: $(VENV)/.stamp-$(DEV_EXTRAS) $(VENV)/bin/perf_analyzer
	$(PY) -m bench.run $(BENCH_ARGS)

# Exit status 1 when the verdict is FAIL; --leaky serves a model that leaks (it must FAIL).
SOAK_ARGS ?=
soak: $(VENV)/.stamp-$(DEV_EXTRAS)
	$(PY) -m bench.soak $(SOAK_ARGS)

dashboards: $(VENV)/.stamp-$(DEV_EXTRAS)
	$(PY) deploy/grafana/generate_dashboard.py

clean:
	rm -rf $(VENV) $(GPU_CONTRACT_VENV) build .mypy_cache .ruff_cache .pytest_cache
