# deltaferry — the two commands a newcomer needs: `make demo` and `make test`.
# Both run `make setup` first; setup is idempotent (stamp files skip what is already done).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
DEPS   := $(CURDIR)/.deps
MVN    := mvn -q -B -Dmaven.repo.local=$(HOME)/.m2/repository
UV_VERSION := 0.13.9
# The dlt pipeline's own venv (bench/dlt_pipeline.py): dlt never enters the product's .venv.
DLT_VENV := .venv-dlt

.PHONY: setup deps class-archive browser lint docs test test-unit test-integration demo airflow stack-up stack-down bench bench-airflow bench-protobuf bench-notebook bench-merge bench-layout bench-cluster bench-ui bench-goals bench-fleet bench-peers lock lock-dlt clean help

help:
	@echo "make demo   - local Kafka, sample events, one DAG run through Airflow, the resulting table"
	@echo "make airflow - a local Airflow in the background (http://localhost:8080, user admin) on the repo's DAGs (CONNECT=1: steps on the stack's Spark Connect server)"
	@echo "make test   - lint and type checks, unit tests, the docs' strict build, then integration tests on a real broker and Spark"
	@echo "make docs   - build the documentation site into site/ (mkdocs, strict: broken links fail)"
	@echo "make setup  - install pinned Python deps into .venv, resolve pinned jars and build the Schema Registry into .deps"
	@echo "make bench  - ingest/inference benchmark (N=... MSG_BYTES=...)"
	@echo "make bench-airflow - demo-run and idle-run times through a real Airflow scheduler"
	@echo "make bench-protobuf - protobuf decode rate per core; protobuf vs JSON ingest (N=...)"
	@echo "make bench-goals - the performance goals against their targets, one table; exit 1 if one is NOT MET (N=... REPEATS=...)"
	@echo "make bench-notebook - deltaferry vs a port of the notebook it replaces (Spark's defaults and deltaferry's session): backlog and +5 % (N=... REPEATS=...)"
	@echo "make bench-merge - MERGE cost vs table size (deletion vectors off/on); a 2 M-message backlog's memory"
	@echo "make bench-layout - files a query filtering on the clustering column reads, with and without cluster_by (ROWS=... BATCHES=...)"
	@echo "make bench-cluster - the same backlog on local[2] and on the stack's two-worker Spark cluster (N=...)"
	@echo "make bench-ui - time of each deltaferry page of the Airflow UI on the demo data"
	@echo "make bench-peers - deltaferry vs the notebook port vs a dlt pipeline, same topic: backlog and +5 % (N=... REPEATS=... LARGE=1)"
	@echo "make bench-fleet - 24 topics x 3,000 messages all due at once through Airflow: wall time, drivers, memory, fixed cost (CONNECT=1: on the stack's Spark Connect server)"
	@echo "make stack-down - stop the local Airflow and the local stack"

setup: deps class-archive

# What the checks need: the pinned Python deps, the jars, the Schema Registry, the metastore.
deps: $(VENV)/.installed $(DEPS)/jars/spark/.resolved $(DEPS)/jars/kafka/.resolved $(DEPS)/registry/.built $(DEPS)/metastore/.resolved
	@git rev-parse --git-dir >/dev/null 2>&1 && git config core.hooksPath .githooks || true  # the commit convention

# The driver JVM's class archive (once per JVM and jars; a no-op when it is there).
class-archive: deps
	@$(BIN)/python -m deltaferry.spark.class_archive

$(VENV)/.tools:
	scripts/ensure-tools.sh
	mkdir -p $(VENV) && touch $@

# Bytecode compiled at install (uv does not by default), deltaferry's own modules too: where
# PYTHONDONTWRITEBYTECODE is set (the development machine sets it) no process caches what it
# compiles, so each compiled every module it imports from source, every time (`import
# airflow.sdk` 10.9 CPU-s instead of 3.4 in each Airflow process, `import pyspark.sql` 1.4 s
# instead of 0.4). A module edited later is compiled again in memory, as before.
$(VENV)/.installed: requirements.lock overrides.txt pyproject.toml dev/pyproject.toml | $(VENV)/.tools
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check uv==$(UV_VERSION)
	$(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python --override overrides.txt -r requirements.lock
	$(BIN)/uv pip install -q --python $(BIN)/python --no-deps -e .
	$(BIN)/uv pip install -q --python $(BIN)/python --no-deps -e dev/  # the harness: deltaferry_dev
	$(BIN)/python -m compileall -q deltaferry dev/deltaferry_dev
	touch $@

$(DEPS)/jars/spark/.resolved: jvm/spark/pom.xml $(VENV)/.installed
	rm -rf $(DEPS)/jars/spark
	cd jvm/spark && $(MVN) dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(DEPS)/jars/spark
	$(BIN)/python -m deltaferry.jvm
	touch $@

$(DEPS)/jars/kafka/.resolved: jvm/kafka/pom.xml | $(VENV)/.tools
	rm -rf $(DEPS)/jars/kafka
	cd jvm/kafka && $(MVN) dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(DEPS)/jars/kafka
	touch $@

# The whole check, timed: its total in minutes is its last line (CI's budget is 35). The class
# archive's build, the lint, the unit tests, the browser's install and the docs run side by
# side (each a core at most, the install mostly waits), then the integration tests.
test: deps
	@started=$$(date +%s); status=0; \
	$(MAKE) --no-print-directory -j3 --output-sync=target class-archive lint test-unit browser docs \
	&& $(MAKE) --no-print-directory test-integration || status=$$?; \
	took=$$(( $$(date +%s) - started )); \
	echo "make test: $$((took / 60)) min $$((took % 60)) s in all (exit $$status)"; exit $$status

# ruff (style, imports, bugbear) and mypy over the library, the harness, the tests, the
# benchmarks, the DAGs, the spark-submit entry points.
lint: deps
	$(BIN)/ruff check deltaferry spark_jobs dev tests bench dags plugins
	$(BIN)/mypy deltaferry dev/deltaferry_dev

test-unit: deps
	$(BIN)/pytest tests/unit -q

browser:
	@scripts/ensure-browser.sh

# The documentation site (mkdocs.yml, docs/) into site/; strict: a broken link or anchor, or a
# page left out of the navigation, fails the build.
docs: deps
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The UI's browser tests need Debian's chromium and chromium-driver (`browser`: installed when
# missing).
# Two processes (pytest-xdist), a test file at a time each, so a file's module fixtures (its
# Airflow, a stack part it stops) stay in one process; the files sharing one Airflow
# (tests/integration/airflow_shared.py) go to one process together (conftest.py's scheduler).
# The slowest start first, in conftest.py's order (--no-loadscope-reorder: xdist would
# otherwise start the files with the most tests first). INTEGRATION_WORKERS=1 runs them one after another.
INTEGRATION_WORKERS ?= 2
test-integration: setup browser
	$(BIN)/pytest tests/integration -q -m integration --durations=25 -n $(INTEGRATION_WORKERS) --dist loadfile --no-loadscope-reorder

demo: setup
	$(BIN)/python -m deltaferry_dev.demo

# A local Airflow (api-server, scheduler, dag-processor, triggerer) in .airflow/, in the
# background, on the local stack: http://localhost:8080 (or AIRFLOW__API__PORT, or a free port).
# CONNECT=1: the tasks run their steps on the stack's Spark Connect server (`airflow up --connect`).
airflow: setup
	@$(BIN)/deltaferry airflow up $(if $(CONNECT),--connect)

stack-up: setup
	@$(BIN)/deltaferry stack up

stack-down:
	@test ! -x $(BIN)/deltaferry || $(BIN)/deltaferry airflow down
	@test ! -x $(BIN)/deltaferry || $(BIN)/deltaferry stack down

bench: setup
	$(BIN)/python bench/bench_pipeline.py $(if $(N),--messages $(N)) $(if $(MSG_BYTES),--message-bytes $(MSG_BYTES))

# The performance goals: notebook ratios, ingest rate, micro-batch cost (warm, and
# cold beside it), MERGE scaling, a 2 M backlog's memory, each phase's time; one table at the
# end, also in bench/out/goals-*.md; exits 1 when a goal is NOT MET. Needs a quiet machine.
bench-goals: setup
	$(BIN)/python bench/bench_goals.py $(if $(N),--messages $(N)) $(if $(REPEATS),--repeats $(REPEATS))

# deltaferry against the notebook it replaces (its port: bench/seed004_port.py), fresh processes.
bench-notebook: setup
	$(BIN)/python bench/bench_notebook.py $(if $(N),--messages $(N)) $(if $(REPEATS),--repeats $(REPEATS))

# MERGE cost as the table grows (20 k vs 2 M rows), and a 2 M-message backlog's batches and memory.
bench-merge: setup
	$(BIN)/python bench/bench_merge.py

# Layout: the files a query filtering on the clustering column reads, with and without cluster_by.
bench-layout: setup
	$(BIN)/python bench/bench_layout.py --rows $(or $(ROWS),400000) --batches $(or $(BATCHES),20)

# Protobuf: decode rate per core, and a protobuf topic's ingest next to a JSON one of the same content.
bench-protobuf: setup
	$(BIN)/python bench/bench_protobuf.py $(if $(N),--messages $(N))

# The same backlog on local[2] and on the stack's two-worker Spark standalone cluster.
bench-cluster: setup
	$(BIN)/python bench/bench_cluster.py $(if $(N),--messages $(N))

# What an hourly DAG run costs through a real Airflow scheduler: the demo's run, an idle run.
bench-airflow: setup
	$(BIN)/python bench/bench_airflow.py

# Each deltaferry page of the Airflow UI on the demo data (a running local Airflow, else in-process).
bench-ui: setup
	$(BIN)/python bench/bench_ui.py

bench-fleet: setup
	$(BIN)/python bench/bench_fleet.py $(if $(TOPICS),--topics $(TOPICS)) $(if $(N),--messages $(N)) $(if $(CONNECT),--connect)

# deltaferry, the notebook's port and a dlt pipeline (bench/dlt_pipeline.py, run by .venv-dlt's
# Python) side by side on one topic, the tables verified equal; exits 1 when a goal is NOT MET.
bench-peers: setup $(DLT_VENV)/.installed
	$(BIN)/python bench/bench_peers.py --dlt-python $(DLT_VENV)/bin/python $(if $(N),--messages $(N)) $(if $(REPEATS),--repeats $(REPEATS)) $(if $(LARGE),--large)

# dlt's venv from its lock (exact pins, Python 3.11); idempotent: a stamp per lock.
$(DLT_VENV)/.installed: bench/dlt-requirements.lock | $(VENV)/.installed
	test -x $(DLT_VENV)/bin/python || $(BIN)/uv venv -q --python 3.11 $(DLT_VENV)
	$(BIN)/uv pip sync -q --compile-bytecode --python $(DLT_VENV)/bin/python bench/dlt-requirements.lock
	touch $@

# The local Schema Registry: Apicurio Registry 2.4.2.Final built as a Quarkus app from Maven
# Central (jvm/registry/pom.xml): registry-runner.jar and its lib/ into .deps/registry, which
# `deltaferry stack up` starts. About 210 MB of downloads and a minute the first time.
$(DEPS)/registry/.built: jvm/registry/pom.xml jvm/registry/src/main/resources/application.properties | $(VENV)/.tools
	rm -rf $(DEPS)/registry jvm/registry/target
	cd jvm/registry && $(MVN) package
	mkdir -p $(DEPS)/registry
	cp -r jvm/registry/target/registry-runner.jar jvm/registry/target/lib $(DEPS)/registry/
	touch $@

# The local Hive Metastore (`deltaferry stack up --catalog`): the standalone metastore, its
# Hadoop and PostgreSQL's JDBC driver from Maven Central (jvm/metastore/pom.xml) into
# .deps/metastore/lib, its PostgreSQL schema scripts into .deps/metastore/scripts. Its database
# is Debian's PostgreSQL, which scripts/ensure-tools.sh installs.
$(DEPS)/metastore/.resolved: jvm/metastore/pom.xml | $(VENV)/.tools
	scripts/ensure-tools.sh  # PostgreSQL's server, on a checkout set up before it was needed
	rm -rf $(DEPS)/metastore
	cd jvm/metastore && $(MVN) dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(DEPS)/metastore/lib
	tar -xzf $(DEPS)/metastore/lib/hive-standalone-metastore-*-bin.tar.gz -C $(DEPS)/metastore --strip-components=1 --wildcards '*/scripts/metastore/upgrade/postgres'
	rm $(DEPS)/metastore/lib/*.tar.gz
	touch $@

# Re-resolve requirements.lock after changing pyproject.toml (needs uv in .venv).
lock:
	$(BIN)/uv pip compile pyproject.toml --extra airflow --extra dev --python-version 3.11 --override overrides.txt -o requirements.lock

# Re-resolve dlt's lock after changing bench/dlt-requirements.in.
lock-dlt:
	$(BIN)/uv pip compile bench/dlt-requirements.in --python-version 3.11 -o bench/dlt-requirements.lock

clean: stack-down
	rm -rf $(VENV) $(DLT_VENV) .deps .stack warehouse .airflow
