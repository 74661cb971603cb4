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
const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// Health checking and remediation settings (Go duration strings).
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthCheck {
    /// Time between checks of each member (default 10s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"))]
    pub interval: Option<String>,
    /// Timeout of one check (default 5s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"))]
    pub timeout: Option<String>,
    /// How long a member may be unhealthy before it is replaced (default 5m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"))]
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
/// default (admission rejects it; this keeps the controller safe if one slips through).
pub(super) fn settings(hc: Option<&HealthCheck>) -> HealthSettings {
    let hc = hc.cloned().unwrap_or_default();
    let pick = |v: &Option<String>, default: Duration| {
        v.as_deref()
            .and_then(|s| duration::parse(s).ok())
            .filter(|d| !d.is_zero())
            .unwrap_or(default)
    };
    HealthSettings {
        interval: pick(&hc.interval, DEFAULT_HEALTH_INTERVAL),
        timeout: pick(&hc.timeout, DEFAULT_HEALTH_TIMEOUT),
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
    if interval.is_some_and(|i| i < MIN_INTERVAL) {
        errors.push(FieldError::new(
            "spec.healthCheck.interval",
            "must be at least 1s",
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
