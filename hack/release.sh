#!/usr/bin/env bash
# Writes the clusterctl release assets of this provider into a directory (default out/):
# bootstrap-components.yaml (kustomize build of config/default), metadata.yaml and the cluster
# templates. Usage: hack/release.sh [OUTPUT_DIR]
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/out}"

if ! command -v kubectl >/dev/null 2>&1; then
  echo "hack/release.sh: kubectl not found; install kubectl (it has kustomize built in)" >&2
  exit 1
fi

mkdir -p "$out"
kubectl kustomize "$root/config/default" > "$out/bootstrap-components.yaml.tmp"
mv "$out/bootstrap-components.yaml.tmp" "$out/bootstrap-components.yaml"
cp "$root/metadata.yaml" "$out/metadata.yaml"

templates=("$root"/templates/cluster-template*.yaml)
if [[ ! -e "${templates[0]}" ]]; then
  echo "hack/release.sh: no templates/cluster-template*.yaml found" >&2
  exit 1
fi
cp "${templates[@]}" "$out/"

echo "release assets written to $out:"
printf '  %s\n' bootstrap-components.yaml metadata.yaml "${templates[@]##*/}"
