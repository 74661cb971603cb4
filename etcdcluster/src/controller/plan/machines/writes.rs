//! The Kubernetes writes of the Machine concern: a member's objects created, a Machine adopted,
//! deleted or released from its hook, leftovers removed, a remediation recorded.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use etcdadm_shared::api::capi::Machine;
use etcdadm_shared::api::{EtcdadmCluster, EtcdadmConfig};
use etcdadm_shared::contract::{controller_reference, create_if_absent, owner_reference};
use etcdadm_shared::error::Error;
use etcdadm_shared::names;
use etcdadm_shared::ssa;

use super::metrics::MachineMetrics;
use super::step::{Growth, MemberTemplate, Removal, UpToDateReport};
use crate::controller::decision::{Applied, FIELD_MANAGER, Outputs};
use crate::controller::observation::Observation;
use crate::controller::observation::clock::{
    REMEDIATION_ANNOTATION, REMEDIATION_FOR_ANNOTATION, RemediationRecord,
};

const BOOTSTRAP_GROUP: &str = "bootstrap.cluster.x-k8s.io";
/// Apply sites on member Machines.
const HOOK_MANAGER: &str = "etcdadm-controller/pre-terminate-hook";
const ADOPTION_MANAGER: &str = "etcdadm-controller/adoption";
const UP_TO_DATE_MANAGER: &str = "etcdadm-controller/up-to-date";
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
    ns: &'a str,
    template: &'a MemberTemplate,
    failure_domain: Option<&'a str>,
}

/// Create member `name`: infra machine cloned from the template, EtcdadmConfig, then the Machine
/// that references both, all named `name`. Parts that exist already (an interrupted attempt)
/// are kept.
pub(super) async fn create(
    out: &Outputs<'_>,
    o: &Observation,
    name: &str,
    failure_domain: Option<&str>,
    purpose: Growth,
    template: &MemberTemplate,
) -> Result<Applied, Error> {
    let etcd = &o.etcd_cluster;
    let m = NewMember {
        etcd,
        ns: &o.namespace,
        template,
        failure_domain,
    };
    let labels = member_labels(&template.cluster, &etcd.name_any());
    let client = out.client;
    let infra = &template.infra;

    // 1. Infra machine, cloned from the template.
    let template_ref = &etcd.spec.infrastructure_template;
    let template_name = template_ref.name.clone().unwrap_or_default();
    let template_kind = template_ref.kind.clone().unwrap_or_default();
    let template_resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        &infra.group,
        &infra.version,
        &template_kind,
    ));
    let infra_api: Api<DynamicObject> = Api::namespaced_with(client.clone(), m.ns, infra);
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

    // 2. EtcdadmConfig with the cluster's config spec (corruption checks on unless it turns
    // them off: docs/day2.md, "Routine maintenance"), asking for a learner join and saying how
    // long it may wait for its turn (the first member initializes instead; a flavor that
    // cannot join as a learner keeps the voter join), or, for the restored first member, naming
    // the Secret with its snapshot's download.
    let configs: Api<EtcdadmConfig> = Api::namespaced(client.clone(), m.ns);
    let mut config = EtcdadmConfig::new(name, etcd.spec.etcdadm_config_spec.for_new_member());
    config.metadata.namespace = Some(m.ns.into());
    config.metadata.labels = Some(labels.clone());
    let mut annotations = if purpose == Growth::Restore {
        BTreeMap::from([(
            names::RESTORE_SECRET_ANNOTATION.to_string(),
            names::restore_secret_name(&etcd.name_any()),
        )])
    } else {
        BTreeMap::from([
            (names::LEARNER_JOIN_ANNOTATION.to_string(), "true".to_string()),
            (
                names::LEARNER_LISTED_WAIT_ANNOTATION.to_string(),
                template.listed_wait.as_secs().to_string(),
            ),
        ])
    };
    if let Some(bundle) = &template.ca_bundle {
        annotations.insert(names::CA_BUNDLE_ANNOTATION.to_string(), bundle.clone());
    }
    config.metadata.annotations = Some(annotations);
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
    let infra = &m.template.infra;
    let group_kind = if infra.group.is_empty() {
        template_kind
    } else {
        format!("{template_kind}.{}", infra.group)
    };
    annotations.insert(names::CLONED_FROM_NAME_ANNOTATION.into(), template.name_any());
    annotations.insert(names::CLONED_FROM_GROUPKIND_ANNOTATION.into(), group_kind);
    let mut object = DynamicObject::new(name, infra).within(m.ns);
    object.metadata.labels = Some(all_labels);
    object.metadata.annotations = Some(annotations);
    object.metadata.owner_references = Some(vec![owner_reference(m.etcd)?]);
    object.data = json!({ "spec": spec });
    Ok(object)
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
    if let Some(record) = &m.template.remediation_for {
        annotations.insert(REMEDIATION_FOR_ANNOTATION.into(), record.clone());
    }
    let mut owner = controller_reference(m.etcd)?;
    owner.block_owner_deletion = Some(true);
    let infra = &m.template.infra;
    let mut spec = json!({
        "clusterName": m.template.cluster,
        "bootstrap": { "configRef": { "apiGroup": BOOTSTRAP_GROUP, "kind": "EtcdadmConfig", "name": name } },
        "infrastructureRef": { "apiGroup": infra.group, "kind": infra.kind, "name": name },
    });
    if let Some(domain) = m.failure_domain {
        spec["failureDomain"] = json!(domain);
    }
    if let Some(version) = &m.template.version {
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
    namespace: &str,
    names: &[String],
    infra: Option<&ApiResource>,
) -> Result<Applied, Error> {
    let configs: Api<EtcdadmConfig> = Api::namespaced(out.client.clone(), namespace);
    for name in names {
        ignore_not_found(configs.delete(name, &DeleteParams::default()).await.map(drop))?;
        if let Some(resource) = infra {
            let api: Api<DynamicObject> = Api::namespaced_with(out.client.clone(), namespace, resource);
            ignore_not_found(api.delete(name, &DeleteParams::default()).await.map(drop))?;
        }
    }
    Ok(Applied::Done)
}

/// Remove our pre-terminate hook from Machine `machine` (its member is gone, or the whole
/// cluster is).
pub async fn release_hook(out: &Outputs<'_>, namespace: &str, machine: &str) -> Result<(), Error> {
    let machines: Api<Machine> = Api::namespaced(out.client.clone(), namespace);
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

/// Record on Machine `machine` that its turn to join came now (its join deadline runs from it),
/// before its learner is added. A merge patch: a Machine deleted meanwhile is not made again.
pub async fn record_join_start(out: &Outputs<'_>, namespace: &str, machine: &str) -> Result<(), Error> {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let patch = json!({ "metadata": { "annotations": { names::JOIN_STARTED_ANNOTATION: now } } });
    Api::<Machine>::namespaced(out.client.clone(), namespace)
        .patch(machine, &patch_params(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Deletion of the whole etcd cluster (or of a lost one a recovery replaces): drop our
/// pre-terminate hook (no member removal: every member is going) and delete each Machine.
pub async fn release_and_delete(
    out: &Outputs<'_>,
    namespace: &str,
    names: &[String],
) -> Result<Applied, Error> {
    let machines: Api<Machine> = Api::namespaced(out.client.clone(), namespace);
    for name in names {
        let Some(machine) = machines.get_opt(name).await? else {
            continue;
        };
        if machine
            .annotations()
            .contains_key(names::PRE_TERMINATE_HOOK_ANNOTATION)
        {
            release_hook(out, namespace, name).await?;
        }
        if !machine.is_deleting() {
            ignore_not_found(machines.delete(name, &DeleteParams::background()).await.map(drop))?;
        }
    }
    Ok(Applied::Done)
}

/// Take over a Machine labelled for us: our pre-terminate hook, and our controller reference
/// when it has no controller. Two apply sites, so restoring the hook never drops the reference.
pub(super) async fn adopt(out: &Outputs<'_>, o: &Observation, name: &str) -> Result<Applied, Error> {
    let machines: Api<Machine> = Api::namespaced(out.client.clone(), &o.namespace);
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
        let mut owner = controller_reference(&o.etcd_cluster)?;
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
    o: &Observation,
    machine: &str,
    purpose: Removal,
) -> Result<Applied, Error> {
    if let Removal::Remediation { retries } = purpose {
        let record = RemediationRecord {
            machine: machine.to_string(),
            timestamp: Time(k8s_openapi::jiff::Timestamp::now()),
            retry_count: retries,
        };
        record_remediation(out, &o.etcd_cluster, &record).await?;
        out.concern_metrics(&o.etcd_cluster, |m: &MachineMetrics, ns, name| {
            m.remediation(ns, name)
        });
    }
    let machines: Api<Machine> = Api::namespaced(out.client.clone(), &o.namespace);
    ignore_not_found(
        machines
            .delete(machine, &DeleteParams::background())
            .await
            .map(drop),
    )?;
    Ok(Applied::Done)
}

/// Record a remediation on the EtcdadmCluster (read back for the backoff after a failed
/// replacement): one annotation, this controller's alone.
async fn record_remediation(
    out: &Outputs<'_>,
    etcd: &EtcdadmCluster,
    record: &RemediationRecord,
) -> Result<(), Error> {
    const REMEDIATION_MANAGER: &str = "etcdadm-controller/remediation";
    let metadata = json!({ "annotations": { REMEDIATION_ANNOTATION: record.to_annotation() } });
    let body = ssa::configuration::<EtcdadmCluster>(&etcd.name_any(), metadata, json!({}));
    Api::<EtcdadmCluster>::namespaced(out.client.clone(), &etcd.namespace().unwrap_or_default())
        .patch(
            &etcd.name_any(),
            &ssa::params(REMEDIATION_MANAGER, true),
            &Patch::Apply(body),
        )
        .await?;
    Ok(())
}

/// Apply a Machine's `UpToDate` condition (the conditions list merges by type: CAPI's own stay).
pub async fn write_up_to_date(
    out: &Outputs<'_>,
    namespace: &str,
    report: &UpToDateReport,
) -> Result<(), Error> {
    let UpToDateReport {
        machine,
        up_to_date,
        message,
        since,
    } = report;
    let now = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let (status, reason) = if *up_to_date {
        ("True", "UpToDate")
    } else {
        ("False", "NotUpToDate")
    };
    let condition = json!({
        "type": names::UP_TO_DATE_CONDITION, "status": status, "reason": reason, "message": message,
        "lastTransitionTime": since.as_deref().unwrap_or(&now),
    });
    let body = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": machine},
        "status": {"conditions": [condition]},
    });
    let machines: Api<Machine> = Api::namespaced(out.client.clone(), namespace);
    ignore_not_found(
        machines
            .patch_status(
                machine,
                &ssa::params(UP_TO_DATE_MANAGER, true),
                &Patch::Apply(body),
            )
            .await
            .map(|_| ()),
    )
}
