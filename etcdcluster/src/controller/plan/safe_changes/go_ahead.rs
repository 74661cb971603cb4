//! The `proceed-without-snapshot` annotation bound to one change (docs/day2.md, "Snapshots
//! before changes"): its value names the change it lets go ahead, as `<reason>@<decided>` from
//! `status.beforeChange`, so one set early, left over, or written without a value never waives
//! another change; one naming no change under way is removed, and these are the words saying why.

use k8s_openapi::jiff::Timestamp;

use etcdadm_shared::names::PROCEED_WITHOUT_SNAPSHOT_ANNOTATION;

/// Longest part of an annotation's value repeated in an Event or a condition.
const SHOWN_VALUE_CHARS: usize = 80;

/// The value that names a change: its snapshot reason and when it was decided, to the second.
pub fn change_name(reason: &str, decided: Timestamp) -> String {
    format!("{reason}@{}", decided.strftime("%Y-%m-%dT%H:%M:%SZ"))
}

/// The name of the change under way (`reason`), once a record of it says when it was decided.
pub fn current(reason: Option<&str>, recorded: Option<(&str, Option<Timestamp>)>) -> Option<String> {
    let reason = reason?;
    match recorded? {
        (stored, Some(decided)) if stored == reason => Some(change_name(reason, decided)),
        _ => None,
    }
}

/// `value` as an Event may repeat it: bounded, and quoted.
pub fn shown(value: &str) -> String {
    let mut cut: String = value.chars().take(SHOWN_VALUE_CHARS).collect();
    if cut.len() < value.len() {
        cut.push('…');
    }
    format!("{cut:?}")
}

/// Why an annotation lets no change go ahead: there is no store, no change (`what` is under
/// way), or the one under way has another name (or none yet).
pub fn why_stale(backup: bool, what: Option<&str>, current: Option<&str>) -> String {
    match (backup, what, current) {
        (false, _, _) => "spec.backup is not set, so no change waits for a before-change snapshot".into(),
        (true, None, _) => "no rolling replacement or scale-down is under way".into(),
        (true, Some(_), Some(name)) => format!(
            "the change under way is {name}: set {PROCEED_WITHOUT_SNAPSHOT_ANNOTATION}={name} to let it go ahead \
             without a snapshot"
        ),
        (true, Some(what), None) => {
            format!("the {what} under way is not recorded in status.beforeChange yet")
        }
    }
}

/// The hint a held change's message ends with: the exact value that lets it go ahead.
pub fn hint(current: Option<&str>) -> String {
    match current {
        Some(name) => format!(
            "annotate {PROCEED_WITHOUT_SNAPSHOT_ANNOTATION}={name} to let this change go ahead without one"
        ),
        None => format!(
            "annotate {PROCEED_WITHOUT_SNAPSHOT_ANNOTATION} with the change's name \
             (<reason>@<status.beforeChange.decided>) to go ahead without one"
        ),
    }
}
