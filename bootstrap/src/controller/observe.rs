//! All reads one reconcile of an EtcdadmConfig needs, turned into its one `Observation`.

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;
use kube::{Client, Resource, ResourceExt};

use etcdadm_shared::api::capi::{Cluster, Machine};
use etcdadm_shared::api::{EtcdadmCluster, EtcdadmConfig};
use etcdadm_shared::contract::ClusterRef;
use etcdadm_shared::contract::ca::{Ca, ca_from_secret, member_ca, read_ca};
use etcdadm_shared::contract::init_lock;
use etcdadm_shared::contract::init_secret::InitSecret;
use etcdadm_shared::error::Error;
use etcdadm_shared::names;

use super::plan::{CaView, ClusterView, DataSecretView, EtcdClusterView, LockView, MachineView, Observation};
use crate::render::{LearnerJoin, ResolvedSecrets, SnapshotDownload, secret_refs};

/// Read everything for `config`.
pub async fn observe(client: &Client, config: &EtcdadmConfig) -> Result<Observation, Error> {
    // Each read depends on the one before (Machine → Cluster → lock, CA; config → Secrets).
    let namespace = config.namespace().ok_or_else(|| {
        Error::Internal(format!(
            "EtcdadmConfig {} reached reconcile without a namespace",
            config.name_any()
        ))
    })?;
    let machines: Api<Machine> = Api::namespaced(client.clone(), &namespace);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);

    let machine = match owner_name(config, "Machine", "cluster.x-k8s.io") {
        Some(name) => machines.get_opt(&name).await?,
        None => None,
    };
    let cluster_name = machine
        .as_ref()
        .and_then(|m| m.labels().get(names::CLUSTER_NAME_LABEL).cloned());
    let cluster = match &cluster_name {
        Some(name) => {
            Api::<Cluster>::namespaced(client.clone(), &namespace)
                .get_opt(name)
                .await?
        }
        None => None,
    };
    let etcd_cluster_name = machine
        .as_ref()
        .and_then(|m| owner_name(m, "EtcdadmCluster", "etcdcluster.cluster.x-k8s.io"));
    let etcd_cluster = match &etcd_cluster_name {
        Some(name) => {
            Api::<EtcdadmCluster>::namespaced(client.clone(), &namespace)
                .get_opt(name)
                .await?
        }
        None => None,
    };

    let data_secret = match secrets.get_opt(&config.name_any()).await? {
        None => DataSecretView::Missing,
        Some(secret) => data_secret_view(&secret, config),
    };

    let mut init_client_urls = None;
    let mut lock = LockView::Free;
    let mut lock_resource_version = None;
    let mut ca = CaView::Missing;
    if let Some(cluster) = &cluster_name {
        if let Some(init) = secrets.get_opt(&names::init_secret_name(cluster)).await? {
            init_client_urls = Some(InitSecret::from_secret(&init).join_urls());
        }
        let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
        if let Some(lock_cm) = configmaps.get_opt(&names::init_lock_name(cluster)).await? {
            lock_resource_version = lock_cm.resource_version();
            lock = match init_lock::holder(&lock_cm) {
                // The holder is looked up in the Cluster's namespace (the lock's own).
                Some(holder) => {
                    let holder_exists = machines.get_opt(&holder).await?.is_some_and(|m| !m.is_deleting());
                    LockView::Held {
                        holder,
                        holder_exists,
                    }
                }
                None => LockView::Unreadable,
            };
        }
        ca = read_ca(&secrets, &namespace, cluster).await?;
        if let (CaView::Valid(current), Some(named)) =
            (&ca, config.annotations().get(names::CA_BUNDLE_ANNOTATION))
        {
            ca = rotating_member_ca(&secrets, &namespace, cluster, current, named).await?;
        }
    }

    let (resolved, mut spec_problem) = if data_secret == DataSecretView::Missing {
        resolve_secret_refs(&secrets, config, &namespace).await?
    } else {
        (ResolvedSecrets::default(), None)
    };
    let restore_secret = config.annotations().get(names::RESTORE_SECRET_ANNOTATION);
    let mut restore = None;
    if let (DataSecretView::Missing, Some(name)) = (&data_secret, restore_secret) {
        match secrets.get_opt(name).await? {
            Some(secret) => match restore_secret_not_ours(&secret, etcd_cluster.as_ref())
                .map_or_else(|| snapshot_download(&secret), Err)
            {
                Ok(download) => restore = Some(download),
                Err(problem) => spec_problem = spec_problem.or(Some(problem)),
            },
            None => {
                spec_problem = spec_problem.or_else(|| {
                    Some(format!(
                        "metadata.annotations[{}]: Secret {namespace}/{name} not found (the \
                         EtcdadmCluster controller creates it before the Machine; it is deleted once \
                         the restored member is healthy)",
                        names::RESTORE_SECRET_ANNOTATION
                    ))
                })
            }
        }
    }

    Ok(Observation {
        namespace,
        paused_annotation: config.annotations().contains_key(names::PAUSED_ANNOTATION),
        machine: machine.as_ref().map(|m| MachineView {
            name: m.name_any(),
            cluster_name: cluster_name.clone(),
            etcd_cluster: etcd_cluster_name.clone(),
            address: m.etcd_address().map(str::to_string),
            deleting: m.is_deleting(),
        }),
        cluster: match &cluster {
            None => ClusterView::Missing,
            Some(c) => ClusterView::Found {
                reference: ClusterRef::of(c)?,
                paused: c.is_paused(),
                managed_etcd_initialized: c.managed_etcd_initialized(),
            },
        },
        etcd_cluster: etcd_cluster.as_ref().map(etcd_cluster_view),
        data_secret,
        init_client_urls,
        lock,
        ca,
        spec_problem,
        learner_join: LearnerJoin::of(config),
        secrets: resolved,
        restore,
        lock_resource_version,
    })
}

/// Why the Secret the restore annotation names is not used: only the EtcdadmCluster that owns
/// this config's Machine writes one, with its controller reference (by UID), so the CA and URL
/// of any other Secret a config is pointed at never reach a machine.
fn restore_secret_not_ours(secret: &Secret, etcd_cluster: Option<&EtcdadmCluster>) -> Option<String> {
    let field = format!("metadata.annotations[{}]", names::RESTORE_SECRET_ANNOTATION);
    let Some(etcd) = etcd_cluster else {
        return Some(format!(
            "{field}: only a member of an EtcdadmCluster is restored from a snapshot, and this              config's Machine belongs to none"
        ));
    };
    let uid = etcd.meta().uid.as_deref();
    let ours = secret.owner_references().iter().any(|o| {
        o.controller == Some(true)
            && o.kind == "EtcdadmCluster"
            && o.api_version.split('/').next() == Some("etcdcluster.cluster.x-k8s.io")
            && Some(o.uid.as_str()) == uid
    });
    (!ours).then(|| {
        format!(
            "{field}: Secret {} is not controlled by EtcdadmCluster {} (the one that writes a              restore's download URL), so it is not used",
            secret.name_any(),
            etcd.name_any()
        )
    })
}

/// The download a restore Secret describes; a missing URL or a value that is not UTF-8 is the
/// problem to show.
fn snapshot_download(secret: &Secret) -> Result<SnapshotDownload, String> {
    let data = secret.data.clone().unwrap_or_default();
    let text = |key: &str| -> Result<Option<String>, String> {
        data.get(key)
            .map(|v| {
                String::from_utf8(v.0.clone()).map_err(|_| {
                    format!(
                        "metadata.annotations[{}]: Secret {} has a key {key} that is not UTF-8",
                        names::RESTORE_SECRET_ANNOTATION,
                        secret.name_any()
                    )
                })
            })
            .transpose()
    };
    let url = text(names::RESTORE_URL_KEY)?.ok_or_else(|| {
        format!(
            "metadata.annotations[{}]: Secret {} has no key {}",
            names::RESTORE_SECRET_ANNOTATION,
            secret.name_any(),
            names::RESTORE_URL_KEY
        )
    })?;
    let not_positive = |key: &str| {
        format!(
            "metadata.annotations[{}]: Secret {} has a key {key} that is not a positive number",
            names::RESTORE_SECRET_ANNOTATION,
            secret.name_any()
        )
    };
    let bump_revision = text(names::RESTORE_BUMP_REVISION_KEY)?
        .map(|v| positive::<i64>(&v).ok_or_else(|| not_positive(names::RESTORE_BUMP_REVISION_KEY)))
        .transpose()?;
    let size = text(names::RESTORE_SIZE_KEY)?
        .map(|v| positive::<u64>(&v).ok_or_else(|| not_positive(names::RESTORE_SIZE_KEY)))
        .transpose()?;
    Ok(SnapshotDownload {
        size,
        url,
        sha256: text(names::RESTORE_SHA256_KEY)?,
        ca_pem: text(names::RESTORE_CA_KEY)?,
        bump_revision,
        insecure: text(names::RESTORE_INSECURE_KEY)?.is_some_and(|v| v.trim() == "true"),
    })
}

/// A whole number above zero, written with or without surrounding space.
fn positive<T: std::str::FromStr + PartialOrd + Default>(value: &str) -> Option<T> {
    value.trim().parse::<T>().ok().filter(|n| *n > T::default())
}

/// Name of the owner of `kind` in `group` (any version), preferring the controller reference.
fn owner_name<K: Resource>(object: &K, kind: &str, group: &str) -> Option<String> {
    let matching = |r: &&k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference| {
        r.kind == kind && r.api_version.split('/').next() == Some(group)
    };
    let owners = object.meta().owner_references.as_deref().unwrap_or_default();
    owners
        .iter()
        .filter(matching)
        .find(|r| r.controller == Some(true))
        .or_else(|| owners.iter().find(matching))
        .map(|r| r.name.clone())
}

fn data_secret_view(secret: &Secret, config: &EtcdadmConfig) -> DataSecretView {
    let controller = secret
        .owner_references()
        .iter()
        .find(|r| r.controller == Some(true));
    match controller {
        Some(owner) if Some(&owner.uid) == config.uid().as_ref() => DataSecretView::Ours,
        Some(owner) => DataSecretView::Foreign(format!(
            "Secret {} already exists and is controlled by {} {}; it is not overwritten",
            secret.name_any(),
            owner.kind,
            owner.name
        )),
        None => DataSecretView::Foreign(format!(
            "Secret {} already exists without a controller; delete it or make this EtcdadmConfig its controller",
            secret.name_any()
        )),
    }
}

pub(super) fn etcd_cluster_view(etcd: &EtcdadmCluster) -> EtcdClusterView {
    let status = etcd.status.clone().unwrap_or_default();
    EtcdClusterView {
        initialized: status.initialized,
        healthy_client_urls: status
            .members
            .iter()
            .filter(|m| m.healthy && !m.is_learner)
            .filter_map(|m| m.client_url.clone())
            .collect(),
        reports_members: !status.members.is_empty(),
    }
}

/// Fetch every Secret value the spec refers to; the first missing one becomes the spec problem
/// (an optional reference's Secret may be absent, not a key of it when it exists).
async fn resolve_secret_refs(
    secrets: &Api<Secret>,
    config: &EtcdadmConfig,
    namespace: &str,
) -> Result<(ResolvedSecrets, Option<String>), Error> {
    let mut resolved = ResolvedSecrets::default();
    for reference in secret_refs(&config.spec) {
        let Some(secret) = secrets.get_opt(&reference.secret_name).await? else {
            if reference.optional {
                continue;
            }
            let problem = format!(
                "{}: Secret {namespace}/{} not found",
                reference.field_path, reference.secret_name
            );
            return Ok((resolved, Some(problem)));
        };
        let Some(value) = secret
            .data
            .as_ref()
            .and_then(|d| d.get(&reference.key))
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
        else {
            let problem = format!(
                "{}: Secret {namespace}/{} has no UTF-8 key {}",
                reference.field_path, reference.secret_name, reference.key
            );
            return Ok((resolved, Some(problem)));
        };
        resolved.insert(&reference.target, value);
    }
    Ok((resolved, None))
}

/// The CA a member of a CA rotation gets (docs/security.md, "Rotating the etcd CA"): the bundle
/// its config's `ca-bundle` annotation names, from the current CA and the next one
/// (`<cluster>-managed-etcd-next`), its signer's key for etcdadm. A CA it names that neither
/// Secret holds is reported and nothing is rendered: a guess would make a member its peers may
/// not trust.
async fn rotating_member_ca(
    secrets: &Api<Secret>,
    namespace: &str,
    cluster: &str,
    current: &Ca,
    named: &str,
) -> Result<CaView, Error> {
    let next_name = names::next_ca_secret_name(cluster);
    let next = secrets
        .get_opt(&next_name)
        .await?
        .and_then(|secret| ca_from_secret(&secret, namespace, &next_name).ok());
    let known: Vec<&etcdadm_shared::pki::CertificateAuthority> =
        std::iter::once(&**current).chain(next.as_ref()).collect();
    Ok(match member_ca(Some(named), &known) {
        Ok(bundle) => CaView::Valid(Ca::new(bundle)),
        Err(problem) => CaView::Corrupt(format!(
            "{problem} ({} and {next_name})",
            names::ca_secret_name(cluster)
        )),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use serde_json::json;

    fn etcd_cluster(uid: &str) -> EtcdadmCluster {
        serde_json::from_value(json!({
            "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
            "metadata": {"name": "c1-etcd", "namespace": "ns", "uid": uid},
            "spec": {"infrastructureTemplate": {"kind": "K", "name": "t"}},
        }))
        .unwrap()
    }

    fn secret(owners: serde_json::Value) -> Secret {
        serde_json::from_value(json!({"metadata": {"name": "c1-etcd-restore", "ownerReferences": owners}}))
            .unwrap()
    }

    fn owner(kind: &str, api_version: &str, uid: &str, controller: bool) -> serde_json::Value {
        json!({"apiVersion": api_version, "kind": kind, "name": "c1-etcd", "uid": uid, "controller": controller})
    }

    #[test]
    fn only_a_restore_secret_controlled_by_the_machines_etcdadmcluster_is_used() {
        let ours = etcd_cluster("u1");
        let group = "etcdcluster.cluster.x-k8s.io/v1beta1";
        assert_eq!(
            restore_secret_not_ours(
                &secret(json!([owner("EtcdadmCluster", group, "u1", true)])),
                Some(&ours)
            ),
            None
        );
        for (what, owners) in [
            ("no owner", json!([])),
            (
                "another cluster's",
                json!([owner("EtcdadmCluster", group, "u2", true)]),
            ),
            (
                "not the controller",
                json!([owner("EtcdadmCluster", group, "u1", false)]),
            ),
            (
                "another kind",
                json!([owner("Cluster", "cluster.x-k8s.io/v1beta2", "u1", true)]),
            ),
            (
                "another group",
                json!([owner("EtcdadmCluster", "evil.example/v1", "u1", true)]),
            ),
        ] {
            let problem = restore_secret_not_ours(&secret(owners), Some(&ours)).unwrap_or_default();
            assert!(
                problem.contains("is not controlled by EtcdadmCluster c1-etcd"),
                "{what}: {problem:?}"
            );
            assert!(problem.starts_with("metadata.annotations[etcdcluster.cluster.x-k8s.io/restore-secret]"));
        }
        let standalone =
            restore_secret_not_ours(&secret(json!([owner("EtcdadmCluster", group, "u1", true)])), None);
        assert!(standalone.unwrap_or_default().contains("belongs to none"));
    }
}
