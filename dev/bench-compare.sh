#!/usr/bin/env bash
# `make bench-compare`: streamapp-processor next to Kafka Streams 4.4 on the local broker
# (processor/benches/vs_kafka_streams.rs). Installs what it needs — Kafka's jars, the Kafka
# Streams peer (bench/kafka-streams, through Maven) and matplotlib (a virtualenv) — all in the
# cache folder; starts the broker (in the test bed's network namespace, dev/net.sh) if it is not
# running (and stops it again at the end); prints
# the table; writes vs-kafka-streams.{txt,csv,png} into $BENCH_RESULTS (default bench/results).
# `dev/bench-compare.sh prepare` only installs: Kafka's jars, the peer, the chart's virtualenv.
# BENCH_PIN=1 pins each system to a core of its own (see below).
# Smaller runs: BENCH_RECORDS, BENCH_RUNS, BENCH_RECOVERY_KEYS, BENCH_LATENCY_SECONDS and the
# other knobs in the doc comment of processor/benches/vs_kafka_streams/main.rs; `make test` runs
# a small one (dev/bench-compare-smoke.sh) for its exactly-once checks.
source "$(dirname "$0")/lib.sh"

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$STREAMAPP_CACHE/target}"
results="${BENCH_RESULTS:-$REPO_DIR/bench/results}"
mkdir -p "$results"
# Absolute: the benchmark runs in the package's folder, not here.
results=$(cd "$results" && pwd)
# BENCH_THROUGHPUT_FROM: the CSV of an earlier run's throughput phase (a full run in two halves,
# see processor/benches/vs_kafka_streams/main.rs).
if [[ -n ${BENCH_THROUGHPUT_FROM:-} ]]; then
  [[ -f $BENCH_THROUGHPUT_FROM ]] || die "BENCH_THROUGHPUT_FROM: no file $BENCH_THROUGHPUT_FROM"
  BENCH_THROUGHPUT_FROM=$(realpath "$BENCH_THROUGHPUT_FROM")
  export BENCH_THROUGHPUT_FROM
fi

"$DEV_DIR/install-kafka.sh"

# BENCH_PEER_BUILD: where the peer is built (a second checkout builds its own, not over this one).
peer_build="${BENCH_PEER_BUILD:-$STREAMAPP_CACHE/bench/kafka-streams}"
log "building the Kafka Streams peer (bench/kafka-streams)"
mvn -B -q -f "$REPO_DIR/bench/kafka-streams/pom.xml" \
  -Dmaven.repo.local="$STREAMAPP_CACHE/m2" -Dbuild.dir="$peer_build" package ||
  die "could not build the Kafka Streams peer with maven"
export BENCH_KS_CLASSPATH="$peer_build/kafka-streams-dedup-1.jar:$peer_build/lib/*"

venv="$STREAMAPP_CACHE/bench/venv"
requirements="$REPO_DIR/bench/compare/requirements.txt"
if ! cmp -s "$requirements" "$venv/requirements.txt" 2>/dev/null; then
  log "installing matplotlib into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
  "$venv/bin/pip" install -q -r "$requirements" || die "pip could not install $requirements"
  cp "$requirements" "$venv/requirements.txt"
fi
# `prepare`: only what the comparison installs (`make setup` does it beside the rest).
[[ ${1:-} == prepare ]] && exit 0

started_kafka=false
pinned_broker=""
cleanup() {
  [[ -n $pinned_broker ]] && taskset -a -p -c "0-$(($(nproc) - 1))" "$pinned_broker" >/dev/null 2>&1
  $started_kafka && "$DEV_DIR/kafka.sh" stop
  return 0
}
trap cleanup EXIT
if ! "$DEV_DIR/kafka.sh" status | grep -q "kafka running"; then
  "$DEV_DIR/net.sh" start
  "$DEV_DIR/kafka.sh" start
  started_kafka=true
fi

# BENCH_PIN=1: each system under test on the last CPU, the broker and this driver on the others,
# so that "per core" means one core and the broker's work does not compete with the system's
# (the broker's affinity is given back at the end). Unpinned (the default), they share them all.
pin=()
if [[ ${BENCH_PIN:-0} == 1 ]]; then
  last=$(($(nproc) - 1))
  ((last >= 1)) || die "BENCH_PIN=1 needs at least 2 CPUs"
  pinned_broker=$(cat "$STREAMAPP_RUN/kafka/kafka.pid")
  taskset -a -p -c "0-$((last - 1))" "$pinned_broker" >/dev/null ||
    die "could not pin the broker (pid $pinned_broker) with taskset"
  export BENCH_SYSTEM_CPU=$last
  pin=(taskset -c "0-$((last - 1))")
fi
export STREAMAPP_KAFKA_BOOTSTRAP="${STREAMAPP_KAFKA_BOOTSTRAP:-127.0.0.1:$KAFKA_PORT}"
export BENCH_CSV="$results/vs-kafka-streams.csv"

cargo bench --locked -p streamapp-processor --bench vs_kafka_streams --no-run
log "running the comparison (at full size, 5M records, 3 runs and three linger.ms values: several hours on 2 cores)"
# Inside the test bed's network namespace, where the broker is (no relay in the data path).
in_testbed "${pin[@]}" cargo bench --locked --offline -p streamapp-processor --bench vs_kafka_streams 2>&1 |
  tee "$results/vs-kafka-streams.txt"
status=${PIPESTATUS[0]}
((status == 0)) || die "the comparison failed (exit $status); its output: $results/vs-kafka-streams.txt"

"$venv/bin/python" "$REPO_DIR/bench/compare/chart.py" "$BENCH_CSV" "$results/vs-kafka-streams.png" ||
  die "could not draw the chart from $BENCH_CSV"
