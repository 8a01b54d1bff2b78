#!/usr/bin/env bash
# Starts or stops the local Kubernetes control plane, inside the test bed's network namespace
# (dev/net.sh): etcd, kube-apiserver (Node and RBAC authorization), kube-controller-manager,
# kube-scheduler, kwok (fake nodes for tests that need many nodes: it marks pods on them
# Running without running anything, stages in dev/kube/kwok-stages.yaml; its node is tainted so
# that only pods that ask for it land there) and the test bed's PersistentVolume provisioner.
# The real nodes that run pods (containerd + kubelet) are dev/node.sh.
#   dev/kube.sh start|stop|status
# The admin kubeconfig is written to $KUBECONFIG_PATH; the API server answers on
# https://127.0.0.1:$APISERVER_PORT inside the namespace (and, through dev/net.sh's relay, on this
# machine's loopback) and on https://$HUB_IP:$APISERVER_PORT for the nodes and the pods.
source "$(dirname "$0")/lib.sh"

dir="$STREAMAPP_RUN/kube"
pki="$dir/pki"
APISERVER_URL="https://127.0.0.1:$APISERVER_PORT"
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok local-provisioner)
PROVISIONER_BIN="${PROVISIONER_BIN:-${CARGO_TARGET_DIR:-$STREAMAPP_CACHE/target}/release/local-provisioner}"

# Certificates and keys: a CA, the API server's serving certificate, the service-account
# signing key pair, a static admin token (in system:masters) for every local client, and client
# certificates for kube-proxy and the API server's own calls to the kubelets (logs, exec). Each
# node's kubelet gets its own (system:node:<name>) when dev/node.sh starts it.
make_pki() {
  [[ -f $pki/.complete ]] && return
  mkdir -p "$pki"
  log "creating certificates in $pki"
  (
    cd "$pki"
    openssl ecparam -name prime256v1 -genkey -noout -out ca.key 2>/dev/null
    openssl req -x509 -new -key ca.key -subj "/CN=streamapp-local-ca" -days 3650 -out ca.crt 2>/dev/null
    openssl ecparam -name prime256v1 -genkey -noout -out apiserver.key 2>/dev/null
    openssl req -new -key apiserver.key -subj "/CN=kube-apiserver" -out apiserver.csr 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,IP:%s,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\nextendedKeyUsage=serverAuth\n' "$HUB_IP" >apiserver.ext
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile apiserver.ext -out apiserver.crt 2>/dev/null
    client_cert kube-proxy system:kube-proxy
    client_cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    echo "$(openssl rand -hex 24),admin,admin,system:masters" >tokens.csv
    touch .complete
  ) || die "creating the test bed's certificates in $pki failed (openssl)"
}

write_kubeconfig() {
  local token
  token=$(cut -d, -f1 "$pki/tokens.csv")
  mkdir -p "$(dirname "$KUBECONFIG_PATH")"
  cat >"$KUBECONFIG_PATH" <<KC
apiVersion: v1
kind: Config
clusters:
- name: streamapp-local
  cluster:
    server: $APISERVER_URL
    certificate-authority-data: $(base64 -w0 <"$pki/ca.crt")
users:
- name: admin
  user:
    token: $token
contexts:
- name: streamapp-local
  context: {cluster: streamapp-local, user: admin, namespace: default}
current-context: streamapp-local
KC
}

# start_bg NAME CMD...: runs CMD in the background inside the test bed's network namespace,
# logging to $dir/NAME.log.
start_bg() {
  local name=$1
  shift
  if pid_alive "$dir/$name.pid"; then
    log "$name already running (pid $(cat "$dir/$name.pid"))"
    return
  fi
  nohup nsenter --net="$NETNS_PATH" -- "$@" >"$dir/$name.log" 2>&1 &
  echo $! >"$dir/$name.pid"
}

k() { in_testbed kubectl --kubeconfig "$KUBECONFIG_PATH" "$@"; }

apiserver_ready() { k get --raw /readyz; }
node_ready() { [[ $(k get node kwok-node-0 -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}') == True ]]; }
default_sa_exists() { k -n default get serviceaccount default; }

start() {
  for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    [[ -x $KUBE_BIN/$b ]] || die "$b is not built: run 'make setup' (or dev/install-kube.sh)"
  done
  [[ -x $TOOLS_BIN/kwok ]] || die "kwok is not built: run 'make setup' (or dev/install-kube.sh)"
  [[ -x $PROVISIONER_BIN ]] || die "local-provisioner is not built at $PROVISIONER_BIN: run 'make build'"
  [[ -e $NETNS_PATH ]] || die "the test bed's network namespace is missing: run 'make up' (or dev/net.sh start first)"
  mkdir -p "$dir"
  make_pki
  write_kubeconfig

  log "starting etcd on 127.0.0.1:$ETCD_PORT"
  start_bg etcd "$KUBE_BIN/etcd" --name local --data-dir "$dir/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "local=http://127.0.0.1:$ETCD_PEER_PORT" --unsafe-no-fsync --log-level warn
  wait_until 60 etcd "$dir/etcd.log" in_testbed curl -sf "http://127.0.0.1:$ETCD_PORT/health"

  log "starting kube-apiserver on $APISERVER_URL"
  start_bg kube-apiserver "$KUBE_BIN/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 0.0.0.0 --advertise-address "$HUB_IP" --secure-port "$APISERVER_PORT" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" --token-auth-file "$pki/tokens.csv" \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$pki/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP,Hostname \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --api-audiences https://kubernetes.default.svc.cluster.local \
    --service-cluster-ip-range "$SERVICE_CIDR" --allow-privileged=true
  wait_until 120 kube-apiserver "$dir/kube-apiserver.log" apiserver_ready

  log "starting kube-controller-manager and kube-scheduler"
  start_bg kube-controller-manager "$KUBE_BIN/kube-controller-manager" \
    --kubeconfig "$KUBECONFIG_PATH" --leader-elect=false --secure-port 0 \
    --use-service-account-credentials=false \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --concurrent-statefulset-syncs 5 --concurrent-gc-syncs 5 \
    --service-cluster-ip-range "$SERVICE_CIDR" --pvclaimbinder-sync-period 2s
  start_bg kube-scheduler "$KUBE_BIN/kube-scheduler" \
    --kubeconfig "$KUBECONFIG_PATH" --leader-elect=false --secure-port 0

  log "starting kwok (fake nodes) and the local volume provisioner"
  # Stages: StreamApp pods on a fake node become Running but never Ready (nothing runs them);
  # every other pod is Running and Ready at once.
  start_bg kwok "$TOOLS_BIN/kwok" --kubeconfig "$KUBECONFIG_PATH" --config "$DEV_DIR/kube/kwok-stages.yaml" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
    --cidr 10.244.0.1/16 --node-ip 127.0.0.1
  start_bg local-provisioner "$PROVISIONER_BIN" --kubeconfig "$KUBECONFIG_PATH" \
    --volumes-dir "$STREAMAPP_RUN/volumes"
  k apply -f "$DEV_DIR/kube/testbed.yaml" >/dev/null
  wait_until 60 "kwok node" "$dir/kwok.log" node_ready
  wait_until 60 "kube-controller-manager (default service account)" \
    "$dir/kube-controller-manager.log" default_sa_exists
  log "kubernetes is up: export KUBECONFIG=$KUBECONFIG_PATH"
}

stop() {
  for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do
    stop_pid "${COMPONENTS[i]}" "$dir/${COMPONENTS[i]}.pid"
  done
}


case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) components_status "$dir" "${COMPONENTS[@]}" ;;
  *) die "usage: $0 start|stop|status" ;;
esac
