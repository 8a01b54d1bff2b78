#!/usr/bin/env bash
# The test bed's network: network namespaces of its own. The hub ($TESTBED_NETNS) holds Kafka,
# the control plane and the tests, at $HUB_IP on the bridge sa-hub. Each real node N has a
# namespace of its own ($TESTBED_NETNS-node-N) whose eth0 (node_ip N) is a veth pair's end, the
# other end (sa-nN) on the hub's bridge, as a machine's NIC is on a switch. Routes: each node's
# pod CIDR via that node's address, from the hub and from every other node; a node's default
# route is the hub. Nothing is routed out of these namespaces: pods reach exactly what runs in
# them. A node's link can be taken down and up (`link N down|up`): dev/node.sh's faults.
#
# For a developer's shell and tools on this machine, two relays make the API server and Kafka
# answer on this machine's own loopback too (127.0.0.1:$APISERVER_PORT, 127.0.0.1:$KAFKA_PORT),
# each connection forwarded into the hub's loopback. Tests and benchmarks run inside the hub
# instead (`dev/net.sh exec CMD`), without the relay in their data path.
# TESTBED_RELAYS=off leaves them out (a second test bed on the same machine, in namespaces of
# its own, would collide with the first one's relays).
#
#   dev/net.sh start|stop|status
#   dev/net.sh exec CMD...     runs CMD inside the hub
#   dev/net.sh link N up|down  node N's link to the hub
source "$(dirname "$0")/lib.sh"

dir="$STREAMAPP_RUN/net"
RELAYED_PORTS=("$APISERVER_PORT" "$KAFKA_PORT")

need_root() {
  ((EUID == 0)) || die "the test bed needs root: it creates a network namespace and runs a kubelet (run make as root)"
}

# netns_add NAME: a network namespace with its loopback up.
netns_add() {
  ip netns add "$1" 2>"$dir/netns.err" ||
    die "cannot create a network namespace ($(cat "$dir/netns.err")): the test bed needs network namespaces (CAP_SYS_ADMIN)"
  ip netns exec "$1" ip link set lo up
}

create_hub() {
  [[ -e $NETNS_PATH ]] && return
  log "creating the hub's network namespace $TESTBED_NETNS ($HUB_IP)"
  netns_add "$TESTBED_NETNS"
  # This kernel has no loadable modules, but bridges and veth pairs are built in.
  in_testbed ip link add sa-hub type bridge 2>"$dir/netns.err" ||
    { ip netns delete "$TESTBED_NETNS"; die "cannot create a bridge ($(cat "$dir/netns.err")): the test bed needs bridge interfaces"; }
  in_testbed ip addr add "$HUB_IP/24" dev sa-hub
  in_testbed ip link set sa-hub up
  # The hub forwards between nodes (a pod on one node reaching a Service DNATed to another).
  in_testbed sysctl -qw net.ipv4.ip_forward=1
}

# create_node N: node N's namespace, its link to the hub and the routes to every node's pods.
create_node() {
  local n=$1 ns ip
  ns=$(node_netns "$n")
  ip=$(node_ip "$n")
  if [[ ! -e /run/netns/$ns ]]; then
    log "creating node $n's network namespace $ns ($ip, pods $(pod_cidr "$n"))"
    netns_add "$ns"
    in_testbed ip link add "sa-n$n" type veth peer name eth0 netns "$ns" 2>"$dir/netns.err" ||
      die "cannot create a veth pair ($(cat "$dir/netns.err")): the test bed needs veth interfaces"
    in_testbed ip link set "sa-n$n" master sa-hub up
    in_node "$n" ip addr add "$ip/24" dev eth0
    in_node "$n" ip link set eth0 up
    in_node "$n" ip route add default via "$HUB_IP"
    # Pods reach Services by DNAT and answer each other through the node's bridge.
    in_node "$n" sysctl -qw net.ipv4.ip_forward=1
  fi
  in_testbed ip route replace "$(pod_cidr "$n")" via "$ip"
  local m
  for m in $(node_numbers); do
    ((m == n)) || in_node "$n" ip route replace "$(pod_cidr "$m")" via "$(node_ip "$m")"
  done
}

# The node namespaces there are, whatever NODE_COUNT says now.
node_namespaces() { ip netns list | awk '{print $1}' | grep -E "^$TESTBED_NETNS-node-[0-9]+$" || true; }

start_relays() {
  [[ ${TESTBED_RELAYS:-on} == off ]] && return
  command -v socat >/dev/null || die "socat is not installed (dev/install-system-packages.sh installs it)"
  for port in "${RELAYED_PORTS[@]}"; do
    local pidfile="$dir/relay-$port.pid"
    pid_alive "$pidfile" && continue
    nohup socat "TCP-LISTEN:$port,bind=127.0.0.1,reuseaddr,fork" "EXEC:$DEV_DIR/net.sh relay $port" \
      >"$dir/relay-$port.log" 2>&1 &
    echo $! >"$pidfile"
  done
}

start() {
  need_root
  mkdir -p "$dir"
  create_hub
  local n
  for n in $(node_numbers); do create_node "$n"; done
  start_relays
}

# kill_namespace_pids NAME: stops what still runs in a namespace.
kill_namespace_pids() {
  local left
  left=$(ip netns pids "$1" 2>/dev/null | tr '\n' ' ')
  [[ -n $left ]] || return 0
  log "processes still run in $1 ($left): stopping them"
  # shellcheck disable=SC2086
  kill $left 2>/dev/null || true
  sleep 2
  # shellcheck disable=SC2086
  kill -9 $(ip netns pids "$1" 2>/dev/null) 2>/dev/null || true
}

stop() {
  for port in "${RELAYED_PORTS[@]}"; do
    stop_pid "relay to port $port" "$dir/relay-$port.pid"
  done
  local ns
  for ns in $(node_namespaces); do
    kill_namespace_pids "$ns"
    ip netns delete "$ns"
  done
  [[ -e $NETNS_PATH ]] || return 0
  kill_namespace_pids "$TESTBED_NETNS"
  ip netns delete "$TESTBED_NETNS"
}

status() {
  if [[ -e $NETNS_PATH ]]; then echo "network namespace $TESTBED_NETNS present"; else echo "network namespace $TESTBED_NETNS absent"; fi
  local ns
  for ns in $(node_namespaces); do echo "network namespace $ns present"; done
  for port in "${RELAYED_PORTS[@]}"; do
    if pid_alive "$dir/relay-$port.pid"; then echo "relay 127.0.0.1:$port running"; else echo "relay 127.0.0.1:$port stopped"; fi
  done
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  exec)
    shift
    in_testbed "$@"
    ;;
  # One relayed connection (socat runs this per connection): stdin/stdout to the port inside.
  link)
    [[ ${3:-} == up || ${3:-} == down ]] || die "usage: $0 link N up|down"
    in_testbed ip link set "sa-n$2" "$3"
    ;;
  # One relayed connection (socat runs this per connection): stdin/stdout to the port inside.
  relay) exec nsenter --net="$NETNS_PATH" -- socat STDIO "TCP:127.0.0.1:$2" ;;
  *) die "usage: $0 start|stop|status | exec CMD... | link N up|down" ;;
esac
