# What a new user runs: `make demo`, and `make test` before pushing; CI runs `make check` (.ci/run).
# The test lanes (README, "Tests"; tests/conftest.py gives each test folder its markers):
#   make unit   the pure tests, no control plane (about 45 s);
#   make test   lint, every unit test, the simulation at 10,000 trials, and per feature the one test
#               that drives it end to end against the real API server (at most 8 minutes);
#   make check  everything: the slow integration and e2e tests, the 100,000-trial simulation, the
#               fault injection, the real node's tests and a quick run of every benchmark.
VENV ?= .venv
# The interpreter the venv is made from: the distribution's CPython first, when it is 3.11 or newer
# and can make a venv (distributions build it with PGO and LTO, as python:3.11.7, the images' base,
# is built), else the first python3 on PATH. A default pyenv build has neither (and a shared
# libpython): it runs the simulation's CI batch about 1.3 times slower (docs/simulation.md).
# `make PYTHON=/path/to/python3` chooses another. An existing venv stays what it was made from (a venv
# cannot be remade over by another interpreter): `rm -rf .venv` first to rebuild it.
PYTHON ?= $(shell for p in /usr/bin/python3 python3; do \
  $$p -c 'import sys, ensurepip; sys.exit(sys.version_info < (3, 11) or not ensurepip.version())' \
  >/dev/null 2>&1 && { echo $$p; break; }; done)
BIN := $(VENV)/bin

.PHONY: demo demo-real-node test check lint unit install locks sim sim-bench bench-quick node-deps release
$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || { python="$(PYTHON)"; [ -n "$$python" ] || { echo "make: no python3 3.11+ that can make a venv (Debian/Ubuntu: apt install python3-venv); or make PYTHON=/path/to/python3" >&2; exit 1; }; $$python -m venv $(VENV); }
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

install: $(BIN)/.installed

demo: $(BIN)/.installed
	$(BIN)/coroner demo

# The same job as Coroner ships: its images, DaemonSet and Deployment on two real kubelets.
demo-real-node: $(BIN)/.installed node-deps
	$(BIN)/coroner demo --real-node

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/hadolint images/*.Dockerfile
	$(BIN)/python tests/support/checkov_overlays.py
	# The Helm chart (helm is built from Go modules on first use, like the control plane).
	HELM=$$($(BIN)/python -m coroner_dev.devcluster.tools helm) && \
	  $$HELM lint --strict charts/coroner && \
	  $$HELM template coroner charts/coroner --namespace coroner-system --include-crds >/dev/null && \
	  $$HELM template coroner charts/coroner --namespace coroner-system --include-crds \
	    --set retireGrant.enabled=true,nodeLoss.enabled=true,monitoring.enabled=true >/dev/null

# The real node's system packages (Debian's): buildah and mmdebstrap build the images, catatonit is
# the sandbox (pause) process, libseccomp-dev and gcc let runc load seccomp profiles. Installed
# only where one is missing (root; apt).
NODE_PACKAGES := buildah mmdebstrap catatonit libseccomp-dev gcc
node-deps:
	@missing=$$(for p in $(NODE_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then echo "installing $$missing"; apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi

# pytest prints the slowest tests of every lane (--durations). The simulation's batch has the size
# CORONER_SIM_TRIALS (docs/simulation.md, "The scale goals").
PYTEST_DURATIONS := --durations=25

# The fast lane. The control plane is built on first use (cached under ~/.cache/coroner).
test: lint
	CORONER_SIM_TRIALS=10000 $(BIN)/pytest -m "not slow" $(PYTEST_DURATIONS)

# Everything (what CI runs): builds the control plane, the real node and Coroner's images on first
# use (cached under ~/.cache/coroner), then runs every test, the real node's (tests/node, marker
# `node`) included, and every benchmark once at its smallest size.
# The integration, e2e and fault tests mostly wait on the API server and on processes: they run on
# PYTEST_WORKERS pytest-xdist workers, each with its own control plane, a file (all of tests/faults,
# one fault plane) per worker at a time (tests/conftest.py). Then the rest, serially (the real
# node's tests never run beside another node cluster), then the quick benchmarks. The simulation's
# 100,000-trial batch is CPU work on every CPU while all of that mostly waits: it runs from the
# start to the end beside them, at the lowest priority (nice 19), so it takes only the CPU they leave
# idle. Its output is printed at the end; a failing lane stops the target (and the batch) at once.
# (bench/quick.py, not $(MAKE) bench-quick: make -n runs a line naming $(MAKE).)
PYTEST_WORKERS ?= 2
PARALLEL_TESTS := tests/integration tests/e2e tests/faults
SIM_BATCH := tests/sim/test_sim.py::test_the_ci_batch_of_seeded_trials
check: lint node-deps
	$(BIN)/coroner dev-cluster build --node --karpenter
	log=$$(mktemp); \
	CORONER_SIM_TRIALS=100000 nice -n 19 $(BIN)/pytest $(SIM_BATCH) $(PYTEST_DURATIONS) >$$log 2>&1 & batch=$$!; \
	stop() { pkill -P $$batch 2>/dev/null; kill $$batch 2>/dev/null; cat $$log; rm -f $$log; exit 1; }; \
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PARALLEL_TESTS) $(PYTEST_DURATIONS) || stop; \
	$(BIN)/pytest $(addprefix --ignore=,$(PARALLEL_TESTS)) --deselect $(SIM_BATCH) $(PYTEST_DURATIONS) || stop; \
	$(BIN)/python bench/quick.py || stop; \
	wait $$batch; sim=$$?; cat $$log; rm -f $$log; \
	echo "simulation batch exit $$sim"; \
	test $$sim -eq 0

# The pure tests, on every core (they start no cluster and no process to share).
unit: $(BIN)/.installed
	$(BIN)/pytest -n $(PYTEST_WORKERS) -m "unit and not sim" $(PYTEST_DURATIONS)

# Every benchmark at its smallest size, its results in a temporary directory (never bench/results):
# that each still starts, runs and writes its record. BENCH_OUT=DIR keeps them there.
bench-quick: $(BIN)/.installed
	$(BIN)/python bench/quick.py $(if $(BENCH_OUT),--out $(BENCH_OUT))

# The deterministic simulation (docs/simulation.md): the CI batch of 100,000 seeded trials over every
# CPU and the mutants (`make check` runs it too; `make test` at 10,000); sim-bench runs 1,000,000 into bench/results/sim.json,
# resumably: stop it at any time (^C) and run it again to continue where it stopped.
sim: $(BIN)/.installed
	$(BIN)/pytest -q tests/sim

sim-bench: $(BIN)/.installed
	$(BIN)/python bench/sim.py --resume

# The images' hashed locks (images/<name>.lock): one per deployable, from pyproject's extras; the
# registrar's is the base dependencies alone (it needs no extra). The operator image also carries
# the CLI (its `cli` extra), so that the chart's `helm test` runs `kubectl coroner doctor` in it.
locks: $(BIN)/.installed
	$(BIN)/uv pip compile pyproject.toml --extra agent --universal --python-version 3.11 \
	  --generate-hashes --no-header --quiet -o images/agent.lock
	$(BIN)/uv pip compile pyproject.toml --extra operator --extra cli --universal --python-version 3.11 \
	  --generate-hashes --no-header --quiet -o images/operator.lock
	$(BIN)/uv pip compile pyproject.toml --universal --python-version 3.11 \
	  --generate-hashes --no-header --quiet -o images/registrar.lock
	$(BIN)/uv pip compile pyproject.toml --extra cli --universal --python-version 3.11 \
	  --generate-hashes --no-header --quiet -o plugins/kubectl-coroner.lock

# The release, into dist/ (coroner_dev.release says what it holds): the images as OCI archives and
# their SBOMs (syft, built from Go modules on first use), install.yaml for plan-only and production,
# the chart, the kubectl plugin and its krew manifest, release notes, SHA256SUMS. Reproducible: two
# runs give the same SHA256SUMS. RELEASE_FLAGS=--no-images skips the images and SBOMs.
release: $(BIN)/.installed
	$(BIN)/python -m coroner_dev.release --out dist $(RELEASE_FLAGS)
