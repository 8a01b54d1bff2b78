#!/usr/bin/env bash
# The test bed's network: a network namespace of its own ($TESTBED_NETNS) in which Kafka, the
# control plane, the node and its pods run. Inside it there is a loopback, the node's address
# $NODE_IP on a veth pair whose two ends both stay inside, and (once the node runs) the pods'
# bridge. Nothing is routed out of it: pods reach exactly what runs in it.
#
# For a developer's shell and tools on this machine, two relays make the API server and Kafka
# answer on this machine's own loopback too (127.0.0.1:$APISERVER_PORT, 127.0.0.1:$KAFKA_PORT),
# each connection forwarded into the namespace's loopback. Tests and benchmarks run inside the
# namespace instead (`dev/net.sh exec CMD`), without the relay in their data path.
# TESTBED_RELAYS=off leaves them out (a second test bed on the same machine, in a namespace of
# its own, would collide with the first one's relays).
#
#   dev/net.sh start|stop|status
#   dev/net.sh exec CMD...     runs CMD inside the namespace
source "$(dirname "$0")/lib.sh"

dir="$STREAMAPP_RUN/net"
RELAYED_PORTS=("$APISERVER_PORT" "$KAFKA_PORT")

need_root() {
  ((EUID == 0)) || die "the test bed needs root: it creates a network namespace and runs a kubelet (run make as root)"
}

create_namespace() {
  if [[ -e $NETNS_PATH ]]; then
    return
  fi
  log "creating the network namespace $TESTBED_NETNS (node address $NODE_IP)"
  ip netns add "$TESTBED_NETNS" 2>"$dir/netns.err" ||
    die "cannot create a network namespace ($(cat "$dir/netns.err")): the test bed needs network namespaces (CAP_SYS_ADMIN)"
  in_testbed ip link set lo up
  # Both ends of the pair stay in the namespace: the node's address needs an interface, and
  # this kernel has no loadable modules (no dummy interface).
  in_testbed ip link add sa-node type veth peer name sa-node-peer 2>"$dir/netns.err" ||
    { ip netns delete "$TESTBED_NETNS"; die "cannot create a veth pair ($(cat "$dir/netns.err")): the test bed needs veth interfaces"; }
  in_testbed ip addr add "$NODE_IP/30" dev sa-node
  in_testbed ip link set sa-node up
  in_testbed ip link set sa-node-peer up
}

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
  create_namespace
  start_relays
}

stop() {
  for port in "${RELAYED_PORTS[@]}"; do
    stop_pid "relay to port $port" "$dir/relay-$port.pid"
  done
  [[ -e $NETNS_PATH ]] || return 0
  local left
  left=$(ip netns pids "$TESTBED_NETNS" 2>/dev/null | tr '\n' ' ')
  if [[ -n $left ]]; then
    log "processes still run in $TESTBED_NETNS ($left): stopping them"
    # shellcheck disable=SC2086
    kill $left 2>/dev/null || true
    sleep 2
    # shellcheck disable=SC2086
    kill -9 $(ip netns pids "$TESTBED_NETNS" 2>/dev/null) 2>/dev/null || true
  fi
  ip netns delete "$TESTBED_NETNS"
}

status() {
  if [[ -e $NETNS_PATH ]]; then echo "network namespace $TESTBED_NETNS present"; else echo "network namespace $TESTBED_NETNS absent"; fi
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
  relay) exec nsenter --net="$NETNS_PATH" -- socat STDIO "TCP:127.0.0.1:$2" ;;
  *) die "usage: $0 start|stop|status | exec CMD..." ;;
esac
