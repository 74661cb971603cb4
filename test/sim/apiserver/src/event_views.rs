//! One store of Events, two APIs: core `v1` and `events.k8s.io/v1` serve the same objects, with
//! the field mapping the real server applies between the two versions. Events are kept in the
//! core form; the `events.k8s.io` resource converts on the way in and out.

use serde_json::{Map, Value, json};

/// Fields named differently by the two APIs: (core `v1`, `events.k8s.io/v1`). Every other field
/// (metadata, reason, type, action, related, series, eventTime, reportingInstance) is the same.
const RENAMED: [(&str, &str); 7] = [
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
    ("reportingComponent", "reportingController"),
];

fn renamed(object: Value, rename: impl Fn(&str) -> Option<&'static str>) -> Map<String, Value> {
    match object {
        Value::Object(fields) => fields
            .into_iter()
            .map(|(key, value)| match rename(&key) {
                Some(to) => (to.to_string(), value),
                None => (key, value),
            })
            .collect(),
        _ => Map::new(),
    }
}

/// Fields the real server always shows, empty when unset (core `v1` form): a struct and two
/// timestamps.
const ALWAYS_SHOWN: [&str; 3] = ["source", "firstTimestamp", "lastTimestamp"];

/// A stored (core `v1`) Event as `events.k8s.io/v1` shows it. `eventTime` is required there and
/// shown as `null` when the Event was created without one, as the real server does.
pub fn to_events_v1(core: Value) -> Value {
    let mut fields = renamed(core, |key| {
        RENAMED.iter().find(|(core, _)| *core == key).map(|(_, new)| *new)
    });
    fields.insert("apiVersion".into(), json!("events.k8s.io/v1"));
    fields.entry("eventTime").or_insert(Value::Null);
    Value::Object(fields)
}

/// An `events.k8s.io/v1` Event in the stored (core `v1`) form, with the core fields it leaves
/// unset shown empty, as the real server shows them (`kubectl get events --sort-by
/// .lastTimestamp` needs the field to be there).
pub fn to_core(event: Value) -> Value {
    let mut fields = renamed(event, |key| {
        RENAMED.iter().find(|(_, new)| *new == key).map(|(core, _)| *core)
    });
    fields.insert("apiVersion".into(), json!("v1"));
    for key in ALWAYS_SHOWN {
        let empty = if key == "source" { json!({}) } else { Value::Null };
        fields.entry(key).or_insert(empty);
    }
    Value::Object(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_two_forms_map_field_for_field_and_back() {
        let new = json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "e1", "namespace": "default"},
            "eventTime": "2025-01-01T00:00:00.000000Z",
            "regarding": {"kind": "EtcdadmCluster", "name": "c1"},
            "note": "joined", "reason": "MemberJoined", "type": "Normal", "action": "Reconcile",
            "reportingController": "etcdadm-controller", "reportingInstance": "etcdadm-controller-1",
            "series": {"count": 2, "lastObservedTime": "2025-01-01T00:01:00.000000Z"},
        });
        let core = to_core(new.clone());
        assert_eq!(core["apiVersion"], "v1");
        assert_eq!(core["involvedObject"]["name"], "c1");
        assert_eq!(core["message"], "joined");
        assert_eq!(core["reportingComponent"], "etcdadm-controller");
        assert_eq!(core["series"]["count"], 2);
        assert!(core.get("regarding").is_none() && core.get("note").is_none());
        assert_eq!(core["lastTimestamp"], Value::Null);
        assert_eq!(core["source"], json!({}));
        let mut back = new;
        back["deprecatedSource"] = json!({});
        back["deprecatedFirstTimestamp"] = Value::Null;
        back["deprecatedLastTimestamp"] = Value::Null;
        assert_eq!(to_events_v1(core), back);
    }

    #[test]
    fn a_core_event_without_event_time_shows_it_as_null() {
        let core = json!({"apiVersion": "v1", "kind": "Event", "message": "m", "count": 3,
                          "lastTimestamp": "2025-01-01T00:00:00Z"});
        let new = to_events_v1(core);
        assert_eq!(new["eventTime"], Value::Null);
        assert_eq!(new["deprecatedCount"], 3);
        assert_eq!(new["deprecatedLastTimestamp"], "2025-01-01T00:00:00Z");
        assert_eq!(new["note"], "m");
    }
}
