//! Member Machines: when one is created (in the failure domain with the fewest members,
//! finishing an interrupted creation first), adopted, given up on after a failed join, chosen
//! to leave, deleted (its hook removes its member first, docs/safety.md rule 4) or cleaned up
//! after an interrupted creation; what each of those says; and the writes that do it.
//!
//! Split along its seams: the step and its words (`step`), the decisions of the plan
//! (`decisions`), booting ahead of a turn to join (`boot_ahead`), the Machine conditions
//! (`conditions`) and the Kubernetes writes (`writes`); here, what each step says and does.

use etcdadm_shared::error::Error;

use self::writes::{adopt, create, delete, delete_leftovers};
use crate::controller::decision::reason::{PROVISIONING, REMEDIATING, RESTORING, ROLLING_UPDATE, SCALING_UP};
use crate::controller::decision::{
    After, Applied, ConcernStep, EventNote, Outputs, StatusPart, WAIT_REQUEUE,
};
use crate::controller::observation::Observation;
use crate::controller::plan::restore::view::RestoreFrom;

mod boot_ahead;
mod conditions;
mod decisions;
mod metrics;
mod step;
mod writes;

pub use self::boot_ahead::{create_ahead, surplus_waiting};
pub use self::conditions::{machines_condition, resize_condition, spec_up_to_date_condition};
pub use self::decisions::{
    adoption, create_machine, creation_blocked, dead_victim, deletion_in_flight, failed_join, leftovers,
    remove_one, up_to_date_reports,
};
pub use self::metrics::MachineMetrics;
pub use self::step::{Growth, MachineStep, MemberTemplate, Removal, UpToDateReport, reason, removal_reason};
pub use self::writes::{record_join_start, release_and_delete, release_hook, write_up_to_date};

impl ConcernStep for MachineStep {
    type View = ();
    type Metrics = MachineMetrics;

    /// `MachinesReady`, `ResizeCompleted` and `MachinesSpecUpToDate` (with what the plan does
    /// about an outdated Machine).
    fn status(part: &mut StatusPart<'_>, _: Option<&Self>) {
        let active = part.o.active_machines().count();
        part.set_condition(machines_condition(part.o, active));
        part.set_condition(resize_condition(part.o, active));
        part.set_condition(spec_up_to_date_condition(part.o, part.next));
    }

    /// The condition reason and message for `Ready` while this step is next.
    fn reason(&self) -> (&'static str, String) {
        match self {
            MachineStep::CreateMachine { purpose, .. } => match purpose {
                Growth::ScaleUp => (SCALING_UP, "creating a member Machine".into()),
                Growth::Rollout => (
                    ROLLING_UPDATE,
                    "creating a member Machine of the current spec".into(),
                ),
                Growth::Replacement => (
                    REMEDIATING,
                    "creating a Machine to replace the remediated member".into(),
                ),
                Growth::Restore => (
                    RESTORING,
                    "creating the first member Machine, its data restored from the snapshot".into(),
                ),
            },
            MachineStep::AdoptMachine { machine, .. } => (
                reason::ADOPTING_MACHINE,
                format!("adopting Machine {machine} (controller reference, pre-terminate hook)"),
            ),
            MachineStep::DeleteMachine { purpose, message, .. } => {
                (removal_reason(*purpose), message.clone())
            }
            MachineStep::DeleteLeftovers { names, .. } => (
                PROVISIONING,
                format!(
                    "removing leftovers of interrupted creations: {}",
                    names.join(", ")
                ),
            ),
        }
    }

    /// The Event this step leaves once applied.
    fn event(&self, o: &Observation) -> Option<EventNote> {
        Some(match self {
            MachineStep::CreateMachine {
                name,
                resume,
                failure_domain,
                purpose,
                ..
            } => {
                let machines = o.active_machines().count() + 1;
                let replicas = o.replicas;
                let mut note = match purpose {
                    Growth::ScaleUp => {
                        format!("created Machine {name} (Machine {machines} for {replicas} replicas)")
                    }
                    Growth::Rollout => format!(
                        "rolling update: created Machine {name} of the current spec ({machines} Machines for {replicas} replicas)"
                    ),
                    Growth::Replacement => format!(
                        "created Machine {name} to replace the remediated member ({machines} Machines for {replicas} replicas)"
                    ),
                    Growth::Restore => format!(
                        "created Machine {name}, the first member, its data restored from {}",
                        o.view::<RestoreFrom>()
                            .view
                            .clone()
                            .unwrap_or_default()
                            .describe()
                    ),
                };
                if let Some(domain) = failure_domain {
                    note.push_str(&format!(" in failure domain {domain}"));
                }
                if *resume {
                    note.push_str(", finishing an interrupted creation");
                }
                EventNote::normal("MachineCreated", note)
            }
            MachineStep::AdoptMachine { machine, orphan } => {
                let note = if *orphan {
                    format!(
                        "adopted Machine {machine}: it carries this EtcdadmCluster's label but had no controller"
                    )
                } else {
                    format!(
                        "restored the pre-terminate hook on Machine {machine}: its deletion must remove its member first"
                    )
                };
                EventNote::normal("MachineAdopted", note)
            }
            MachineStep::DeleteMachine { purpose, message, .. } => {
                let (warning, reason) = match purpose {
                    Removal::ScaleDown => (false, "ScalingDown"),
                    Removal::Rollout => (false, "RollingUpdate"),
                    Removal::Remediation { .. } => (true, "MemberRemediation"),
                    Removal::OrphanMachine => (true, "OrphanMachineDeleted"),
                    Removal::FailedJoin => (true, "MemberJoinFailed"),
                };
                EventNote {
                    warning,
                    reason,
                    note: message.clone(),
                }
            }
            MachineStep::DeleteLeftovers { names, .. } => EventNote::normal(
                "LeftoversDeleted",
                format!("deleted leftovers of interrupted creations: {}", names.join(", ")),
            ),
        })
    }

    /// Perform the step.
    async fn apply(&self, out: &Outputs<'_>, o: &Observation) -> Result<Applied, Error> {
        match self {
            MachineStep::CreateMachine {
                name,
                failure_domain,
                purpose,
                template,
                ..
            } => create(out, o, name, failure_domain.as_deref(), *purpose, template).await,
            MachineStep::AdoptMachine { machine, .. } => adopt(out, o, machine).await,
            MachineStep::DeleteMachine { machine, purpose, .. } => delete(out, o, machine, *purpose).await,
            MachineStep::DeleteLeftovers { names, infra } => {
                delete_leftovers(out, &o.namespace, names, infra.as_ref()).await
            }
        }
    }

    /// What comes after: a new Machine boots, a deleted one waits for its member's removal.
    fn after(&self, o: &Observation) -> After {
        match self {
            MachineStep::CreateMachine { .. } => After::Requeue(o.health_interval().min(WAIT_REQUEUE)),
            MachineStep::AdoptMachine { .. }
            | MachineStep::DeleteMachine { .. }
            | MachineStep::DeleteLeftovers { .. } => After::Again,
        }
    }
}

#[cfg(test)]
mod tests;
