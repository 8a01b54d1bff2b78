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

.PHONY: help setup system-packages tools build up down status test test-only lint crds demo clean

help:
	@echo "make demo    - set up, start the local services and run the demo"
	@echo "make test    - set up, start the local services, run all tests, stop the services"
	@echo "make setup   - install system packages, Kafka and the control plane (idempotent)"
	@echo "make up/down - start/stop Kafka and the local Kubernetes control plane"
	@echo "make lint    - rustfmt and clippy"
	@echo "make crds    - regenerate crds/streamapp.dev_streamapps.yaml from the Rust types"

setup: system-packages tools build

system-packages:
	@dev/install-system-packages.sh

tools:
	@dev/install-kafka.sh
	@dev/install-kube.sh

build:
	$(CARGO) build $(CARGO_FLAGS) --bins

up: build
	@dev/kafka.sh start
	@dev/kube.sh start

down:
	@dev/kube.sh stop
	@dev/kafka.sh stop

status:
	@dev/kafka.sh status
	@dev/kube.sh status

# Services are stopped whatever the tests' outcome; the exit code is the tests'.
test: setup
	@$(MAKE) --no-print-directory up
	@status=0; $(MAKE) --no-print-directory test-only || status=$$?; \
	  $(MAKE) --no-print-directory down; exit $$status

# The tests alone, against services that are already up (`make up`).
test-only:
	$(CARGO) test $(CARGO_FLAGS) --no-fail-fast

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy $(CARGO_FLAGS) --all-targets -- -D warnings

# The generated CustomResourceDefinition (a test fails when it drifts from api/src/crd.rs).
crds:
	$(CARGO) run --release --locked -p streamapp-operator --bin crdgen > crds/streamapp.dev_streamapps.yaml.tmp
	mv crds/streamapp.dev_streamapps.yaml.tmp crds/streamapp.dev_streamapps.yaml

demo: setup
	@echo "the demo is not built yet (see the issue 'Helm chart, container image recipe, README, and the one-command local demo')" >&2
	@exit 1

clean: down
	rm -rf "$(STREAMAPP_RUN)"
