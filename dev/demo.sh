#!/usr/bin/env bash
# The local demo: the operator, a StreamApp, its processors and agents, and the dashboard — all
# as pods on the test bed's real nodes, from the project's own image.
#   dev/demo.sh up     (what `make demo` runs after `make setup` and `make up`)
#   dev/demo.sh down   (what `make demo-down` runs before `make down`)
#
# It does what a user does on a cluster: `helm install` the operator chart (the operator runs
# as a Deployment pod), `kubectl apply` examples/streamapp.yaml (with the image built here
# instead of the published one), and watches `kubectl get streamapps`. The kubelet runs the
# processor and the agent sidecar, their probes and the preStop drain; nothing is emulated.
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

app_ready() {
  [[ $(kubectl -n "$app_ns" get streamapp "$app" -o jsonpath='{.status.phase}/{.status.conditions[?(@.type=="StateHealthy")].status}') == Running/True ]]
}

count() { "$bin/demo-commands" count "$1"; }

up() {
  mkdir -p "$demo"
  step "Kafka topics for the example (input with 4 partitions)"
  "$bin/demo-commands" create-topics "$input:4" "$input.deduped:4" "$input.duplicates:4" "$input.dlq:1"

  step "helm install the operator (chart charts/streamapp-operator, image $APP_IMAGE)"
  helm upgrade --install "$release" "$REPO_DIR/charts/streamapp-operator" \
    --namespace "$operator_ns" --create-namespace \
    --set image.repository="${APP_IMAGE%:*}" --set image.tag="${APP_IMAGE##*:}" --set image.pullPolicy=Never \
    --wait --timeout 120s >"$demo/helm.log" 2>&1 ||
    { cat "$demo/helm.log" >&2; kubectl -n "$operator_ns" get pods -o wide >&2; die "helm install failed"; }
  kubectl -n "$operator_ns" get pods -o wide

  step "kubectl apply -f examples/streamapp.yaml (image: $APP_IMAGE)"
  sed "s#image: ghcr.io/streamapp-dev/streamapp:.*#image: $APP_IMAGE#" "$REPO_DIR/examples/streamapp.yaml" |
    kubectl apply -f -

  step "Waiting for the StreamApp to be Running with healthy state"
  local deadline=$((SECONDS + 240))
  until app_ready; do
    ((SECONDS < deadline)) || {
      kubectl -n "$app_ns" get streamapp "$app" -o yaml >&2
      kubectl -n "$app_ns" get pods -o wide >&2
      die "the StreamApp did not become ready (kubectl -n $app_ns describe pods; kubectl -n $app_ns logs <pod> -c processor)"
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
    ((SECONDS < deadline)) || die "the output did not reach $distinct new records (kubectl -n $app_ns logs <pod> -c processor)"
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

  step "kubectl streamapp status $app -n $app_ns (the plugin, found by kubectl on PATH)"
  PATH="$bin:$PATH" kubectl streamapp status "$app" -n "$app_ns"

  cat <<EOF

The demo keeps running. Try:
  export KUBECONFIG=$KUBECONFIG_PATH PATH=$bin:$KUBE_BIN:$TOOLS_BIN:\$PATH
  kubectl get streamapps -A -w
  kubectl streamapp status $app -n $app_ns --watch
  kubectl scale streamapp $app -n $app_ns --replicas 3
  kubectl -n $app_ns delete pod $app-0          (the kubelet runs the preStop drain)
  kubectl streamapp inspect $app-0 -n $app_ns
  kubectl streamapp drain $app-1 -n $app_ns    (the preStop drain, then the pod comes back)
  kubectl -n $app_ns logs $app-0 -c processor
Stop it all with: make demo-down
EOF
}

down() {
  step "Stopping the demo"
  if [[ -f $KUBECONFIG_PATH ]] && kubectl get --raw /readyz >/dev/null 2>&1; then
    # The kubelet drains each processor (preStop) before its pod goes.
    kubectl delete -f "$REPO_DIR/examples/streamapp.yaml" --ignore-not-found --timeout 120s >/dev/null 2>&1 || true
    helm uninstall "$release" --namespace "$operator_ns" --wait >/dev/null 2>&1 || true
  fi
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  *) die "usage: $0 up|down" ;;
esac
