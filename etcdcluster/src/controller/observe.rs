//! All API reads of one EtcdadmCluster reconcile, turned into the plan's `Observed` (the etcd
//! side comes from `health`), plus the objects `apply` acts on.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::{Client, Resource, ResourceExt};

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::EtcdadmConfig;
use etcdadm_shared::api::capi::{Cluster, ControlPlaneEtcd, KubeadmControlPlane, Machine};
use etcdadm_shared::names;
use etcdadm_shared::pki::{CertificateAuthority, ca_from_secret};

use super::plan::{CaView, ClusterView, EtcdView, InitSecretView, KcpView, MachineView, Observed};
use crate::error::Error;

/// Group and kind of our own API, for owner references and `managedExternalEtcdRef`.
pub const ETCD_CLUSTER_GROUP: &str = "etcdcluster.cluster.x-k8s.io";
pub const ETCD_CLUSTER_KIND: &str = "EtcdadmCluster";
const KCP_KIND: &str = "KubeadmControlPlane";
const KCP_GROUP: &str = "controlplane.cluster.x-k8s.io";

/// What was read, for the plan and for `apply`.
pub struct Observation {
    /// The EtcdadmCluster as just read.
    pub etcd_cluster: EtcdadmCluster,
    pub namespace: String,
    pub cluster: Option<Cluster>,
    pub ca: Option<CertificateAuthority>,
    pub ca_view: CaView,
    pub machines: Vec<MachineView>,
    pub leftovers: Vec<String>,
    pub init_secret: Option<InitSecretView>,
    pub kcp: Option<KubeadmControlPlane>,
    pub kcp_view: KcpView,
    pub control_plane_machines: usize,
    pub spec_problem: Option<String>,
    /// The infra machine kind cloned from `spec.infrastructureTemplate`.
    pub infra_machine: Option<ApiResource>,
}

impl Observation {
    /// `<namespace>/<cluster>`, the key of per-cluster caches.
    pub fn cache_key(&self) -> String {
        format!("{}/{}", self.namespace, self.etcd_cluster.name_any())
    }

    pub fn cluster_name(&self) -> Option<String> {
        self.cluster.as_ref().map(|c| c.name_any())
    }

    /// `Machine.spec.version` for new members: `machineTemplate.version`, else the KCP's.
    pub fn machine_version(&self) -> Option<String> {
        self.etcd_cluster
            .spec
            .machine_version()
            .map(String::from)
            .or_else(|| self.kcp.as_ref().and_then(|k| k.spec.version.clone()))
    }

    /// The plan's input, with the etcd side from the health check.
    pub fn observed(&self, etcd: EtcdView) -> Observed {
        let e = &self.etcd_cluster;
        let status = e.status.clone().unwrap_or_default();
        let cluster_view = match &self.cluster {
            None => ClusterView::Missing,
            Some(c) => ClusterView::Found {
                name: c.name_any(),
                paused: c.is_paused(),
                deleting: c.meta().deletion_timestamp.is_some(),
                infrastructure_ready: c.infrastructure_ready(),
                failure_domains: c.failure_domain_names(),
            },
        };
        let has_cluster_owner_ref = self.cluster.as_ref().is_some_and(|c| {
            e.owner_references()
                .iter()
                .any(|r| Some(&r.uid) == c.uid().as_ref())
        });
        Observed {
            name: e.name_any(),
            deleting: e.meta().deletion_timestamp.is_some(),
            has_finalizer: e
                .finalizers()
                .iter()
                .any(|f| f == names::ETCDADM_CLUSTER_FINALIZER),
            has_cluster_owner_ref,
            paused_annotation: e.annotations().contains_key(names::PAUSED_ANNOTATION),
            replicas: e.spec.replicas(),
            spec_problem: self.spec_problem.clone(),
            spec_failure_domains: e.spec.failure_domains.clone(),
            cluster: cluster_view,
            ca: self.ca_view.clone(),
            machines: self.machines.clone(),
            leftovers: self.leftovers.clone(),
            etcd,
            init_secret: self.init_secret.clone(),
            initialized: status.initialized,
            creation_complete: status.creation_complete,
            kcp: self.kcp_view.clone(),
            control_plane_machines: self.control_plane_machines,
        }
    }
}

/// Read everything for the EtcdadmCluster `name` in `namespace`; `None` once it is gone.
pub async fn observe(client: &Client, namespace: &str, name: &str) -> Result<Option<Observation>, Error> {
    let Some(etcd_cluster) = Api::<EtcdadmCluster>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?
    else {
        return Ok(None);
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let machines_api: Api<Machine> = Api::namespaced(client.clone(), namespace);

    let cluster = find_cluster(client, namespace, &etcd_cluster).await?;
    let cluster_name = cluster.as_ref().map(|c| c.name_any());
    let deleting = etcd_cluster.meta().deletion_timestamp.is_some()
        || cluster
            .as_ref()
            .is_some_and(|c| c.meta().deletion_timestamp.is_some());

    let (spec_problem, infra_machine) = infra_machine_kind(&etcd_cluster, namespace);

    let selector = format!("{}={}", names::ETCD_CLUSTER_LABEL, etcd_cluster.name_any());
    let listed = machines_api
        .list(&ListParams::default().labels(&selector))
        .await?;
    let mut machines: Vec<&Machine> = listed
        .items
        .iter()
        .filter(|m| controlled_by_us_or_nobody(m.owner_references(), &etcd_cluster))
        .collect();
    machines.sort_by(|a, b| age_order(a.meta(), b.meta()));
    let machine_names: BTreeSet<String> = machines.iter().map(|m| m.name_any()).collect();
    let machine_views: Vec<MachineView> = machines
        .iter()
        .map(|m| MachineView {
            name: m.name_any(),
            failure_domain: m.spec.failure_domain.clone(),
            address: m.etcd_address().map(String::from),
            deleting: m.is_deleting(),
            has_hook: m.annotations().contains_key(names::PRE_TERMINATE_HOOK_ANNOTATION),
        })
        .collect();

    let leftovers = find_leftovers(
        client,
        namespace,
        &selector,
        infra_machine.as_ref(),
        &machine_names,
    )
    .await?;

    let (ca, ca_view, init_secret) = match &cluster_name {
        None => (None, CaView::Missing, None),
        Some(cluster) => {
            let ca_name = names::ca_secret_name(cluster);
            let (ca, view) = match secrets.get_opt(&ca_name).await? {
                None => (None, CaView::Missing),
                Some(secret) => match ca_from_secret(&secret, namespace, &ca_name) {
                    Ok(ca) => (Some(ca), CaView::Valid),
                    Err(problem) => (None, CaView::Corrupt(problem)),
                },
            };
            let init = secrets
                .get_opt(&names::init_secret_name(cluster))
                .await?
                .map(|s| init_secret_view(&s));
            (ca, view, init)
        }
    };

    let (kcp, kcp_view) = match (&cluster, &cluster_name) {
        (Some(c), Some(cluster_name)) => observe_kcp(client, namespace, c, cluster_name).await?,
        _ => (None, KcpView::None),
    };

    let control_plane_machines = match (&cluster_name, deleting) {
        (Some(cluster), true) => {
            let selector = format!(
                "{},{}={cluster}",
                names::CONTROL_PLANE_LABEL,
                names::CLUSTER_NAME_LABEL
            );
            machines_api
                .list(&ListParams::default().labels(&selector))
                .await?
                .items
                .len()
        }
        _ => 0,
    };

    Ok(Some(Observation {
        etcd_cluster: etcd_cluster.clone(),
        namespace: namespace.to_string(),
        cluster,
        ca,
        ca_view,
        machines: machine_views,
        leftovers,
        init_secret,
        kcp,
        kcp_view,
        control_plane_machines,
        spec_problem,
        infra_machine,
    }))
}

/// The Cluster named by our `cluster.x-k8s.io/cluster-name` label, else one whose
/// `spec.managedExternalEtcdRef` points at us (the EKS-A fork's link).
async fn find_cluster(
    client: &Client,
    namespace: &str,
    etcd: &EtcdadmCluster,
) -> Result<Option<Cluster>, Error> {
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), namespace);
    if let Some(name) = etcd.labels().get(names::CLUSTER_NAME_LABEL) {
        return Ok(clusters.get_opt(name).await?);
    }
    let name = etcd.name_any();
    Ok(clusters
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .find(|c| {
            c.spec
                .managed_external_etcd_ref
                .as_ref()
                .is_some_and(|r| r.points_to(ETCD_CLUSTER_GROUP, ETCD_CLUSTER_KIND, &name))
        }))
}

/// A Machine labelled for us is ours unless another object controls it.
fn controlled_by_us_or_nobody(owners: &[OwnerReference], etcd: &EtcdadmCluster) -> bool {
    match owners.iter().find(|r| r.controller == Some(true)) {
        None => true,
        Some(owner) => Some(&owner.uid) == etcd.uid().as_ref(),
    }
}

/// Oldest first, ties by name.
fn age_order(
    a: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    b: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> std::cmp::Ordering {
    let key = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        (
            m.creation_timestamp.as_ref().map(|t| t.0),
            m.name.clone().unwrap_or_default(),
        )
    };
    key(a).cmp(&key(b))
}

/// The infra machine kind (`<Template kind minus "Template">`, same apiVersion), or the spec
/// problem that prevents knowing it.
pub fn infra_machine_kind(etcd: &EtcdadmCluster, namespace: &str) -> (Option<String>, Option<ApiResource>) {
    let template = &etcd.spec.infrastructure_template;
    if let Some(ns) = template
        .namespace
        .as_deref()
        .filter(|ns| !ns.is_empty() && *ns != namespace)
    {
        return (
            Some(format!(
                "spec.infrastructureTemplate.namespace is {ns}; it must be empty or {namespace}"
            )),
            None,
        );
    }
    let api_version = template.api_version.clone().unwrap_or_default();
    let kind = template.kind.clone().unwrap_or_default();
    let name = template.name.clone().unwrap_or_default();
    let Some(machine_kind) = kind.strip_suffix("Template").filter(|k| !k.is_empty()) else {
        return (
            Some(format!(
                "spec.infrastructureTemplate.kind {kind:?} must name a machine template (…Template)"
            )),
            None,
        );
    };
    if api_version.is_empty() || name.is_empty() {
        return (
            Some("spec.infrastructureTemplate needs apiVersion, kind and name".into()),
            None,
        );
    }
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version.as_str()));
    let gvk = GroupVersionKind::gvk(group, version, machine_kind);
    (None, Some(ApiResource::from_gvk(&gvk)))
}

/// Names of infra machines and EtcdadmConfigs of ours with no Machine: interrupted creations.
/// Objects a Machine owned (left behind while CAPI deletes them) or already deleting are not.
async fn find_leftovers(
    client: &Client,
    namespace: &str,
    selector: &str,
    infra: Option<&ApiResource>,
    machines: &BTreeSet<String>,
) -> Result<Vec<String>, Error> {
    let params = ListParams::default().labels(selector);
    let mut metas = Vec::new();
    let configs: Api<EtcdadmConfig> = Api::namespaced(client.clone(), namespace);
    metas.extend(configs.list(&params).await?.items.into_iter().map(|c| c.metadata));
    if let Some(resource) = infra {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, resource);
        match api.list(&params).await {
            Ok(list) => metas.extend(list.items.into_iter().map(|o| o.metadata)),
            // The kind is not served (yet): creation will say so.
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    metas.retain(|m| {
        let name = m.name.clone().unwrap_or_default();
        let machine_owned = m
            .owner_references
            .as_deref()
            .unwrap_or_default()
            .iter()
            .any(|r| r.kind == "Machine");
        !machines.contains(&name) && !machine_owned && m.deletion_timestamp.is_none()
    });
    metas.sort_by(age_order);
    let mut names: Vec<String> = Vec::new();
    for m in metas {
        let name = m.name.unwrap_or_default();
        if !names.contains(&name) {
            names.push(name);
        }
    }
    Ok(names)
}

fn secret_text(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|v| String::from_utf8(v.0.clone()).ok())
        .or_else(|| secret.string_data.as_ref().and_then(|d| d.get(key)).cloned())
}

fn init_secret_view(secret: &Secret) -> InitSecretView {
    InitSecretView {
        address: secret_text(secret, names::INIT_ADDRESS_KEY)
            .map(|a| a.trim().to_string())
            .filter(|a| !a.is_empty()),
        client_urls: secret_text(secret, names::INIT_CLIENT_URLS_KEY)
            .map(|urls| {
                urls.split(',')
                    .map(str::trim)
                    .filter(|u| !u.is_empty())
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default(),
    }
}

async fn observe_kcp(
    client: &Client,
    namespace: &str,
    cluster: &Cluster,
    cluster_name: &str,
) -> Result<(Option<KubeadmControlPlane>, KcpView), Error> {
    let Some(reference) = cluster.spec.control_plane_ref.as_ref() else {
        return Ok((None, KcpView::None));
    };
    let group = reference.group();
    if reference.kind != KCP_KIND || !(group.is_empty() || group == KCP_GROUP) {
        return Ok((None, KcpView::None));
    }
    let kcps: Api<KubeadmControlPlane> = Api::namespaced(client.clone(), namespace);
    let Some(kcp) = kcps.get_opt(&reference.name).await? else {
        return Ok((
            None,
            KcpView::Missing {
                name: reference.name.clone(),
            },
        ));
    };
    let (local_etcd, endpoints) = match kcp.etcd() {
        ControlPlaneEtcd::External(endpoints) => (false, endpoints),
        ControlPlaneEtcd::Local => (true, Vec::new()),
    };
    let secrets_present = if local_etcd {
        false
    } else {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
        secrets
            .get_opt(&names::kcp_etcd_ca_secret_name(cluster_name))
            .await?
            .is_some()
            && secrets
                .get_opt(&names::apiserver_client_secret_name(cluster_name))
                .await?
                .is_some()
    };
    let view = KcpView::Found {
        name: kcp.name_any(),
        local_etcd,
        endpoints,
        paused: kcp.annotations().contains_key(names::PAUSED_ANNOTATION),
        skip_pause: kcp.annotations().contains_key(names::SKIP_PAUSE_CP_ANNOTATION),
        secrets_present,
    };
    Ok((Some(kcp), view))
}
