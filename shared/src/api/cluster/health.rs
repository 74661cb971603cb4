//! Health checking and remediation: `spec.healthCheck`, its defaults and checks.

use std::time::Duration;

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use crate::duration;
use crate::validation::field::{FieldError, quoted};

/// Default health-check interval.
pub const DEFAULT_HEALTH_INTERVAL: Duration = Duration::from_secs(10);
/// Default timeout of one health check.
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(5);
/// Default time a member may be unhealthy before it is remediated.
pub const DEFAULT_UNHEALTHY_AFTER: Duration = Duration::from_secs(300);
/// Shortest health-check interval accepted: every check opens TLS connections to every member.
pub const MIN_HEALTH_INTERVAL: Duration = Duration::from_secs(1);
/// Longest health-check interval accepted: a dead member goes unnoticed for up to this long.
pub const MAX_HEALTH_INTERVAL: Duration = Duration::from_secs(600);
/// Longest timeout of one check accepted: a reconcile waits this long on a member that does not
/// answer, holding one of the controller's `--concurrency` slots shared by every cluster.
pub const MAX_HEALTH_TIMEOUT: Duration = Duration::from_secs(30);

/// Health checking and remediation settings (Go duration strings of at most 32 characters).
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.timeout) || duration(self.timeout) <= (has(self.interval) ? duration(self.interval) : duration('10s'))").message("timeout must not exceed the interval (default 10s)").field_path(".timeout").reason(Reason::FieldValueInvalid))]
#[x_kube(validation = Rule::new("!has(self.unhealthyAfter) || duration(self.unhealthyAfter) >= (has(self.interval) ? duration(self.interval) : duration('10s'))").message("unhealthyAfter must be at least the interval (default 10s): one failed check must never be enough").field_path(".unhealthyAfter").reason(Reason::FieldValueInvalid))]
pub struct HealthCheck {
    /// Time between checks of each member: 1s to 10m (default 10s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 32),
        regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$")
    )]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1s') && duration(self) <= duration('10m')").message("interval must be 1s to 10m").reason(Reason::FieldValueInvalid))]
    pub interval: Option<String>,
    /// Timeout of one check: above zero, at most 30s and at most the interval (default 5s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 32),
        regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$")
    )]
    #[x_kube(validation = Rule::new("duration(self) > duration('0s') && duration(self) <= duration('30s')").message("timeout must be above zero and at most 30s").reason(Reason::FieldValueInvalid))]
    pub timeout: Option<String>,
    /// How long a member may be unhealthy before it is replaced: at least the interval
    /// (default 5m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 32),
        regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$")
    )]
    #[x_kube(validation = Rule::new("duration(self) > duration('0s')").message("unhealthyAfter must be above zero").reason(Reason::FieldValueInvalid))]
    pub unhealthy_after: Option<String>,
    /// `Enabled` (default) or `Disabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remediation: Option<Remediation>,
}

/// Whether unhealthy members are replaced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Remediation {
    #[default]
    Enabled,
    Disabled,
}

/// Health settings after defaulting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthSettings {
    pub interval: Duration,
    pub timeout: Duration,
    pub unhealthy_after: Duration,
    pub remediation: bool,
}

/// Health-check settings with defaults applied. A duration that does not parse falls back to the
/// default, and one out of its bounds is brought within them (admission and the CRD refuse
/// both; this keeps the controller safe if one slips through, and `InvalidSpec` says so).
pub(super) fn settings(hc: Option<&HealthCheck>) -> HealthSettings {
    let hc = hc.cloned().unwrap_or_default();
    let pick = |v: &Option<String>, default: Duration| {
        v.as_deref()
            .and_then(|s| duration::parse(s).ok())
            .filter(|d| !d.is_zero())
            .unwrap_or(default)
    };
    let interval =
        pick(&hc.interval, DEFAULT_HEALTH_INTERVAL).clamp(MIN_HEALTH_INTERVAL, MAX_HEALTH_INTERVAL);
    HealthSettings {
        interval,
        timeout: pick(&hc.timeout, DEFAULT_HEALTH_TIMEOUT)
            .min(MAX_HEALTH_TIMEOUT)
            .min(interval),
        unhealthy_after: pick(&hc.unhealthy_after, DEFAULT_UNHEALTHY_AFTER),
        remediation: hc.remediation.unwrap_or_default() == Remediation::Enabled,
    }
}

/// The health-check durations parse and make sense together.
pub(super) fn problems(hc: Option<&HealthCheck>) -> Vec<FieldError> {
    let Some(hc) = hc else {
        return vec![];
    };
    let mut errors = vec![];
    let mut parsed = |field: &str, value: &Option<String>| -> Option<Duration> {
        let value = value.as_deref()?;
        match duration::parse(value) {
            Ok(d) if !d.is_zero() => Some(d),
            Ok(_) => {
                errors.push(FieldError::new(
                    format!("spec.healthCheck.{field}"),
                    "must be greater than zero",
                ));
                None
            }
            Err(e) => {
                errors.push(FieldError::new(
                    format!("spec.healthCheck.{field}"),
                    format!("{}: {e}", quoted(value)),
                ));
                None
            }
        }
    };
    let interval = parsed("interval", &hc.interval);
    let timeout = parsed("timeout", &hc.timeout);
    let unhealthy_after = parsed("unhealthyAfter", &hc.unhealthy_after);
    let interval_or_default = interval.unwrap_or(DEFAULT_HEALTH_INTERVAL);
    if let Some(interval) = interval
        && !(MIN_HEALTH_INTERVAL..=MAX_HEALTH_INTERVAL).contains(&interval)
    {
        errors.push(FieldError::new(
            "spec.healthCheck.interval",
            format!(
                "{}: must be {} to {}",
                duration::format(interval),
                duration::format(MIN_HEALTH_INTERVAL),
                duration::format(MAX_HEALTH_INTERVAL)
            ),
        ));
    }
    if let Some(timeout) = timeout
        && timeout > MAX_HEALTH_TIMEOUT
    {
        errors.push(FieldError::new(
            "spec.healthCheck.timeout",
            format!(
                "{}: must be at most {} (a check holds one of the controller's reconcile slots)",
                duration::format(timeout),
                duration::format(MAX_HEALTH_TIMEOUT)
            ),
        ));
    }
    if let Some(timeout) = timeout
        && timeout > interval_or_default
    {
        errors.push(FieldError::new(
            "spec.healthCheck.timeout",
            format!(
                "{}: must not exceed the interval {}",
                duration::format(timeout),
                duration::format(interval_or_default)
            ),
        ));
    }
    if let Some(after) = unhealthy_after
        && after < interval_or_default
    {
        errors.push(FieldError::new(
            "spec.healthCheck.unhealthyAfter",
            format!(
                "{}: must be at least the interval {} (one failed check must never be enough)",
                duration::format(after),
                duration::format(interval_or_default)
            ),
        ));
    }
    errors
}
