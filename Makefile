# StreamApp developer commands. The two a newcomer needs:
#   make demo   set everything up and run the local demo (Kafka, control plane, operator, app)
#   make test   set everything up and run every test, against real services
# Downloads and builds are cached in $(STREAMAPP_CACHE) (default ~/.cache/streamapp).

SHELL := /bin/bash
export STREAMAPP_CACHE ?= $(HOME)/.cache/streamapp
export STREAMAPP_RUN ?= $(STREAMAPP_CACHE)/run
# One persistent target dir outside the clone: RocksDB's C++ is built once per machine.
export CARGO_TARGET_DIR ?= $(STREAMAPP_CACHE)/target
CARGO := cargo
CARGO_FLAGS := --release --workspace --locked

.PHONY: help setup system-packages tools kafka-jars control-plane build bench-tools base-images images up down status test test-only test-build test-run test-nodes bench bench-compare lint crds demo demo-down clean

help:
	@echo "make demo    - set up, start the local services and run the demo"
	@echo "make demo-down - stop the demo and the local services"
	@echo "make test    - set up, start the local services, run all tests, stop the services"
	@echo "make setup   - install system packages, Kafka and the control plane (idempotent)"
	@echo "make up/down - start/stop the test bed: Kafka, the Kubernetes control plane and real nodes (NODE_COUNT, default 3)"
	@echo "make test-nodes - only the tests that need three nodes, against 'make up'"
	@echo "make images  - build the node's images (Debian base, pause, the project's image) with podman"
	@echo "make bench   - processor benchmark: dedup vs a transactional copy, 1M records (needs make up)"
	@echo "make bench-compare - side by side with Kafka Streams 4.4: table, CSV, chart (hours at full size; two halves: docs/performance.md)"
	@echo "make lint    - rustfmt and clippy"
	@echo "make crds    - regenerate crds/streamapp.dev_streamapps.yaml from the Rust types"

# What does not depend on each other runs side by side (-j): the Go build of the control plane,
# the downloads (Kafka's jars, the Debian base image) and the Rust build each leave a core idle
# part of the time (links, one large crate, the network).
SETUP_PARTS := tools build base-images
setup: system-packages
	@$(MAKE) --no-print-directory -j4 $(SETUP_PARTS)

system-packages:
	@dev/install-system-packages.sh

tools: kafka-jars control-plane

kafka-jars:
	@dev/install-kafka.sh

control-plane:
	@dev/install-kube.sh

build:
	$(CARGO) build $(CARGO_FLAGS) --bins

# What the comparison needs besides the broker (`make test` runs a small one): the Kafka Streams
# peer (bench/kafka-streams, through Maven; after Kafka's jars, which use the same local Maven
# repository) and the chart's virtualenv.
bench-tools: kafka-jars
	@dev/bench-compare.sh prepare

# The node's Debian base and pause images (the project's image needs `build`: `images`).
base-images:
	@dev/image.sh base

# The project's image from the binaries of `build` (Dockerfile target `prebuilt`), on a Debian
# base made here; the pause image of the node.
images: build
	@dev/image.sh build

# The test bed, in network namespaces of its own (dev/net.sh): Kafka and the control plane in the
# hub, and NODE_COUNT real nodes (containerd + kubelet + kube-proxy, each in a namespace of its
# own) that run the project's image.
up: images
	@dev/net.sh start
	@dev/kafka.sh start
	@dev/kube.sh start
	@dev/node.sh start

down:
	@dev/node.sh stop
	@dev/kube.sh stop
	@dev/kafka.sh stop
	@dev/net.sh stop

status:
	@dev/net.sh status
	@dev/kafka.sh status
	@dev/kube.sh status
	@dev/node.sh status

# Every run starts from an empty test bed (fresh Kafka log, fresh etcd) and stops it whatever
# the tests' outcome; the exit code is the tests'.
# The set-up (with what the comparison needs) side by side as in `setup`, and the tests compiled
# while the test bed starts.
test: system-packages
	@$(MAKE) --no-print-directory -j4 $(SETUP_PARTS) bench-tools
	@$(MAKE) --no-print-directory down
	rm -rf "$(STREAMAPP_RUN)"
	@$(MAKE) --no-print-directory -j2 up test-build
	@status=0; $(MAKE) --no-print-directory test-run || status=$$?; \
	  $(MAKE) --no-print-directory down; exit $$status

# The tests alone, against services that are already up (`make up`): the workspace's tests and
# a small run of the Kafka Streams comparison for its exactly-once checks. Everything runs even
# when something fails; the exit code says whether all passed.
test-only: test-build
	@$(MAKE) --no-print-directory test-run

# Every test binary, and the comparison's (after `build`: one cargo at a time holds the target
# directory).
test-build: build
	$(CARGO) test $(CARGO_FLAGS) --features streamapp-e2e/three-nodes --no-run
	$(CARGO) bench --locked -p streamapp-processor --bench vs_kafka_streams --no-run

# Two lanes side by side (dev/test-run.sh): the processor's integration tests, and every other
# test followed by the comparison's smoke.
test-run:
	@dev/test-run.sh

# Only the tests that need three real nodes (e2e/tests/nodes; `make test` runs them too), against
# services that are already up with three nodes (`make up`).
# (--workspace: the features of the dependencies stay those of every other build, so nothing
# is rebuilt but the test.)
NODES_TEST := $(CARGO_FLAGS) --features streamapp-e2e/three-nodes --test nodes
test-nodes: build
	$(CARGO) test $(NODES_TEST) --no-run
	dev/net.sh exec $(CARGO) test $(NODES_TEST) --offline

# The processor benchmark (processor/benches/dedup_vs_copy.rs) against the broker of `make up`:
# the dedup topology next to a plain transactional copy, figures and ratios; asserts nothing.
# `cargo bench` uses the bench profile, which inherits release and shares its build dir.
bench:
	$(CARGO) bench --locked -p streamapp-processor --bench dedup_vs_copy --no-run
	dev/net.sh exec $(CARGO) bench --locked --offline -p streamapp-processor --bench dedup_vs_copy

# streamapp-processor next to Kafka Streams 4.4 (bench/kafka-streams) on the local broker, at
# its defaults and tuned, with a transactional copy as the ceiling: steady-state throughput, CPU,
# latency, memory (3 runs, medians), recovery after kill -9 with 1M and 5M keys. Installs the
# Java side through Maven; starts Kafka if needed. Writes bench/results/vs-kafka-streams.*.
bench-compare: system-packages
	@dev/bench-compare.sh

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy $(CARGO_FLAGS) --all-targets -- -D warnings

# The generated CustomResourceDefinition (a test fails when it drifts from api/src/crd.rs).
crds:
	$(CARGO) run --release --locked -p streamapp-operator --bin crdgen > crds/streamapp.dev_streamapps.yaml.tmp
	mv crds/streamapp.dev_streamapps.yaml.tmp crds/streamapp.dev_streamapps.yaml
	mkdir -p docs
	$(CARGO) run --release --locked -p streamapp-operator --bin crdgen -- --reference > docs/spec-reference.md
	cp crds/streamapp.dev_streamapps.yaml charts/streamapp-operator/crds/streamapp.dev_streamapps.yaml

# The local demo keeps running after this returns; `make demo-down` stops it.
demo: setup
	@$(MAKE) --no-print-directory up
	@dev/demo.sh up

demo-down:
	@dev/demo.sh down
	@$(MAKE) --no-print-directory down

clean: down
	rm -rf "$(STREAMAPP_RUN)"
