#!/usr/bin/env bash
# The test bed's real nodes, 1..$NODE_COUNT. Node N is a machine of its own as far as Kubernetes
# can tell: its network namespace (dev/net.sh: address node_ip N, pods in pod_cidr N, a link to
# the hub), containerd (runc, overlayfs snapshots, bridge CNI, the local pause image, its own
# root, state and socket), a kubelet registered as Node streamapp-node-N with its own
# system:node certificate, labels streamapp.dev/node=real and topology.kubernetes.io/zone, and
# kube-proxy (iptables mode, so pods reach the API server through the `kubernetes` Service), with
# the project's images (dev/image.sh) imported. Everything of node N runs in a cgroup of its own
# (/$TESTBED_NETNS-node-N in every v1 hierarchy: the daemons in .../daemons, the kubelet's pods in
# .../kubepods), which is what the faults act on.
#
#   dev/node.sh start [N...]     starts the nodes (all of 1..NODE_COUNT by default) side by side
#   dev/node.sh stop|status      every node there is
#   dev/node.sh import [N...]    (re)imports the images into running nodes' containerd
#   dev/node.sh ctr N ARGS...    ctr against node N's containerd (namespace k8s.io)
#
# Node faults, as a real cluster has them (nothing is emulated; the control plane finds out the
# way it would):
#   dev/node.sh kill N           power loss: the link goes down, then every process of the node
#                                (daemons and containers) is killed at once; its disk stays
#   dev/node.sh freeze N | thaw N   every process of the node stopped (cgroup freezer) / resumed
#   dev/node.sh partition N [all]   the node loses the API server (its other traffic flows), or
#                                with `all` its link
#   dev/node.sh heal N           undoes a partition
#   dev/node.sh restart N        a killed node boots again: link up, containerd and kubelet
#                                started on the same disk
#
# containerd and the kubelet run in a private mount namespace of their own, which keeps them
# off what the machine shares with other programs:
# - the kubelet sets vm.overcommit_memory, kernel.panic and kernel.panic_on_oops at start, which
#   are host-wide: the three files are bind-mounted over with the values it expects;
# - /var/lib and /var/log are copy-on-write there (the kubelet hardcodes
#   /var/lib/kubelet/device-plugins, the CNI library caches in /var/lib/cni), /run/containerd
#   is a tmpfs of its own (the shims' sockets);
# every other path they use is under $STREAMAPP_RUN/node-N. Stopping the nodes stops every
# container, removes the nodes' cgroups and leaves nothing running.
source "$(dirname "$0")/lib.sh"

pki="$STREAMAPP_RUN/kube/pki"
COMPONENTS=(kube-proxy kubelet containerd node-namespace)

# use_node N: the settings of node N, as globals the functions below read.
use_node() {
  [[ $1 =~ ^[1-9]$ ]] || die "no such node: '$1' (nodes are numbered 1 to 9)"
  n=$1
  dir="$STREAMAPP_RUN/node-$n"
  sock="$dir/containerd/containerd.sock"
  name=$(node_name "$n")
  ip=$(node_ip "$n")
  cidr=$(pod_cidr "$n")
  netns_path="/run/netns/$(node_netns "$n")"
  cgroot=$(node_netns "$n")
}

# The nodes that have a directory (started at least once), whatever NODE_COUNT says now.
known_nodes() {
  local d
  for d in "$STREAMAPP_RUN"/node-[1-9]; do [[ -d $d ]] && echo "${d##*-}"; done
  return 0
}

ctr_() { ctr --address "$sock" --namespace k8s.io "$@"; }

# Fails, naming what is missing, when this machine cannot run the nodes.
check_machine() {
  ((EUID == 0)) || die "running the nodes needs root (they run containerd and kubelets)"
  grep -qw overlay /proc/filesystems || die "the kernel has no overlay filesystem: containerd's overlayfs snapshotter needs it"
  [[ -d /sys/fs/cgroup/memory && -d /sys/fs/cgroup/cpu && -d /sys/fs/cgroup/pids && -d /sys/fs/cgroup/freezer ]] ||
    die "cgroup v1 memory, cpu, pids and freezer hierarchies are not mounted under /sys/fs/cgroup: the kubelets and the node faults need them"
  unshare --mount true 2>/dev/null || die "cannot create a mount namespace (unshare --mount): the nodes need one"
  for b in containerd runc ctr iptables iptables-restore conntrack openssl; do
    command -v "$b" >/dev/null || die "$b is not installed (dev/install-system-packages.sh installs it)"
  done
  [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] ||
    die "the CNI plugins are not installed in /usr/lib/cni (package containernetworking-plugins)"
  for b in kubelet kube-proxy; do
    [[ -x $KUBE_BIN/$b ]] || die "$b is not built: run 'make setup' (or dev/install-kube.sh)"
  done
  for f in pause.oci.tar app.oci.tar; do
    [[ -s $IMAGES_DIR/$f ]] || die "$IMAGES_DIR/$f is missing: run dev/image.sh build"
  done
  [[ -f $pki/ca.key ]] || die "the control plane's certificates are missing: run dev/kube.sh start first"
}

# The node's kubelet certificate (system:node:<name>, authorized by the Node authorizer).
make_node_cert() {
  [[ -f $pki/kubelet-$n.crt ]] && return
  (cd "$pki" && client_cert "kubelet-$n" "system:node:$name" system:nodes) ||
    die "creating node $n's kubelet certificate in $pki failed (openssl)"
}

kubeconfig() {
  local who=$1
  cat <<KC
apiVersion: v1
kind: Config
clusters:
- name: streamapp-local
  cluster:
    server: https://$HUB_IP:$APISERVER_PORT
    certificate-authority: $pki/ca.crt
users:
- name: $who
  user:
    client-certificate: $pki/$who.crt
    client-key: $pki/$who.key
contexts:
- name: $who
  context: {cluster: streamapp-local, user: $who}
current-context: $who
KC
}

write_configs() {
  mkdir -p "$dir"/{containerd/root,containerd/state,containerd/opt,runc,cni/net.d,cni/ipam,kubelet/root,pod-logs,kube-proxy,sysctl,varlib/upper,varlib/work,varlog/upper,varlog/work}
  cat >"$dir/containerd/config.toml" <<TOML
version = 2
root = "$dir/containerd/root"
state = "$dir/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "$sock"

[ttrpc]
  address = "$sock.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "$dir/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  # The pod sandbox image is built here (dev/image.sh): nothing is pulled.
  sandbox_image = "$PAUSE_IMAGE"
  # No CAP_SYS_RESOURCE: a negative oom_score_adj is refused, so never ask for one.
  restrict_oom_score_adj = true
  # hugetlb lives only in the unused cgroup2 hierarchy of this machine.
  tolerate_missing_hugetlb_controller = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "$dir/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$dir/cni/net.d"
    max_conf_num = 1
TOML
  cat >"$dir/cni/net.d/10-streamapp-pods.conflist" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "streamapp-pods",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "sa-pods0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$dir/cni/ipam",
        "ranges": [[{ "subnet": "$cidr" }]],
        "routes": [{ "dst": "0.0.0.0/0" }]
      }
    }
  ]
}
JSON
  kubeconfig "kubelet-$n" >"$dir/kubelet/kubeconfig"
  cat >"$dir/kubelet/config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine mounts cgroup v1 controllers (a cgroup2 hierarchy exists but has none).
failCgroupV1: false
cgroupDriver: cgroupfs
# The node's own cgroup (see make_cgroups): its pods go under it, not beside the other nodes'.
cgroupRoot: /$cgroot
containerRuntimeEndpoint: unix://$sock
address: $ip
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization:
  mode: Webhook
# No cluster DNS, and the pods must not use this machine's resolvers.
resolvConf: ""
podLogsDir: $dir/pod-logs
rotateCertificates: false
serverTLSBootstrap: false
# Without CAP_SYS_RESOURCE these cannot be raised or lowered below 0.
oomScoreAdj: 0
maxOpenFiles: 20000
# The machine's disk is shared with everything else: evict only when it is really full, and
# never garbage-collect the images (they cannot be pulled again).
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
failSwapOn: false
# Node shutdown handling needs systemd's inhibitor locks.
shutdownGracePeriod: 0s
# Pick up ConfigMap and Secret changes and report pod status promptly on a test bed.
syncFrequency: 10s
YAML
  kubeconfig kube-proxy >"$dir/kube-proxy/kubeconfig"
  cat >"$dir/kube-proxy/config.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection:
  kubeconfig: $dir/kube-proxy/kubeconfig
hostnameOverride: $name
clusterCIDR: 10.214.0.0/16
bindAddress: $ip
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# Source-NAT every Service connection, so a pod reaching a Service backed by a pod on the
# same bridge gets its answers back without br_netfilter (no loadable modules here).
iptables:
  masqueradeAll: true
# Zeros leave the kernel's conntrack settings alone: they are host-wide.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
YAML
  # What the kubelet expects of the three host-wide sysctls (it would write them otherwise).
  echo 1 >"$dir/sysctl/vm.overcommit_memory"
  echo 10 >"$dir/sysctl/kernel.panic"
  echo 1 >"$dir/sysctl/kernel.panic_on_oops"
}

# The v1 hierarchies the node's cgroup is made in (the cgroup2 one has no controllers here).
hierarchies() {
  local h
  for h in /sys/fs/cgroup/*; do
    [[ -f $h/cgroup.procs && $h != /sys/fs/cgroup/unified ]] && echo "$h"
  done
  return 0
}

# The node's cgroup and its daemons' one in every hierarchy (cpuset needs its cpus and memory
# nodes before it takes a process).
make_cgroups() {
  local h c
  for h in $(hierarchies); do
    for c in "$h/$cgroot" "$h/$cgroot/daemons"; do
      mkdir -p "$c"
      if [[ -f $c/cpuset.cpus && -z $(cat "$c/cpuset.cpus") ]]; then
        cat "$(dirname "$c")/cpuset.cpus" >"$c/cpuset.cpus"
        cat "$(dirname "$c")/cpuset.mems" >"$c/cpuset.mems"
      fi
    done
  done
}

# Every process of the node: its daemons and its containers.
node_pids() {
  [[ -d /sys/fs/cgroup/freezer/$cgroot ]] || return 0
  find "/sys/fs/cgroup/freezer/$cgroot" -name cgroup.procs -exec cat {} + 2>/dev/null
}

set_freezer() { [[ -d /sys/fs/cgroup/freezer/$cgroot ]] && echo "$1" >"/sys/fs/cgroup/freezer/$cgroot/freezer.state"; }

# Runs inside `unshare --mount` in the node's network namespace: prepares the private mounts,
# then starts containerd and the kubelet and waits for them.
node_namespace() {
  mount --make-rslave /
  mount --bind "$dir/sysctl/vm.overcommit_memory" /proc/sys/vm/overcommit_memory
  mount --bind "$dir/sysctl/kernel.panic" /proc/sys/kernel/panic
  mount --bind "$dir/sysctl/kernel.panic_on_oops" /proc/sys/kernel/panic_on_oops
  mount -t overlay overlay -o "lowerdir=/var/lib,upperdir=$dir/varlib/upper,workdir=$dir/varlib/work" /var/lib
  mount -t overlay overlay -o "lowerdir=/var/log,upperdir=$dir/varlog/upper,workdir=$dir/varlog/work" /var/log
  # containerd's shims put their sockets under /run/containerd whatever its configuration says.
  mkdir -p /run/containerd
  mount -t tmpfs -o mode=0700 tmpfs /run/containerd
  containerd --config "$dir/containerd/config.toml" >>"$dir/containerd.log" 2>&1 &
  echo $! >"$dir/containerd.pid"
  local deadline=$((SECONDS + 30))
  until ctr_ version >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { echo "containerd did not start" >&2; exit 1; }
    sleep 0.2
  done
  touch "$dir/containerd.up"
  # The images first: the kubelet may start pods at once.
  while [[ ! -f $dir/images.imported ]]; do sleep 0.2; done
  "$KUBE_BIN/kubelet" --config "$dir/kubelet/config.yaml" --kubeconfig "$dir/kubelet/kubeconfig" \
    --root-dir "$dir/kubelet/root" --cert-dir "$dir/kubelet/root/pki" \
    --node-ip "$ip" --hostname-override "$name" \
    --node-labels "streamapp.dev/node=real,topology.kubernetes.io/zone=$(node_zone "$n")" \
    >>"$dir/kubelet.log" 2>&1 &
  echo $! >"$dir/kubelet.pid"
  wait
}

import_images() {
  local f
  for f in pause.oci.tar app.oci.tar; do
    ctr_ images import "$IMAGES_DIR/$f" >>"$dir/import.log" 2>&1 ||
      die "importing $IMAGES_DIR/$f into node $n's containerd failed (see $dir/import.log)"
  done
  log "node $n images: $(ctr_ images list -q | grep '^localhost/' | tr '\n' ' ')"
}

node_ready() {
  [[ $(in_testbed kubectl --kubeconfig "$KUBECONFIG_PATH" get node "$name" \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}

# in_cgroup CMD...: runs CMD in the node's daemons cgroup (what it starts stays in the node's).
in_cgroup() {
  local h
  for h in $(hierarchies); do echo $$ >"$h/$cgroot/daemons/cgroup.procs"; done
  exec "$@"
}

start_node() {
  use_node "$1"
  [[ -e $netns_path ]] || die "node $n's network namespace is missing: run dev/net.sh start (with NODE_COUNT=$NODE_COUNT)"
  if pid_alive "$dir/kubelet.pid"; then
    log "node $n already running (kubelet pid $(cat "$dir/kubelet.pid")): refreshing its images"
    import_images
    return
  fi
  make_node_cert
  write_configs
  make_cgroups
  rm -f "$dir/containerd.up" "$dir/images.imported"
  log "starting node $n: containerd and the kubelet ($name at $ip, pods $cidr; logs in $dir)"
  nohup "$DEV_DIR/node.sh" in-cgroup "$n" nsenter --net="$netns_path" -- \
    unshare --mount --propagation slave -- "$DEV_DIR/node.sh" node-namespace "$n" \
    >"$dir/node-namespace.log" 2>&1 &
  echo $! >"$dir/node-namespace.pid"
  wait_until 30 "containerd of node $n" "$dir/containerd.log" test -f "$dir/containerd.up"
  import_images
  touch "$dir/images.imported"
  nohup "$DEV_DIR/node.sh" in-cgroup "$n" nsenter --net="$netns_path" -- \
    "$KUBE_BIN/kube-proxy" --config "$dir/kube-proxy/config.yaml" >>"$dir/kube-proxy.log" 2>&1 &
  echo $! >"$dir/kube-proxy.pid"
  wait_until 90 "the kubelet of node $n ($name Ready)" "$dir/kubelet.log" node_ready
  log "node $name is Ready"
}

# start [N...]: the nodes side by side; fails if any failed.
start() {
  check_machine
  local nodes=("$@") pids=() i failed=0
  ((${#nodes[@]})) || mapfile -t nodes < <(node_numbers)
  # The certificates one after the other: each signing rewrites the CA's serial file.
  for i in "${nodes[@]}"; do
    (use_node "$i" && make_node_cert)
  done
  for i in "${nodes[@]}"; do
    start_node "$i" &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || failed=1; done
  ((failed == 0)) || die "a node did not start (see the messages above)"
}

# Every container of the node, then its daemons, then whatever is left in its cgroup; then the
# cgroups.
stop_node() {
  use_node "$1"
  set_freezer THAWED || true
  stop_pid "kube-proxy of node $n" "$dir/kube-proxy.pid"
  stop_pid "kubelet of node $n" "$dir/kubelet.pid"
  if [[ -S $sock ]] && ctr_ version >/dev/null 2>&1; then
    local tasks t
    tasks=$(ctr_ tasks list -q 2>/dev/null || true)
    for t in $tasks; do ctr_ tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true; done
    sleep 1
    for t in $tasks; do ctr_ tasks delete -f "$t" >/dev/null 2>&1 || true; done
  fi
  stop_pid "containerd of node $n" "$dir/containerd.pid"
  stop_pid "node $n's namespace" "$dir/node-namespace.pid"
  # Shims outlive containerd by design; they are in the node's cgroup with the rest.
  kill_everything
  remove_cgroups
}

kill_everything() {
  local pids tries=0
  while pids=$(node_pids) && [[ -n $pids ]]; do
    # shellcheck disable=SC2086
    kill -9 $pids 2>/dev/null || true
    ((++tries < 50)) || { log "node $n: processes left in its cgroup: $pids"; return 0; }
    sleep 0.1
  done
}

remove_cgroups() {
  local h
  for h in $(hierarchies); do
    [[ -d $h/$cgroot ]] || continue
    # Deepest first: a cgroup can only be removed once it has no children (and no processes).
    find "$h/$cgroot" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    [[ -d $h/$cgroot ]] && log "could not remove $h/$cgroot (processes left in it?)"
  done
  return 0
}

stop() {
  local i
  for i in $(known_nodes); do stop_node "$i" & done
  wait
}

status() {
  local i c
  for i in $(known_nodes); do
    use_node "$i"
    for c in "${COMPONENTS[@]}"; do
      if pid_alive "$dir/$c.pid"; then echo "node $i $c running (pid $(cat "$dir/$c.pid"))"; else echo "node $i $c stopped"; fi
    done
  done
}

# Power loss: nothing of the node answers any more, from one instant on. Its disk (containerd's
# root, the kubelet's, its local volumes) stays as it was.
kill_node() {
  use_node "$1"
  log "node $n: power loss"
  "$DEV_DIR/net.sh" link "$n" down
  set_freezer FROZEN
  # shellcheck disable=SC2046
  kill -9 $(node_pids) 2>/dev/null || true
  set_freezer THAWED
  kill_everything
  rm -f "$dir"/{kube-proxy,kubelet,containerd,node-namespace}.pid
}

freeze_node() { use_node "$1" && set_freezer FROZEN && log "node $n frozen"; }
thaw_node() { use_node "$1" && set_freezer THAWED && log "node $n thawed"; }

# The node loses the API server: its daemons' and its pods' connections to it are dropped,
# as a firewall or a broken route between the node and the control plane would.
PARTITION_CHAIN=STREAMAPP-PARTITION
partition_node() {
  use_node "$1"
  if [[ ${2:-} == all ]]; then
    log "node $n: link down"
    "$DEV_DIR/net.sh" link "$n" down
    return
  fi
  [[ -z ${2:-} ]] || die "usage: $0 partition N [all]"
  log "node $n: cut off from the API server"
  in_node "$n" iptables -w -N "$PARTITION_CHAIN" 2>/dev/null || in_node "$n" iptables -w -F "$PARTITION_CHAIN"
  in_node "$n" iptables -w -A "$PARTITION_CHAIN" -p tcp -d "$HUB_IP" --dport "$APISERVER_PORT" -j DROP
  in_node "$n" iptables -w -I OUTPUT -j "$PARTITION_CHAIN"
  in_node "$n" iptables -w -I FORWARD -j "$PARTITION_CHAIN"
}

heal_node() {
  use_node "$1"
  "$DEV_DIR/net.sh" link "$n" up
  if in_node "$n" iptables -w -L "$PARTITION_CHAIN" -n >/dev/null 2>&1; then
    while in_node "$n" iptables -w -D OUTPUT -j "$PARTITION_CHAIN" 2>/dev/null; do :; done
    while in_node "$n" iptables -w -D FORWARD -j "$PARTITION_CHAIN" 2>/dev/null; do :; done
    in_node "$n" iptables -w -F "$PARTITION_CHAIN"
    in_node "$n" iptables -w -X "$PARTITION_CHAIN"
  fi
  log "node $n healed"
}

# A killed node boots again on the same disk.
restart_node() {
  use_node "$1"
  pid_alive "$dir/kubelet.pid" && die "node $n is running: kill it first"
  heal_node "$n"
  check_machine
  start_node "$n"
}

one_node() { [[ $# -ge 1 ]] || die "usage: $0 $cmd N"; }

cmd=${1:-}
shift || true
case "$cmd" in
  start) start "$@" ;;
  stop) stop ;;
  status) status ;;
  import)
    (($#)) || set -- $(known_nodes)
    for i in "$@"; do use_node "$i" && import_images; done
    ;;
  ctr)
    one_node "$@"
    use_node "$1"
    shift
    ctr_ "$@"
    ;;
  kill) one_node "$@" && kill_node "$1" ;;
  freeze) one_node "$@" && freeze_node "$1" ;;
  thaw) one_node "$@" && thaw_node "$1" ;;
  partition) one_node "$@" && partition_node "$@" ;;
  heal) one_node "$@" && heal_node "$1" ;;
  restart) one_node "$@" && restart_node "$1" ;;
  node-namespace) use_node "$1" && node_namespace ;;
  in-cgroup)
    use_node "$1"
    shift
    in_cgroup "$@"
    ;;
  *) die "usage: $0 start [N...]|stop|status|import [N...] | ctr N ARGS... | kill|freeze|thaw|heal|restart N | partition N [all]" ;;
esac
