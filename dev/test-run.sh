#!/usr/bin/env bash
# Runs every test against the test bed that is up (`make test-run`). Most of it in two lanes side
# by side, each of which leaves a core idle much of the time (the processor's tests wait on the
# broker, the e2e tests on kubelets):
#
#   processor  the processor's integration tests but those that take the broker away, then the
#              small Kafka Streams comparison (dev/bench-compare-smoke.sh);
#   rest       every other test binary (unit tests, agent, e2e, operator, plugin, test bed) and
#              the doc tests, then the tests that need three nodes (e2e/tests/nodes: they kill,
#              freeze and cut off nodes, so they never overlap the other e2e tests);
#
# then, alone, the processor's tests that kill, stop, restart or freeze the broker (the
# `environment` and `soak` modules), which would fail whatever else was using it.
#
# Each line of the lanes (and of the tests run alone) is prefixed with its lane's name.
# Everything runs to the end; the exit code is non-zero when anything failed, and the failed
# parts are named with their tests' panics. The tests run inside the test bed's network
# namespace, where Kafka and the API server are.
source "$(dirname "$0")/lib.sh"

cd "$REPO_DIR"
# The features of `make test-build`, so nothing is compiled again here.
cargo_test=(cargo test --release --workspace --features streamapp-e2e/three-nodes --locked --offline --no-fail-fast)

# The processor test modules that take the broker away, and a check that no other test does
# (they would break the other lane's tests).
broker_away_modules=(environment soak)
broker_away_calls='kill_and_restart_broker|restart_broker_cleanly|stop_broker_for|freeze_broker_for'
others=$(grep -rlE "$broker_away_calls" --include='*.rs' -- */tests */benches dev/testbed/tests |
  grep -vE "^processor/tests/processor/($(IFS='|'; echo "${broker_away_modules[*]}"))\.rs$" || true)
[[ -z $others ]] ||
  die "these tests take the broker away but are not run alone; add their module to broker_away_modules in $0: $others"

# Every integration-test target but the processor's and those behind a feature (the three-node
# tests: `make test-nodes`), read from the workspace so a new test binary is never left out.
rest_targets=()
while read -r target; do
  rest_targets+=(--test "$target")
done < <(cargo metadata --no-deps --format-version 1 --offline | python3 -c '
import json, sys
for package in json.load(sys.stdin)["packages"]:
    for target in package["targets"]:
        if target["kind"] == ["test"] and target["name"] != "processor" and not target.get("required-features"):
            print(target["name"])
')

skip_broker_away=()
for module in "${broker_away_modules[@]}"; do
  skip_broker_away+=(--skip "$module::")
done

# Everything each lane prints is also kept, a file per lane, so that the end of the run can say
# why each failed test failed: a panic's message sits above its backtrace, far from the summary.
outputs="$STREAMAPP_RUN/reports/test-output"
rm -rf "$outputs"
mkdir -p "$outputs"

lane() {
  local name=$1
  shift
  # The lane's status is the command's, not sed's or tee's.
  ("$@" 2>&1 | sed -u "s/^/[$name] /" | tee "$outputs/$name.txt"; exit "${PIPESTATUS[0]}")
}

# Each panic in the kept output: its first line and its message (up to 12 lines more).
panics() {
  awk '/panicked at/ { n = 13 }
       n > 0 && /stack backtrace:|note: run with `RUST_BACKTRACE/ { n = 0 }
       n > 0 { print; n-- }' "$outputs"/*.txt
}

processor() {
  local status=0
  "$DEV_DIR/net.sh" exec "${cargo_test[@]}" --test processor -- "${skip_broker_away[@]}" || status=$?
  "$DEV_DIR/bench-compare-smoke.sh" || status=$?
  return "$status"
}

rest() {
  local status=0
  "$DEV_DIR/net.sh" exec "${cargo_test[@]}" --lib --bins "${rest_targets[@]}" || status=$?
  "$DEV_DIR/net.sh" exec "${cargo_test[@]}" --doc || status=$?
  if ((NODE_COUNT >= 3)); then
    "$DEV_DIR/net.sh" exec "${cargo_test[@]}" --test nodes || status=$?
  else
    log "NODE_COUNT=$NODE_COUNT: the tests that need three nodes (e2e/tests/nodes) are NOT run"
  fi
  return "$status"
}

lane processor processor &
processor_lane=$!
lane rest rest &
rest_lane=$!

failed=()
wait "$processor_lane" || failed+=("the processor's tests or the comparison's smoke ([processor] lines)")
wait "$rest_lane" || failed+=("the other tests ([rest] lines)")

log "the processor's tests that take the broker away (${broker_away_modules[*]}), alone"
filters=()
for module in "${broker_away_modules[@]}"; do
  filters+=("$module::")
done
lane alone "$DEV_DIR/net.sh" exec "${cargo_test[@]}" --test processor -- "${filters[@]}" ||
  failed+=("the processor's tests that take the broker away (${broker_away_modules[*]}, [alone] lines)")

# Figures the tests measured but do not assert (e2e/src/lib.rs, `report`).
report="$STREAMAPP_RUN/reports/e2e.txt"
if [[ -s $report ]]; then
  log "the end-to-end report ($report):"
  cat "$report"
fi

if ((${#failed[@]} > 0)); then
  log "the panics of the failed tests (each lane's whole output: $outputs):"
  panics
  die "failed: $(IFS=';'; echo "${failed[*]}")"
fi
log "every test passed"
