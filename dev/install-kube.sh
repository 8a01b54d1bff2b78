#!/usr/bin/env bash
# Builds the local Kubernetes control plane from Go modules into the cache:
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (same version as the
#   API server, so there is no client/server skew), the node's kubelet and kube-proxy (same
#   module and version), kwok (fake nodes) and helm.
# Idempotent: a binary that is already in the cache is not rebuilt.
#
# k8s.io/kubernetes and etcd's server module cannot be `go install`ed: their go.mod files
# replace sibling modules with local paths. We build them from a small wrapper module that
# requires them and pins each replaced module to its published version instead.
source "$(dirname "$0")/lib.sh"

command -v go >/dev/null || die "go is not installed (needed to build the control plane)"
mkdir -p "$KUBE_BIN" "$TOOLS_BIN"
work="$STREAMAPP_CACHE/gobuild"
mkdir -p "$work"

# wrapper_module DIR MODULE VERSION REPLACE_VERSION_FN: writes DIR/go.mod requiring MODULE and
# replacing every `=> ./...` path replacement of MODULE's go.mod with a published version.
wrapper_module() {
  local dir=$1 module=$2 version=$3 map_fn=$4
  mkdir -p "$dir"
  rm -f "$dir/go.mod" "$dir/go.sum" # a stale wrapper would break the download below
  local gomod
  gomod=$(cd "$dir" && go mod download -json "$module@$version" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
  [[ -f $gomod ]] || die "could not download $module@$version from the Go module proxy"
  {
    echo "module streamapp.dev/devbuild"
    echo
    echo "go $(go env GOVERSION | sed 's/^go//; s/\([0-9]*\.[0-9]*\).*/\1/')"
    echo
    echo "require $module $version"
    echo
    # Lines look like `\tk8s.io/api => ./staging/src/k8s.io/api` (inside a replace block) or
    # `replace go.etcd.io/etcd/api/v3 => ../api`.
    grep -E '=>[[:space:]]*\.\.?/' "$gomod" | sed -E 's/^replace[[:space:]]+//; s/^[[:space:]]+//' |
      while read -r dep _arrow _path; do
        local v
        v=$($map_fn "$dep" "$version")
        # An empty answer means the replaced module is not published (a placeholder): skip it.
        [[ -z $v ]] || echo "replace $dep => $dep $v"
      done
  } >"$dir/go.mod"
}

# k8s.io/kubernetes v1.X.Y publishes its staging modules as v0.X.Y.
kube_staging_version() { echo "v0.${2#v1.}"; }
# etcd publishes its sibling modules (go.etcd.io/etcd/<name>/v3) at the server's version;
# its other replaces (the repository root, the tests module) are not needed to build the server.
etcd_sibling_version() { [[ $1 == go.etcd.io/etcd/*/v3 ]] && echo "$2" || true; }

build_kube() {
  local bins=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)
  local missing=0
  for b in "${bins[@]}"; do [[ -x $KUBE_BIN/$b ]] || missing=1; done
  ((missing)) || { log "kubernetes $KUBE_VERSION binaries already built"; return; }
  log "building kubernetes $KUBE_VERSION (${bins[*]});" \
    "the first build takes 15-40 minutes on 2 cores"
  local dir="$work/kubernetes-$KUBE_VERSION"
  wrapper_module "$dir" k8s.io/kubernetes "$KUBE_VERSION" kube_staging_version
  local minor=${KUBE_VERSION#v1.}
  minor=${minor%%.*}
  local pkg=k8s.io/component-base/version
  local ldflags="-s -w -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  (
    cd "$dir"
    local cmds=()
    for b in "${bins[@]}"; do cmds+=("k8s.io/kubernetes/cmd/$b"); done
    go get "${cmds[@]/%/@$KUBE_VERSION}"
    go build -trimpath -ldflags "$ldflags" -o "$KUBE_BIN/" "${cmds[@]}"
  )
}

build_etcd() {
  [[ -x $KUBE_BIN/etcd ]] && { log "etcd $ETCD_VERSION already built"; return; }
  log "building etcd $ETCD_VERSION"
  local dir="$work/etcd-$ETCD_VERSION"
  wrapper_module "$dir" go.etcd.io/etcd/server/v3 "$ETCD_VERSION" etcd_sibling_version
  (
    cd "$dir"
    go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
    go build -trimpath -ldflags "-s -w" -o "$KUBE_BIN/etcd" go.etcd.io/etcd/server/v3
  )
}

# go_install NAME PACKAGE VERSION: plain `go install` for modules without local replaces.
go_install() {
  local name=$1 pkg=$2 version=$3
  [[ -x $TOOLS_BIN/$name-$version ]] && { log "$name $version already built"; return; }
  log "building $name $version"
  GOBIN="$TOOLS_BIN/.gobin-$name" go install -trimpath -ldflags "-s -w" "$pkg@$version"
  mv "$TOOLS_BIN/.gobin-$name/$name" "$TOOLS_BIN/$name-$version"
  rmdir "$TOOLS_BIN/.gobin-$name"
  ln -sfn "$name-$version" "$TOOLS_BIN/$name"
}

build_etcd
go_install kwok sigs.k8s.io/kwok/cmd/kwok "$KWOK_VERSION"
go_install helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION"
build_kube
log "control plane binaries are in $KUBE_BIN and $TOOLS_BIN"
