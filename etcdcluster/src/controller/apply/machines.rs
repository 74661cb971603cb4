//! Member Machines: one created at a time (infra machine cloned from the template, EtcdadmConfig,
//! then the Machine with our pre-terminate hook), adopted, deleted (its hook removes its member
//! first), released; and the leftovers of interrupted creations.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use etcdadm_shared::api::capi::Machine;
use etcdadm_shared::api::{EtcdadmCluster, EtcdadmConfig};
use etcdadm_shared::contract::{controller_reference, create_if_absent, owner_reference};
use etcdadm_shared::names;
use etcdadm_shared::ssa;

use super::etcd_cluster::record_remediation;
use super::{Applied, FIELD_MANAGER, Outputs, observed};
use crate::controller::observe::Observation;
use crate::controller::plan::{
    Growth, REMEDIATION_ANNOTATION, REMEDIATION_FOR_ANNOTATION, RemediationRecord, Removal,
};
use crate::error::Error;

const BOOTSTRAP_GROUP: &str = "bootstrap.cluster.x-k8s.io";
/// Apply sites on member Machines.
const HOOK_MANAGER: &str = "etcdadm-controller/pre-terminate-hook";
const ADOPTION_MANAGER: &str = "etcdadm-controller/adoption";

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

fn ignore_not_found(result: Result<(), kube::Error>) -> Result<(), Error> {
    match result {
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        other => other.map_err(Error::from),
    }
}

/// `cluster-name` and `etcd-cluster` labels of every member object.
fn member_labels(cluster: &str, etcd: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (names::CLUSTER_NAME_LABEL.to_string(), cluster.to_string()),
        (names::ETCD_CLUSTER_LABEL.to_string(), etcd.to_string()),
    ])
}

/// What a new member is made of besides its name.
struct NewMember<'a> {
    etcd: &'a EtcdadmCluster,
    cluster: &'a str,
    ns: &'a str,
    /// The infra machine kind (the template's kind without `Template`).
    infra: &'a ApiResource,
    failure_domain: Option<&'a str>,
    version: Option<&'a str>,
    /// The remediation record this member replaces (`remediation-for` annotation).
    remediation_for: Option<&'a str>,
}

/// Create member `name`: infra machine cloned from the template, EtcdadmConfig, then the Machine
/// that references both, all named `name`. Parts that exist already (an interrupted attempt)
/// are kept.
pub(super) async fn create(
    out: &Outputs<'_>,
    obs: &Observation,
    name: &str,
    failure_domain: Option<&str>,
    purpose: Growth,
) -> Result<Applied, Error> {
    let etcd = &obs.etcd_cluster;
    let cluster = observed(&obs.cluster, "Cluster")?.name_any();
    let version = obs.machine_version();
    let remediation_for = match purpose {
        Growth::Replacement => etcd.annotations().get(REMEDIATION_ANNOTATION),
        Growth::ScaleUp | Growth::Rollout | Growth::Restore => None,
    };
    let m = NewMember {
        etcd,
        cluster: &cluster,
        ns: &obs.namespace,
        infra: observed(&obs.infra_machine, "infrastructure machine kind")?,
        failure_domain,
        version: version.as_deref(),
        remediation_for: remediation_for.map(String::as_str),
    };
    let labels = member_labels(m.cluster, &etcd.name_any());
    let client = out.client;

    // 1. Infra machine, cloned from the template.
    let template_ref = &etcd.spec.infrastructure_template;
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
            Error::NotFound(format!(
                "infrastructure template {template_kind} {}/{template_name} not found",
                m.ns
            ))
        })?;
        let infra = clone_infra_machine(&template, &m, name, &labels)?;
        create_if_absent(&infra_api, &infra, FIELD_MANAGER).await?;
    }

    // 2. EtcdadmConfig with the cluster's config spec, asking for a learner join (the first
    // member initializes instead; a flavor that cannot join as a learner keeps the voter join),
    // or, for the restored first member, naming the Secret with its snapshot's download.
    let configs: Api<EtcdadmConfig> = Api::namespaced(client.clone(), m.ns);
    let mut config = EtcdadmConfig::new(name, etcd.spec.etcdadm_config_spec.clone());
    config.metadata.namespace = Some(m.ns.into());
    config.metadata.labels = Some(labels.clone());
    let annotation = if purpose == Growth::Restore {
        (
            names::RESTORE_SECRET_ANNOTATION.to_string(),
            names::restore_secret_name(&etcd.name_any()),
        )
    } else {
        (names::LEARNER_JOIN_ANNOTATION.to_string(), "true".to_string())
    };
    config.metadata.annotations = Some(BTreeMap::from([annotation]));
    config.metadata.owner_references = Some(vec![owner_reference(etcd)?]);
    create_if_absent(&configs, &config, FIELD_MANAGER).await?;

    // 3. The Machine, controlled by the EtcdadmCluster, with our pre-terminate hook.
    let machine: Machine = serde_json::from_value(member_machine(&m, name, &labels)?)?;
    let machines: Api<Machine> = Api::namespaced(client.clone(), m.ns);
    create_if_absent(&machines, &machine, FIELD_MANAGER).await?;
    Ok(Applied::Done)
}

/// The infra machine for member `name`: the template's `spec.template.spec` (and metadata), the
/// kind without `Template`, CAPI's cloned-from annotations, owned by the EtcdadmCluster.
fn clone_infra_machine(
    template: &DynamicObject,
    m: &NewMember<'_>,
    name: &str,
    labels: &BTreeMap<String, String>,
) -> Result<DynamicObject, Error> {
    let template_spec = &template.data["spec"]["template"];
    let spec = template_spec.get("spec").cloned().unwrap_or_else(|| json!({}));
    let strings = |value: &Value| -> BTreeMap<String, String> {
        value
            .as_object()
            .map(|o| {
                o.iter()
                    .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut all_labels = strings(&template_spec["metadata"]["labels"]);
    all_labels.extend(labels.clone());
    let mut annotations = strings(&template_spec["metadata"]["annotations"]);
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
    infra.metadata.owner_references = Some(vec![owner_reference(m.etcd)?]);
    infra.data = json!({ "spec": spec });
    Ok(infra)
}

/// The Machine of member `name`.
fn member_machine(m: &NewMember<'_>, name: &str, labels: &BTreeMap<String, String>) -> Result<Value, Error> {
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
        annotations.insert(REMEDIATION_FOR_ANNOTATION.into(), record.into());
    }
    let mut owner = controller_reference(m.etcd)?;
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
pub(super) async fn delete_leftovers(
    out: &Outputs<'_>,
    obs: &Observation,
    names: &[String],
) -> Result<Applied, Error> {
    let configs: Api<EtcdadmConfig> = Api::namespaced(out.client.clone(), &obs.namespace);
    for name in names {
        ignore_not_found(configs.delete(name, &DeleteParams::default()).await.map(drop))?;
        if let Some(resource) = &obs.infra_machine {
            let api: Api<DynamicObject> = Api::namespaced_with(out.client.clone(), &obs.namespace, resource);
            ignore_not_found(api.delete(name, &DeleteParams::default()).await.map(drop))?;
        }
    }
    Ok(Applied::Done)
}

/// Remove our pre-terminate hook from a Machine whose member is gone.
pub(super) async fn release_hook(
    out: &Outputs<'_>,
    obs: &Observation,
    machine: &str,
) -> Result<Applied, Error> {
    unhook(out, &obs.namespace, machine).await?;
    Ok(Applied::Done)
}

async fn unhook(out: &Outputs<'_>, ns: &str, machine: &str) -> Result<(), Error> {
    let machines: Api<Machine> = Api::namespaced(out.client.clone(), ns);
    // A merge patch: an apply removes only what its manager alone owns, and the hook came with
    // the Machine's creation.
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
pub(super) async fn release_and_delete(
    out: &Outputs<'_>,
    obs: &Observation,
    names: &[String],
) -> Result<Applied, Error> {
    let machines: Api<Machine> = Api::namespaced(out.client.clone(), &obs.namespace);
    for name in names {
        let Some(machine) = machines.get_opt(name).await? else {
            continue;
        };
        if machine
            .annotations()
            .contains_key(names::PRE_TERMINATE_HOOK_ANNOTATION)
        {
            unhook(out, &obs.namespace, name).await?;
        }
        if !machine.is_deleting() {
            ignore_not_found(machines.delete(name, &DeleteParams::background()).await.map(drop))?;
        }
    }
    Ok(Applied::Done)
}

/// Take over a Machine labelled for us: our pre-terminate hook, and our controller reference
/// when it has no controller. Two apply sites, so restoring the hook never drops the reference.
pub(super) async fn adopt(out: &Outputs<'_>, obs: &Observation, name: &str) -> Result<Applied, Error> {
    let machines: Api<Machine> = Api::namespaced(out.client.clone(), &obs.namespace);
    let Some(machine) = machines.get_opt(name).await? else {
        return Ok(Applied::AlreadyDone);
    };
    if machine.is_deleting() {
        return Ok(Applied::AlreadyDone);
    }
    let apply = |manager: &'static str, force: bool, metadata: Value| {
        let body = ssa::configuration::<Machine>(name, metadata, json!({}));
        let machines = machines.clone();
        async move {
            machines
                .patch(name, &ssa::params(manager, force), &Patch::Apply(body))
                .await
        }
    };
    let hook = json!({ "annotations": { names::PRE_TERMINATE_HOOK_ANNOTATION: "" } });
    apply(HOOK_MANAGER, true, hook).await?;
    if !machine
        .owner_references()
        .iter()
        .any(|r| r.controller == Some(true))
    {
        let mut owner = controller_reference(&obs.etcd_cluster)?;
        owner.block_owner_deletion = Some(true);
        // Not forced: if another controller took the Machine meanwhile, it stays theirs.
        apply(ADOPTION_MANAGER, false, json!({ "ownerReferences": [owner] })).await?;
    }
    Ok(Applied::Done)
}

/// Delete a member Machine; CAPI's finalizer and our hook keep it until its member is removed.
/// A remediation is recorded first, for the backoff after a failed replacement.
pub(super) async fn delete(
    out: &Outputs<'_>,
    obs: &Observation,
    machine: &str,
    purpose: Removal,
) -> Result<Applied, Error> {
    if let Removal::Remediation { retries } = purpose {
        let record = RemediationRecord {
            machine: machine.to_string(),
            timestamp: Time(k8s_openapi::jiff::Timestamp::now()),
            retry_count: retries,
        };
        record_remediation(out, &obs.etcd_cluster, &record).await?;
        out.metrics(&obs.etcd_cluster, |m, ns, name| m.remediation(ns, name));
    }
    let machines: Api<Machine> = Api::namespaced(out.client.clone(), &obs.namespace);
    ignore_not_found(
        machines
            .delete(machine, &DeleteParams::background())
            .await
            .map(drop),
    )?;
    Ok(Applied::Done)
}
