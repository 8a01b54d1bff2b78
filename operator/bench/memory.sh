#!/usr/bin/env bash
# Memory of the operator with many StreamApps: creates COUNT (default 100) StreamApps in a
# fresh namespace of the local control plane, runs the release operator binary on that
# namespace, waits until it has reconciled every one, and prints its resident memory
# (VmRSS, and the peak VmHWM) from /proc.
#
#   operator/bench/memory.sh            # needs `make up` and a release build of the operator
#   COUNT=200 REPLICAS=1 operator/bench/memory.sh
#
# REPLICAS defaults to 0: the operator still creates and watches every owned object and writes
# every status, without filling the single kwok node (110 pods) that other tests share.
source "$(dirname "$0")/../../dev/lib.sh"

COUNT="${COUNT:-100}"
REPLICAS="${REPLICAS:-0}"
OPERATOR_BIN="${OPERATOR_BIN:-${CARGO_TARGET_DIR:-$STREAMAPP_CACHE/target}/release/streamapp-operator}"
[[ -x $OPERATOR_BIN ]] || die "no operator binary at $OPERATOR_BIN: cargo build --release -p streamapp-operator"
k() { kubectl --kubeconfig "$KUBECONFIG_PATH" "$@"; }
k get --raw /readyz >/dev/null 2>&1 || die "the local control plane is not running: make up"

ns="bench-memory-$(openssl rand -hex 4)"
log_file="$(mktemp)"
pid=""
cleanup() {
  [[ -n $pid ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  k delete namespace "$ns" --wait=false >/dev/null 2>&1 || true
  rm -f "$log_file"
}
trap cleanup EXIT

k apply --server-side --force-conflicts -f "$REPO_DIR/crds/streamapp.dev_streamapps.yaml" >/dev/null
k wait --for condition=Established crd/streamapps.streamapp.dev --timeout=30s >/dev/null
k create namespace "$ns" >/dev/null

port=$(shuf -i 20000-60000 -n 1)
KUBECONFIG="$KUBECONFIG_PATH" RUST_LOG=warn "$OPERATOR_BIN" --namespace "$ns" --leader-election false \
  --metrics-port "$port" >"$log_file" 2>&1 &
pid=$!
sleep 2
kill -0 "$pid" 2>/dev/null || { cat "$log_file" >&2; die "the operator did not start"; }
rss() { awk -v f="$1" '$1 == f":" {print $2}' "/proc/$pid/status"; }
reconciliations() { curl -sf "http://127.0.0.1:$port/metrics" | awk '$1 == "streamapp_operator_reconciliations_total" {print $2}'; }
echo "idle operator: VmRSS $(rss VmRSS) kB"

started=$SECONDS
for ((i = 0; i < COUNT; i++)); do
  cat <<YAML
---
apiVersion: streamapp.dev/v1alpha1
kind: StreamApp
metadata: {name: app-$i}
spec:
  image: registry.example/streamapp:1.0
  replicas: $REPLICAS
  kafka: {bootstrapServers: "kafka.example:9092"}
  topology: {inputTopic: in-$i, outputTopic: out-$i, deadLetterTopic: dlq-$i}
YAML
done | k apply -n "$ns" -f - >/dev/null

reconciled() { k get streamapps -n "$ns" -o jsonpath='{range .items[*]}{.status.observedGeneration}{"\n"}{end}' | grep -c . || true; }
until (( $(reconciled) >= COUNT )); do
  (( SECONDS - started < 300 )) || die "only $(reconciled)/$COUNT StreamApps reconciled after 300 s"
  sleep 1
done
echo "reconciled $COUNT StreamApps ($((COUNT * 7)) owned objects) in $((SECONDS - started)) s"
sleep 5 # let the watches settle
before=$(reconciliations)
sleep 30
echo "reconciliations in 30 s of quiet (no reconcile storm): $(( $(reconciliations) - before ))"
echo "operator with $COUNT StreamApps: VmRSS $(rss VmRSS) kB, peak VmHWM $(rss VmHWM) kB"
