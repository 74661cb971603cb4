//! Every object name, label, annotation, finalizer and Secret key the specs define, in one place.

/// Label on every object that belongs to a CAPI cluster.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// Label on the Machines of an EtcdadmCluster; the value is the EtcdadmCluster's name.
/// Label CAPI puts on control plane Machines.
pub const CONTROL_PLANE_LABEL: &str = "cluster.x-k8s.io/control-plane";
/// The Machine condition a v1beta2 Machine's owner reports: whether it runs the current spec.
pub const UP_TO_DATE_CONDITION: &str = "UpToDate";
/// Machine label naming the EtcdadmCluster it belongs to.
pub const ETCD_CLUSTER_LABEL: &str = "cluster.x-k8s.io/etcd-cluster";
/// Label that puts our objects under one clusterctl provider.
pub const PROVIDER_LABEL: &str = "cluster.x-k8s.io/provider";
/// Value of [`PROVIDER_LABEL`] for this provider pair.
pub const PROVIDER_NAME: &str = "bootstrap-etcdadm";

/// CRD label that tells CAPI which of our versions implements its v1beta1 contract.
pub const CONTRACT_V1BETA1_LABEL: &str = "cluster.x-k8s.io/v1beta1";
/// CRD label that tells CAPI which of our versions implements its v1beta2 contract.
pub const CONTRACT_V1BETA2_LABEL: &str = "cluster.x-k8s.io/v1beta2";

/// Pauses reconciliation of the object that carries it.
pub const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";
/// On a KubeadmControlPlane: do not pause it while managed etcd is not ready.
pub const SKIP_PAUSE_CP_ANNOTATION: &str = "cluster.x-k8s.io/skip-pause-cp-managed-etcd";
/// On an EtcdadmCluster: the reference's health-check retry count (0 turns remediation off).
pub const HEALTHCHECK_RETRIES_ANNOTATION: &str = "etcdcluster.cluster.x-k8s.io/healthcheck-retries";
/// On `<cluster>-apiserver-etcd-client`: when the controller last re-issued the certificate
/// (RFC 3339). The KubeadmControlPlane owes a rollout while its rollout time is earlier.
pub const APISERVER_CLIENT_RENEWED_ANNOTATION: &str = "etcdcluster.cluster.x-k8s.io/apiserver-client-renewed";
/// Environment of the etcd controller set (to anything) only by crash tests: it exits right
/// after re-issuing the API server client certificate, before the control plane rollout.
pub const EXIT_AFTER_CLIENT_RENEWAL_ENV: &str = "ETCDADM_TEST_EXIT_AFTER_CLIENT_RENEWAL";
/// On an EtcdadmConfig, set to `"true"` by the EtcdadmCluster controller when it creates the
/// config: the controller pre-adds the Machine's member as a learner, so the user data waits
/// for it before `etcdadm join` (see `EtcdadmConfig::joins_as_learner`).
pub const LEARNER_JOIN_ANNOTATION: &str = "etcdcluster.cluster.x-k8s.io/learner-join";
/// On a learner join's EtcdadmConfig, written by the EtcdadmCluster controller: how many seconds
/// the user data waits for its member to be listed (its turn may come after other joins; see
/// `EtcdadmConfig::learner_listed_wait`).
pub const LEARNER_LISTED_WAIT_ANNOTATION: &str = "etcdcluster.cluster.x-k8s.io/learner-listed-wait";
/// On a member Machine that joins as a learner: when its turn came (RFC 3339), written just
/// before its learner is added. Its join deadline runs from then, not from its creation.
pub const JOIN_STARTED_ANNOTATION: &str = "etcdcluster.cluster.x-k8s.io/join-started";
/// On the first member's EtcdadmConfig of a cluster created from a snapshot: the Secret (same
/// namespace) holding the snapshot's short-lived download URL ([`RESTORE_URL_KEY`]), its
/// SHA-256 ([`RESTORE_SHA256_KEY`], required: every restore is checked), the store's CA bundle
/// ([`RESTORE_CA_KEY`], optional) and whether a plain http URL is allowed
/// ([`RESTORE_INSECURE_KEY`]). The bootstrap provider renders `etcdadm init --snapshot` from it.
pub const RESTORE_SECRET_ANNOTATION: &str = "etcdcluster.cluster.x-k8s.io/restore-secret";
/// On the restore Secret: when its URL was presigned (RFC 3339), so it is renewed in time.
pub const RESTORE_URL_WRITTEN_ANNOTATION: &str = "etcdcluster.cluster.x-k8s.io/restore-url-written";
/// Restore Secret key: the presigned GET URL of the snapshot object.
pub const RESTORE_URL_KEY: &str = "url";
/// Restore Secret key: hex SHA-256 of the snapshot object.
pub const RESTORE_SHA256_KEY: &str = "sha256";
/// Restore Secret key: PEM CA bundle the store's certificate is checked against.
pub const RESTORE_CA_KEY: &str = "ca.crt";
/// Restore Secret key: raise the restored revision by this much and mark the older ones
/// compacted, where the node's etcdutl can (docs/day2.md, "Revisions after a restore").
pub const RESTORE_BUMP_REVISION_KEY: &str = "bumpRevision";
/// Restore Secret key: `"true"` when the store is `insecure: true`, the one case a plain
/// `http://` URL is downloaded from.
pub const RESTORE_INSECURE_KEY: &str = "insecure";
/// Restore Secret key: the object's size in bytes, when known: the download is refused past it
/// and given a deadline from it.
pub const RESTORE_SIZE_KEY: &str = "size";
/// On the restore Secret: where its SHA-256 came from (a `ChecksumSource`: EtcdadmSnapshot,
/// Spec, ObjectMetadata or Computed); a computed one is kept when the URL is renewed.
pub const RESTORE_SHA256_SOURCE_ANNOTATION: &str = "etcdcluster.cluster.x-k8s.io/sha256-source";
/// On an EtcdadmCluster with `spec.backup.verify`: run a restore drill now, once per value (a
/// token of the caller's, e.g. the time it asked), besides the schedule.
pub const DRILL_NOW_ANNOTATION: &str = "etcdcluster.cluster.x-k8s.io/drill-now";
/// On the restore Secret: why continuous backup's deltas cannot be restored as they stand (a
/// gap, a damaged object), so the restore waits saying so until they are read again.
pub const RESTORE_DELTAS_UNUSABLE_ANNOTATION: &str = "etcdcluster.cluster.x-k8s.io/deltas-unusable";
/// On the restore Secret: when the deltas were found unusable (RFC 3339).
pub const RESTORE_DELTAS_CHECKED_ANNOTATION: &str = "etcdcluster.cluster.x-k8s.io/deltas-checked";
/// On an EtcdadmCluster: rotate the etcd CA; the value tells one request from the next
/// (docs/security.md, "Rotating the etcd CA"; not acted on yet).
pub const ROTATE_CA_ANNOTATION: &str = "etcdcluster.cluster.x-k8s.io/rotate-ca";
/// On `<cluster>-managed-etcd-next`, and on `<cluster>-managed-etcd` once a rotation is done: the
/// `rotate-ca` request the CA in it was made for.
pub const CA_ROTATED_FOR_ANNOTATION: &str = "etcdcluster.cluster.x-k8s.io/ca-rotated-for";
/// On an EtcdadmConfig: the CAs its member's `ca.crt` holds, by SHA-256 fingerprint, comma
/// separated, the one whose key signs first. Absent: the CA of `<cluster>-managed-etcd` alone.
pub const CA_BUNDLE_ANNOTATION: &str = "etcdcluster.cluster.x-k8s.io/ca-bundle";
/// On an EtcdadmCluster: recover from quorum loss from this source (`latest`,
/// `member/<machine>`, `snapshot/<name>`), docs/day2.md, "Quorum loss".
pub const RECOVER_ANNOTATION: &str = "etcdcluster.cluster.x-k8s.io/recover";
/// On an EtcdadmSnapshot the EtcdadmCluster controller made before a disruptive change: why
/// (`before-rollout`, `before-scale-down`), docs/day2.md, "Snapshots before changes".
pub const SNAPSHOT_REASON_LABEL: &str = "etcdcluster.cluster.x-k8s.io/snapshot-reason";
/// [`SNAPSHOT_REASON_LABEL`] of the snapshot before a rolling replacement's first removal.
pub const BEFORE_ROLLOUT: &str = "before-rollout";
/// [`SNAPSHOT_REASON_LABEL`] of the snapshot before a scale-down's first removal.
pub const BEFORE_SCALE_DOWN: &str = "before-scale-down";
/// On an EtcdadmCluster: let the change waiting for its before-change snapshot go ahead without
/// it. Its value names that change (`<reason>@<decided>`); the controller removes it when it
/// uses it, and removes one naming no change under way.
pub const PROCEED_WITHOUT_SNAPSHOT_ANNOTATION: &str = "etcdcluster.cluster.x-k8s.io/proceed-without-snapshot";
/// On a Machine: prefer this one when choosing a scale-down victim.
pub const DELETE_MACHINE_ANNOTATION: &str = "cluster.x-k8s.io/delete-machine";
/// Prefix of CAPI's pre-terminate hook annotations: a Machine is not terminated while one is set.
pub const PRE_TERMINATE_HOOK_PREFIX: &str = "pre-terminate.delete.hook.machine.cluster.x-k8s.io";
/// Our pre-terminate hook: set on every etcd Machine so its member is removed before it goes.
pub const PRE_TERMINATE_HOOK_ANNOTATION: &str =
    "pre-terminate.delete.hook.machine.cluster.x-k8s.io/etcdadm-cluster";
/// CAPI's annotation naming the template an infrastructure machine was cloned from.
pub const CLONED_FROM_NAME_ANNOTATION: &str = "cluster.x-k8s.io/cloned-from-name";
/// The API group of infrastructure providers' kinds: the only group an EtcdadmCluster's
/// `spec.infrastructureTemplate` may name (its RBAC covers no other).
pub const INFRASTRUCTURE_GROUP: &str = "infrastructure.cluster.x-k8s.io";
/// CAPI's annotation naming the group and kind of that template (`Kind.group`).
pub const CLONED_FROM_GROUPKIND_ANNOTATION: &str = "cluster.x-k8s.io/cloned-from-groupkind";

/// Finalizer of the EtcdadmCluster controller (the reference's name, kept).
pub const ETCDADM_CLUSTER_FINALIZER: &str = "etcdcluster.cluster.x-k8s.io";

/// Type of every Secret CAPI reads or adopts.
pub const CLUSTER_SECRET_TYPE: &str = "cluster.x-k8s.io/secret";
/// Data Secret key holding the user data.
pub const DATA_SECRET_VALUE_KEY: &str = "value";
/// Data Secret key holding the user-data format.
pub const DATA_SECRET_FORMAT_KEY: &str = "format";
/// Certificate key in TLS Secrets.
pub const TLS_CERT_KEY: &str = "tls.crt";
/// Private key in TLS Secrets.
pub const TLS_KEY_KEY: &str = "tls.key";
/// `<cluster>-etcd-init` key: address of the first member.
pub const INIT_ADDRESS_KEY: &str = "address";
/// `<cluster>-etcd-init` key: comma-separated client URLs to join through.
pub const INIT_CLIENT_URLS_KEY: &str = "clientUrls";
/// `<cluster>-etcd-lock` key: JSON `{"machineName": ...}` of the lock holder.
pub const LOCK_INFORMATION_KEY: &str = "lock-information";

/// Cluster condition the EKS-A fork sets when managed etcd is initialized.
pub const MANAGED_ETCD_INITIALIZED_CONDITION: &str = "ManagedEtcdInitialized";

/// etcd's client port.
pub const ETCD_CLIENT_PORT: u16 = 2379;
/// etcd's peer port.
pub const ETCD_PEER_PORT: u16 = 2380;

/// Secret `<cluster>-managed-etcd`: the etcd CA (`tls.crt`, `tls.key`).
pub fn ca_secret_name(cluster: &str) -> String {
    format!("{cluster}-managed-etcd")
}

/// Secret `<cluster>-managed-etcd-next`: the CA a rotation moves to, beside the current one.
pub fn next_ca_secret_name(cluster: &str) -> String {
    format!("{cluster}-managed-etcd-next")
}

/// Secret `<cluster>-etcd-init`: where joining members find the cluster.
pub fn init_secret_name(cluster: &str) -> String {
    format!("{cluster}-etcd-init")
}

/// Secret `<etcdadmcluster>-restore`: see [`RESTORE_SECRET_ANNOTATION`].
pub fn restore_secret_name(etcd_cluster: &str) -> String {
    format!("{etcd_cluster}-restore")
}

/// ConfigMap `<cluster>-etcd-lock`: the init lock.
pub fn init_lock_name(cluster: &str) -> String {
    format!("{cluster}-etcd-lock")
}

/// Secret `<cluster>-etcd`: the etcd CA certificate for KubeadmControlPlane.
pub fn kcp_etcd_ca_secret_name(cluster: &str) -> String {
    format!("{cluster}-etcd")
}

/// Secret `<cluster>-apiserver-etcd-client`: the kube-apiserver's etcd client certificate.
pub fn apiserver_client_secret_name(cluster: &str) -> String {
    format!("{cluster}-apiserver-etcd-client")
}

/// Common name of the kube-apiserver's etcd client certificate.
pub fn apiserver_client_common_name(cluster: &str) -> String {
    format!("{cluster}-kube-apiserver-etcd-client")
}

/// `https://<address>:2379`, the client URL of a member at `address` (IPv6 bracketed).
pub fn client_url(address: &str) -> String {
    format!("https://{}:{ETCD_CLIENT_PORT}", host_for_url(address))
}

/// `https://<address>:2380`, the peer URL of a member at `address` (IPv6 bracketed).
pub fn peer_url(address: &str) -> String {
    format!("https://{}:{ETCD_PEER_PORT}", host_for_url(address))
}

/// `cluster.x-k8s.io/cluster-name=<cluster>,cluster.x-k8s.io/etcd-cluster=<etcd>`: the Machines
/// of an EtcdadmCluster (its `status.selector`, for the scale subresource).
pub fn member_selector(cluster: &str, etcd: &str) -> String {
    format!("{CLUSTER_NAME_LABEL}={cluster},{ETCD_CLUSTER_LABEL}={etcd}")
}

fn host_for_url(address: &str) -> String {
    if address.contains(':') && !address.starts_with('[') {
        format!("[{address}]")
    } else {
        address.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_names_follow_the_reference() {
        assert_eq!(ca_secret_name("c1"), "c1-managed-etcd");
        assert_eq!(next_ca_secret_name("c1"), "c1-managed-etcd-next");
        assert_eq!(init_secret_name("c1"), "c1-etcd-init");
        assert_eq!(init_lock_name("c1"), "c1-etcd-lock");
        assert_eq!(kcp_etcd_ca_secret_name("c1"), "c1-etcd");
        assert_eq!(apiserver_client_secret_name("c1"), "c1-apiserver-etcd-client");
        assert_eq!(
            apiserver_client_common_name("c1"),
            "c1-kube-apiserver-etcd-client"
        );
    }

    #[test]
    fn urls_bracket_ipv6_hosts() {
        assert_eq!(client_url("10.0.0.1"), "https://10.0.0.1:2379");
        assert_eq!(peer_url("fd00::2"), "https://[fd00::2]:2380");
        assert_eq!(client_url("etcd-0.example"), "https://etcd-0.example:2379");
    }
}
