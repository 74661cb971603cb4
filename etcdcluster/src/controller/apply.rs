//! Performing the planned step, end to end: the status it leaves first, then the step itself
//! (its concern performs it), then what only its outcome tells into the status, its Event, a log
//! line and metrics, and what the reconcile does next. This is the one place the status is
//! written, and what each member Machine reports of itself (`UpToDate`) with it. Every write is safe to repeat and to interrupt: a crash between any two writes
//! leaves objects the next observation recognises and resumes from. Objects are created only if
//! absent; changes are server-side applied, each site as a field manager of its own, forced only
//! for fields this controller alone decides; a merge patch is kept only where an apply cannot
//! remove what an earlier writer added.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::controller::Action;
use tracing::{debug, info};

use etcdadm_shared::api::{EtcdadmCluster, EtcdadmClusterStatus};
use etcdadm_shared::error::Error;
use etcdadm_shared::manager::reconcile::Next;

use super::decision::{Applied, EventNote, JOIN_POLL, MEMBERSHIP_RETRY, Outputs, Record};
use super::observation::Observation;
use super::plan::Step;
use super::plan::lifecycle::LifecycleStep;
use super::plan::machines;
use super::plan::requeue::deferred_retry;
use super::status;

/// Write the status `o` and `step` make, then perform `step` and report it. Status comes
/// first, so what the step's consequences rely on (e.g. `status.initialized` for a joining
/// Machine's bootstrap) is stored before they happen.
pub async fn apply(out: &Outputs<'_>, o: &mut Observation, step: Step) -> Result<Next, Error> {
    if let Some(updated) = write_status(out, o, &step).await? {
        // The finalizer's removal is guarded by the resourceVersion this write produced.
        o.etcd_cluster = updated;
    }
    let o = &*o;
    // What each member Machine reports of itself, beside the status (not while paused).
    if !matches!(step, Step::Lifecycle(LifecycleStep::Paused)) {
        for report in machines::up_to_date_reports(o) {
            machines::write_up_to_date(out, &o.namespace, &report).await?;
        }
    }
    if !step.writes() {
        if let Step::Hold(hold) = &step
            && hold.is_refusal()
        {
            debug!(reason = hold.reason, message = %hold.message, "refusing to act");
        }
        return Ok(Next::Done(
            step.after(o).action().unwrap_or_else(Action::await_change),
        ));
    }
    match step.apply(out, o).await? {
        Applied::Done => report(out, o, &step).await,
        Applied::Recorded(record) => {
            write_outcome(out, o, record).await?;
            report(out, o, &step).await;
        }
        Applied::AlreadyDone => debug!(step = step.reason().0, "nothing to do: done already"),
        Applied::Deferred(e) => {
            let retry = deferred_retry(&e);
            // The strict reconfiguration check refuses a few times a second for up to 5 s after
            // every join: its Event series counts those, the log keeps them for debugging.
            if retry < MEMBERSHIP_RETRY {
                debug!(error = %e, ?retry, "etcd refused a membership change for now; retrying");
            } else {
                info!(error = %e, ?retry, "etcd refused a membership change for now; retrying");
            }
            let note = format!("etcd refused the membership change for now, retrying: {e}");
            out.publish(
                &o.etcd_cluster,
                EventNote::normal("MembershipChangeDeferred", note),
            )
            .await;
            return Ok(Next::Done(Action::requeue(retry)));
        }
        Applied::NotYet => {
            debug!(
                step = step.reason().0,
                "etcd is not ready for it yet; asking again shortly"
            );
            return Ok(Next::Done(Action::requeue(JOIN_POLL)));
        }
    }
    Ok(match step.after(o).action() {
        Some(action) => Next::Done(action),
        None => Next::Again,
    })
}

/// The Event the plan names for `step`, with a log line saying the same.
async fn report(out: &Outputs<'_>, o: &Observation, step: &Step) {
    match step.event(o) {
        Some(note) => {
            info!(reason = note.reason, "{}", note.note);
            out.publish(&o.etcd_cluster, note).await;
        }
        None => debug!(step = step.reason().0, "applied"),
    }
}

/// Publish the Events of the status's transitions, then write status if it changed. Returns the
/// object as written, if it was. The Events go first: a controller killed between the two sees
/// the same transitions again and repeats them, where the other order would lose them for good.
async fn write_status(
    out: &Outputs<'_>,
    o: &Observation,
    step: &Step,
) -> Result<Option<EtcdadmCluster>, Error> {
    let etcd = &o.etcd_cluster;
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let (status, transitions) = status::next_status(etcd, o, step, &now);
    out.metrics(etcd, |m, ns, name| {
        m.observe_status(ns, name, &etcd.spec, &status);
        Step::observe_concern_metrics(m, ns, name, o, &status);
    });
    let old: EtcdadmClusterStatus = etcd.status.clone().unwrap_or_default();
    for t in transitions {
        out.publish(etcd, t).await;
    }
    let mut written = None;
    if status != old {
        written = Some(out.write_status(etcd, &status).await?);
    }
    Ok(written)
}

/// Write what a step's outcome adds to the status written before it (recorded once done: only
/// the outcome tells it).
async fn write_outcome(out: &Outputs<'_>, o: &Observation, record: Record) -> Result<(), Error> {
    let mut status = o.etcd_cluster.status.clone().unwrap_or_default();
    record(&mut status);
    out.write_status(&o.etcd_cluster, &status).await?;
    Ok(())
}
