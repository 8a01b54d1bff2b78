#!/usr/bin/env bash
# A small `make bench-compare` for `make test`: the whole comparison (the Java peer built through
# Maven, every system and configuration, one run each, the latency warm-up and its backlog check,
# the crash and restart of each recovered system, the CSV and the chart) on a few thousand
# records. Its figures mean nothing at this size; what it checks is that the command works and
# that every system's output is exactly once, in every phase and across a kill -9 (the benchmark
# exits non-zero otherwise, and this script counts the checks so that none is skipped).
source "$(dirname "$0")/lib.sh"

out="$STREAMAPP_RUN/bench-compare-smoke"
rm -rf "$out"
# The latency phase at one fixed rate that every system sustains on a busy machine: the full
# run's rate (half of each system's own throughput) comes from throughput figures that mean
# nothing on 10,000 records (a Kafka Streams peer measured 8,400 and 35,700 records/s at two
# lingers), and half of a lucky figure is a rate the peer cannot keep while the other test lane
# loads the machine — the warm-up then never ends without a backlog and the run fails.
BENCH_RESULTS="$out" BENCH_RECORDS=10000 BENCH_RUNS=1 BENCH_LINGERS=5,20 BENCH_RECOVERY_KEYS=5000 BENCH_FAILOVER_KEYS=5000 \
  BENCH_LATENCY_RATE=1000 BENCH_LATENCY_WARMUP_SECONDS=3 BENCH_LATENCY_SECONDS=2 "$DEV_DIR/bench-compare.sh"
for f in vs-kafka-streams.csv vs-kafka-streams.png; do
  [[ -s $out/$f ]] || die "bench-compare smoke: $out/$f was not written"
done
rows=$(grep -c "^recovery 5k keys" "$out/vs-kafka-streams.csv")
((rows == 8)) || die "bench-compare smoke: expected 8 recovery rows in the CSV, found $rows"
# The full restore's rate and when each system went quiet after it: a figure for streamapp
# (column 4) and ks-window (column 10).
for row in "full restore rate" "full restore settled"; do
  awk -F, -v row="recovery 5k keys: $row" '$1 == row && $4 > 0 && $10 > 0 { found = 1 } END { exit !found }' \
    "$out/vs-kafka-streams.csv" ||
    die "bench-compare smoke: no \"$row\" for both streamapp and ks-window in the CSV"
done
rows=$(grep -c "^failover 5k keys" "$out/vs-kafka-streams.csv")
((rows == 4)) || die "bench-compare smoke: expected 4 failover rows in the CSV, found $rows"
grep -q "exactly once: NO" "$out/vs-kafka-streams.txt" &&
  die "bench-compare smoke: an output was not exactly once (see $out/vs-kafka-streams.txt)"
rows=$(grep -c "^scaling: " "$out/vs-kafka-streams.csv")
((rows == 8)) || die "bench-compare smoke: expected 8 scaling rows in the CSV, found $rows"
# Throughput: 8 systems at linger.ms 5, the 4 the sweep covers at 20 (streamapp, skeleton,
# ks-window, ks-kv); latency: the broker's warm-up run and 4; recovery: 3; failover: 2, with
# and without standbys; scaling: 1, 2 and 4 processes, and 1 process with 2 threads — each
# output checked once.
grep -q "^linger.ms sweep" "$out/vs-kafka-streams.txt" ||
  die "bench-compare smoke: the linger.ms sweep was not reported (see $out/vs-kafka-streams.txt)"
grep -q "^broker warm-up: one run not counted" "$out/vs-kafka-streams.txt" ||
  die "bench-compare smoke: the latency phase did not begin with the broker's warm-up run (see $out/vs-kafka-streams.txt)"
checks=$(grep -c "exactly once: yes" "$out/vs-kafka-streams.txt")
((checks == 28)) ||
  die "bench-compare smoke: expected 28 passed exactly-once checks, found $checks (see $out/vs-kafka-streams.txt)"
log "bench-compare smoke passed: $out"
