# syntax=docker/dockerfile:1
# One image with both provider binaries (etcdadm-bootstrap, etcdadm-controller); each Deployment
# in config/manager sets its command. Build from the repository root:
#   docker build -t ghcr.io/etcdadm-rs/etcdadm-providers:v0.1.0 .
# Needs BuildKit (the default builder of current Docker) for the cache mounts.

ARG RUST_VERSION=1.89

FROM rust:${RUST_VERSION}-bookworm AS builder
# etcd-client compiles etcd's protobuf definitions at build time: protoc is required.
RUN apt-get update \
 && apt-get install -y --no-install-recommends protobuf-compiler libprotobuf-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bins -p etcdadm-bootstrap -p etcdadm-etcdcluster \
 && mkdir -p /out \
 && cp target/release/etcdadm-bootstrap target/release/etcdadm-controller /out/

# glibc-based (the builder is Debian bookworm too), no shell, runs as uid/gid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /out/etcdadm-bootstrap /out/etcdadm-controller /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/etcdadm-controller"]
CMD ["--help"]
