//! Certificate-authority rotation (issue 46, docs/security.md, "Rotating the etcd CA"): the
//! phase a rotation is in and its one next step, derived from the world alone (which CA each
//! Secret holds, what each member's `ca.crt` holds, what the control plane was given), so a
//! controller killed anywhere resumes. Pure and table-tested, beside what it sees of the objects
//! (`view`, made from the observation in `seen`), what it says (`words`), what it writes
//! (`writes`), its place in the plan with its part of the status (`step`) and its gauge
//! (`metrics`).
//!
//! A member's `ca.crt` is a bundle: the CA whose key (`ca.key`) etcdadm signs the member's
//! certificates with first, then the other CAs it trusts (`--trusted-ca-file` and
//! `--peer-trusted-ca-file` read every certificate of it). With O the current CA and N the next
//! one, members move through four bundles, one rolling replacement each:
//!
//! | rank | bundle | signed by | trusts |
//! |---|---|---|---|
//! | 0 | `[O]` | O | O |
//! | 1 | `[O, N]` | O | O, N |
//! | 2 | `[N, O]` | N | O, N |
//! | 3 | `[N]` | N | N |
//!
//! Two members reach each other over TLS when each trusts the other's signer: adjacent ranks
//! do, ranks two apart do not (0 does not trust N; 3 does not trust O). So the target of every
//! roll is one rank above the lowest member's, and a member more than one rank from another is
//! refused, never made.

use std::fmt;

use k8s_openapi::jiff::Timestamp;

use etcdadm_shared::api::cluster::BOTTLEROCKET_REFUSAL;

use crate::controller::decision::{Decision, Hold};

pub mod metrics;
pub mod seen;
pub mod step;
pub mod view;
pub mod words;
pub mod writes;

/// Condition reasons of a CA rotation.
pub mod reason {
    pub const ROTATING_CA: &str = "RotatingCA";
    pub const CA_ROTATION_REFUSED: &str = "CARotationRefused";
    pub const CA_ROTATION_WAITING: &str = "CARotationWaiting";
}

/// A CA named by the SHA-256 of its certificate (`CertificateAuthority::fingerprint`).
pub type Fingerprint = String;

/// The phases, in order. `Idle` is no rotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    Idle,
    /// A request seen: the next CA is generated into `<cluster>-managed-etcd-next`.
    Generating,
    /// Members rolled to trust both CAs, still signed by the current one (rank 1).
    Trusting,
    /// The control plane given both CAs to trust and a client certificate from the next CA,
    /// and its KubeadmControlPlane rolled once.
    ControlPlane,
    /// Members rolled to be signed by the next CA, trusting both (rank 2).
    Signing,
    /// Members rolled to trust the next CA alone (rank 3).
    Dropping,
    /// The next CA becomes the current one (`<cluster>-managed-etcd`, marked with the request),
    /// then `<cluster>-managed-etcd-next` and the old CA in the control plane's trust go.
    Finishing,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Idle => "Idle",
            Phase::Generating => "Generating",
            Phase::Trusting => "Trusting",
            Phase::ControlPlane => "ControlPlane",
            Phase::Signing => "Signing",
            Phase::Dropping => "Dropping",
            Phase::Finishing => "Finishing",
        }
    }

    /// The phases of a rotation, in order.
    pub const ROTATING: [Phase; 6] = [
        Phase::Generating,
        Phase::Trusting,
        Phase::ControlPlane,
        Phase::Signing,
        Phase::Dropping,
        Phase::Finishing,
    ];

    /// The phases after this one, for the status's "what is left".
    pub fn remaining(self) -> Vec<Phase> {
        if self == Phase::Idle {
            return Vec::new();
        }
        Phase::ROTATING.into_iter().filter(|p| *p > self).collect()
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a member's `ca.crt` holds: the signing CA first, then the others it trusts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bundle(pub Vec<Fingerprint>);

impl Bundle {
    /// The bundle of `rank` between `old` and `new` (see the module's table).
    pub fn of_rank(rank: u8, old: &str, new: &str) -> Bundle {
        let list: &[&str] = match rank {
            0 => &[old],
            1 => &[old, new],
            2 => &[new, old],
            _ => &[new],
        };
        Bundle(list.iter().map(|f| f.to_string()).collect())
    }

    /// Its rank between `old` and `new`, None when it is none of the four.
    pub fn rank(&self, old: &str, new: &str) -> Option<u8> {
        (0..4).find(|r| Bundle::of_rank(*r, old, new) == *self)
    }

    /// The CA that signs a member with this bundle.
    pub fn signer(&self) -> Option<&str> {
        self.0.first().map(String::as_str)
    }
}

/// One member Machine as the rotation sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct MemberCa {
    pub machine: String,
    /// What its EtcdadmConfig says its `ca.crt` holds (the `ca-bundle` annotation, absent: the
    /// current CA alone); None when the config is gone or the annotation unreadable.
    pub bundle: Option<Bundle>,
    /// The CA that signed the server certificate it presented at the last health check.
    pub signed_by: Option<Fingerprint>,
}

/// `<cluster>-managed-etcd-next` as the rotation sees it.
#[derive(Clone, Debug, PartialEq)]
pub enum NextCa {
    Missing,
    /// The next CA and the `rotate-ca` request it was made for.
    Present {
        fingerprint: Fingerprint,
        request: String,
    },
    /// Present but unusable: reported, never replaced.
    Corrupt(String),
}

/// What the KubeadmControlPlane was given, when one uses this etcd.
#[derive(Clone, Debug, PartialEq)]
pub struct ControlPlaneCa {
    pub kcp: String,
    /// The CAs `<cluster>-etcd` holds (what its API servers trust etcd's servers by).
    pub trusted: Vec<Fingerprint>,
    /// The CA that signed `<cluster>-apiserver-etcd-client`.
    pub client_signed_by: Option<Fingerprint>,
    /// When that client certificate was last re-issued (its annotation).
    pub client_reissued: Option<Timestamp>,
    /// The KubeadmControlPlane's `spec.rollout.after`.
    pub rollout_after: Option<Timestamp>,
    /// Whether every control plane Machine is up to date.
    pub rollout_complete: bool,
}

/// Everything the rotation decides from.
#[derive(Clone, Debug, PartialEq)]
pub struct RotationView {
    /// The `rotate-ca` annotation of the EtcdadmCluster.
    pub request: Option<String>,
    /// The CA of `<cluster>-managed-etcd`.
    pub current: Fingerprint,
    /// The request the current CA was made for (`ca-rotated-for`), after a rotation.
    pub rotated_for: Option<String>,
    pub next: NextCa,
    pub members: Vec<MemberCa>,
    /// None: no KubeadmControlPlane uses this etcd.
    pub control_plane: Option<ControlPlaneCa>,
    /// Every desired member is a healthy voter and no Machine is being created or deleted.
    pub settled: bool,
    /// What else is under way that a rotation must not start beside (a restore, a recovery).
    pub busy: Option<String>,
    /// The members run Bottlerocket.
    pub bottlerocket: bool,
}

/// One step of the rotation (the writes; rolls are the rolling replacement's).
#[derive(Clone, Debug, PartialEq)]
pub enum RotationStep {
    /// Generate the next CA into `<cluster>-managed-etcd-next` for `request` (create only: an
    /// existing Secret is never replaced).
    CreateNextCa { request: String },
    /// Roll every Machine in `outdated` so its `ca.crt` becomes `target`: they are outdated for
    /// the rolling replacement, which replaces them one at a time under the membership rules,
    /// new Machines made with `target`.
    Roll {
        phase: Phase,
        target: Bundle,
        outdated: Vec<String>,
    },
    /// Write `<cluster>-etcd` to trust `trusted` and re-issue `<cluster>-apiserver-etcd-client`
    /// from the next CA (each only if it is not so already).
    HandControlPlane {
        trusted: Vec<Fingerprint>,
        reissue_client: bool,
    },
    /// Ask KubeadmControlPlane `kcp` to replace its Machines created before `after`.
    RollControlPlane { kcp: String, after: Timestamp },
    /// Store the next CA in `<cluster>-managed-etcd`, marked `ca-rotated-for: request`, over
    /// exactly the version read: the rotation is done, and the old CA goes with it.
    AdoptNextCa { request: String },
    /// The control plane trusts the new CA alone from now on (new Machines; no rollout), then
    /// `<cluster>-managed-etcd-next` is deleted.
    ForgetOldCa { trust_new_only: bool },
}

/// Where the rotation stands: for the status and the Events.
#[derive(Clone, Debug, PartialEq)]
pub struct Progress {
    pub phase: Phase,
    pub request: Option<String>,
    /// Per member Machine: the CA that signed it, `current`, `next` or `unknown`.
    pub members: Vec<(String, &'static str)>,
    pub remaining: Vec<Phase>,
}

/// The phase the world is in.
pub fn phase(v: &RotationView) -> Phase {
    match &v.next {
        NextCa::Missing | NextCa::Corrupt(_) => {
            if requested(v).is_some() {
                Phase::Generating
            } else {
                Phase::Idle
            }
        }
        NextCa::Present { fingerprint, .. } if *fingerprint == v.current => Phase::Finishing,
        NextCa::Present { fingerprint, .. } => match lowest_rank(v, fingerprint) {
            0 => Phase::Trusting,
            // Once a member of the Signing roll exists the control plane was done: a later
            // rollout of its own (the endpoints switched mid-roll) does not bring it back.
            1 if highest_rank(v, fingerprint) < 2 && !control_plane_done(v, fingerprint) => {
                Phase::ControlPlane
            }
            1 => Phase::Signing,
            2 => Phase::Dropping,
            _ => Phase::Finishing,
        },
    }
}

/// A request not yet served: set, and not the one the current CA was made for.
fn requested(v: &RotationView) -> Option<&str> {
    v.request
        .as_deref()
        .filter(|r| !r.is_empty() && v.rotated_for.as_deref() != Some(*r))
}

/// Each member's rank (unknown bundles count as 0: they hold the plan back anyway).
fn ranks<'a>(v: &'a RotationView, new: &'a str) -> impl Iterator<Item = u8> + 'a {
    v.members.iter().map(move |m| {
        m.bundle
            .as_ref()
            .and_then(|b| b.rank(&v.current, new))
            .unwrap_or(0)
    })
}

/// The lowest rank of any member.
fn lowest_rank(v: &RotationView, new: &str) -> u8 {
    ranks(v, new).min().unwrap_or(0)
}

/// The highest rank of any member.
fn highest_rank(v: &RotationView, new: &str) -> u8 {
    ranks(v, new).max().unwrap_or(0)
}

/// The control plane trusts both CAs, holds a client certificate from the next one and has
/// rolled since it was re-issued (or there is no control plane).
fn control_plane_done(v: &RotationView, new: &str) -> bool {
    let Some(cp) = &v.control_plane else {
        return true;
    };
    let trusts_both = cp.trusted.iter().any(|f| f == new) && cp.trusted.contains(&v.current);
    trusts_both
        && cp.client_signed_by.as_deref() == Some(new)
        && rolled_since_reissue(cp)
        && cp.rollout_complete
}

fn rolled_since_reissue(cp: &ControlPlaneCa) -> bool {
    match (cp.client_reissued, cp.rollout_after) {
        (Some(reissued), Some(after)) => after >= reissued,
        _ => false,
    }
}

/// The rotation's next step, or what holds it, or None (no rotation).
pub fn decide(v: &RotationView) -> Option<Decision<RotationStep>> {
    if let Some(refusal) = refusal(v) {
        return Some(refusal.into());
    }
    let phase = phase(v);
    match phase {
        Phase::Idle => None,
        Phase::Generating => Some(generate(v)),
        Phase::Trusting | Phase::Signing | Phase::Dropping => Some(roll(v, phase)),
        Phase::ControlPlane => Some(control_plane(v)),
        Phase::Finishing => Some(finish(v)),
    }
}

/// What only a human can fix: an unusable next CA, members whose `ca.crt` no rotation made,
/// members too far apart to reach each other.
fn refusal(v: &RotationView) -> Option<Hold> {
    if let NextCa::Corrupt(problem) = &v.next {
        return Some(Hold::refuse(
            reason::CA_ROTATION_REFUSED,
            format!("{problem}: the next CA is reported, never replaced; delete the Secret to start again"),
        ));
    }
    let NextCa::Present { fingerprint: new, .. } = &v.next else {
        return None;
    };
    let mut ranks = Vec::new();
    for member in &v.members {
        let rank = member.bundle.as_ref().and_then(|b| b.rank(&v.current, new));
        match rank {
            Some(rank) => ranks.push((rank, member.machine.as_str())),
            None if member.bundle.is_none() => {}
            None => {
                return Some(Hold::refuse(
                    reason::CA_ROTATION_REFUSED,
                    format!(
                        "Machine {}: its ca.crt holds CAs that are neither the current nor the next etcd CA in a rotation's order",
                        member.machine
                    ),
                ));
            }
        }
    }
    let (Some(low), Some(high)) = (ranks.iter().min(), ranks.iter().max()) else {
        return None;
    };
    (high.0 > low.0 + 1).then(|| {
        Hold::refuse(
            reason::CA_ROTATION_REFUSED,
            format!(
                "Machine {} and Machine {} are two CA rotation phases apart and cannot reach each other over TLS; replace one by hand",
                low.1, high.1
            ),
        )
    })
}

fn generate(v: &RotationView) -> Decision<RotationStep> {
    let request = requested(v).unwrap_or_default().to_string();
    if v.bottlerocket {
        return Hold::refuse(reason::CA_ROTATION_REFUSED, BOTTLEROCKET_REFUSAL).into();
    }
    if let Some(busy) = &v.busy {
        return Hold::wait(
            reason::CA_ROTATION_WAITING,
            format!("CA rotation {request:?} waits: {busy}"),
        )
        .into();
    }
    if !v.settled {
        return Hold::wait(
            reason::CA_ROTATION_WAITING,
            format!("CA rotation {request:?} waits for every member to be a healthy voter"),
        )
        .into();
    }
    Decision::Do(RotationStep::CreateNextCa { request })
}

/// Trusting, Signing, Dropping: the members below the target are outdated; once none is, wait
/// for the cluster to settle before the next phase (an unsettled cluster may still be making a
/// Machine of the previous target).
fn roll(v: &RotationView, phase: Phase) -> Decision<RotationStep> {
    let NextCa::Present { fingerprint: new, .. } = &v.next else {
        return Hold::wait(reason::CA_ROTATION_WAITING, "the next CA is not there yet").into();
    };
    let rank = match phase {
        Phase::Trusting => 1,
        Phase::Signing => 2,
        _ => 3,
    };
    let target = Bundle::of_rank(rank, &v.current, new);
    let outdated: Vec<String> = v
        .members
        .iter()
        .filter(|m| m.bundle.as_ref() != Some(&target))
        .map(|m| m.machine.clone())
        .collect();
    Decision::Do(RotationStep::Roll {
        phase,
        target,
        outdated,
    })
}

fn control_plane(v: &RotationView) -> Decision<RotationStep> {
    let (Some(cp), NextCa::Present { fingerprint: new, .. }) = (&v.control_plane, &v.next) else {
        return Hold::wait(
            reason::CA_ROTATION_WAITING,
            "no control plane to hand the next CA",
        )
        .into();
    };
    if !v.settled {
        return Hold::wait(
            reason::CA_ROTATION_WAITING,
            "every member trusts the next CA: waiting for them to be healthy voters before the control plane takes it",
        )
        .into();
    }
    let trusted = vec![v.current.clone(), new.clone()];
    let reissue_client = cp.client_signed_by.as_deref() != Some(new.as_str());
    if cp.trusted != trusted || reissue_client {
        return Decision::Do(RotationStep::HandControlPlane {
            trusted,
            reissue_client,
        });
    }
    match cp.client_reissued {
        Some(after) if !rolled_since_reissue(cp) => Decision::Do(RotationStep::RollControlPlane {
            kcp: cp.kcp.clone(),
            after,
        }),
        // Re-issued by someone who did not mark when: issue again, so a rollout can follow it.
        None => Decision::Do(RotationStep::HandControlPlane {
            trusted,
            reissue_client: true,
        }),
        Some(_) => Hold::wait(
            reason::CA_ROTATION_WAITING,
            format!(
                "waiting for KubeadmControlPlane {} to replace its Machines with ones that trust both etcd CAs and hold a client certificate from the next one",
                cp.kcp
            ),
        )
        .into(),
    }
}

fn finish(v: &RotationView) -> Decision<RotationStep> {
    let NextCa::Present {
        fingerprint: new,
        request,
    } = &v.next
    else {
        return Hold::wait(reason::CA_ROTATION_WAITING, "the next CA is not there yet").into();
    };
    if *new != v.current {
        if !v.settled {
            return Hold::wait(
                reason::CA_ROTATION_WAITING,
                "every member trusts the next CA alone: waiting for them to be healthy voters before it becomes the current CA",
            )
            .into();
        }
        return Decision::Do(RotationStep::AdoptNextCa {
            request: request.clone(),
        });
    }
    let trust_new_only = v
        .control_plane
        .as_ref()
        .is_some_and(|cp| cp.trusted != [new.clone()]);
    Decision::Do(RotationStep::ForgetOldCa { trust_new_only })
}

/// The bundle a Machine created now gets (None: the current CA alone): the target of the roll
/// under way, so a replacement made by remediation or scaling mid-rotation is never two ranks
/// from the others.
pub fn new_member_bundle(v: &RotationView) -> Option<Bundle> {
    let NextCa::Present { fingerprint: new, .. } = &v.next else {
        return None;
    };
    let rank = match phase(v) {
        Phase::Idle | Phase::Generating => return None,
        Phase::Trusting | Phase::ControlPlane => 1,
        Phase::Signing => 2,
        Phase::Dropping => 3,
        // Before the next CA is adopted the members hold it alone; after, it is the current CA.
        Phase::Finishing if *new != v.current => 3,
        Phase::Finishing => return None,
    };
    Some(Bundle::of_rank(rank, &v.current, new))
}

/// Where the rotation stands, per member which CA signed it and what is left.
pub fn progress(v: &RotationView) -> Progress {
    let phase = phase(v);
    let new = match &v.next {
        NextCa::Present { fingerprint, .. } => Some(fingerprint.as_str()),
        NextCa::Missing | NextCa::Corrupt(_) => None,
    };
    let members = v
        .members
        .iter()
        .map(|m| {
            let signer = match m.signed_by.as_deref() {
                Some(f) if new == Some(f) => "next",
                Some(f) if f == v.current => "current",
                _ => "unknown",
            };
            (m.machine.clone(), signer)
        })
        .collect();
    let request = match &v.next {
        NextCa::Present { request, .. } => Some(request.clone()),
        NextCa::Missing | NextCa::Corrupt(_) => requested(v).map(str::to_string),
    };
    Progress {
        phase,
        request,
        members,
        remaining: phase.remaining(),
    }
}

#[cfg(test)]
mod tests;
