#!/usr/bin/env bash
# Installs the Debian packages the build and the test bed need, when they are missing:
#   libclang-dev (RocksDB bindings), libcurl4-openssl-dev, libssl-dev, libsasl2-dev, zlib1g-dev
#   (librdkafka with TLS/SASL), openssl and curl (the dev scripts);
#   for the test bed's node and images: containerd, runc, containernetworking-plugins (bridge
#   CNI), iptables and conntrack (kube-proxy), podman and mmdebstrap (images), socat (the
#   relays of dev/net.sh), libc6-dev (the static pause program).
source "$(dirname "$0")/lib.sh"

packages=(libclang-dev libcurl4-openssl-dev libssl-dev libsasl2-dev zlib1g-dev cmake pkg-config openssl curl
  containerd runc containernetworking-plugins iptables conntrack podman mmdebstrap socat libc6-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
((${#missing[@]})) || exit 0
log "installing system packages: ${missing[*]}"
sudo=()
((EUID == 0)) || sudo=(sudo)
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
