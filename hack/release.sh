#!/usr/bin/env bash
# Writes the clusterctl release assets of this provider into a directory (default out/):
# bootstrap-components.yaml (kustomize build of config/default: the managers watch every
# namespace), bootstrap-components-namespaced.yaml (config/namespaced: they watch, and may read
# and write in, only the namespace ETCDADM_WATCH_NAMESPACE), metadata.yaml and the cluster
# templates.
#
# The managers' image is pinned by digest, as the Dockerfile pins its base images: set
# ETCDADM_IMAGE_DIGEST to the digest of the pushed image (sha256:<64 hex digits>, e.g. from
# `docker buildx imagetools inspect ghcr.io/etcdadm-rs/etcdadm-providers:v0.1.0`). --unpinned
# writes the tag alone, for an image built and loaded locally (test/capd/e2e.sh).
#
# Usage: hack/release.sh [--unpinned] [OUTPUT_DIR]
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pinned=true
if [[ "${1:-}" == "--unpinned" ]]; then
  pinned=false
  shift
fi
out="${1:-$root/out}"
image="ghcr.io/etcdadm-rs/etcdadm-providers:v0.1.0"

if ! command -v kubectl >/dev/null 2>&1; then
  echo "hack/release.sh: kubectl not found; install kubectl (it has kustomize built in)" >&2
  exit 1
fi
digest="${ETCDADM_IMAGE_DIGEST:-}"
if [[ "$pinned" == true && ! "$digest" =~ ^sha256:[0-9a-f]{64}$ ]]; then
  echo "hack/release.sh: the release pins its image by digest: set ETCDADM_IMAGE_DIGEST to the" \
    "pushed image's (sha256:<64 hex digits>; docker buildx imagetools inspect $image), or pass" \
    "--unpinned for a locally built image" >&2
  exit 1
fi

mkdir -p "$out"
# One components file per kustomization; the image (the ETCDADM_IMAGE variable's default, in
# both Deployments) gets the digest.
components() {
  local kustomization="$1" file="$2"
  kubectl kustomize "$root/config/$kustomization" > "$out/$file.tmp"
  if [[ "$pinned" == true ]]; then
    local uses
    uses=$(grep -c -F "\${ETCDADM_IMAGE:=$image}" "$out/$file.tmp" || true)
    if [[ "$uses" != 2 ]]; then
      echo "hack/release.sh: expected the image $image twice in config/$kustomization, found it $uses times" >&2
      exit 1
    fi
    sed -i "s|\${ETCDADM_IMAGE:=$image}|\${ETCDADM_IMAGE:=$image@$digest}|" "$out/$file.tmp"
  fi
  mv "$out/$file.tmp" "$out/$file"
}
components default bootstrap-components.yaml
components namespaced bootstrap-components-namespaced.yaml
cp "$root/metadata.yaml" "$out/metadata.yaml"

templates=("$root"/templates/cluster-template*.yaml)
if [[ ! -e "${templates[0]}" ]]; then
  echo "hack/release.sh: no templates/cluster-template*.yaml found" >&2
  exit 1
fi
cp "${templates[@]}" "$out/"

echo "release assets written to $out:"
printf '  %s\n' bootstrap-components.yaml bootstrap-components-namespaced.yaml metadata.yaml "${templates[@]##*/}"
