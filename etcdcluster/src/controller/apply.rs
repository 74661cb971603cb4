//! The writes of one planned step. Each is safe to repeat and to interrupt: a crash between any
//! two writes leaves objects the next observation recognises and resumes from.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::{Client, Resource, ResourceExt};
use rand::Rng;
use serde_json::{Value, json};

use etcdadm_shared::api::capi::{Cluster, KubeadmControlPlane, Machine};
use etcdadm_shared::api::{EtcdadmCluster, EtcdadmConfig};
use etcdadm_shared::names;
use etcdadm_shared::pki::{CertificateAuthority, LeafRequest};

use crate::error::Error;

/// Field manager for every write of this controller.
pub const FIELD_MANAGER: &str = "etcdadm-controller";
/// Length of the random suffix of member object names.
const NAME_SUFFIX_LEN: usize = 5;
const BOOTSTRAP_GROUP: &str = "bootstrap.cluster.x-k8s.io";

fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

/// Create `object`; AlreadyExists means an earlier attempt (or a racer) made it. Returns
/// whether this call created it.
async fn create_if_absent<K>(api: &Api<K>, object: &K) -> Result<bool, Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    match api.create(&post_params(), object).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

fn ignore_not_found(result: Result<(), kube::Error>) -> Result<(), Error> {
    match result {
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        other => other.map_err(Error::from),
    }
}

/// A non-controller owner reference to `owner`.
fn owner_ref<K: Resource<DynamicType = ()>>(owner: &K) -> Result<OwnerReference, Error> {
    owner
        .controller_owner_ref(&())
        .map(|mut r| {
            r.controller = None;
            r.block_owner_deletion = None;
            r
        })
        .ok_or_else(|| Error::InvalidObject(format!("{} {} has no uid", K::kind(&()), owner.name_any())))
}

/// The controller owner reference Machines carry.
fn controller_ref(etcd: &EtcdadmCluster) -> Result<OwnerReference, Error> {
    etcd.controller_owner_ref(&())
        .ok_or_else(|| Error::InvalidObject(format!("EtcdadmCluster {} has no uid", etcd.name_any())))
}

/// `cluster-name` and `etcd-cluster` labels of every member object.
pub fn member_labels(cluster: &str, etcd: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (names::CLUSTER_NAME_LABEL.to_string(), cluster.to_string()),
        (names::ETCD_CLUSTER_LABEL.to_string(), etcd.to_string()),
    ])
}

/// `cluster.x-k8s.io/cluster-name=<c>,cluster.x-k8s.io/etcd-cluster=<name>`: the Machines of an
/// EtcdadmCluster (`status.selector`, for the scale subresource).
pub fn member_selector(cluster: &str, etcd: &str) -> String {
    format!(
        "{}={cluster},{}={etcd}",
        names::CLUSTER_NAME_LABEL,
        names::ETCD_CLUSTER_LABEL
    )
}

/// `<etcdadmcluster>-<5 random lowercase alphanumerics>`.
pub fn member_name(etcd: &str) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::thread_rng();
    let suffix: String = (0..NAME_SUFFIX_LEN)
        .map(|_| char::from(ALPHABET[rng.gen_range(0..ALPHABET.len())]))
        .collect();
    format!("{etcd}-{suffix}")
}

/// Merge-patch `metadata` of the EtcdadmCluster, guarded by its resourceVersion (lists in a
/// merge patch are replaced whole, so a concurrent change must not be overwritten).
async fn patch_etcd_metadata(client: &Client, etcd: &EtcdadmCluster, metadata: Value) -> Result<(), Error> {
    let mut metadata = metadata;
    if let Some(map) = metadata.as_object_mut() {
        map.insert("resourceVersion".into(), json!(etcd.resource_version()));
    }
    let api: Api<EtcdadmCluster> = Api::namespaced(client.clone(), &etcd.namespace().unwrap_or_default());
    api.patch(
        &etcd.name_any(),
        &patch_params(),
        &Patch::Merge(json!({ "metadata": metadata })),
    )
    .await?;
    Ok(())
}

/// Add the Cluster as a (non-controller) owner: garbage collection and `clusterctl move`.
pub async fn add_cluster_owner_ref(
    client: &Client,
    etcd: &EtcdadmCluster,
    cluster: &Cluster,
) -> Result<(), Error> {
    let mut owners = etcd.owner_references().to_vec();
    owners.push(owner_ref(cluster)?);
    patch_etcd_metadata(client, etcd, json!({ "ownerReferences": owners })).await
}

pub async fn add_finalizer(client: &Client, etcd: &EtcdadmCluster) -> Result<(), Error> {
    let mut finalizers = etcd.finalizers().to_vec();
    finalizers.push(names::ETCDADM_CLUSTER_FINALIZER.to_string());
    patch_etcd_metadata(client, etcd, json!({ "finalizers": finalizers })).await
}

pub async fn remove_finalizer(client: &Client, etcd: &EtcdadmCluster) -> Result<(), Error> {
    let finalizers: Vec<&String> = etcd
        .finalizers()
        .iter()
        .filter(|f| *f != names::ETCDADM_CLUSTER_FINALIZER)
        .collect();
    patch_etcd_metadata(client, etcd, json!({ "finalizers": finalizers })).await
}

/// Set (`true`) or remove the `cluster.x-k8s.io/paused` annotation on the KCP.
pub async fn set_kcp_paused(client: &Client, kcp: &KubeadmControlPlane, paused: bool) -> Result<(), Error> {
    let value = if paused { json!("") } else { Value::Null };
    let patch = json!({ "metadata": { "annotations": { names::PAUSED_ANNOTATION: value } } });
    let api: Api<KubeadmControlPlane> = Api::namespaced(client.clone(), &kcp.namespace().unwrap_or_default());
    api.patch(&kcp.name_any(), &patch_params(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Write the external etcd endpoints into the KCP (only that list: everything else stays).
pub async fn write_kcp_endpoints(
    client: &Client,
    kcp: &KubeadmControlPlane,
    endpoints: &[String],
) -> Result<(), Error> {
    let patch = json!({ "spec": { "kubeadmConfigSpec": { "clusterConfiguration": {
        "etcd": { "external": { "endpoints": endpoints } }
    } } } });
    let api: Api<KubeadmControlPlane> = Api::namespaced(client.clone(), &kcp.namespace().unwrap_or_default());
    api.patch(&kcp.name_any(), &patch_params(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

fn cluster_secret(
    cluster: &Cluster,
    ns: &str,
    name: String,
    data: BTreeMap<String, ByteString>,
) -> Result<Secret, Error> {
    Ok(Secret {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(ns.into()),
            labels: Some(BTreeMap::from([(
                names::CLUSTER_NAME_LABEL.to_string(),
                cluster.name_any(),
            )])),
            owner_references: Some(vec![owner_ref(cluster)?]),
            ..Default::default()
        },
        type_: Some(names::CLUSTER_SECRET_TYPE.into()),
        data: Some(data),
        ..Default::default()
    })
}

fn bytes(text: &str) -> ByteString {
    ByteString(text.as_bytes().to_vec())
}

/// Generate the CA and create `<cluster>-managed-etcd`; an existing one is never replaced.
/// Returns whether this call created it.
pub async fn create_ca(client: &Client, cluster: &Cluster, ns: &str) -> Result<bool, Error> {
    let ca = CertificateAuthority::generate("etcd-ca")?;
    let data = BTreeMap::from([
        (names::TLS_CERT_KEY.to_string(), bytes(ca.cert_pem())),
        (names::TLS_KEY_KEY.to_string(), bytes(ca.key_pem())),
    ]);
    let secret = cluster_secret(cluster, ns, names::ca_secret_name(&cluster.name_any()), data)?;
    create_if_absent(&Api::namespaced(client.clone(), ns), &secret).await
}

/// Create the two Secrets KCP needs: `<cluster>-etcd` (CA certificate) and
/// `<cluster>-apiserver-etcd-client` (client certificate and key). Existing ones are kept.
pub async fn create_kcp_secrets(
    client: &Client,
    cluster: &Cluster,
    ns: &str,
    ca: &CertificateAuthority,
) -> Result<Vec<String>, Error> {
    let cluster_name = cluster.name_any();
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    let mut created = Vec::new();
    let ca_name = names::kcp_etcd_ca_secret_name(&cluster_name);
    if api.get_opt(&ca_name).await?.is_none() {
        let data = BTreeMap::from([(names::TLS_CERT_KEY.to_string(), bytes(ca.cert_pem()))]);
        if create_if_absent(&api, &cluster_secret(cluster, ns, ca_name.clone(), data)?).await? {
            created.push(ca_name);
        }
    }
    let client_name = names::apiserver_client_secret_name(&cluster_name);
    if api.get_opt(&client_name).await?.is_none() {
        let leaf = ca.issue(&LeafRequest::apiserver_etcd_client(&cluster_name))?;
        let data = BTreeMap::from([
            (names::TLS_CERT_KEY.to_string(), bytes(&leaf.cert_pem)),
            (names::TLS_KEY_KEY.to_string(), bytes(&leaf.key_pem)),
        ]);
        if create_if_absent(&api, &cluster_secret(cluster, ns, client_name.clone(), data)?).await? {
            created.push(client_name);
        }
    }
    Ok(created)
}

fn init_secret_data(address: &str, client_urls: &[String]) -> BTreeMap<String, ByteString> {
    BTreeMap::from([
        (names::INIT_ADDRESS_KEY.to_string(), bytes(address)),
        (
            names::INIT_CLIENT_URLS_KEY.to_string(),
            bytes(&client_urls.join(",")),
        ),
    ])
}

/// Publish `<cluster>-etcd-init`. Returns whether this call created it.
pub async fn publish_init_secret(
    client: &Client,
    cluster: &Cluster,
    ns: &str,
    address: &str,
    client_urls: &[String],
) -> Result<bool, Error> {
    let secret = cluster_secret(
        cluster,
        ns,
        names::init_secret_name(&cluster.name_any()),
        init_secret_data(address, client_urls),
    )?;
    create_if_absent(&Api::namespaced(client.clone(), ns), &secret).await
}

/// Point the join URLs of `<cluster>-etcd-init` at the current healthy voters.
pub async fn update_init_secret_urls(
    client: &Client,
    cluster: &str,
    ns: &str,
    client_urls: &[String],
) -> Result<(), Error> {
    let patch = json!({ "data": { names::INIT_CLIENT_URLS_KEY: bytes(&client_urls.join(",")) } });
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    api.patch(
        &names::init_secret_name(cluster),
        &patch_params(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

/// What a new member needs besides its name.
pub struct NewMember<'a> {
    pub etcd: &'a EtcdadmCluster,
    pub cluster: &'a str,
    pub ns: &'a str,
    /// The infra machine kind (the template's kind without `Template`).
    pub infra: &'a ApiResource,
    pub failure_domain: Option<&'a str>,
    pub version: Option<&'a str>,
    /// The remediation record this member replaces (`remediation-for` annotation).
    pub remediation_for: Option<&'a str>,
}

/// Create one member: infra machine cloned from the template, EtcdadmConfig, then the Machine
/// that references both, all named `name`. Parts that exist already (an interrupted attempt)
/// are kept.
pub async fn create_member(client: &Client, m: &NewMember<'_>, name: &str) -> Result<(), Error> {
    let etcd_name = m.etcd.name_any();
    let labels = member_labels(m.cluster, &etcd_name);

    // 1. Infra machine, cloned from the template.
    let template_ref = &m.etcd.spec.infrastructure_template;
    let template_name = template_ref.name.clone().unwrap_or_default();
    let template_kind = template_ref.kind.clone().unwrap_or_default();
    let template_resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        &m.infra.group,
        &m.infra.version,
        &template_kind,
    ));
    let infra_api: Api<DynamicObject> = Api::namespaced_with(client.clone(), m.ns, m.infra);
    if infra_api.get_opt(name).await?.is_none() {
        let templates: Api<DynamicObject> = Api::namespaced_with(client.clone(), m.ns, &template_resource);
        let template = templates.get_opt(&template_name).await?.ok_or_else(|| {
            Error::InvalidObject(format!(
                "infrastructure template {template_kind} {}/{template_name} not found",
                m.ns
            ))
        })?;
        let infra = clone_infra_machine(&template, m, name, &labels)?;
        create_if_absent(&infra_api, &infra).await?;
    }

    // 2. EtcdadmConfig with the cluster's config spec.
    let configs: Api<EtcdadmConfig> = Api::namespaced(client.clone(), m.ns);
    let mut config = EtcdadmConfig::new(name, m.etcd.spec.etcdadm_config_spec.clone());
    config.metadata.namespace = Some(m.ns.into());
    config.metadata.labels = Some(labels.clone());
    config.metadata.owner_references = Some(vec![owner_ref(m.etcd)?]);
    create_if_absent(&configs, &config).await?;

    // 3. The Machine, controlled by the EtcdadmCluster, with our pre-terminate hook.
    let machine = member_machine(m, name, &labels)?;
    let machines: Api<Machine> = Api::namespaced(client.clone(), m.ns);
    let machine: Machine = serde_json::from_value(machine)?;
    create_if_absent(&machines, &machine).await?;
    Ok(())
}

/// The infra machine for member `name`: the template's `spec.template.spec` (and metadata), the
/// kind without `Template`, CAPI's cloned-from annotations, owned by the EtcdadmCluster.
pub fn clone_infra_machine(
    template: &DynamicObject,
    m: &NewMember<'_>,
    name: &str,
    labels: &BTreeMap<String, String>,
) -> Result<DynamicObject, Error> {
    let template_spec = &template.data["spec"]["template"];
    let spec = template_spec.get("spec").cloned().unwrap_or_else(|| json!({}));
    let mut all_labels: BTreeMap<String, String> = template_spec["metadata"]["labels"]
        .as_object()
        .map(|o| {
            o.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                .collect()
        })
        .unwrap_or_default();
    all_labels.extend(labels.clone());
    let mut annotations: BTreeMap<String, String> = template_spec["metadata"]["annotations"]
        .as_object()
        .map(|o| {
            o.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                .collect()
        })
        .unwrap_or_default();
    let template_kind = m
        .etcd
        .spec
        .infrastructure_template
        .kind
        .clone()
        .unwrap_or_default();
    let group_kind = if m.infra.group.is_empty() {
        template_kind
    } else {
        format!("{template_kind}.{}", m.infra.group)
    };
    annotations.insert(names::CLONED_FROM_NAME_ANNOTATION.into(), template.name_any());
    annotations.insert(names::CLONED_FROM_GROUPKIND_ANNOTATION.into(), group_kind);
    let mut infra = DynamicObject::new(name, m.infra).within(m.ns);
    infra.metadata.labels = Some(all_labels);
    infra.metadata.annotations = Some(annotations);
    infra.metadata.owner_references = Some(vec![owner_ref(m.etcd)?]);
    infra.data = json!({ "spec": spec });
    Ok(infra)
}

/// The Machine of member `name`.
pub fn member_machine(
    m: &NewMember<'_>,
    name: &str,
    labels: &BTreeMap<String, String>,
) -> Result<Value, Error> {
    let template_meta = m
        .etcd
        .spec
        .machine_template
        .as_ref()
        .and_then(|t| t.metadata.clone())
        .unwrap_or_default();
    let mut all_labels = template_meta.labels.clone();
    all_labels.extend(labels.clone());
    let mut annotations = template_meta.annotations.clone();
    annotations.insert(names::PRE_TERMINATE_HOOK_ANNOTATION.into(), String::new());
    if let Some(record) = m.remediation_for {
        annotations.insert(super::plan::REMEDIATION_FOR_ANNOTATION.into(), record.into());
    }
    let mut owner = controller_ref(m.etcd)?;
    owner.block_owner_deletion = Some(true);
    let mut spec = json!({
        "clusterName": m.cluster,
        "bootstrap": { "configRef": { "apiGroup": BOOTSTRAP_GROUP, "kind": "EtcdadmConfig", "name": name } },
        "infrastructureRef": { "apiGroup": m.infra.group, "kind": m.infra.kind, "name": name },
    });
    if let Some(domain) = m.failure_domain {
        spec["failureDomain"] = json!(domain);
    }
    if let Some(version) = m.version {
        spec["version"] = json!(version);
    }
    Ok(json!({
        "apiVersion": Machine::api_version(&()),
        "kind": "Machine",
        "metadata": {
            "name": name,
            "namespace": m.ns,
            "labels": all_labels,
            "annotations": annotations,
            "ownerReferences": [owner],
        },
        "spec": spec,
    }))
}

/// Delete infra machines and EtcdadmConfigs of interrupted creations.
pub async fn delete_leftovers(
    client: &Client,
    ns: &str,
    infra: Option<&ApiResource>,
    names: &[String],
) -> Result<(), Error> {
    let configs: Api<EtcdadmConfig> = Api::namespaced(client.clone(), ns);
    for name in names {
        ignore_not_found(configs.delete(name, &DeleteParams::default()).await.map(drop))?;
        if let Some(resource) = infra {
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, resource);
            ignore_not_found(api.delete(name, &DeleteParams::default()).await.map(drop))?;
        }
    }
    Ok(())
}

/// Remove our pre-terminate hook from a Machine whose member is gone.
pub async fn release_hook(client: &Client, ns: &str, machine: &str) -> Result<(), Error> {
    let machines: Api<Machine> = Api::namespaced(client.clone(), ns);
    let patch = json!({ "metadata": { "annotations": { names::PRE_TERMINATE_HOOK_ANNOTATION: null } } });
    ignore_not_found(
        machines
            .patch(machine, &patch_params(), &Patch::Merge(&patch))
            .await
            .map(drop),
    )
}

/// Deletion of the whole etcd cluster: drop our pre-terminate hook (no member removal: every
/// member is going) and delete each Machine.
pub async fn release_and_delete_machines(client: &Client, ns: &str, names: &[String]) -> Result<(), Error> {
    let machines: Api<Machine> = Api::namespaced(client.clone(), ns);
    for name in names {
        let Some(machine) = machines.get_opt(name).await? else {
            continue;
        };
        if machine
            .annotations()
            .contains_key(names::PRE_TERMINATE_HOOK_ANNOTATION)
        {
            release_hook(client, ns, name).await?;
        }
        if !machine.is_deleting() {
            ignore_not_found(machines.delete(name, &DeleteParams::background()).await.map(drop))?;
        }
    }
    Ok(())
}

/// Take over a Machine labelled for us: our controller reference (when it has no controller)
/// and our pre-terminate hook, guarded by its resourceVersion (owner lists are replaced whole).
pub async fn adopt_machine(
    client: &Client,
    ns: &str,
    etcd: &EtcdadmCluster,
    name: &str,
) -> Result<bool, Error> {
    let machines: Api<Machine> = Api::namespaced(client.clone(), ns);
    let Some(machine) = machines.get_opt(name).await? else {
        return Ok(false);
    };
    if machine.is_deleting() {
        return Ok(false);
    }
    let mut metadata = json!({
        "resourceVersion": machine.resource_version(),
        "annotations": { names::PRE_TERMINATE_HOOK_ANNOTATION: "" },
    });
    let mut adopted = false;
    if !machine
        .owner_references()
        .iter()
        .any(|r| r.controller == Some(true))
    {
        let mut owner = controller_ref(etcd)?;
        owner.block_owner_deletion = Some(true);
        let mut owners = machine.owner_references().to_vec();
        owners.push(owner);
        metadata["ownerReferences"] = json!(owners);
        adopted = true;
    }
    machines
        .patch(
            name,
            &patch_params(),
            &Patch::Merge(json!({ "metadata": metadata })),
        )
        .await?;
    Ok(adopted)
}

/// Delete a member Machine; CAPI's finalizer and our hook keep it until its member is removed.
pub async fn delete_machine(client: &Client, ns: &str, name: &str) -> Result<(), Error> {
    let machines: Api<Machine> = Api::namespaced(client.clone(), ns);
    ignore_not_found(machines.delete(name, &DeleteParams::background()).await.map(drop))
}

/// Record a remediation on the EtcdadmCluster (read back for the backoff after a failed
/// replacement). One annotation key: nothing else is touched.
pub async fn record_remediation(client: &Client, etcd: &EtcdadmCluster, record: &Value) -> Result<(), Error> {
    let api: Api<EtcdadmCluster> = Api::namespaced(client.clone(), &etcd.namespace().unwrap_or_default());
    let patch = json!({ "metadata": { "annotations": {
        super::plan::REMEDIATION_ANNOTATION: record.to_string()
    } } });
    api.patch(&etcd.name_any(), &patch_params(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}
