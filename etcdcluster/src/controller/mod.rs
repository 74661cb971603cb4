//! The EtcdadmCluster controller: observe (API + etcd health) → plan one step → status → apply,
//! repeated a few times per reconcile, then requeued at the health-check interval.
//!
//! Status is written before the step is applied, so what the step's consequences rely on (e.g.
//! `status.initialized` for a joining Machine's bootstrap) is stored before they happen.

pub mod apply;
pub mod health;
pub mod memo;
pub mod observe;
pub mod plan;
pub mod status;

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::runtime::{PredicateConfig, WatchStreamExt};
use kube::{Client, Resource, ResourceExt};
use tracing::{debug, info, warn};

use etcdadm_shared::api::capi::{Cluster, KubeadmControlPlane, Machine};
use etcdadm_shared::api::{EtcdadmCluster, EtcdadmClusterStatus};
use etcdadm_shared::etcd::{EtcdError, MemberClient, Refusal, member_id_hex};
use etcdadm_shared::manager::ManagerContext;
use etcdadm_shared::manager::invalid::report_invalid_object;
use etcdadm_shared::names;
use kube::core::DeserializeGuard;

use self::health::{CheckInput, EtcdClients};
use self::memo::Observations;
use self::observe::Observation;
use self::plan::{EtcdView, Growth, MachineView, Removal, Step, UnhealthyClock};
use crate::error::Error;
use crate::metrics::EtcdClusterMetrics;

/// An EtcdadmCluster as watched: read, or the reason it could not be.
type Guarded = DeserializeGuard<EtcdadmCluster>;

/// Requeue while waiting on another actor, at most (the health interval may be shorter).
const WAIT_REQUEUE: Duration = Duration::from_secs(5);
/// A state only a human can fix is still looked at now and then.
const REFUSED_REQUEUE: Duration = Duration::from_secs(60);
/// Retry of a membership change etcd refused for a passing reason (its strict reconfiguration
/// check wants a new member connected for 5 s before another change).
const MEMBERSHIP_RETRY: Duration = Duration::from_secs(1);
/// Steps applied in one reconcile before yielding.
const MAX_STEPS: usize = 8;

/// Shared by every reconcile.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    /// Controller client certificates and member clients, per etcd cluster.
    pub etcd_clients: EtcdClients,
    /// Observations reused by health rounds while nothing they were made from changed.
    pub observations: Observations,
    /// Per-cluster metrics, when run by the manager (tests go without).
    pub metrics: Option<EtcdClusterMetrics>,
}

impl Context {
    pub fn new(client: Client) -> Self {
        let reporter = Reporter {
            controller: "etcdadm-controller".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            etcd_clients: EtcdClients::new(),
            observations: Observations::default(),
            metrics: None,
        }
    }

    /// The same, exporting per-cluster metrics.
    pub fn with_metrics(client: Client, metrics: EtcdClusterMetrics) -> Self {
        Context {
            metrics: Some(metrics),
            ..Context::new(client)
        }
    }

    /// Something the observations of `clusters` were made from changed; passes them on.
    fn changed(&self, clusters: Vec<ObjectRef<Guarded>>) -> Vec<ObjectRef<Guarded>> {
        for cluster in &clusters {
            let namespace = cluster.namespace.as_deref().unwrap_or_default();
            self.observations
                .invalidate(&format!("{namespace}/{}", cluster.name));
        }
        clusters
    }

    fn metrics(&self, etcd: &EtcdadmCluster, record: impl FnOnce(&EtcdClusterMetrics, &str, &str)) {
        if let Some(metrics) = &self.metrics {
            record(metrics, &etcd.namespace().unwrap_or_default(), &etcd.name_any());
        }
    }

    async fn event(&self, etcd: &EtcdadmCluster, warning: bool, reason: &str, note: String) {
        let event = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.into(),
            note: Some(note),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &etcd.object_ref(&())).await {
            warn!(etcdcluster = %etcd.name_any(), error = %e, "publishing event failed");
        }
    }
}

/// Reconcile one EtcdadmCluster.
pub async fn reconcile(etcd: Arc<EtcdadmCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    let namespace = etcd.namespace().ok_or_else(|| {
        Error::InvalidObject(format!("EtcdadmCluster {} has no namespace", etcd.name_any()))
    })?;
    let name = etcd.name_any();
    let key = format!("{namespace}/{name}");
    // The etcd side is checked once per reconcile: the steps taken in between do not change it.
    let mut etcd_view: Option<EtcdView> = None;
    // A kept observation may be used to find that nothing needs doing, never to do something.
    let mut read_afresh = false;
    for _ in 0..MAX_STEPS {
        let Some((mut obs, fresh)) = observe(&ctx, &namespace, &name, &key, read_afresh).await? else {
            ctx.etcd_clients.forget(&key);
            ctx.observations.forget(&key);
            return Ok(Action::await_change());
        };
        let clock = obs.clock(k8s_openapi::jiff::Timestamp::now());
        let machines = obs.machine_views(&clock);
        let view = match &etcd_view {
            Some(view) => view.clone(),
            None => {
                let view = check_health(&ctx, &obs, &machines, &clock).await?;
                etcd_view = Some(view.clone());
                view
            }
        };
        let observed = obs.observed(machines, view, &clock);
        let step = plan::plan(&observed);
        if step.writes() && !fresh {
            read_afresh = true;
            continue;
        }
        if let Some(updated) = write_status(&ctx, &obs, &observed, &step).await? {
            // Metadata patches are guarded by the resourceVersion the status write produced.
            obs.etcd_cluster = updated;
        }
        if step.writes() {
            let (why, message) = step.reason();
            debug!(etcdcluster = %name, reason = why, %message, "applying step");
            ctx.observations.invalidate(&key);
            read_afresh = true;
        }
        match apply_step(&ctx, &obs, step).await? {
            Next::Again => continue,
            Next::Done(action) => return Ok(action),
        }
    }
    Ok(Action::requeue(Duration::from_secs(1)))
}

/// The EtcdadmCluster as just read and everything around it, read too or (unless `afresh`) as
/// kept from an earlier reconcile; whether it was all read now. `None` once the cluster is gone.
async fn observe(
    ctx: &Context,
    namespace: &str,
    name: &str,
    key: &str,
    afresh: bool,
) -> Result<Option<(Observation, bool)>, Error> {
    let Some(etcd) = Api::<EtcdadmCluster>::namespaced(ctx.client.clone(), namespace)
        .get_opt(name)
        .await?
    else {
        return Ok(None);
    };
    let now = std::time::Instant::now();
    if !afresh && let Some(kept) = ctx.observations.reuse(key, &etcd, now) {
        return Ok(Some((kept, false)));
    }
    let epoch = ctx.observations.epoch(key);
    let obs = observe::observe_around(&ctx.client, namespace, etcd).await?;
    ctx.observations.keep(key, epoch, &obs, now);
    Ok(Some((obs, true)))
}

async fn check_health(
    ctx: &Context,
    obs: &Observation,
    machines: &[MachineView],
    clock: &UnhealthyClock,
) -> Result<EtcdView, Error> {
    let Some(ca) = &obs.ca else {
        return Ok(EtcdView::NotChecked);
    };
    let settings = obs.etcd_cluster.spec.health_settings();
    let key = obs.cache_key();
    let input = CheckInput {
        key: &key,
        ca,
        machines,
        previous: obs.stored_members(),
        clock,
        timeout: settings.timeout,
    };
    let started = std::time::Instant::now();
    let view = health::check(&ctx.etcd_clients, &input).await;
    ctx.metrics(&obs.etcd_cluster, |m, ns, name| {
        m.observe_health_check(ns, name, started.elapsed());
        if let Ok(EtcdView::Members(members)) = &view {
            let mut alarms = vec![];
            for member in members {
                if let Some(bytes) = member.db_size.and_then(|b| u64::try_from(b).ok()) {
                    m.observe_db_size(ns, name, &member.name, bytes);
                }
                alarms.extend(member.alarms.iter().cloned());
            }
            m.observe_alarms(ns, name, &alarms);
        }
    });
    view
}

enum Next {
    /// Something changed; observe again.
    Again,
    Done(Action),
}

fn required<'a, T>(value: &'a Option<T>, what: &str) -> Result<&'a T, Error> {
    value
        .as_ref()
        .ok_or_else(|| Error::InvalidObject(format!("{what} disappeared during reconcile")))
}

async fn apply_step(ctx: &Context, obs: &Observation, step: Step) -> Result<Next, Error> {
    let client = &ctx.client;
    let etcd = &obs.etcd_cluster;
    let ns = obs.namespace.as_str();
    let interval = etcd.spec.health_settings().interval;
    let cluster_name = obs.cluster_name().unwrap_or_default();
    match step {
        Step::Wait { .. } => Ok(Next::Done(Action::requeue(interval.min(WAIT_REQUEUE)))),
        Step::Refuse { reason, message } => {
            warn!(etcdcluster = %etcd.name_any(), reason, %message, "refusing to act");
            Ok(Next::Done(Action::requeue(REFUSED_REQUEUE)))
        }
        Step::Paused => Ok(Next::Done(Action::requeue(interval))),
        Step::Steady => Ok(Next::Done(Action::requeue(interval))),
        Step::AddClusterOwnerRef => {
            apply::add_cluster_owner_ref(client, etcd, required(&obs.cluster, "Cluster")?).await?;
            Ok(Next::Again)
        }
        Step::AddFinalizer => {
            apply::add_finalizer(client, etcd).await?;
            Ok(Next::Again)
        }
        Step::PauseKcp => {
            let kcp = required(&obs.kcp, "KubeadmControlPlane")?;
            apply::set_kcp_paused(client, kcp, true).await?;
            let note = format!(
                "paused KubeadmControlPlane {} until etcd is ready",
                kcp.name_any()
            );
            ctx.event(etcd, false, "ControlPlanePaused", note).await;
            Ok(Next::Again)
        }
        Step::CreateCa => {
            let cluster = required(&obs.cluster, "Cluster")?;
            if apply::create_ca(client, cluster, ns).await? {
                let note = format!(
                    "generated the etcd CA in Secret {}",
                    names::ca_secret_name(&cluster_name)
                );
                ctx.event(etcd, false, "CACreated", note).await;
            }
            Ok(Next::Again)
        }
        Step::PublishInitSecret { address, client_urls } => {
            let cluster = required(&obs.cluster, "Cluster")?;
            if apply::publish_init_secret(client, cluster, ns, &address, &client_urls).await? {
                let note = format!(
                    "published Secret {} with the first member's address {address}",
                    names::init_secret_name(&cluster_name)
                );
                ctx.event(etcd, false, "InitSecretPublished", note).await;
            }
            Ok(Next::Again)
        }
        Step::UpdateInitSecretUrls { client_urls } => {
            apply::update_init_secret_urls(client, &cluster_name, ns, &client_urls).await?;
            Ok(Next::Again)
        }
        Step::CreateMachine {
            adopt,
            failure_domain,
            purpose,
        } => {
            let infra = required(&obs.infra_machine, "infrastructure machine kind")?;
            let version = obs.machine_version();
            let remediation_for = match purpose {
                Growth::Replacement => etcd.annotations().get(plan::REMEDIATION_ANNOTATION),
                _ => None,
            };
            let new = apply::NewMember {
                etcd,
                cluster: &cluster_name,
                ns,
                infra,
                failure_domain: failure_domain.as_deref(),
                version: version.as_deref(),
                remediation_for: remediation_for.map(String::as_str),
            };
            let adopted = adopt.is_some();
            let name = adopt.unwrap_or_else(|| apply::member_name(&etcd.name_any()));
            apply::create_member(client, &new, &name).await?;
            let members = obs.machines.iter().filter(|m| !m.deleting).count() + 1;
            let mut note = match purpose {
                Growth::ScaleUp => format!(
                    "created Machine {name} (Machine {members} for {} replicas)",
                    etcd.spec.replicas()
                ),
                Growth::Rollout => format!(
                    "rolling update: created Machine {name} of the current spec ({members} Machines for {} replicas)",
                    etcd.spec.replicas()
                ),
                Growth::Replacement => format!(
                    "created Machine {name} to replace the remediated member ({members} Machines for {} replicas)",
                    etcd.spec.replicas()
                ),
            };
            if let Some(domain) = &failure_domain {
                note.push_str(&format!(" in failure domain {domain}"));
            }
            if adopted {
                note.push_str(", finishing an interrupted creation");
            }
            info!(etcdcluster = %etcd.name_any(), machine = %name, "created member Machine");
            ctx.event(etcd, false, "MachineCreated", note).await;
            Ok(Next::Done(Action::requeue(interval.min(WAIT_REQUEUE))))
        }
        Step::AdoptMachine { machine } => {
            let adopted = apply::adopt_machine(client, ns, etcd, &machine).await?;
            let note = if adopted {
                format!(
                    "adopted Machine {machine}: it carries this EtcdadmCluster's label but had no controller"
                )
            } else {
                format!(
                    "restored the pre-terminate hook on Machine {machine}: its deletion must remove its member first"
                )
            };
            ctx.event(etcd, false, "MachineAdopted", note).await;
            Ok(Next::Again)
        }
        Step::DeleteMachine {
            machine,
            purpose,
            message,
        } => {
            let event_reason = match purpose {
                Removal::ScaleDown => "ScalingDown",
                Removal::Rollout => "RollingUpdate",
                Removal::Remediation { retries } => {
                    let record = serde_json::json!({
                        "machine": machine,
                        "timestamp": Time(k8s_openapi::jiff::Timestamp::now()),
                        "retryCount": retries,
                    });
                    apply::record_remediation(client, etcd, &record).await?;
                    ctx.metrics(etcd, |m, ns, name| m.remediation(ns, name));
                    "MemberRemediation"
                }
                Removal::OrphanMachine => "OrphanMachineDeleted",
                Removal::FailedJoin => "MemberJoinFailed",
            };
            apply::delete_machine(client, ns, &machine).await?;
            info!(etcdcluster = %etcd.name_any(), %machine, reason = event_reason, "deleting member Machine");
            let warning = matches!(
                purpose,
                Removal::Remediation { .. } | Removal::OrphanMachine | Removal::FailedJoin
            );
            ctx.event(etcd, warning, event_reason, message).await;
            Ok(Next::Again)
        }
        Step::DeleteLeftovers { names } => {
            apply::delete_leftovers(client, ns, obs.infra_machine.as_ref(), &names).await?;
            let note = format!("deleted leftovers of interrupted creations: {}", names.join(", "));
            ctx.event(etcd, false, "LeftoversDeleted", note).await;
            Ok(Next::Again)
        }
        Step::WriteKcpEndpoints { endpoints } => {
            let kcp = required(&obs.kcp, "KubeadmControlPlane")?;
            apply::write_kcp_endpoints(client, kcp, &endpoints).await?;
            info!(etcdcluster = %etcd.name_any(), endpoints = %endpoints.join(","), "wrote the KubeadmControlPlane's etcd endpoints");
            let note = format!(
                "wrote etcd endpoints {} into KubeadmControlPlane {}",
                endpoints.join(","),
                kcp.name_any()
            );
            ctx.event(etcd, false, "ControlPlaneEndpointsUpdated", note).await;
            Ok(Next::Again)
        }
        Step::CreateKcpSecrets => {
            let cluster = required(&obs.cluster, "Cluster")?;
            let ca = required(&obs.ca, "etcd CA")?;
            let created = apply::create_kcp_secrets(client, cluster, ns, ca).await?;
            if !created.is_empty() {
                let note = format!("created Secrets {} for the control plane", created.join(", "));
                ctx.event(etcd, false, "ControlPlaneSecretsCreated", note).await;
            }
            Ok(Next::Again)
        }
        Step::UnpauseKcp => {
            let kcp = required(&obs.kcp, "KubeadmControlPlane")?;
            apply::set_kcp_paused(client, kcp, false).await?;
            let note = format!("etcd is ready: un-paused KubeadmControlPlane {}", kcp.name_any());
            ctx.event(etcd, false, "ControlPlaneUnpaused", note).await;
            Ok(Next::Again)
        }
        Step::MoveLeader {
            leader_url,
            to,
            machine,
        } => {
            let member = member_client(ctx, obs, &leader_url)?;
            if let Err(e) = member.move_leader(to).await {
                ctx.metrics(etcd, |m, ns, name| {
                    m.membership_operation(ns, name, "move-leader", "refused")
                });
                return refused_for_now(ctx, etcd, e).await;
            }
            ctx.metrics(etcd, |m, ns, name| {
                m.membership_operation(ns, name, "move-leader", "done")
            });
            let note = format!(
                "moved etcd leadership to member {} before removing Machine {machine}'s member",
                member_id_hex(to)
            );
            info!(etcdcluster = %etcd.name_any(), %machine, "moved etcd leadership");
            ctx.event(etcd, false, "LeadershipMoved", note).await;
            Ok(Next::Done(Action::requeue(Duration::from_secs(1))))
        }
        Step::RemoveMember {
            member_id,
            via_url,
            member: what,
            why,
        } => {
            let member = member_client(ctx, obs, &via_url)?;
            match member.member_remove(member_id).await {
                Ok(()) => {}
                Err(e) if e.refusal() == Some(Refusal::MemberNotFound) => {}
                Err(e) => {
                    ctx.metrics(etcd, |m, ns, name| {
                        m.membership_operation(ns, name, "remove", "refused")
                    });
                    return refused_for_now(ctx, etcd, e).await;
                }
            }
            ctx.metrics(etcd, |m, ns, name| {
                m.membership_operation(ns, name, "remove", "done")
            });
            let note = format!("removed the etcd {what} ({}): {why}", member_id_hex(member_id));
            info!(etcdcluster = %etcd.name_any(), member = %member_id_hex(member_id), %why, "removed etcd member");
            ctx.event(etcd, false, "MemberRemoved", note).await;
            Ok(Next::Done(Action::requeue(Duration::from_secs(1))))
        }
        Step::ReleaseHook { machine } => {
            apply::release_hook(client, ns, &machine).await?;
            let note = format!("Machine {machine} has no etcd member; released its pre-terminate hook");
            ctx.event(etcd, false, "PreTerminateHookReleased", note).await;
            Ok(Next::Again)
        }
        Step::ReleaseAndDeleteMachines { names } => {
            apply::release_and_delete_machines(client, ns, &names).await?;
            let note = format!(
                "deleting etcd Machines {} (their pre-terminate hooks released)",
                names.join(", ")
            );
            ctx.event(etcd, false, "MachinesDeleted", note).await;
            Ok(Next::Done(Action::requeue(interval.min(WAIT_REQUEUE))))
        }
        Step::RemoveFinalizer => {
            apply::remove_finalizer(client, etcd).await?;
            ctx.etcd_clients.forget(&obs.cache_key());
            info!(etcdcluster = %etcd.name_any(), "every etcd Machine is gone; finalizer removed");
            Ok(Next::Done(Action::await_change()))
        }
    }
}

/// etcd refusing a membership change for a passing reason (its strict reconfiguration check
/// wants every peer connected for a while, leadership just moved...) is waited out, with an
/// Event saying why; anything else is an error.
async fn refused_for_now(ctx: &Context, etcd: &EtcdadmCluster, e: EtcdError) -> Result<Next, Error> {
    let passing = matches!(
        e.refusal(),
        Some(
            Refusal::UnhealthyCluster
                | Refusal::NotEnoughStartedMembers
                | Refusal::NoLeader
                | Refusal::NotLeader
                | Refusal::RequestTimedOut
        )
    );
    if passing {
        info!(etcdcluster = %etcd.name_any(), error = %e, "etcd refused a membership change for now; retrying");
        let note = format!("etcd refused the membership change for now, retrying: {e}");
        ctx.event(etcd, false, "MembershipChangeDeferred", note).await;
        Ok(Next::Done(Action::requeue(MEMBERSHIP_RETRY)))
    } else {
        Err(e.into())
    }
}

/// The client of the member at `url`, with the controller's certificate.
fn member_client(ctx: &Context, obs: &Observation, url: &str) -> Result<Arc<MemberClient>, Error> {
    let ca = required(&obs.ca, "etcd CA")?;
    let timeout = obs.etcd_cluster.spec.health_settings().timeout;
    let mut clients = ctx
        .etcd_clients
        .clients(&obs.cache_key(), ca, &[url.to_string()], timeout)?;
    match clients.pop() {
        Some((_, client)) => Ok(client?),
        None => Err(Error::InvalidObject(format!("no etcd client for {url}"))),
    }
}

/// Write status if it changed, and publish the Events of its transitions. Returns the object as
/// written, if it was.
async fn write_status(
    ctx: &Context,
    obs: &Observation,
    observed: &plan::Observed,
    step: &Step,
) -> Result<Option<EtcdadmCluster>, Error> {
    let etcd = &obs.etcd_cluster;
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let (status, transitions) = status::next_status(etcd, observed, step, &now);
    ctx.metrics(etcd, |m, ns, name| {
        m.observe_status(ns, name, etcd.spec.replicas(), &status)
    });
    let old: EtcdadmClusterStatus = etcd.status.clone().unwrap_or_default();
    let mut written = None;
    if status != old {
        let api: Api<EtcdadmCluster> = Api::namespaced(ctx.client.clone(), &obs.namespace);
        let patch = serde_json::json!({ "status": status });
        let params = PatchParams {
            field_manager: Some(apply::FIELD_MANAGER.into()),
            ..Default::default()
        };
        written = Some(
            api.patch_status(&etcd.name_any(), &params, &Patch::Merge(&patch))
                .await?,
        );
    }
    for t in transitions {
        ctx.event(etcd, t.warning, t.reason, t.note).await;
    }
    Ok(written)
}

fn error_policy(etcd: Arc<Guarded>, error: &Error, _ctx: Arc<Context>) -> Action {
    warn!(etcdcluster = %etcd.name_any(), category = error.category(), %error, "reconcile failed");
    Action::requeue(WAIT_REQUEUE)
}

/// What a change to an EtcdadmCluster must differ in to trigger a reconcile: anything but the
/// status fields that only record observations (`lastHealthyTime`, `dbSize`). A steady cluster's
/// status is rewritten for those every 30 s or so, and each rewrite would otherwise cost one
/// more round of health checks (a third more at 1,000 clusters); status changes during an
/// operation still trigger the next step at once.
fn worth_reconciling(etcd: &Guarded) -> Option<u64> {
    let meta = etcd.meta();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    meta.generation.hash(&mut hasher);
    meta.labels.hash(&mut hasher);
    meta.annotations.hash(&mut hasher);
    meta.finalizers.hash(&mut hasher);
    meta.deletion_timestamp.is_some().hash(&mut hasher);
    for owner in meta.owner_references.iter().flatten() {
        (&owner.uid, owner.controller).hash(&mut hasher);
    }
    if let Ok(EtcdadmCluster {
        status: Some(status), ..
    }) = &etcd.0
    {
        let mut status = status.clone();
        for member in &mut status.members {
            member.last_healthy_time = None;
            member.db_size = None;
        }
        serde_json::to_string(&status)
            .unwrap_or_default()
            .hash(&mut hasher);
    }
    Some(hasher.finish())
}

/// The EtcdadmCluster a member Machine belongs to, by its label (orphans included).
fn member_of(machine: &DeserializeGuard<Machine>) -> Vec<ObjectRef<Guarded>> {
    match (
        machine.namespace(),
        machine.labels().get(names::ETCD_CLUSTER_LABEL),
    ) {
        (Some(namespace), Some(name)) => vec![ObjectRef::new(name).within(&namespace)],
        _ => vec![],
    }
}

/// EtcdadmClusters of the Cluster `cluster` (by label or by the fork's reference).
fn etcd_clusters_of(store: &Store<Guarded>, cluster: &Cluster) -> Vec<ObjectRef<Guarded>> {
    let ns = cluster.namespace();
    let name = cluster.name_any();
    let referenced = cluster
        .spec
        .managed_external_etcd_ref
        .as_ref()
        .map(|r| r.name.clone());
    store
        .state()
        .iter()
        .filter(|e| e.namespace() == ns)
        .filter(|e| {
            e.labels().get(names::CLUSTER_NAME_LABEL) == Some(&name)
                || referenced.as_deref() == Some(e.name_any().as_str())
        })
        .map(|e| ObjectRef::from_obj(e.as_ref()))
        .collect()
}

/// EtcdadmClusters that read the Secret `secret` (the CA, the init Secret, or the two the
/// control plane is given), by its cluster-name label. Other Secrets of the Cluster (bootstrap
/// data, kubeconfigs) trigger nothing.
fn etcd_clusters_using(
    store: &Store<Guarded>,
    secret: &PartialObjectMeta<Secret>,
) -> Vec<ObjectRef<Guarded>> {
    let Some(cluster) = secret.labels().get(names::CLUSTER_NAME_LABEL) else {
        return vec![];
    };
    let name = secret.name_any();
    let read_by_us = [
        names::ca_secret_name(cluster),
        names::init_secret_name(cluster),
        names::kcp_etcd_ca_secret_name(cluster),
        names::apiserver_client_secret_name(cluster),
    ]
    .contains(&name);
    if !read_by_us {
        return vec![];
    }
    let ns = secret.namespace();
    store
        .state()
        .iter()
        .filter(|e| e.namespace() == ns && e.labels().get(names::CLUSTER_NAME_LABEL) == Some(cluster))
        .map(|e| ObjectRef::from_obj(e.as_ref()))
        .collect()
}

/// EtcdadmClusters in the namespace of a KCP (few per namespace; the reconcile filters).
fn etcd_clusters_in(store: &Store<Guarded>, namespace: Option<String>) -> Vec<ObjectRef<Guarded>> {
    store
        .state()
        .iter()
        .filter(|e| e.namespace() == namespace)
        .map(|e| ObjectRef::from_obj(e.as_ref()))
        .collect()
}

/// Name of this controller in metrics and logs.
pub const CONTROLLER_NAME: &str = "etcdadmcluster";

/// Run the controller until the manager's shutdown signal. `--namespace` limits and
/// `--watch-filter` filters every watch; readiness is reported once the clusters are listed.
pub async fn run(manager: ManagerContext) {
    let ManagerContext {
        client,
        settings,
        readiness,
        shutdown,
        metrics,
        ..
    } = manager;
    // Guarded: one object this version cannot read must not stop the watch for all the others.
    let (store, changes) = settings.watch_own_kind::<Guarded>(&client, readiness);
    let changes = changes.predicate_filter(worth_reconciling, PredicateConfig::default());
    let controller = Controller::for_stream(changes, store.clone()).with_config(settings.controller_config());
    let cluster_store = store.clone();
    let kcp_store = store;
    let ctx = Arc::new(Context::with_metrics(
        client.clone(),
        EtcdClusterMetrics::register(&metrics),
    ));
    // Only member Machines, within the `--watch-filter` selection if there is one.
    let mut member_machines = settings.watcher_config();
    member_machines.label_selector = Some(match member_machines.label_selector.take() {
        Some(filter) => format!("{filter},{}", names::ETCD_CLUSTER_LABEL),
        None => names::ETCD_CLUSTER_LABEL.to_string(),
    });
    let measured = move |guarded: Arc<Guarded>, ctx: Arc<Context>| {
        let timer = metrics.reconcile_started(CONTROLLER_NAME);
        async move {
            let result = match &guarded.0 {
                Ok(etcd) => reconcile(Arc::new(etcd.clone()), ctx).await,
                Err(invalid) => report_invalid_object::<EtcdadmCluster>(
                    &ctx.client,
                    &ctx.recorder,
                    apply::FIELD_MANAGER,
                    invalid,
                )
                .await
                .map(|()| Action::await_change())
                .map_err(Error::from),
            };
            timer.finish(&result, Error::category);
            result
        }
    };
    // The Secrets the controller depends on, metadata only (memory stays flat however many
    // Secrets a namespace holds), by the cluster-name label they carry.
    let mut cluster_secrets = settings.watcher_config();
    cluster_secrets.label_selector = Some(match cluster_secrets.label_selector.take() {
        Some(filter) => format!("{filter},{}", names::CLUSTER_NAME_LABEL),
        None => names::CLUSTER_NAME_LABEL.to_string(),
    });
    let secrets = watcher(
        settings.api::<PartialObjectMeta<Secret>>(&client),
        cluster_secrets,
    )
    .default_backoff()
    .touched_objects();
    let secret_store = cluster_store.clone();
    // Every event that triggers a reconcile also ends the reuse of that cluster's observation.
    let (machines_ctx, clusters_ctx, kcps_ctx, secrets_ctx) =
        (ctx.clone(), ctx.clone(), ctx.clone(), ctx.clone());
    controller
        .watches(
            settings.api::<DeserializeGuard<Machine>>(&client),
            member_machines,
            move |machine| machines_ctx.changed(member_of(&machine)),
        )
        .watches(
            settings.api::<DeserializeGuard<Cluster>>(&client),
            settings.watcher_config(),
            move |cluster| match &cluster.0 {
                Ok(cluster) => clusters_ctx.changed(etcd_clusters_of(&cluster_store, cluster)),
                Err(_) => vec![],
            },
        )
        .watches(
            settings.api::<DeserializeGuard<KubeadmControlPlane>>(&client),
            settings.watcher_config(),
            move |kcp| kcps_ctx.changed(etcd_clusters_in(&kcp_store, kcp.namespace())),
        )
        .watches_stream(secrets, move |secret| {
            secrets_ctx.changed(etcd_clusters_using(&secret_store, &secret))
        })
        .reconcile_all_on(settings.resync_ticks())
        .graceful_shutdown_on(shutdown.wait())
        .run(measured, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                warn!(error = %e, "controller event");
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn guarded(value: serde_json::Value) -> Guarded {
        DeserializeGuard(Ok(serde_json::from_value(value).unwrap()))
    }

    fn etcd(generation: i64, paused: bool, last_healthy: &str, db_size: i64, healthy: bool) -> Guarded {
        let annotations = if paused {
            serde_json::json!({names::PAUSED_ANNOTATION: ""})
        } else {
            serde_json::json!({})
        };
        guarded(serde_json::json!({
            "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
            "metadata": {"name": "c1-etcd", "namespace": "default", "generation": generation,
                         "annotations": annotations},
            "spec": {"infrastructureTemplate": {}},
            "status": {"members": [{"name": "m1", "healthy": healthy, "lastHealthyTime": last_healthy,
                                    "dbSize": db_size}]},
        }))
    }

    #[test]
    fn observation_only_status_updates_do_not_trigger_a_reconcile_but_everything_else_does() {
        let base = worth_reconciling(&etcd(1, false, "2026-11-23T10:00:00Z", 100, true));
        assert_eq!(
            base,
            worth_reconciling(&etcd(1, false, "2026-11-23T10:00:30Z", 4096, true)),
            "a lastHealthyTime or dbSize refresh"
        );
        for (what, changed) in [
            ("spec", etcd(2, false, "2026-11-23T10:00:00Z", 100, true)),
            ("annotations", etcd(1, true, "2026-11-23T10:00:00Z", 100, true)),
            (
                "member health",
                etcd(1, false, "2026-11-23T10:00:00Z", 100, false),
            ),
        ] {
            assert_ne!(base, worth_reconciling(&changed), "{what}");
        }
    }

    #[test]
    fn only_the_secrets_the_controller_reads_reach_the_etcd_clusters_of_their_cluster() {
        let (reader, mut writer) = kube::runtime::reflector::store::<Guarded>();
        let etcd = |name: &str, cluster: &str| {
            guarded(serde_json::json!({
                "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
                "metadata": {"name": name, "namespace": "default",
                             "labels": {names::CLUSTER_NAME_LABEL: cluster}},
                "spec": {"infrastructureTemplate": {}},
            }))
        };
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(etcd("c1-etcd", "c1")));
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(etcd("c2-etcd", "c2")));
        let secret = |name: &str, namespace: &str| -> PartialObjectMeta<Secret> {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": name, "namespace": namespace,
                             "labels": {names::CLUSTER_NAME_LABEL: "c1"}},
            }))
            .unwrap()
        };
        let c1 = vec![ObjectRef::<Guarded>::new("c1-etcd").within("default")];
        for name in [
            "c1-managed-etcd",
            "c1-etcd-init",
            "c1-etcd",
            "c1-apiserver-etcd-client",
        ] {
            assert_eq!(
                etcd_clusters_using(&reader, &secret(name, "default")),
                c1,
                "{name}"
            );
        }
        assert!(etcd_clusters_using(&reader, &secret("c1-kubeconfig", "default")).is_empty());
        assert!(etcd_clusters_using(&reader, &secret("c1-managed-etcd", "other")).is_empty());
    }

    #[tokio::test]
    async fn a_member_machine_event_reaches_its_cluster_and_ends_the_reuse_of_its_observation() {
        let machine = |labels: serde_json::Value| -> DeserializeGuard<Machine> {
            DeserializeGuard(Ok(serde_json::from_value(serde_json::json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                "metadata": {"name": "m1", "namespace": "default", "labels": labels},
                "spec": {"clusterName": "c1", "bootstrap": {},
                         "infrastructureRef": {"apiGroup": "x", "kind": "K", "name": "i"}},
            }))
            .unwrap()))
        };
        let member = machine(serde_json::json!({names::ETCD_CLUSTER_LABEL: "c1-etcd"}));
        let refs = member_of(&member);
        assert_eq!(refs, vec![ObjectRef::<Guarded>::new("c1-etcd").within("default")]);
        assert!(member_of(&machine(serde_json::json!({}))).is_empty());

        let client = Client::try_from(kube::Config::new("http://127.0.0.1:1".parse().unwrap())).unwrap();
        let ctx = Context::new(client);
        let epoch = ctx.observations.epoch("default/c1-etcd");
        assert_eq!(ctx.changed(refs.clone()), refs);
        assert_ne!(ctx.observations.epoch("default/c1-etcd"), epoch);
    }
}
