# The README's two commands are `make demo` and `make test`; every other target serves them.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help setup system-deps test-deps jars demo test lint typecheck unit integration clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

# Bytecode compiled at install: uv does not by default, and where Python may not write it at
# run time (PYTHONDONTWRITEBYTECODE, set on this project's machines and in many containers),
# every process (the CLI, each Spark Python worker, each test's subprocess) compiled every module
# it imports from source, pandas included: 2.4 CPU s for `import pipeline.silence`, against
# 0.9-1.0 s (docs/PERFORMANCE.md). Our own packages are compiled too; a module edited since is
# compiled again in memory, as before.
$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit("Python 3.10+ is required, found " + sys.version.split()[0]) if sys.version_info < (3, 10) else None'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check uv
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -e '.[all,dev]'
	$(BIN)/python -m compileall -q infra simulator pipeline models dashboard iotfraud
	touch $(STAMP)

system-deps: ## Debian packages the demo needs (Java 17); no-op when present
	@./scripts/system-deps.sh demo

test-deps: ## Debian packages only the tests need (headless Chromium, docker-compose); no-op when present
	@./scripts/system-deps.sh test

setup: system-deps $(STAMP) jars ## create the virtualenv, install packages and jars

jars: $(STAMP) ## resolve the Kafka broker and Spark connector jars into ~/.cache/iotfraud
	$(BIN)/iotfraud stack jars

demo: setup ## set everything up and run the demo
	$(BIN)/iotfraud demo

lint: $(STAMP) ## ruff lint and format check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP) ## mypy (strict) on the packages
	$(BIN)/mypy

unit: $(STAMP) ## the fast loop: unit tests only
	$(BIN)/pytest tests/unit -q

# The bounded demo first, alone: its alerts are what a user sees on a machine that runs only the
# demo (beside another test's Spark job they lagged by minutes, and two more model alerts stood).
# Then two workers on the two cores, each with its own broker and SparkSession; much of an
# integration test's time is waiting (a simulator streaming in real time, a broker restarting),
# which the other worker's tests fill. A third worker only slowed every test down, until two ran
# past their deadlines on CI (docs/PERFORMANCE.md).
# worksteal: a worker that runs out takes half of what another has left, so the long tests
# (first) never end the run alone.
# The two steps share the suite's 45 minutes: the demo's step has at most 12 of them, the second
# step whatever the first left (a demo done in 8 minutes leaves it 37).
# The second step's JVMs (Spark, brokers) run on the client compiler only: they live for seconds
# to minutes on small inputs, where the optimizing compiler's threads cost more CPU than its code
# saves. The client compiler alone gets a code cache of 48 MB, which a Spark JVM fills within
# minutes; the compiler is then switched off ("CodeCache is full") and every method run later is
# interpreted, or a query fails ("Out of space in CodeCache"): hence the tiered default, 240 MB.
# Its Spark sessions take tests/spark-conf/spark-defaults.conf (expressions not compiled). The
# demo keeps the JVM's and Spark's defaults (docs/PERFORMANCE.md).
TEST_JVM := -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:ReservedCodeCacheSize=240m
SUITE_S := 2700
test: setup test-deps lint typecheck ## set everything up and run the whole suite
	start=$$(date +%s); \
	$(BIN)/pytest -q -m e2e -o session_timeout=720 && \
	JAVA_TOOL_OPTIONS="$(TEST_JVM)" SPARK_CONF_DIR="$(CURDIR)/tests/spark-conf" \
	  $(BIN)/pytest -q -m "not e2e" -n 2 --dist worksteal \
	    -o session_timeout=$$(( $(SUITE_S) - $$(date +%s) + start ))

clean: ## stop the local stack and remove local state (keeps the jar cache)
	-$(BIN)/iotfraud stack down
	rm -rf .iotfraud .pytest_cache .mypy_cache .ruff_cache
