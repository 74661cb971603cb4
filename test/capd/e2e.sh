#!/usr/bin/env bash
# End-to-end run of the etcdadm providers on kind + Cluster API's Docker provider (CAPD):
# builds the image and a clusterctl local repository from this checkout, creates a kind
# management cluster, installs CAPI + kubeadm + CAPD + etcdadm with clusterctl, creates a
# workload cluster with external etcd, then checks, scales 3 -> 5 -> 3, rolls etcd to a new
# version and deletes everything. Stops at the first broken step with diagnostics.
#
# Needs: Linux, docker, kind, kubectl, clusterctl (v1.13+), curl, and internet access.
# Settings (environment): see test/capd/README.md.
set -Eeuo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"

: "${E2E_WORK_DIR:=$root/out/capd}"
: "${MGMT_CLUSTER_NAME:=etcdadm-mgmt}"
: "${CLUSTER_NAME:=etcd-e2e}"
: "${NAMESPACE:=default}"
: "${KUBERNETES_VERSION:=v1.34.0}"
: "${CONTROL_PLANE_MACHINE_COUNT:=1}"
: "${ETCD_VERSION:=3.5.17}"
: "${ETCD_UPGRADE_VERSION:=3.5.21}"
: "${ETCDADM_VERSION:=v0.1.5}"
: "${ETCDADM_IMAGE:=etcdadm-providers:e2e}"
: "${SKIP_IMAGE_BUILD:=false}"
: "${CAPI_VERSION:=}"
: "${CALICO_VERSION:=v3.29.1}"
: "${E2E_TIMEOUT:=1200}"
: "${KEEP_ON_FAILURE:=false}"
export CLUSTER_NAME NAMESPACE KUBERNETES_VERSION CONTROL_PLANE_MACHINE_COUNT ETCD_VERSION \
  ETCDADM_VERSION ETCDADM_IMAGE

etcd_name="$CLUSTER_NAME-etcd"
kcp_name="$CLUSTER_NAME-control-plane"
mgmt_kubeconfig="$E2E_WORK_DIR/management.kubeconfig"
workload_kubeconfig="$E2E_WORK_DIR/workload.kubeconfig"
clusterctl_config="$E2E_WORK_DIR/clusterctl.yaml"
shim_pid=""
current_step="setup"
succeeded=false

log() { printf '%s [e2e] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
step() {
  current_step="$*"
  printf '\n==== %s\n' "$*"
}
die() {
  printf '\nerror in step "%s": %s\n' "$current_step" "$*" >&2
  exit 1
}

k() { kubectl --kubeconfig "$mgmt_kubeconfig" "$@"; }
kn() { k -n "$NAMESPACE" "$@"; }
kw() { kubectl --kubeconfig "$workload_kubeconfig" "$@"; }

diagnostics() {
  [[ -f "$mgmt_kubeconfig" ]] || return 0
  printf '\n==== diagnostics\n' >&2
  k get cluster,kubeadmcontrolplane,etcdadmcluster,machines,devmachines -A -o wide >&2 || true
  kn get etcdadmcluster "$etcd_name" -o yaml >&2 || true
  kn get etcdadmconfigs -o yaml >&2 || true
  for deploy in etcdadm-bootstrap-manager etcdadm-controller-manager; do
    printf '\n---- logs of %s\n' "$deploy" >&2
    k -n etcdadm-system logs "deploy/$deploy" --tail=200 >&2 || true
  done
  printf '\n---- logs of capd\n' >&2
  k -n capd-system logs deploy/capd-controller-manager --tail=100 >&2 || true
}

delete_everything() {
  kind delete cluster --name "$MGMT_CLUSTER_NAME" || true
  # Workload containers outlive the management cluster if it went first.
  local leftovers
  leftovers="$(docker ps -aq --filter "label=io.x-k8s.kind.cluster=$CLUSTER_NAME")"
  if [[ -n "$leftovers" ]]; then
    # shellcheck disable=SC2086 # one container id per word
    docker rm -f $leftovers >/dev/null || true
  fi
}

on_exit() {
  local status=$?
  if [[ -n "$shim_pid" ]]; then
    kill "$shim_pid" 2>/dev/null || true
    wait "$shim_pid" 2>/dev/null || true
  fi
  if [[ "$succeeded" != true ]]; then
    diagnostics
    if [[ "$KEEP_ON_FAILURE" == true ]]; then
      printf '\nKept for inspection: KUBECONFIG=%s; delete with: kind delete cluster --name %s\n' \
        "$mgmt_kubeconfig" "$MGMT_CLUSTER_NAME" >&2
    else
      delete_everything
    fi
    printf '\nE2E FAILED in step "%s" (exit %s)\n' "$current_step" "$status" >&2
  fi
}
trap on_exit EXIT
trap 'die "command failed at line $LINENO: $BASH_COMMAND"' ERR

# wait_until DESCRIPTION TIMEOUT_SECONDS COMMAND...: poll every 10 s until COMMAND succeeds.
wait_until() {
  local what="$1" timeout="$2"
  shift 2
  local deadline=$((SECONDS + timeout))
  log "waiting for: $what"
  until "$@"; do
    if ((SECONDS >= deadline)); then
      die "timed out after ${timeout}s waiting for: $what"
    fi
    sleep 10
  done
  log "done: $what"
}

require() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool not found on PATH (see test/capd/README.md)"
  done
}

# ---- facts read from the management cluster

etcd_field() { kn get etcdadmcluster "$etcd_name" -o jsonpath="$1"; }

# Names of the etcd member Machines that are not being deleted.
# (kubectl's JSONPath has no negation: deleting ones are filtered out by awk.)
member_machines() {
  kn get machines -l "cluster.x-k8s.io/etcd-cluster=$etcd_name" \
    -o jsonpath='{range .items[*]}{.metadata.name}{"|"}{.metadata.deletionTimestamp}{"\n"}{end}' |
    awk -F'|' '$1 != "" && $2 == "" { print $1 }'
}

# CAPD's container name for a Machine (its rule: no cluster prefix when the name has it).
container_of() {
  if [[ "$1" == "$CLUSTER_NAME"* ]]; then echo "$1"; else echo "$CLUSTER_NAME-$1"; fi
}

# etcdctl inside one running member, against the whole cluster.
member_etcdctl() {
  local machine container
  for machine in $(member_machines); do
    container="$(container_of "$machine")"
    if [[ "$(docker inspect -f '{{.State.Running}}' "$container" 2>/dev/null)" == true ]]; then
      docker exec "$container" /opt/bin/etcdctl --endpoints=https://127.0.0.1:2379 \
        --cacert=/etc/etcd/pki/ca.crt --cert=/etc/etcd/pki/etcdctl-etcd-client.crt \
        --key=/etc/etcd/pki/etcdctl-etcd-client.key "$@"
      return
    fi
  done
  return 1
}

etcd_ready_with() {
  local want="$1"
  [[ "$(etcd_field '{.status.ready}/{.status.readyReplicas}/{.spec.replicas}')" == "true/$want/$want" ]] || return 1
  [[ "$(member_machines | grep -c .)" == "$want" ]] || return 1
  [[ "$(member_etcdctl member list | grep -c started)" == "$want" ]]
}

etcd_health_all() {
  local want="$1" out
  out="$(member_etcdctl endpoint health --cluster 2>&1)" || return 1
  [[ "$(grep -c 'is healthy' <<<"$out")" == "$want" ]] && ! grep -q unhealthy <<<"$out"
}

kcp_endpoints() {
  kn get kubeadmcontrolplane "$kcp_name" \
    -o jsonpath='{.spec.kubeadmConfigSpec.clusterConfiguration.etcd.external.endpoints}' |
    tr -d '[]" ' | tr ',' '\n' | sort | paste -sd, -
}

kcp_has_etcd_endpoints() {
  local want
  want="$(etcd_field '{.status.endpoints}' | tr ',' '\n' | sort | paste -sd, -)"
  [[ -n "$want" && "$(kcp_endpoints)" == "$want" ]]
}

kcp_not_paused() {
  ! kn get kubeadmcontrolplane "$kcp_name" -o jsonpath='{.metadata.annotations}' |
    grep -q '"cluster.x-k8s.io/paused"'
}

kcp_initialized() {
  [[ "$(kn get kubeadmcontrolplane "$kcp_name" -o jsonpath='{.status.initialization.controlPlaneInitialized}')" == true ]]
}

# Every control plane Machine runs the current spec (the endpoints the controller wrote).
kcp_rolled_out() {
  local state gen counts want
  state="$(kn get kubeadmcontrolplane "$kcp_name" \
    -o jsonpath='{.metadata.generation}/{.status.observedGeneration} {.spec.replicas}/{.status.replicas}/{.status.upToDateReplicas}')"
  gen="${state%% *}"
  counts="${state#* }"
  [[ "${gen%/*}" == "${gen#*/}" ]] || return 1
  want="${counts%%/*}"
  [[ "$counts" == "$want/$want/$want" ]]
}

apiserver_uses_etcd() {
  [[ "$(kw get --raw=/readyz/etcd 2>/dev/null)" == ok ]]
}

etcd_runs_version() {
  local want="$1" versions
  versions="$(member_etcdctl endpoint status --cluster --write-out=fields 2>/dev/null | grep '"Version"')" || return 1
  [[ -n "$versions" ]] && ! grep -qv "\"$want\"" <<<"$versions"
}

members_spread() {
  # Every failure domain used by at most ceil(n/3) members: 1/1/1 for 3, 2/2/1 for 5.
  local n="$1" max
  max=$(((n + 2) / 3))
  local domains
  domains="$(kn get machines -l "cluster.x-k8s.io/etcd-cluster=$etcd_name" \
    -o jsonpath='{range .items[*]}{.spec.failureDomain}{"|"}{.metadata.deletionTimestamp}{"\n"}{end}' |
    awk -F'|' '$1 != "" && $2 == "" { print $1 }')"
  [[ "$(grep -c . <<<"$domains")" == "$n" ]] || return 1
  ! sort <<<"$domains" | uniq -c | awk -v max="$max" '$1 > max { bad = 1 } END { exit !bad }'
}

# CAPD only reports a machine as provisioned (and so lets CAPI copy its addresses to the Machine)
# after it has patched the matching Node in the workload cluster. etcd machines never become
# Nodes, and the workload control plane waits for etcd, so upstream CAPD alone deadlocks here.
# This loop plays the cloud provider for etcd machines only: once CAPD has run the bootstrap
# data (spec.backend.docker.bootstrapped) it sets the providerID CAPD would have set, after which
# CAPD marks the machine provisioned and CAPI copies its addresses.
capd_etcd_provider_ids() {
  # Runs in the background: a failed poll is retried, never fatal.
  set +eE
  trap - ERR
  while true; do
    k get devmachines -A -l cluster.x-k8s.io/etcd-cluster \
      -o jsonpath='{range .items[*]}{.metadata.namespace}{"|"}{.metadata.name}{"|"}{.spec.backend.docker.bootstrapped}{"|"}{.spec.providerID}{"|"}{.status.addresses[?(@.type=="Hostname")].address}{"\n"}{end}' 2>/dev/null |
      while IFS='|' read -r ns name bootstrapped provider_id host; do
        if [[ "$bootstrapped" == true && -z "$provider_id" && -n "$host" ]]; then
          k -n "$ns" patch devmachine "$name" --type=merge \
            -p "{\"spec\":{\"providerID\":\"docker:////$host\"}}" >/dev/null &&
            log "providerID set on etcd DevMachine $ns/$name"
        fi
      done
    sleep 5
  done
}

# ---- the run

step "check tools"
require docker kind kubectl clusterctl curl sed awk
docker info >/dev/null 2>&1 || die "docker is not usable by this user"
provider_version="$(sed -n 's/.*"nextVersion": *"\([^"]*\)".*/\1/p' "$root/clusterctl-settings.json")"
[[ -n "$provider_version" ]] || die "no nextVersion in clusterctl-settings.json"
log "kind $(kind version | head -n1); clusterctl $(clusterctl version -o short 2>/dev/null || clusterctl version)"
mkdir -p "$E2E_WORK_DIR"

step "build the provider image $ETCDADM_IMAGE"
if [[ "$SKIP_IMAGE_BUILD" == true ]]; then
  docker image inspect "$ETCDADM_IMAGE" >/dev/null || die "SKIP_IMAGE_BUILD=true but $ETCDADM_IMAGE does not exist"
else
  docker build -t "$ETCDADM_IMAGE" "$root"
fi

step "build the clusterctl local repository"
repository="$E2E_WORK_DIR/repository"
rm -rf "$repository"
# The image is built here and loaded into kind, not pushed: no digest to pin.
"$root/hack/release.sh" --unpinned "$repository/bootstrap-etcdadm/$provider_version"
sed -e "s|@LOCAL_REPOSITORY@|$repository|g" -e "s|/v0.1.0/|/$provider_version/|g" \
  "$here/clusterctl.yaml" >"$clusterctl_config"

step "create the management cluster $MGMT_CLUSTER_NAME"
kind delete cluster --name "$MGMT_CLUSTER_NAME" >/dev/null 2>&1 || true
kind create cluster --name "$MGMT_CLUSTER_NAME" --config "$here/kind-config.yaml" \
  --kubeconfig "$mgmt_kubeconfig" --wait 5m
kind load docker-image "$ETCDADM_IMAGE" --name "$MGMT_CLUSTER_NAME"

step "install the providers with clusterctl"
capi_suffix=""
[[ -n "$CAPI_VERSION" ]] && capi_suffix=":$CAPI_VERSION"
clusterctl init --kubeconfig "$mgmt_kubeconfig" --config "$clusterctl_config" \
  --core "cluster-api$capi_suffix" \
  --bootstrap "kubeadm$capi_suffix,etcdadm:$provider_version" \
  --control-plane "kubeadm$capi_suffix" \
  --infrastructure "docker$capi_suffix" \
  --wait-providers --wait-provider-timeout 600
for deploy in etcdadm-bootstrap-manager etcdadm-controller-manager; do
  k -n etcdadm-system rollout status "deploy/$deploy" --timeout=5m
done

step "create the workload cluster $CLUSTER_NAME (etcd $ETCD_VERSION, 3 members)"
capd_etcd_provider_ids &
shim_pid=$!
clusterctl generate cluster "$CLUSTER_NAME" --kubeconfig "$mgmt_kubeconfig" --config "$clusterctl_config" \
  --from "$here/cluster-template-e2e.yaml" --target-namespace "$NAMESPACE" \
  --kubernetes-version "$KUBERNETES_VERSION" --control-plane-machine-count "$CONTROL_PLANE_MACHINE_COUNT" \
  >"$E2E_WORK_DIR/cluster.yaml"
k apply -f "$E2E_WORK_DIR/cluster.yaml"

step "wait for the EtcdadmCluster to be Ready"
wait_until "EtcdadmCluster $etcd_name ready with 3 members" "$E2E_TIMEOUT" etcd_ready_with 3
members_spread 3 || die "etcd members are not spread 1/1/1 over the failure domains"

step "wait for the control plane"
wait_until "KCP endpoints = etcd endpoints" "$E2E_TIMEOUT" kcp_has_etcd_endpoints
wait_until "KCP un-paused" 300 kcp_not_paused
wait_until "control plane initialized" "$E2E_TIMEOUT" kcp_initialized
clusterctl get kubeconfig "$CLUSTER_NAME" --kubeconfig "$mgmt_kubeconfig" -n "$NAMESPACE" >"$workload_kubeconfig"
wait_until "kube-apiserver reports etcd ok" "$E2E_TIMEOUT" apiserver_uses_etcd
# A CNI, so that control plane Nodes become Ready and KCP rollouts below proceed normally.
kw apply -f "https://raw.githubusercontent.com/projectcalico/calico/$CALICO_VERSION/manifests/calico.yaml"

step "check etcd health and kube-apiserver through it"
etcd_health_all 3 || die "etcd endpoint health: $(member_etcdctl endpoint health --cluster 2>&1)"
kn get secret "$CLUSTER_NAME-etcd" "$CLUSTER_NAME-apiserver-etcd-client" >/dev/null ||
  die "the certificate Secrets for KCP are missing"
kw create configmap e2e-canary --from-literal=written-by=etcdadm-e2e
[[ "$(kw get configmap e2e-canary -o jsonpath='{.data.written-by}')" == etcdadm-e2e ]] ||
  die "canary ConfigMap did not read back"
member_etcdctl get /registry/configmaps/default/e2e-canary --keys-only | grep -q e2e-canary ||
  die "the canary ConfigMap is not in the external etcd"

step "scale etcd to 5"
kn scale etcdadmcluster "$etcd_name" --replicas=5
wait_until "5 healthy members" "$E2E_TIMEOUT" etcd_ready_with 5
members_spread 5 || die "5 members are not spread 2/2/1"
wait_until "KCP endpoints = the 5 members" "$E2E_TIMEOUT" kcp_has_etcd_endpoints
wait_until "KCP rollout finished" "$E2E_TIMEOUT" kcp_rolled_out
wait_until "kube-apiserver reports etcd ok" 600 apiserver_uses_etcd

step "scale etcd back to 3"
kn scale etcdadmcluster "$etcd_name" --replicas=3
wait_until "3 healthy members" "$E2E_TIMEOUT" etcd_ready_with 3
members_spread 3 || die "3 members are not spread 1/1/1 after scale down"
wait_until "KCP endpoints = the 3 members" "$E2E_TIMEOUT" kcp_has_etcd_endpoints
wait_until "KCP rollout finished" "$E2E_TIMEOUT" kcp_rolled_out
wait_until "kube-apiserver reports etcd ok" 600 apiserver_uses_etcd

step "roll etcd from $ETCD_VERSION to $ETCD_UPGRADE_VERSION"
[[ "$(etcd_field '{.spec.etcdadmConfigSpec.files[0].path}')" == /etc/etcdadm-e2e/etcd-version ]] ||
  die "files[0] of the EtcdadmCluster is not the etcd version file the template declares"
kn patch etcdadmcluster "$etcd_name" --type=json -p "[
  {\"op\": \"replace\", \"path\": \"/spec/etcdadmConfigSpec/cloudInitConfig/version\", \"value\": \"$ETCD_UPGRADE_VERSION\"},
  {\"op\": \"replace\", \"path\": \"/spec/etcdadmConfigSpec/files/0/content\", \"value\": \"$ETCD_UPGRADE_VERSION\\n\"}]"
wait_until "every member runs etcd $ETCD_UPGRADE_VERSION" "$((E2E_TIMEOUT * 2))" etcd_runs_version "$ETCD_UPGRADE_VERSION"
wait_until "3 healthy, up-to-date members" "$E2E_TIMEOUT" etcd_ready_with 3
[[ "$(etcd_field '{.status.updatedReplicas}')" == 3 ]] || die "updatedReplicas is not 3 after the rollout"
wait_until "KCP endpoints = the new members" "$E2E_TIMEOUT" kcp_has_etcd_endpoints
wait_until "KCP rollout finished" "$E2E_TIMEOUT" kcp_rolled_out
wait_until "kube-apiserver reports etcd ok" 600 apiserver_uses_etcd
[[ "$(kw get configmap e2e-canary -o jsonpath='{.data.written-by}')" == etcdadm-e2e ]] ||
  die "data written before the rollout is gone"
etcd_health_all 3 || die "etcd endpoint health after the rollout"

step "delete the workload cluster"
k -n "$NAMESPACE" delete cluster "$CLUSTER_NAME" --timeout=20m
[[ -z "$(kn get machines -l "cluster.x-k8s.io/cluster-name=$CLUSTER_NAME" -o name)" ]] ||
  die "Machines left after deleting the Cluster"
[[ -z "$(kn get etcdadmcluster -o name)" ]] || die "EtcdadmCluster left after deleting the Cluster"
[[ -z "$(kn get devmachinetemplates -o name)" ]] ||
  die "machine templates left after deleting the Cluster (the Cluster owns them)"
[[ -z "$(docker ps -aq --filter "label=io.x-k8s.kind.cluster=$CLUSTER_NAME")" ]] ||
  die "workload containers left after deleting the Cluster"

step "delete the management cluster"
kill "$shim_pid" 2>/dev/null || true
wait "$shim_pid" 2>/dev/null || true
shim_pid=""
kind delete cluster --name "$MGMT_CLUSTER_NAME"
succeeded=true
printf '\nE2E PASSED\n'
