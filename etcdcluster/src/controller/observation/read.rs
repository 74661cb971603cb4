//! All API reads of one EtcdadmCluster reconcile, made at once where they do not depend on one
//! another: the Cluster and what is read through it (CA, init Secret, KubeadmControlPlane), the
//! member Machines with their EtcdadmConfigs and infra machines, and what each concern reads for
//! itself (`Concerns`). `assemble` turns them, with the health check, into the observation.

use std::collections::{BTreeMap, BTreeSet};

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::{Client, Resource, ResourceExt};

use etcdadm_shared::api::capi::{Cluster, ControlPlaneEtcd, KubeadmControlPlane, Machine};
use etcdadm_shared::api::{EtcdadmCluster, EtcdadmConfig, EtcdadmConfigSpec};
use etcdadm_shared::contract::ClusterRef;
use etcdadm_shared::contract::ca::CaView;
use etcdadm_shared::contract::init_secret::InitSecret;
use etcdadm_shared::contract::secret_text;
use etcdadm_shared::error::Error;
use etcdadm_shared::names;
use etcdadm_shared::pki::cert_not_after;

use super::ca_secrets::{self, CaSecrets};
use super::clock::UnhealthyClock;
use super::clock::{REMEDIATION_FOR_ANNOTATION, RemediationRecord};
use super::concerns::ByType;
use super::views::{ClientSecret, ClusterView, KcpView, MachineView};

/// Group and kind of our own API, for owner references and `managedExternalEtcdRef`.
pub const ETCD_CLUSTER_GROUP: &str = "etcdcluster.cluster.x-k8s.io";
pub const ETCD_CLUSTER_KIND: &str = "EtcdadmCluster";
const KCP_KIND: &str = "KubeadmControlPlane";
const KCP_GROUP: &str = "controlplane.cluster.x-k8s.io";

/// What was read of one EtcdadmCluster and everything around it: kept between reconciles (see
/// `memo`) and assembled, with each round's health check, into the observation.
#[derive(Clone)]
pub struct Reads {
    /// The EtcdadmCluster as just read.
    pub etcd_cluster: EtcdadmCluster,
    pub namespace: String,
    pub cluster: ClusterView,
    pub ca: CaView,
    /// The CA Secrets a rotation decides from (the next CA among them).
    pub ca_secrets: CaSecrets,
    /// Member Machines, oldest first.
    pub machines: Vec<MachineRecord>,
    pub leftovers: Vec<String>,
    pub init_secret: Option<InitSecret>,
    pub kcp: KcpView,
    /// The KubeadmControlPlane's `spec.version`, when it has one.
    pub kcp_version: Option<String>,
    /// `<cluster>-apiserver-etcd-client`, when it is read (a KubeadmControlPlane with external
    /// etcd).
    pub apiserver_client: Option<ClientSecret>,
    pub control_plane_machines: usize,
    pub spec_problem: Option<String>,
    /// What admission would refuse in the spec new members are made from.
    pub member_spec_problem: Option<String>,
    /// `spec.infrastructureTemplate` as `<Kind> <namespace>/<name>` when it does not exist.
    pub missing_infra_template: Option<String>,
    /// The infra machine kind cloned from `spec.infrastructureTemplate`.
    pub infra_machine: Option<ApiResource>,
    /// What each concern reads for itself, by its view's type.
    pub concerns: ByType,
}

impl Reads {
    /// The EtcdadmCluster or its Cluster is being deleted.
    pub fn deleting(&self) -> bool {
        self.etcd_cluster.meta().deletion_timestamp.is_some()
            || matches!(self.cluster, ClusterView::Found { deleting: true, .. })
    }
}

impl ClientSecret {
    pub fn from_secret(secret: &Secret) -> Self {
        let expiry = secret_text(secret, names::TLS_CERT_KEY)
            .and_then(|pem| cert_not_after(&pem).ok())
            .and_then(|t| Timestamp::try_from(t).ok());
        ClientSecret {
            expiry,
            renewed: secret
                .annotations()
                .get(names::APISERVER_CLIENT_RENEWED_ANNOTATION)
                .and_then(|t| t.parse().ok()),
            resource_version: secret.resource_version(),
        }
    }
}

/// Everything read about one member Machine: the Machine, its EtcdadmConfig and its infra
/// machine. What the plan sees is `read`, completed against the spec, the stored status and the
/// clock when the observation is assembled.
#[derive(Clone, Debug, Default)]
pub struct MachineRecord {
    /// The view's fields read from the Machine and its EtcdadmConfig.
    pub read: MachineView,
    pub created: Option<Timestamp>,
    /// Its EtcdadmConfig's spec.
    pub config: Option<EtcdadmConfigSpec>,
    /// Its EtcdadmConfig's `ca-bundle` annotation (the CAs its `ca.crt` holds), when it has one.
    pub ca_bundle: Option<String>,
    /// `cloned-from-name` and `cloned-from-groupkind` of its infra machine.
    pub cloned_from: Option<(String, String)>,
    /// Its `remediation-for` record, when it replaced a remediated Machine.
    pub remediation_for: Option<RemediationRecord>,
    /// When its turn to join came (`join-started`), when it did.
    pub join_started: Option<Timestamp>,
}

/// The concerns' own reads and views, as the registry of concerns makes them.
pub trait Concerns: Sync {
    /// Every concern's reads of `etcd` (as just read), made at once.
    fn read<'a>(
        &'a self,
        client: &'a Client,
        namespace: &'a str,
        etcd: &'a EtcdadmCluster,
    ) -> BoxFuture<'a, Result<ByType, Error>>;
    /// Whether what was read may be kept between health rounds: no concern waits on something
    /// whose changes end no reuse.
    fn keep(&self, reads: &Reads) -> bool;
    /// Every concern's view at one moment.
    fn views(&self, reads: &Reads, clock: &UnhealthyClock) -> ByType;
    /// Why the concerns whose `views` these are want Machine `machine` replaced, if any does.
    fn outdated(&self, views: &ByType, machine: &str) -> Option<String>;
}

/// Read everything around `etcd_cluster` (as just read). The reads that do not depend on one
/// another are made at once: a reconcile waits for the slowest of them, not for their sum.
pub async fn read(
    client: &Client,
    namespace: &str,
    etcd_cluster: EtcdadmCluster,
    concerns: &dyn Concerns,
) -> Result<Reads, Error> {
    // The independent reads side by side, joined in one try_join: apart, they could not be.
    let machines_api: Api<Machine> = Api::namespaced(client.clone(), namespace);

    let (spec_problem, infra_machine) = infra_machine_kind(&etcd_cluster, namespace);
    let member_spec_problem = member_spec_problem(&etcd_cluster, namespace);

    let selector = format!("{}={}", names::ETCD_CLUSTER_LABEL, etcd_cluster.name_any());
    let params = ListParams::default().labels(&selector);
    let around_cluster = read_cluster_side(client, namespace, &etcd_cluster);
    let machines = async { Ok::<_, Error>(machines_api.list(&params).await?.items) };
    let configs = async {
        Ok::<_, Error>(
            Api::<EtcdadmConfig>::namespaced(client.clone(), namespace)
                .list(&params)
                .await?
                .items,
        )
    };
    let infra_objects = async {
        let Some(resource) = &infra_machine else {
            return Ok::<_, Error>(Vec::new());
        };
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, resource);
        match api.list(&params).await {
            Ok(list) => Ok(list.items),
            // The kind is not served (yet): creation will say so.
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(Vec::new()),
            Err(e) => Err(e.into()),
        }
    };
    let missing_infra_template = async {
        match &infra_machine {
            Some(machine_kind) => missing_template(client, namespace, &etcd_cluster, machine_kind).await,
            None => Ok(None),
        }
    };
    let concern_reads = concerns.read(client, namespace, &etcd_cluster);
    let (
        ClusterSide {
            cluster,
            ca,
            ca_secrets,
            init_secret,
            kcp,
            kcp_version,
            apiserver_client,
            control_plane_machines,
        },
        listed,
        configs,
        infra_objects,
        missing_infra_template,
        concern_reads,
    ) = futures::try_join!(
        around_cluster,
        machines,
        configs,
        infra_objects,
        missing_infra_template,
        concern_reads
    )?;

    let (records, machine_names) = machine_records(&etcd_cluster, &listed, &configs, &infra_objects);
    let mut metas: Vec<ObjectMeta> = configs.iter().map(|c| c.metadata.clone()).collect();
    metas.extend(infra_objects.iter().map(|o| o.metadata.clone()));
    let leftovers = find_leftovers(metas, &machine_names);

    Ok(Reads {
        etcd_cluster: etcd_cluster.clone(),
        namespace: namespace.to_string(),
        cluster,
        ca,
        ca_secrets,
        machines: records,
        leftovers,
        init_secret,
        kcp,
        kcp_version,
        apiserver_client,
        control_plane_machines,
        spec_problem,
        member_spec_problem,
        missing_infra_template,
        infra_machine,
        concerns: concern_reads,
    })
}

/// Every member Machine ours or nobody's, oldest first, with its EtcdadmConfig and infra machine;
/// and their names.
fn machine_records(
    etcd_cluster: &EtcdadmCluster,
    listed: &[Machine],
    configs: &[EtcdadmConfig],
    infra_objects: &[DynamicObject],
) -> (Vec<MachineRecord>, BTreeSet<String>) {
    let mut machines: Vec<&Machine> = listed
        .iter()
        .filter(|m| controlled_by_us_or_nobody(m.owner_references(), etcd_cluster))
        .collect();
    machines.sort_by(|a, b| age_order(a.meta(), b.meta()));
    let machine_names: BTreeSet<String> = machines.iter().map(|m| m.name_any()).collect();
    let configs_by_name: BTreeMap<String, &EtcdadmConfig> =
        configs.iter().map(|c| (c.name_any(), c)).collect();
    let infra_by_name: BTreeMap<String, &DynamicObject> =
        infra_objects.iter().map(|o| (o.name_any(), o)).collect();
    let records: Vec<MachineRecord> = machines
        .iter()
        .map(|m| {
            let config_name = m
                .spec
                .bootstrap
                .config_ref
                .as_ref()
                .map(|r| r.name.clone())
                .unwrap_or_default();
            let cloned_from = infra_by_name
                .get(&m.spec.infrastructure_ref.name)
                .and_then(|infra| {
                    let annotations = infra.annotations();
                    Some((
                        annotations.get(names::CLONED_FROM_NAME_ANNOTATION)?.clone(),
                        annotations.get(names::CLONED_FROM_GROUPKIND_ANNOTATION)?.clone(),
                    ))
                });
            MachineRecord {
                read: MachineView {
                    name: m.name_any(),
                    failure_domain: m.spec.failure_domain.clone(),
                    address: m.etcd_address().map(String::from),
                    deleting: m.is_deleting(),
                    has_hook: m.annotations().contains_key(names::PRE_TERMINATE_HOOK_ANNOTATION),
                    orphan: !m.owner_references().iter().any(|r| r.controller == Some(true)),
                    delete_requested: m.annotations().contains_key(names::DELETE_MACHINE_ANNOTATION),
                    learner_join: configs_by_name
                        .get(&config_name)
                        .is_some_and(|c| c.joins_as_learner()),
                    quota_backend_bytes: configs_by_name
                        .get(&config_name)
                        .filter(|c| c.spec.quota_backend_bytes.is_some())
                        .map(|c| c.spec.quota_backend_bytes()),
                    failed: m.infrastructure_failed(),
                    up_to_date: reported_condition(m, names::UP_TO_DATE_CONDITION),
                    listed_wait: configs_by_name
                        .get(&config_name)
                        .filter(|c| c.joins_as_learner())
                        .map(|c| c.learner_listed_wait()),
                    ..MachineView::default()
                },
                created: m.meta().creation_timestamp.as_ref().map(|t| t.0),
                config: configs_by_name.get(&config_name).map(|c| c.spec.clone()),
                ca_bundle: configs_by_name
                    .get(&config_name)
                    .and_then(|c| c.annotations().get(names::CA_BUNDLE_ANNOTATION).cloned()),
                cloned_from,
                remediation_for: m
                    .annotations()
                    .get(REMEDIATION_FOR_ANNOTATION)
                    .and_then(|text| RemediationRecord::from_annotation(text)),
                join_started: m
                    .annotations()
                    .get(names::JOIN_STARTED_ANNOTATION)
                    .and_then(|text| text.trim().parse::<Timestamp>().ok()),
            }
        })
        .collect();

    (records, machine_names)
}

/// What is read through the Cluster: its CA and init Secrets, its KubeadmControlPlane and, while
/// it is being deleted, how many control plane Machines it still has.
struct ClusterSide {
    cluster: ClusterView,
    ca: CaView,
    ca_secrets: CaSecrets,
    init_secret: Option<InitSecret>,
    kcp: KcpView,
    kcp_version: Option<String>,
    apiserver_client: Option<ClientSecret>,
    control_plane_machines: usize,
}

/// The Cluster of `etcd`, then everything read through it at once.
async fn read_cluster_side(
    client: &Client,
    namespace: &str,
    etcd: &EtcdadmCluster,
) -> Result<ClusterSide, Error> {
    let Some(cluster) = find_cluster(client, namespace, etcd).await? else {
        return Ok(ClusterSide {
            cluster: ClusterView::Missing,
            ca: CaView::Missing,
            ca_secrets: CaSecrets::default(),
            init_secret: None,
            kcp: KcpView::None,
            kcp_version: None,
            apiserver_client: None,
            control_plane_machines: 0,
        });
    };
    let name = cluster.name_any();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let init_name = names::init_secret_name(&name);
    let control_plane_machines = async {
        if !deleting(etcd, Some(&cluster)) {
            return Ok::<_, Error>(0);
        }
        let selector = format!(
            "{},{}={name}",
            names::CONTROL_PLANE_LABEL,
            names::CLUSTER_NAME_LABEL
        );
        let machines: Api<Machine> = Api::namespaced(client.clone(), namespace);
        Ok(machines
            .list(&ListParams::default().labels(&selector))
            .await?
            .items
            .len())
    };
    let ca = ca_secrets::read(&secrets, namespace, &name);
    let init = async { Ok::<_, Error>(secrets.get_opt(&init_name).await?) };
    let ((ca, mut ca_secrets), init, (kcp, kcp_version, kcp_secrets), control_plane_machines) = futures::try_join!(
        ca,
        init,
        observe_kcp(client, namespace, &cluster, &name),
        control_plane_machines
    )?;
    Ok(ClusterSide {
        cluster: ClusterView::Found {
            reference: ClusterRef::of(&cluster)?,
            paused: cluster.is_paused(),
            deleting: cluster.meta().deletion_timestamp.is_some(),
            infrastructure_ready: cluster.infrastructure_ready(),
            failure_domains: cluster.failure_domain_names(),
            deletes_etcd_last: cluster.spec.managed_external_etcd_ref.is_some(),
        },
        ca,
        apiserver_client: kcp_secrets.1.as_ref().map(ClientSecret::from_secret),
        ca_secrets: {
            (ca_secrets.kcp_etcd_ca, ca_secrets.apiserver_client) = kcp_secrets;
            ca_secrets
        },
        init_secret: init.map(|s| InitSecret::from_secret(&s)),
        kcp,
        kcp_version,
        control_plane_machines,
    })
}

/// `spec.infrastructureTemplate` as `<Kind> <namespace>/<name>`, if it (or its kind) does not
/// exist: new members cannot be cloned from it.
async fn missing_template(
    client: &Client,
    namespace: &str,
    etcd: &EtcdadmCluster,
    machine_kind: &ApiResource,
) -> Result<Option<String>, Error> {
    let template = &etcd.spec.infrastructure_template;
    let kind = template.kind.clone().unwrap_or_default();
    let name = template.name.clone().unwrap_or_default();
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        &machine_kind.group,
        &machine_kind.version,
        &kind,
    ));
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
    let found = match api.get_opt(&name).await {
        Ok(found) => found.is_some(),
        // The kind is not served: no template of it can exist.
        Err(kube::Error::Api(status)) if status.code == 404 => false,
        Err(e) => return Err(e.into()),
    };
    Ok((!found).then(|| format!("{kind} {namespace}/{name}")))
}

/// The admission webhook's verdict on the spec, for an object that reached us without it (no
/// webhook installed, or written before it was): every field error, joined.
pub fn member_spec_problem(etcd: &EtcdadmCluster, namespace: &str) -> Option<String> {
    let errors = etcdadm_shared::api::cluster::validate_spec(&etcd.spec, Some(namespace));
    (!errors.is_empty()).then(|| {
        errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    })
}

/// The EtcdadmCluster or its Cluster is being deleted.
fn deleting(etcd: &EtcdadmCluster, cluster: Option<&Cluster>) -> bool {
    etcd.meta().deletion_timestamp.is_some() || cluster.is_some_and(|c| c.meta().deletion_timestamp.is_some())
}

/// Condition `type_` of `machine`'s v1beta2 conditions, as reported.
fn reported_condition(machine: &Machine, type_: &str) -> Option<super::views::ReportedCondition> {
    let conditions = machine.status.as_ref()?.rest.get("conditions")?.as_array()?;
    let condition = conditions.iter().find(|c| c["type"] == type_)?;
    let text = |key: &str| condition[key].as_str().unwrap_or_default().to_string();
    Some(super::views::ReportedCondition {
        status: text("status"),
        message: text("message"),
        last_transition_time: text("lastTransitionTime"),
    })
}

/// The Cluster named by our `cluster.x-k8s.io/cluster-name` label, else one whose
/// `spec.managedExternalEtcdRef` points at us (the EKS-A fork's link).
pub async fn find_cluster(
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
fn age_order(a: &ObjectMeta, b: &ObjectMeta) -> std::cmp::Ordering {
    let key = |m: &ObjectMeta| {
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
    if let Some(problem) = etcdadm_shared::api::cluster::infrastructure_group_problem(&api_version) {
        return (
            Some(format!("spec.infrastructureTemplate.apiVersion {problem}")),
            None,
        );
    }
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version.as_str()));
    let gvk = GroupVersionKind::gvk(group, version, machine_kind);
    (None, Some(ApiResource::from_gvk(&gvk)))
}

/// Names of infra machines and EtcdadmConfigs of ours with no Machine: interrupted creations.
/// Objects a Machine owned (left behind while CAPI deletes them) or already deleting are not.
fn find_leftovers(mut metas: Vec<ObjectMeta>, machines: &BTreeSet<String>) -> Vec<String> {
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
    names
}

/// The two Secrets the control plane is given: `<cluster>-etcd` and
/// `<cluster>-apiserver-etcd-client`, as read.
type KcpSecrets = (Option<Secret>, Option<Secret>);

/// The KubeadmControlPlane, as the plan sees it, its `spec.version`, and the two Secrets it is
/// handed.
async fn observe_kcp(
    client: &Client,
    namespace: &str,
    cluster: &Cluster,
    cluster_name: &str,
) -> Result<(KcpView, Option<String>, KcpSecrets), Error> {
    let Some(reference) = cluster.spec.control_plane_ref.as_ref() else {
        return Ok((KcpView::None, None, (None, None)));
    };
    let group = reference.group();
    if reference.kind != KCP_KIND || !(group.is_empty() || group == KCP_GROUP) {
        return Ok((KcpView::None, None, (None, None)));
    }
    let kcps: Api<KubeadmControlPlane> = Api::namespaced(client.clone(), namespace);
    let Some(kcp) = kcps.get_opt(&reference.name).await? else {
        return Ok((
            KcpView::Missing {
                name: reference.name.clone(),
            },
            None,
            (None, None),
        ));
    };
    let (local_etcd, endpoints) = match kcp.etcd() {
        ControlPlaneEtcd::External(endpoints) => (false, endpoints),
        ControlPlaneEtcd::Local => (true, Vec::new()),
    };
    let (ca_copy, client_secret) = if local_etcd {
        (None, None)
    } else {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
        let ca_copy = secrets
            .get_opt(&names::kcp_etcd_ca_secret_name(cluster_name))
            .await?;
        let client_secret = secrets
            .get_opt(&names::apiserver_client_secret_name(cluster_name))
            .await?;
        (ca_copy, client_secret)
    };
    let secrets_present = ca_copy.is_some() && client_secret.is_some();
    let view = KcpView::Found {
        name: kcp.name_any(),
        local_etcd,
        endpoints,
        paused: kcp.annotations().contains_key(names::PAUSED_ANNOTATION),
        skip_pause: kcp.annotations().contains_key(names::SKIP_PAUSE_CP_ANNOTATION),
        secrets_present,
        rollout_complete: kcp.rollout_complete(),
        rollout_after: kcp.rollout_after(),
    };
    Ok((view, kcp.spec.version.clone(), (ca_copy, client_secret)))
}
