#!/usr/bin/env bash
# The test bed's real node: containerd (runc, overlayfs snapshots, bridge CNI, the local pause
# image), a kubelet registered as Node $NODE_NAME, and kube-proxy (iptables mode, so pods reach
# the API server through the `kubernetes` Service) — all inside the test bed's network
# namespace (dev/net.sh), with the project's images (dev/image.sh) imported into containerd.
#   dev/node.sh start|stop|status
#   dev/node.sh import           (re)imports the images into the running node's containerd
#   dev/node.sh ctr ARGS...      ctr against the node's containerd (namespace k8s.io)
#
# containerd and the kubelet run in a private mount namespace of their own, which keeps them
# off what the machine shares with other programs:
# - the kubelet sets vm.overcommit_memory, kernel.panic and kernel.panic_on_oops at start, which
#   are host-wide: the three files are bind-mounted over with the values it expects;
# - /var/lib and /var/log are copy-on-write there (the kubelet hardcodes
#   /var/lib/kubelet/device-plugins, the CNI library caches in /var/lib/cni), /run/containerd
#   is a tmpfs of its own (the shims' sockets);
# every other path they use is under $STREAMAPP_RUN/node. Stopping the node stops every
# container, removes the cgroups the kubelet created and leaves nothing running.
source "$(dirname "$0")/lib.sh"

dir="$STREAMAPP_RUN/node"
pki="$STREAMAPP_RUN/kube/pki"
sock="$dir/containerd/containerd.sock"
COMPONENTS=(kube-proxy kubelet containerd node-namespace)

ctr_() { ctr --address "$sock" --namespace k8s.io "$@"; }

# Fails, naming what is missing, when this machine cannot run the node.
check_machine() {
  ((EUID == 0)) || die "the node needs root (it runs containerd and a kubelet)"
  grep -qw overlay /proc/filesystems || die "the kernel has no overlay filesystem: containerd's overlayfs snapshotter needs it"
  [[ -d /sys/fs/cgroup/memory && -d /sys/fs/cgroup/cpu && -d /sys/fs/cgroup/pids ]] ||
    die "cgroup v1 memory, cpu and pids hierarchies are not mounted under /sys/fs/cgroup: the kubelet needs them"
  unshare --mount true 2>/dev/null || die "cannot create a mount namespace (unshare --mount): the node needs one"
  for b in containerd runc ctr iptables-restore conntrack; do
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
  [[ -f $pki/kubelet.crt ]] || die "the control plane's certificates are missing: run dev/kube.sh start first"
}

kubeconfig() {
  local who=$1
  cat <<KC
apiVersion: v1
kind: Config
clusters:
- name: streamapp-local
  cluster:
    server: https://$NODE_IP:$APISERVER_PORT
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
        "ranges": [[{ "subnet": "$POD_CIDR" }]],
        "routes": [{ "dst": "0.0.0.0/0" }]
      }
    }
  ]
}
JSON
  kubeconfig kubelet >"$dir/kubelet/kubeconfig"
  cat >"$dir/kubelet/config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine mounts cgroup v1 controllers (a cgroup2 hierarchy exists but has none).
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$sock
address: $NODE_IP
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
hostnameOverride: $NODE_NAME
clusterCIDR: $POD_CIDR
bindAddress: $NODE_IP
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

# Runs inside `unshare --mount` in the test bed's network namespace: prepares the private
# mounts, then starts containerd and the kubelet and waits for them.
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
  containerd --config "$dir/containerd/config.toml" >"$dir/containerd.log" 2>&1 &
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
    --node-ip "$NODE_IP" --hostname-override "$NODE_NAME" \
    --node-labels "streamapp.dev/node=real" >"$dir/kubelet.log" 2>&1 &
  echo $! >"$dir/kubelet.pid"
  wait
}

import_images() {
  for f in pause.oci.tar app.oci.tar; do
    ctr_ images import "$IMAGES_DIR/$f" >>"$dir/import.log" 2>&1 ||
      die "importing $IMAGES_DIR/$f into containerd failed (see $dir/import.log)"
  done
  log "node images: $(ctr_ images list -q | grep '^localhost/' | tr '\n' ' ')"
}

node_ready() {
  [[ $(in_testbed kubectl --kubeconfig "$KUBECONFIG_PATH" get node "$NODE_NAME" \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}

start() {
  check_machine
  if pid_alive "$dir/kubelet.pid"; then
    log "node already running (kubelet pid $(cat "$dir/kubelet.pid")): refreshing its images"
    import_images
    return
  fi
  write_configs
  rm -f "$dir/containerd.up" "$dir/images.imported"
  # Pods reach Services by DNAT and answer each other through the bridge: forwarding inside
  # the namespace only (it is a per-namespace setting, and nothing is routed out of it).
  in_testbed sysctl -qw net.ipv4.ip_forward=1
  log "starting containerd and the kubelet (node $NODE_NAME at $NODE_IP; logs in $dir)"
  nohup nsenter --net="$NETNS_PATH" -- unshare --mount --propagation slave -- \
    "$DEV_DIR/node.sh" node-namespace >"$dir/node-namespace.log" 2>&1 &
  echo $! >"$dir/node-namespace.pid"
  wait_until 30 containerd "$dir/containerd.log" test -f "$dir/containerd.up"
  import_images
  touch "$dir/images.imported"
  nohup nsenter --net="$NETNS_PATH" -- "$KUBE_BIN/kube-proxy" --config "$dir/kube-proxy/config.yaml" \
    >"$dir/kube-proxy.log" 2>&1 &
  echo $! >"$dir/kube-proxy.pid"
  wait_until 90 "the kubelet (node $NODE_NAME Ready)" "$dir/kubelet.log" node_ready
  log "node $NODE_NAME is Ready"
}

# Every container of the node, then its daemons; then the cgroups the kubelet made.
stop() {
  stop_pid kube-proxy "$dir/kube-proxy.pid"
  stop_pid kubelet "$dir/kubelet.pid"
  if [[ -S $sock ]] && ctr_ version >/dev/null 2>&1; then
    local tasks
    tasks=$(ctr_ tasks list -q 2>/dev/null || true)
    for t in $tasks; do ctr_ tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true; done
    sleep 1
    for t in $tasks; do ctr_ tasks delete -f "$t" >/dev/null 2>&1 || true; done
  fi
  stop_pid containerd "$dir/containerd.pid"
  # Shims outlive containerd by design; ours are the ones serving our containerd's socket.
  local pids
  pids=$(pgrep -f "containerd-shim-runc-v2 .*-address $sock" || true)
  # shellcheck disable=SC2086
  [[ -z $pids ]] || kill -9 $pids 2>/dev/null || true
  stop_pid "node namespace" "$dir/node-namespace.pid"
  remove_pod_cgroups
}

remove_pod_cgroups() {
  local h
  for h in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/*/kubepods.slice; do
    [[ -d $h ]] || continue
    # Deepest first: a cgroup can only be removed once it has no children (and no processes).
    find "$h" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    [[ -d $h ]] && log "could not remove $h (processes left in it?)"
  done
  return 0
}


case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) components_status "$dir" "${COMPONENTS[@]}" ;;
  import) import_images ;;
  ctr)
    shift
    ctr_ "$@"
    ;;
  node-namespace) node_namespace ;;
  *) die "usage: $0 start|stop|status|import | ctr ARGS..." ;;
esac
