#!/usr/bin/env bash
# The local demo: an operator, a StreamApp, its processors and agents, and the dashboard.
#   dev/demo.sh up     (what `make demo` runs after `make setup` and `make up`)
#   dev/demo.sh down   (what `make demo-down` runs before `make down`)
#
# There is no container runtime here, so the pieces that would run in containers run as local
# processes, with the identity and permissions they would have in the cluster:
# - the operator runs with a token of the ServiceAccount the Helm chart creates (the chart's
#   Deployment is installed with 0 replicas);
# - dev/testbed's local-kubelet runs each StreamApp pod's processor and agent, with the pod's
#   environment, ConfigMap, volume directory and ServiceAccount token, and reports readiness.
source "$(dirname "$0")/lib.sh"

demo="$STREAMAPP_RUN/demo"
bin="${CARGO_TARGET_DIR:-$STREAMAPP_CACHE/target}/release"
export KUBECONFIG="$KUBECONFIG_PATH"
export STREAMAPP_KAFKA_BOOTSTRAP="127.0.0.1:$KAFKA_PORT"
release=streamapp-operator
operator_ns=streamapp-system
app_ns=streamapp-demo
app=orders-dedup
input=orders.commands

step() { printf '\n\033[1;34m==> %s\033[0m\n' "$*" >&2; }

start_bg() {
  local name=$1
  shift
  pid_alive "$demo/$name.pid" && return
  nohup "$@" >"$demo/$name.log" 2>&1 &
  echo $! >"$demo/$name.pid"
}

operator_kubeconfig() {
  local token
  token=$(kubectl -n "$operator_ns" create token "$release" --duration 24h)
  local kc="$demo/operator.kubeconfig"
  cp "$KUBECONFIG_PATH" "$kc"
  kubectl --kubeconfig "$kc" config set-credentials operator --token "$token" >/dev/null
  kubectl --kubeconfig "$kc" config set-context --current --user operator >/dev/null
  echo "$kc"
}

app_ready() {
  [[ $(kubectl -n "$app_ns" get streamapp "$app" -o jsonpath='{.status.phase}/{.status.conditions[?(@.type=="StateHealthy")].status}') == Running/True ]]
}

count() { "$bin/demo-commands" count "$1"; }

up() {
  mkdir -p "$demo"
  step "Kafka topics for the example (input with 4 partitions)"
  "$bin/demo-commands" create-topics "$input:4" "$input.deduped:4" "$input.duplicates:4" "$input.dlq:1"

  step "Installing the CRD and the operator's RBAC with Helm (chart charts/streamapp-operator)"
  helm upgrade --install "$release" "$REPO_DIR/charts/streamapp-operator" \
    --namespace "$operator_ns" --create-namespace --set replicas=0 --wait >"$demo/helm.log" 2>&1 ||
    { cat "$demo/helm.log" >&2; die "helm install failed"; }
  kubectl wait --for condition=Established crd/streamapps.streamapp.dev --timeout 60s >/dev/null

  step "Starting the operator (as the chart's ServiceAccount; log: $demo/operator.log)"
  KUBECONFIG="$(operator_kubeconfig)" POD_NAMESPACE="$operator_ns" \
    start_bg operator "$bin/streamapp-operator" --metrics-port 18070 --leader-election true
  step "Starting the local kubelet for StreamApp pods (log: $demo/local-kubelet.log)"
  start_bg local-kubelet "$bin/local-kubelet" --bin-dir "$bin" --run-dir "$demo" --base-port 18080 --namespace "$app_ns"

  step "Applying examples/streamapp.yaml"
  kubectl apply -f "$REPO_DIR/examples/streamapp.yaml"

  step "Waiting for the StreamApp to be Running with healthy state"
  local deadline=$((SECONDS + 240))
  until app_ready; do
    ((SECONDS < deadline)) || {
      kubectl -n "$app_ns" get streamapp "$app" -o yaml >&2
      die "the StreamApp did not become ready; logs in $demo"
    }
    printf '  %s\n' "$(kubectl -n "$app_ns" get streamapp "$app" --no-headers 2>/dev/null || echo waiting)"
    sleep 3
  done
  kubectl -n "$app_ns" get pods -o wide

  # Counts before, so that a second run of the demo reports only what it added.
  local before_in before_out before_dups before_dlq
  before_in=$(count "$input") before_out=$(count "$input.deduped")
  before_dups=$(count "$input.duplicates") before_dlq=$(count "$input.dlq")

  step "Producing 5000 sample commands (30% repeated ids) and 10 malformed records"
  "$bin/demo-commands" produce --topic "$input" --count 5000 --duplicates 0.3 --bad 10 | tee "$demo/produced.txt"
  local distinct
  distinct=$(sed -n 's/.*: \([0-9]*\) distinct ids.*/\1/p' "$demo/produced.txt")

  step "Waiting for the processors to commit everything"
  deadline=$((SECONDS + 120))
  until (($(count "$input.deduped") - before_out >= distinct)); do
    ((SECONDS < deadline)) || die "the output did not reach $distinct new records; logs in $demo/pods"
    sleep 2
  done
  sleep 2
  echo "  input:        $(($(count "$input") - before_in)) records"
  echo "  deduped:      $(($(count "$input.deduped") - before_out)) (one per command id: $distinct distinct ids were produced)"
  echo "  duplicates:   $(($(count "$input.duplicates") - before_dups))"
  echo "  dead letters: $(($(count "$input.dlq") - before_dlq)) (each with a streamapp.dlq.reason header)"

  step "Waiting for the agents' next reports"
  sleep 12
  step "kubectl get streamapps -A"
  kubectl get streamapps -A
  step "kubectl get streamapps -A -o wide"
  kubectl get streamapps -A -o wide
  step "Per-pod state health (kubectl get streamapp $app -n $app_ns -o yaml, status.pods)"
  kubectl -n "$app_ns" get streamapp "$app" -o jsonpath='{range .status.pods[*]}{.name}: phase={.phase} ready={.ready} lastShutdownClean={.lastShutdownClean} tasks={range .tasks[*]}[p{.partition} committed={.committedOffset} lag={.restoreLag} opened={.opened}]{end}{"\n"}{end}'

  cat <<EOF

The demo keeps running. Try:
  export KUBECONFIG=$KUBECONFIG_PATH PATH=$KUBE_BIN:$TOOLS_BIN:\$PATH
  kubectl get streamapps -A -w
  kubectl scale streamapp $app -n $app_ns --replicas 3
  $bin/streamapp-processor inspect <state dir>   (state dirs: $STREAMAPP_RUN/volumes/*)
Logs: $demo (operator.log, local-kubelet.log, pods/<namespace>/<pod>/{processor,agent}.log)
Stop it all with: make demo-down
EOF
}

down() {
  step "Stopping the demo"
  if [[ -f $KUBECONFIG_PATH ]] && kubectl get --raw /readyz >/dev/null 2>&1; then
    kubectl delete -f "$REPO_DIR/examples/streamapp.yaml" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  fi
  # The kubelet drains every processor it runs before it exits.
  stop_pid local-kubelet "$demo/local-kubelet.pid"
  stop_pid operator "$demo/operator.pid"
  if [[ -f $KUBECONFIG_PATH ]] && kubectl get --raw /readyz >/dev/null 2>&1; then
    helm uninstall "$release" --namespace "$operator_ns" >/dev/null 2>&1 || true
  fi
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  *) die "usage: $0 up|down" ;;
esac
