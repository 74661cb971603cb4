//! The columns the real server prints for the built-in kinds this server serves (Events,
//! Namespaces, Secrets, ConfigMaps, Leases, CRDs), with the descriptions of the fields they show
//! taken from the Kubernetes API's own schemas.

use std::sync::OnceLock;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use schemars::JsonSchema;
use serde_json::{Value, json};

use crate::columns::{Column, since};
use crate::resources::ResourceType;

/// The description of the field at `path` (property names) in `T`'s schema.
fn doc<T: JsonSchema>(path: &[&str]) -> String {
    let schema = schemars::generate::SchemaSettings::default()
        .with(|s| s.inline_subschemas = true)
        .into_generator()
        .into_root_schema_for::<T>();
    path.iter()
        .try_fold(schema.as_value(), |cur, key| cur.get("properties")?.get(*key))
        .and_then(|field| field.get("description"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn column(name: &str, type_: &str, description: String, priority: i32) -> Column {
    Column {
        name: name.into(),
        type_: type_.into(),
        format: String::new(),
        description,
        priority,
    }
}

/// The Name column every table starts with (Events show it with `-o wide` only).
pub fn name_column() -> Column {
    static NAME: OnceLock<String> = OnceLock::new();
    Column {
        format: "name".into(),
        ..column(
            "Name",
            "string",
            NAME.get_or_init(|| doc::<ObjectMeta>(&["name"])).clone(),
            0,
        )
    }
}

/// What `metadata.creationTimestamp` means, for Age and Created At columns.
pub fn creation_timestamp_description() -> String {
    static CREATED: OnceLock<String> = OnceLock::new();
    CREATED
        .get_or_init(|| doc::<ObjectMeta>(&["creationTimestamp"]))
        .clone()
}

fn age_column() -> Column {
    column("Age", "string", creation_timestamp_description(), 0)
}

/// Which printer a built-in resource has.
#[derive(Clone, Copy)]
enum Printer {
    Event,
    Namespace,
    Secret,
    ConfigMap,
    Lease,
    Definitions,
}

fn printer(rt: &ResourceType) -> Option<Printer> {
    Some(match (rt.group.as_str(), rt.kind.as_str()) {
        ("" | "events.k8s.io", "Event") => Printer::Event,
        ("", "Namespace") => Printer::Namespace,
        ("", "Secret") => Printer::Secret,
        ("", "ConfigMap") => Printer::ConfigMap,
        ("coordination.k8s.io", "Lease") => Printer::Lease,
        ("apiextensions.k8s.io", "CustomResourceDefinition") => Printer::Definitions,
        _ => return None,
    })
}

fn event_columns() -> Vec<Column> {
    vec![
        column("Last Seen", "string", doc::<Event>(&["lastTimestamp"]), 0),
        column("Type", "string", doc::<Event>(&["type"]), 0),
        column("Reason", "string", doc::<Event>(&["reason"]), 0),
        column("Object", "string", doc::<Event>(&["involvedObject"]), 0),
        column(
            "Subobject",
            "string",
            doc::<Event>(&["involvedObject", "fieldPath"]),
            1,
        ),
        column("Source", "string", doc::<Event>(&["source"]), 1),
        column("Message", "string", doc::<Event>(&["message"]), 0),
        column("First Seen", "string", doc::<Event>(&["firstTimestamp"]), 1),
        column("Count", "string", doc::<Event>(&["count"]), 1),
        Column {
            priority: 1,
            ..name_column()
        },
    ]
}

/// The columns of a built-in resource.
pub fn columns(rt: &ResourceType) -> Vec<Column> {
    static EVENT: OnceLock<Vec<Column>> = OnceLock::new();
    match printer(rt) {
        Some(Printer::Event) => EVENT.get_or_init(event_columns).clone(),
        Some(Printer::Namespace) => vec![
            name_column(),
            column("Status", "string", doc::<Namespace>(&["status", "phase"]), 0),
            age_column(),
        ],
        Some(Printer::Secret) => vec![
            name_column(),
            column("Type", "string", doc::<Secret>(&["type"]), 0),
            column("Data", "string", doc::<Secret>(&["data"]), 0),
            age_column(),
        ],
        Some(Printer::ConfigMap) => vec![
            name_column(),
            column("Data", "string", doc::<ConfigMap>(&["data"]), 0),
            age_column(),
        ],
        Some(Printer::Lease) => vec![
            name_column(),
            column("Holder", "string", doc::<Lease>(&["spec", "holderIdentity"]), 0),
            age_column(),
        ],
        Some(Printer::Definitions) | None => vec![
            name_column(),
            column("Created At", "date", creation_timestamp_description(), 0),
        ],
    }
}

fn text<'a>(object: &'a Value, pointer: &str) -> &'a str {
    object
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// The time since a timestamp field, `<unknown>` when it is unset.
fn age_of(object: &Value, pointer: &str, now: Timestamp) -> String {
    match text(object, pointer) {
        "" => "<unknown>".into(),
        t => since(t, now),
    }
}

fn count_keys(object: &Value, fields: &[&str]) -> usize {
    fields
        .iter()
        .filter_map(|f| object.get(*f).and_then(Value::as_object))
        .map(serde_json::Map::len)
        .sum()
}

/// The cells of a built-in resource's row; `object` as served.
pub fn cells(rt: &ResourceType, object: &Value, now: Timestamp) -> Vec<Value> {
    let name = json!(text(object, "/metadata/name"));
    let age = || json!(age_of(object, "/metadata/creationTimestamp", now));
    match printer(rt) {
        Some(Printer::Event) => event_cells(&rt.to_stored(object.clone()), now),
        Some(Printer::Namespace) => vec![name, json!(text(object, "/status/phase")), age()],
        Some(Printer::Secret) => vec![
            name,
            json!(text(object, "/type")),
            json!(count_keys(object, &["data"])),
            age(),
        ],
        Some(Printer::ConfigMap) => vec![name, json!(count_keys(object, &["data", "binaryData"])), age()],
        Some(Printer::Lease) => vec![name, json!(text(object, "/spec/holderIdentity")), age()],
        Some(Printer::Definitions) | None => {
            vec![name, json!(text(object, "/metadata/creationTimestamp"))]
        }
    }
}

/// An Event's row, from its core form: when it was last and first seen (an `events.k8s.io`
/// Event's series and event time stand in for the core timestamps), who reported it, how often.
fn event_cells(event: &Value, now: Timestamp) -> Vec<Value> {
    let first_seen = match text(event, "/firstTimestamp") {
        "" => age_of(event, "/eventTime", now),
        _ => age_of(event, "/firstTimestamp", now),
    };
    let mut last_seen = match text(event, "/lastTimestamp") {
        "" => first_seen.clone(),
        _ => age_of(event, "/lastTimestamp", now),
    };
    let mut count = event.get("count").and_then(Value::as_i64).unwrap_or(0);
    if event.get("series").is_some_and(Value::is_object) {
        last_seen = age_of(event, "/series/lastObservedTime", now);
        count = event
            .pointer("/series/count")
            .and_then(Value::as_i64)
            .unwrap_or(0);
    } else if count == 0 {
        count = 1;
    }
    let kind = text(event, "/involvedObject/kind").to_lowercase();
    let object = match text(event, "/involvedObject/name") {
        "" => kind,
        name => format!("{kind}/{name}"),
    };
    let first_of = |a: &str, b: &str| {
        if a.is_empty() {
            b.to_string()
        } else {
            a.to_string()
        }
    };
    let component = first_of(
        text(event, "/source/component"),
        text(event, "/reportingComponent"),
    );
    let instance = first_of(text(event, "/source/host"), text(event, "/reportingInstance"));
    let source = if instance.is_empty() {
        component
    } else {
        format!("{component}, {instance}")
    };
    vec![
        json!(last_seen),
        json!(text(event, "/type")),
        json!(text(event, "/reason")),
        json!(object),
        json!(text(event, "/involvedObject/fieldPath")),
        json!(source),
        json!(text(event, "/message").trim()),
        json!(first_seen),
        json!(count),
        json!(text(event, "/metadata/name")),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Registry;

    #[test]
    fn an_event_row_reads_as_kubectl_get_events_shows_it() {
        let now: Timestamp = "2025-01-01T00:10:00Z".parse().unwrap();
        let events = Registry::with_builtins()
            .find("events.k8s.io", "v1", "events")
            .unwrap();
        let new = json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "demo-etcd.1", "namespace": "default"},
            "eventTime": "2025-01-01T00:06:00.000000Z",
            "regarding": {"kind": "EtcdadmCluster", "name": "demo-etcd"},
            "note": "Machine m1 is etcd member 8e9e05c52164694d ", "reason": "MemberJoined", "type": "Normal",
            "reportingController": "etcdadm-controller", "reportingInstance": "etcdadm-controller-1",
            "series": {"count": 2, "lastObservedTime": "2025-01-01T00:09:00.000000Z"},
        });
        assert_eq!(
            cells(&events, &new, now),
            vec![
                json!("60s"),
                json!("Normal"),
                json!("MemberJoined"),
                json!("etcdadmcluster/demo-etcd"),
                json!(""),
                json!("etcdadm-controller, etcdadm-controller-1"),
                json!("Machine m1 is etcd member 8e9e05c52164694d"),
                json!("4m"),
                json!(2),
                json!("demo-etcd.1"),
            ]
        );
        let names: Vec<String> = columns(&events).into_iter().map(|c| c.name).collect();
        assert_eq!(
            names,
            [
                "Last Seen",
                "Type",
                "Reason",
                "Object",
                "Subobject",
                "Source",
                "Message",
                "First Seen",
                "Count",
                "Name"
            ]
        );
        assert!(columns(&events).iter().all(|c| !c.description.is_empty()));
    }

    #[test]
    fn a_single_core_event_counts_once() {
        let now: Timestamp = "2025-01-01T00:10:00Z".parse().unwrap();
        let events = Registry::with_builtins().find("", "v1", "events").unwrap();
        let core = json!({"metadata": {"name": "e"}, "involvedObject": {"kind": "Node"},
                          "firstTimestamp": "2025-01-01T00:09:00Z", "source": {"component": "kubelet"}});
        let row = cells(&events, &core, now);
        assert_eq!(row[0], json!("60s"));
        assert_eq!(row[3], json!("node"));
        assert_eq!(row[5], json!("kubelet"));
        assert_eq!(row[8], json!(1));
    }
}
