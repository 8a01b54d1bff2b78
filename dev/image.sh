#!/usr/bin/env bash
# Builds the test bed's container images with podman, from Debian's packages only (there is no
# container registry here):
#   base   a Debian bookworm root filesystem made by mmdebstrap from this machine's apt
#          sources, imported as $BASE_IMAGE: the Dockerfile's BASE_IMAGE for the image below
#   pause  the pod sandbox image of the node (dev/node/pause.c, a static program), $PAUSE_IMAGE
#   app    the project's image from the root Dockerfile, target `prebuilt`: the binaries that
#          `make build` made are copied in instead of being compiled again, $APP_IMAGE
# Each is also exported as an OCI archive into $IMAGES_DIR, which dev/node.sh imports into the
# node's containerd. Base and pause are built once per cache; the app image whenever asked (a
# rebuild with unchanged binaries reuses podman's layer cache).
#
#   dev/image.sh build            all three; prints the app image's manifest digest
#   dev/image.sh podman ARGS...   podman with the test bed's storage and runtime settings
#
# podman keeps its images in $STREAMAPP_CACHE/podman, not in the machine's own store, and runs
# builds with runc and cgroupfs (crun does not support this machine's hybrid cgroups).
source "$(dirname "$0")/lib.sh"

PODMAN_ROOT="$STREAMAPP_CACHE/podman/storage"
PODMAN_RUNROOT="$STREAMAPP_CACHE/podman/run"
# The kernel refuses raising these above what this sandbox allows (no CAP_SYS_RESOURCE);
# podman's defaults are higher.
ULIMITS=(--ulimit nofile=20000:20000 --ulimit nproc=32768:32768)

tb_podman() {
  podman --root "$PODMAN_ROOT" --runroot "$PODMAN_RUNROOT" --tmpdir "$PODMAN_RUNROOT/libpod" --storage-driver overlay \
    --runtime runc --cgroup-manager cgroupfs --events-backend file "$@"
}

# The apt sources this machine is configured with: mmdebstrap pastes each file into the image.
apt_sources() {
  local f
  [[ -s /etc/apt/sources.list ]] && grep -qE '^[[:space:]]*deb ' /etc/apt/sources.list && echo /etc/apt/sources.list
  for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] && echo "$f"
  done
}

build_base() {
  local archive="$IMAGES_DIR/debian-bookworm-minbase.tar"
  if ! tb_podman image exists "$BASE_IMAGE"; then
    if [[ ! -s $archive ]]; then
      command -v mmdebstrap >/dev/null || die "mmdebstrap is not installed (dev/install-system-packages.sh installs it)"
      local sources
      mapfile -t sources < <(apt_sources)
      ((${#sources[@]})) || die "no apt sources configured on this machine (/etc/apt/sources.list*): mmdebstrap needs a Debian mirror"
      log "making a Debian bookworm base with mmdebstrap (about a minute)"
      mmdebstrap --quiet --variant=minbase --format=tar bookworm "$archive.tmp" "${sources[@]}" ||
        die "mmdebstrap failed to make the Debian base"
      mv "$archive.tmp" "$archive"
    fi
    tb_podman import --quiet --change 'CMD ["/bin/bash"]' "$archive" "$BASE_IMAGE" >/dev/null ||
      die "podman could not import the Debian base $archive"
  fi
}

build_pause() {
  local archive="$IMAGES_DIR/pause.oci.tar"
  [[ -s $archive ]] && tb_podman image exists "$PAUSE_IMAGE" && return
  log "building the pod sandbox image $PAUSE_IMAGE"
  local ctx
  ctx=$(mktemp -d)
  gcc -static -Os -Wall -o "$ctx/pause" "$DEV_DIR/node/pause.c" ||
    { rm -rf "$ctx"; die "compiling dev/node/pause.c failed (gcc with a static libc is needed)"; }
  tb_podman build --quiet --network none -f "$DEV_DIR/node/pause.Containerfile" -t "$PAUSE_IMAGE" "$ctx" >/dev/null ||
    { rm -rf "$ctx"; die "podman build of the pause image failed"; }
  rm -rf "$ctx"
  rm -f "$archive"
  tb_podman save --quiet --format oci-archive -o "$archive" "$PAUSE_IMAGE"
}

build_app() {
  local bin="${CARGO_TARGET_DIR:-$STREAMAPP_CACHE/target}/release"
  local ctx="$STREAMAPP_CACHE/image-context"
  mkdir -p "$ctx/prebuilt"
  for b in streamapp-operator streamapp-processor streamapp-agent; do
    [[ -x $bin/$b ]] || die "$bin/$b is not built: run 'make build'"
    # Debug info stripped as the Dockerfile's own build does (RocksDB's makes the processor
    # half a gigabyte). Only replaced when the build changed, so podman's layer cache holds.
    if [[ ! -f $ctx/prebuilt/$b || $bin/$b -nt $ctx/prebuilt/$b ]]; then
      strip --strip-debug -o "$ctx/prebuilt/$b.tmp" "$bin/$b" && mv "$ctx/prebuilt/$b.tmp" "$ctx/prebuilt/$b"
    fi
  done
  log "building $APP_IMAGE (Dockerfile target prebuilt, base $BASE_IMAGE)"
  tb_podman build --quiet --network host "${ULIMITS[@]}" --target prebuilt \
    --build-arg BASE_IMAGE="$BASE_IMAGE" -f "$REPO_DIR/Dockerfile" -t "$APP_IMAGE" "$ctx" >/dev/null ||
    die "podman build of $APP_IMAGE failed"
  # Earlier builds of the tag are left untagged: remove them, they only fill the disk.
  tb_podman image prune --force >/dev/null
  # The image must work as the chart and the operator run it: read-only, non-root, no network.
  for b in streamapp-operator streamapp-processor streamapp-agent; do
    tb_podman run --rm --read-only --network none "${ULIMITS[@]}" "$APP_IMAGE" "$b" --help >/dev/null ||
      die "'$b --help' fails in $APP_IMAGE"
  done
  local id
  id=$(tb_podman image inspect --format '{{.Id}}' "$APP_IMAGE")
  if [[ $(cat "$IMAGES_DIR/app.id" 2>/dev/null) != "$id" || ! -s $IMAGES_DIR/app.oci.tar ]]; then
    rm -f "$IMAGES_DIR/app.oci.tar"
    tb_podman save --quiet --format oci-archive -o "$IMAGES_DIR/app.oci.tar.tmp" "$APP_IMAGE"
    mv "$IMAGES_DIR/app.oci.tar.tmp" "$IMAGES_DIR/app.oci.tar"
    echo "$id" >"$IMAGES_DIR/app.id"
  fi
  # The manifest digest the node's containerd knows the image by.
  local digest
  digest=$(tar -xOf "$IMAGES_DIR/app.oci.tar" index.json | sed -n 's/.*"digest":"\(sha256:[0-9a-f]*\)".*/\1/p')
  log "$APP_IMAGE is $digest ($(du -m "$IMAGES_DIR/app.oci.tar" | cut -f1) MiB OCI archive: $IMAGES_DIR/app.oci.tar)"
}

# The images that do not need the project's binaries.
base() {
  command -v podman >/dev/null || die "podman is not installed (dev/install-system-packages.sh installs it)"
  command -v runc >/dev/null || die "runc is not installed (dev/install-system-packages.sh installs it)"
  mkdir -p "$IMAGES_DIR" "$PODMAN_ROOT" "$PODMAN_RUNROOT"
  build_base
  build_pause
}

build() {
  base
  build_app
}

case "${1:-}" in
  base) base ;;
  build) build ;;
  podman)
    shift
    tb_podman "$@"
    ;;
  *) die "usage: $0 base | build | podman ARGS..." ;;
esac
