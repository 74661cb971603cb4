//! Conditions in the CAPI shape, and the rules for changing them (time moves only on a flip).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The summary condition every object of these providers carries.
pub const READY: &str = "Ready";

/// One observation about an object, in the shape CAPI reads (v1beta1 `Condition` fields, with
/// `reason` always set so v1beta2 readers accept it too).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Type of condition in CamelCase, e.g. `Ready`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: ConditionStatus,
    /// How bad a `False` is: `Error`, `Warning` or `Info` (CAPI v1beta1 readers use it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub severity: Option<String>,
    /// When the status last changed.
    pub last_transition_time: Time,
    /// CamelCase reason for the last transition: what is awaited or what went wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The `metadata.generation` this condition was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The three condition states.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

/// How severe a false condition is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Error,
    Warning,
    Info,
}

impl Severity {
    fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "Error",
            Severity::Warning => "Warning",
            Severity::Info => "Info",
        }
    }
}

/// A condition to set, before it meets the existing list (which decides its transition time).
#[derive(Clone, Debug, PartialEq)]
pub struct NewCondition {
    pub type_: String,
    pub status: ConditionStatus,
    pub severity: Option<Severity>,
    pub reason: String,
    pub message: String,
}

impl NewCondition {
    /// `type_ = True` with a reason (CAPI v1beta2 requires one even when true).
    pub fn true_(type_: &str, reason: &str) -> Self {
        NewCondition {
            type_: type_.into(),
            status: ConditionStatus::True,
            severity: None,
            reason: reason.into(),
            message: String::new(),
        }
    }

    /// `type_ = False` with a reason saying what is awaited or wrong, and a message.
    pub fn false_(type_: &str, severity: Severity, reason: &str, message: impl Into<String>) -> Self {
        NewCondition {
            type_: type_.into(),
            status: ConditionStatus::False,
            severity: Some(severity),
            reason: reason.into(),
            message: message.into(),
        }
    }

    /// `type_ = Unknown`.
    pub fn unknown(type_: &str, reason: &str, message: impl Into<String>) -> Self {
        NewCondition {
            type_: type_.into(),
            status: ConditionStatus::Unknown,
            severity: None,
            reason: reason.into(),
            message: message.into(),
        }
    }

    /// Add or replace a message.
    pub fn with_message(mut self, message: impl Into<String>) -> Self {
        self.message = message.into();
        self
    }
}

/// Find a condition by type.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// True when the condition exists and is `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == ConditionStatus::True)
}

/// Set `new` in `conditions`. The transition time changes only when the status flips (or the
/// condition is new), so repeated reconciles do not churn the object. Returns true if anything
/// changed.
pub fn set(conditions: &mut Vec<Condition>, new: NewCondition, generation: Option<i64>, now: &Time) -> bool {
    let message = (!new.message.is_empty()).then(|| bounded(new.message));
    let severity = new.severity.map(|s| s.as_str().to_string());
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(existing) => {
            let flipped = existing.status != new.status;
            let changed = flipped
                || existing.reason.as_deref() != Some(new.reason.as_str())
                || existing.message != message
                || existing.severity != severity
                || existing.observed_generation != generation;
            if flipped {
                existing.last_transition_time = now.clone();
            }
            existing.status = new.status;
            existing.reason = Some(new.reason);
            existing.message = message;
            existing.severity = severity;
            existing.observed_generation = generation;
            changed
        }
        None => {
            conditions.push(Condition {
                type_: new.type_,
                status: new.status,
                severity,
                last_transition_time: now.clone(),
                reason: Some(new.reason),
                message,
                observed_generation: generation,
            });
            conditions.sort_by(|a, b| condition_order(&a.type_).cmp(&condition_order(&b.type_)));
            true
        }
    }
}

/// Longest condition message kept; a longer one (user input quoted whole, say) is cut, so one
/// condition can never push the status past the API server's request limit.
pub const MAX_MESSAGE_CHARS: usize = 4096;

fn bounded(message: String) -> String {
    match message.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((cut, _)) => format!(
            "{}… (message cut at {MAX_MESSAGE_CHARS} characters)",
            &message[..cut]
        ),
        None => message,
    }
}

/// `Ready` first, then alphabetical, as CAPI orders them.
fn condition_order(type_: &str) -> (bool, &str) {
    (type_ != "Ready", type_)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap_or_default())
    }

    #[test]
    fn a_huge_message_is_cut() {
        let mut list = vec![];
        let huge = "x".repeat(2 << 20);
        set(
            &mut list,
            NewCondition::false_("Ready", Severity::Error, "InvalidSpec", huge),
            None,
            &at(1),
        );
        let message = list[0].message.clone().unwrap_or_default();
        assert!(message.len() < MAX_MESSAGE_CHARS + 100, "{}", message.len());
        assert!(message.ends_with("(message cut at 4096 characters)"));
    }

    #[test]
    fn transition_time_moves_only_when_status_flips() {
        let mut list = Vec::new();
        assert!(set(
            &mut list,
            NewCondition::false_("Ready", Severity::Info, "WaitingForMachines", "0/3"),
            Some(1),
            &at(10)
        ));
        assert!(set(
            &mut list,
            NewCondition::false_("Ready", Severity::Info, "WaitingForMachines", "1/3"),
            Some(1),
            &at(20)
        ));
        assert_eq!(list[0].last_transition_time, at(10));
        assert_eq!(list[0].message.as_deref(), Some("1/3"));
        assert!(!set(
            &mut list,
            NewCondition::false_("Ready", Severity::Info, "WaitingForMachines", "1/3"),
            Some(1),
            &at(25)
        ));
        assert!(set(
            &mut list,
            NewCondition::true_("Ready", "Ready"),
            Some(1),
            &at(30)
        ));
        assert_eq!(list[0].last_transition_time, at(30));
        assert!(is_true(&list, "Ready"));
        assert_eq!(list[0].severity, None);
    }

    #[test]
    fn ready_sorts_first() {
        let mut list = Vec::new();
        set(
            &mut list,
            NewCondition::true_("MachinesReady", "Ready"),
            None,
            &at(1),
        );
        set(&mut list, NewCondition::true_("Ready", "Ready"), None, &at(1));
        set(
            &mut list,
            NewCondition::true_("CertificatesAvailable", "Ready"),
            None,
            &at(1),
        );
        let types: Vec<_> = list.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["Ready", "CertificatesAvailable", "MachinesReady"]);
    }

    #[test]
    fn serializes_in_capi_shape() {
        let mut list = Vec::new();
        set(
            &mut list,
            NewCondition::false_("Ready", Severity::Warning, "QuorumLost", "1 of 3 healthy"),
            Some(2),
            &at(0),
        );
        let json = serde_json::to_value(&list[0]).unwrap_or_default();
        assert_eq!(json["type"], "Ready");
        assert_eq!(json["status"], "False");
        assert_eq!(json["severity"], "Warning");
        assert_eq!(json["reason"], "QuorumLost");
        assert_eq!(json["lastTransitionTime"], "1970-01-01T00:00:00Z");
        assert_eq!(json["observedGeneration"], 2);
    }
}
