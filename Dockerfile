# syntax=docker/dockerfile:1
#
# The one StreamApp image: streamapp-operator, streamapp-processor and streamapp-agent on PATH.
# Published as ghcr.io/streamapp-dev/streamapp (the Helm chart's default image; StreamApps name
# the same image in spec.image, and the operator starts the processor and agent from it).
#
#   docker build -t ghcr.io/streamapp-dev/streamapp:0.1.0 .
#
# Two knobs serve builds that cannot or need not compile inside the build:
#   --build-arg BASE_IMAGE=...   the Debian bookworm image the runtime starts from
#   --target prebuilt            copy binaries built beforehand (the context's prebuilt/ folder,
#                                debug info stripped) instead of compiling them (RocksDB's C++
#                                takes half an hour)
# The local test bed uses both: dev/image.sh builds it with podman from a Debian base made by
# mmdebstrap and the binaries of `make build`.

ARG RUST_VERSION=1.95
ARG BASE_IMAGE=debian:bookworm-slim

# --- build -------------------------------------------------------------------------------
FROM rust:${RUST_VERSION}-bookworm AS builder
# rdkafka builds librdkafka with cmake (with OpenSSL, SASL and zlib); the rocksdb crate
# builds RocksDB's C++ and generates its bindings with libclang.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      cmake clang libclang-dev pkg-config \
      libssl-dev libsasl2-dev libcurl4-openssl-dev zlib1g-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The caches keep the registry and RocksDB's objects between builds (BuildKit).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
      --bin streamapp-operator --bin streamapp-processor --bin streamapp-agent \
 && mkdir -p /out \
 && cp target/release/streamapp-operator target/release/streamapp-processor \
       target/release/streamapp-agent /out/ \
 && strip --strip-debug /out/*

# --- runtime -----------------------------------------------------------------------------
# Debian rather than distroless: the processor links libssl3, zlib and libstdc++ dynamically,
# and distroless/cc has no zlib. Nothing is written to the root filesystem at run time (the
# pods mount it read-only); state lives on the volume the operator mounts.
FROM ${BASE_IMAGE} AS runtime
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 zlib1g libstdc++6 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 streamapp \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin streamapp
# The uid the operator's pods and the chart run as (runAsNonRoot needs a numeric user).
USER 65532:65532
# No entrypoint: the chart and the operator name the program (`streamapp-operator`,
# `streamapp-processor`, `streamapp-agent`); `docker run IMAGE streamapp-processor --help` works.
CMD ["streamapp-operator"]

# --- binaries built outside the image ----------------------------------------------------
FROM runtime AS prebuilt
COPY prebuilt/streamapp-operator prebuilt/streamapp-processor prebuilt/streamapp-agent /usr/local/bin/

# --- the default target: binaries compiled above -----------------------------------------
FROM runtime AS image
COPY --from=builder /out/ /usr/local/bin/
