# syntax=docker/dockerfile:1
# One image with both provider binaries (etcdadm-bootstrap, etcdadm-controller); each Deployment
# in config/manager sets its command. Build from the repository root:
#   docker build -t ghcr.io/etcdadm-rs/etcdadm-providers:v0.1.0 .
# Needs BuildKit (the default builder of current Docker) for the cache mounts.

# Both base images are pinned by digest (the multi-arch index of the tag named beside it), so a
# rebuild uses the bytes that were reviewed. They were written where no registry could be
# reached: check them once with the commands below, and refresh them deliberately, with the tag:
#   docker buildx imagetools inspect rust:1.89-bookworm
#   docker buildx imagetools inspect gcr.io/distroless/cc-debian12:nonroot
# The Rust version is the workspace's rust-version (Cargo.toml).
FROM rust:1.89-bookworm@sha256:948f9b08a66e7fe01b03a98ef1c7568292e07ec2e4fe90d88c07bb14563c84ff AS builder
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
FROM gcr.io/distroless/cc-debian12:nonroot@sha256:9dac0a79194e45a7da0158a9c6da57b217585af0786db3845d1f0ec1a0dd182f
COPY --from=builder /out/etcdadm-bootstrap /out/etcdadm-controller /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/etcdadm-controller"]
CMD ["--help"]
