# shellcheck shell=bash
# Shared settings for the dev scripts: versions, cache and runtime folders, small helpers.
# Sourced, never run. Every value can be overridden from the environment.

set -euo pipefail

DEV_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$DEV_DIR/.." && pwd)"

# Downloads and builds are kept here, outside the clone, so re-runs are fast.
STREAMAPP_CACHE="${STREAMAPP_CACHE:-$HOME/.cache/streamapp}"
# Runtime state of the local services (data dirs, logs, pids): wiped by `make down`.
STREAMAPP_RUN="${STREAMAPP_RUN:-$STREAMAPP_CACHE/run}"

KAFKA_VERSION="${KAFKA_VERSION:-4.4.0}"
KAFKA_PORT="${KAFKA_PORT:-19092}"
KAFKA_CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-19093}"
# A SASL_SSL listener (TLS with the test bed's own CA, SASL PLAIN and SCRAM) for the tests of
# secured connections; its CA and the test user are in $STREAMAPP_RUN/kafka/tls.
KAFKA_SECURE_PORT="${KAFKA_SECURE_PORT:-19095}"

KUBE_VERSION="${KUBE_VERSION:-v1.35.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-v0.7.0}"
HELM_VERSION="${HELM_VERSION:-v3.19.0}"
ETCD_PORT="${ETCD_PORT:-12379}"
ETCD_PEER_PORT="${ETCD_PEER_PORT:-12380}"
APISERVER_PORT="${APISERVER_PORT:-16443}"

# The test bed's container images (dev/image.sh) and their OCI archives.
IMAGES_DIR="$STREAMAPP_CACHE/images"
BASE_IMAGE="${BASE_IMAGE:-localhost/streamapp/debian:bookworm}"
PAUSE_IMAGE="${PAUSE_IMAGE:-localhost/streamapp/pause:1}"
APP_IMAGE="${APP_IMAGE:-localhost/streamapp/streamapp:dev}"

# The test bed's network: network namespaces that the test bed creates and owns, and nothing in
# them is routed anywhere else (dev/net.sh makes them). The hub ($TESTBED_NETNS) holds Kafka, the
# control plane and the tests, at HUB_IP on a bridge; each real node N (1..NODE_COUNT: containerd,
# kubelet, kube-proxy and its pods) has a namespace of its own joined to that bridge by a veth
# pair, at node_ip N, with its pods in pod_cidr N (routed between the nodes and the hub).
# 127.0.0.1 inside each namespace is its own loopback.
TESTBED_NETNS="${TESTBED_NETNS:-streamapp-testbed}"
NETNS_PATH="/run/netns/$TESTBED_NETNS"
HUB_IP="${HUB_IP:-10.213.0.1}"
# How many real nodes: three (what the node-loss, spread and drain tests need) unless told;
# NODE_COUNT=1 is the quick loop, where `make test` leaves those tests out and says so.
NODE_COUNT="${NODE_COUNT:-3}"
SERVICE_CIDR="${SERVICE_CIDR:-10.96.0.0/16}"
# Kafka's listener for pods (advertised as HUB_IP:KAFKA_POD_PORT).
KAFKA_POD_PORT="${KAFKA_POD_PORT:-19094}"

# Node N (1..9): its name, network namespace, address, pods' CIDR and zone.
node_name() { echo "streamapp-node-$1"; }
node_netns() { echo "$TESTBED_NETNS-node-$1"; }
node_ip() { echo "10.213.0.$((10 + $1))"; }
pod_cidr() { echo "10.214.$1.0/24"; }
node_zone() {
  local zones=(a b c)
  echo "zone-${zones[($1 - 1) % 3]}"
}
node_numbers() { seq 1 "$NODE_COUNT"; }

KAFKA_HOME="$STREAMAPP_CACHE/kafka-$KAFKA_VERSION"
KUBE_BIN="$STREAMAPP_CACHE/kube-$KUBE_VERSION/bin"
TOOLS_BIN="$STREAMAPP_CACHE/tools/bin"
KUBECONFIG_PATH="$STREAMAPP_RUN/kube/admin.kubeconfig"

export PATH="$KUBE_BIN:$TOOLS_BIN:$PATH"

log() { printf '\033[1m[streamapp]\033[0m %s\n' "$*" >&2; }
die() { printf '\033[31m[streamapp] error:\033[0m %s\n' "$*" >&2; exit 1; }

# wait_until SECONDS DESCRIPTION LOGFILE CMD...: polls CMD every half second; on timeout
# prints the tail of LOGFILE so the failure explains itself.
wait_until() {
  local secs=$1 what=$2 logfile=$3
  shift 3
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      log "$what did not come up within ${secs}s; last lines of $logfile:"
      tail -n 40 "$logfile" >&2 || true
      die "$what failed to start (full log: $logfile)"
    fi
    sleep 0.5
  done
}

# in_testbed CMD...: runs CMD inside the test bed's network namespace. nsenter, not
# `ip netns exec`: that one remounts /sys and would hide the cgroup hierarchies.
in_testbed() {
  [[ -e $NETNS_PATH ]] || die "the test bed's network namespace $TESTBED_NETNS does not exist: run 'make up' (or dev/net.sh start)"
  nsenter --net="$NETNS_PATH" -- "$@"
}

# in_node N CMD...: runs CMD inside node N's network namespace.
in_node() {
  local ns
  ns=$(node_netns "$1")
  shift
  [[ -e /run/netns/$ns ]] || die "node namespace $ns does not exist: run 'make up' (or dev/net.sh start)"
  nsenter --net="/run/netns/$ns" -- "$@"
}

# client_cert NAME CN [ORG]: in the current directory (the test bed's PKI), a key and a
# certificate signed by its CA (ca.crt, ca.key), for client authentication.
client_cert() {
  local name=$1 cn=$2 org=${3:-}
  local subj="/CN=$cn"
  [[ -n $org ]] && subj="/O=$org/CN=$cn"
  openssl ecparam -name prime256v1 -genkey -noout -out "$name.key" 2>/dev/null
  openssl req -new -key "$name.key" -subj "$subj" -out "$name.csr" 2>/dev/null
  printf 'extendedKeyUsage=clientAuth\n' >"$name.ext"
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
    -extfile "$name.ext" -out "$name.crt" 2>/dev/null
}

# pid_alive PIDFILE: true when the process recorded in PIDFILE still runs.
pid_alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# components_status DIR NAME...: "NAME running (pid P)" or "NAME stopped" for each component
# whose pid file is DIR/NAME.pid.
components_status() {
  local dir=$1 c
  shift
  for c in "$@"; do
    if pid_alive "$dir/$c.pid"; then echo "$c running (pid $(cat "$dir/$c.pid"))"; else echo "$c stopped"; fi
  done
}

# stop_pid NAME PIDFILE: TERM, wait up to 20 s, then KILL.
stop_pid() {
  local name=$1 pidfile=$2
  pid_alive "$pidfile" || { rm -f "$pidfile"; return 0; }
  local pid
  pid=$(cat "$pidfile")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 40); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  if kill -0 "$pid" 2>/dev/null; then
    log "$name did not stop on TERM; killing"
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
}
