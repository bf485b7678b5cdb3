# The project's commands (see README.md). Every target does its own set-up.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test unit integration lint jars plugin demo cluster-up cluster-down cluster-status bench chaos clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is needed: set PYTHON=python3.11")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "[setup] installing the project and its dev tools into $(VENV)"
	@$(PY) -m pip install --quiet --upgrade pip
	@$(PY) -m pip install --quiet -e '.[dev,spark,demo]'
	@touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Two lines at once, on different resources: `lint` and the unit tests (no broker, no Java) run beside, at a lower
# priority, their output kept in $(BESIDE_LOG) and shown once the integration tests end; in front, the broker's jars
# (once, with progress), the broker plugin (Java, with its JUnit tests) and the integration tests against a real
# broker. The target fails when either line failed.
BESIDE_LOG := .pytest_cache/lint-and-unit.log
# The integration tests' JVMs (brokers, bookies, Spark) start and stop dozens of times and run light loads: with the
# C1 compiler alone they start faster (three brokers: 29 s to 17 s here). Benchmarks, chaos and clusters keep Java's default.
INTEGRATION_ENV := JAVA_TOOL_OPTIONS="-XX:TieredStopAtLevel=1 $${JAVA_TOOL_OPTIONS:-}"
test: $(STAMP)
	@mkdir -p $(dir $(BESIDE_LOG))
	@echo "[test] ruff, mypy and the unit tests run beside the rest; their report comes at the end ($(BESIDE_LOG))"
	@( nice -n 10 $(MAKE) --no-print-directory lint && \
	   nice -n 10 $(PY) -m pytest -m unit -q -p no:cacheprovider ) > $(BESIDE_LOG) 2>&1 & beside=$$!; \
	$(MAKE) --no-print-directory plugin && $(INTEGRATION_ENV) $(PY) -m pytest -m integration -q --durations=20; front=$$?; \
	wait $$beside; beside_status=$$?; \
	echo "[test] ruff, mypy and the unit tests (run beside):"; cat $(BESIDE_LOG); \
	echo "[test] lint and unit: $$(test $$beside_status = 0 && echo passed || echo FAILED);" \
	     "plugin and integration: $$(test $$front = 0 && echo passed || echo FAILED)"; \
	test $$beside_status = 0 && test $$front = 0

jars: $(STAMP)
	$(PY) -m devtools.local_cluster fetch

plugin: jars
	$(PY) -m devtools.plugin --test

unit: $(STAMP)
	$(PY) -m pytest -m unit -q

integration: $(STAMP)
	$(INTEGRATION_ENV) $(PY) -m pytest -m integration -q

# AUTH=token: token authentication and authorization (docs/SECURITY.md); tokens in .cluster/auth/
# BROKERS=3: a multi-broker cluster (metadata store, bookie, 3 brokers, a generator per broker)
cluster-up: $(STAMP)
	$(PY) -m devtools.local_cluster up $(if $(AUTH),--auth $(AUTH)) $(if $(BROKERS),--brokers $(BROKERS))

cluster-down: $(STAMP)
	$(PY) -m devtools.local_cluster down

cluster-status: $(STAMP)
	$(PY) -m devtools.local_cluster status

demo: $(STAMP)
	$(PY) -m demo

bench: $(STAMP)
	$(PY) -m bench

# Randomized fault scenarios on a local broker of its own; CHAOS_SEED=N reproduces a run.
# CLUSTER=multi: on a cluster of several brokers of its own (BROKERS=3), with topics moved and brokers killed.
CHAOS_SCENARIOS ?= $(if $(filter multi,$(CLUSTER)),100,200)
chaos: $(STAMP)
	$(PY) -m tests.chaos --scenarios $(CHAOS_SCENARIOS) $(if $(CHAOS_SEED),--seed $(CHAOS_SEED)) \
		$(if $(CLUSTER),--cluster $(CLUSTER)) $(if $(BROKERS),--brokers $(BROKERS)) --record

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
