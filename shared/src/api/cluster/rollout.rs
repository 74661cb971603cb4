//! How members are replaced and brought up: `spec.rolloutStrategy`, `spec.rolloutBefore` (with
//! the certificate renewal window) and `spec.provisioning`, with their defaults and checks.

use std::time::Duration;

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use crate::validation::field::FieldError;

/// Default `rolloutBefore.certificatesExpiryDays`: renewal is on unless asked otherwise, because
/// the alternative is an outage a year after creation.
pub const DEFAULT_CERTIFICATES_EXPIRY_DAYS: i32 = 30;
/// The smallest `rolloutBefore.certificatesExpiryDays` (KubeadmControlPlane's minimum too).
pub const MIN_CERTIFICATES_EXPIRY_DAYS: i32 = 7;
/// The largest: half of etcdadm's 365-day validity, so a fresh certificate stays outside the
/// window for months (one of a year or more would replace every member again at once, forever).
pub const MAX_CERTIFICATES_EXPIRY_DAYS: i32 = 180;

/// How outdated members are replaced.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStrategy {
    /// Only `RollingUpdate`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["RollingUpdate"]))]
    pub type_: Option<String>,
    /// Rolling update parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_update: Option<RollingUpdate>,
}

/// Rolling update parameters.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RollingUpdate {
    /// Extra members allowed during a rollout: 1 (default, add before remove: at most N+1
    /// members and Machines; with a KubeadmControlPlane up to 2N, whose Machines boot together
    /// with learner joins) or 0 (remove first: never more than N Machines).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == 0 || self == 1").message("maxSurge must be 0 or 1"))]
    pub max_surge: Option<i32>,
}

/// How new member Machines are brought up (docs/safety.md, "Boot ahead").
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Provisioning {
    /// The most new Machines not yet voting members at once: booting, booted and waiting for
    /// their turn to join, or joining. Default: as many as a creation or scale-up needs (a
    /// rolling update without a KubeadmControlPlane creates only its current step's Machine). Members still join
    /// one at a time, each as a learner added once every member is healthy; 1 creates each
    /// Machine only after the previous one joined. Machines are created ahead only with learner
    /// joins (the upstream etcdadm flavor with cloud-config); the eks-anywhere flavor and
    /// Bottlerocket create one Machine at a time whatever this says. At least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("parallelMachines must be at least 1"))]
    pub parallel_machines: Option<i32>,
}

/// Replacements made ahead of time.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutBefore {
    /// Replace a member whose certificates expire within this many days, and re-issue the API
    /// server's etcd client certificate (one KubeadmControlPlane rollout) in the same window.
    /// At least 7, at most 180. Default 30 when unset: etcdadm's certificates are valid for a
    /// year and cannot be renewed in place, so without this the cluster stops a year after
    /// creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 7, max = 180))]
    pub certificates_expiry_days: Option<i32>,
}

/// `maxSurge`, with the default (1) applied.
pub(super) fn max_surge(strategy: Option<&RolloutStrategy>) -> i32 {
    strategy
        .and_then(|s| s.rolling_update.as_ref())
        .and_then(|r| r.max_surge)
        .unwrap_or(1)
}

/// `provisioning.parallelMachines` when set: the most new Machines not yet voting members at
/// once (a value below 1, which admission refuses, counts as 1).
pub(super) fn parallel_machines(provisioning: Option<&Provisioning>) -> Option<usize> {
    provisioning
        .and_then(|p| p.parallel_machines)
        .map(|n| usize::try_from(n).unwrap_or(0).max(1))
}

/// How long before a certificate expires it is renewed (`rolloutBefore.certificatesExpiryDays`,
/// default 30 days; within the bounds admission enforces).
pub(super) fn certificates_renew_before(before: Option<&RolloutBefore>) -> Duration {
    let days = before
        .and_then(|r| r.certificates_expiry_days)
        .unwrap_or(DEFAULT_CERTIFICATES_EXPIRY_DAYS)
        .clamp(MIN_CERTIFICATES_EXPIRY_DAYS, MAX_CERTIFICATES_EXPIRY_DAYS);
    Duration::from_secs(u64::from(days.unsigned_abs()) * 86_400)
}

/// `maxSurge` 0 or 1, `parallelMachines` at least 1, `certificatesExpiryDays` in its bounds.
pub(super) fn problems(
    strategy: Option<&RolloutStrategy>,
    provisioning: Option<&Provisioning>,
    before: Option<&RolloutBefore>,
) -> Vec<FieldError> {
    let mut errors = vec![];
    if let Some(surge) = strategy
        .and_then(|s| s.rolling_update.as_ref())
        .and_then(|r| r.max_surge)
        && !(0..=1).contains(&surge)
    {
        errors.push(FieldError::new(
            "spec.rolloutStrategy.rollingUpdate.maxSurge",
            format!("{surge}: must be 0 or 1 (members are replaced one at a time)"),
        ));
    }
    if let Some(parallel) = provisioning.and_then(|p| p.parallel_machines)
        && parallel < 1
    {
        errors.push(FieldError::new(
            "spec.provisioning.parallelMachines",
            format!("{parallel}: must be at least 1 (1 creates one Machine at a time)"),
        ));
    }
    if let Some(days) = before.and_then(|r| r.certificates_expiry_days)
        && !(MIN_CERTIFICATES_EXPIRY_DAYS..=MAX_CERTIFICATES_EXPIRY_DAYS).contains(&days)
    {
        errors.push(FieldError::new(
            "spec.rolloutBefore.certificatesExpiryDays",
            format!(
                "{days}: must be at least {MIN_CERTIFICATES_EXPIRY_DAYS} and at most {MAX_CERTIFICATES_EXPIRY_DAYS} (days left on a certificate when it is renewed; a fresh one is valid 365 days)"
            ),
        ));
    }
    errors
}
