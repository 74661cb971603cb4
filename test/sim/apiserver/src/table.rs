//! `Table` responses, what `kubectl get` prints: a custom resource's `additionalPrinterColumns`
//! (every one, with its priority, so `-o wide` shows the rest), the built-in kinds' columns as
//! the real server prints them (`printers`), and the row's object as `includeObject` asks.

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use crate::columns::{Column, PrinterColumn, since};
use crate::jsonpath::JsonPath;
use crate::printers;
use crate::resources::ResourceType;

/// An Age column from the creation timestamp: what a CRD without columns gets.
fn age_column() -> Option<PrinterColumn> {
    Some(PrinterColumn {
        column: Column {
            name: "Age".into(),
            type_: "date".into(),
            format: String::new(),
            description: printers::creation_timestamp_description(),
            priority: 0,
        },
        path: JsonPath::parse(".metadata.creationTimestamp").ok()?,
    })
}

/// What a row carries besides its cells (`includeObject`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Include {
    None,
    /// The default: `PartialObjectMetadata`.
    Metadata,
    Object,
}

impl Include {
    /// From the `includeObject` query parameter.
    pub fn parse(value: Option<&str>) -> Result<Include, String> {
        match value {
            None | Some("" | "Metadata") => Ok(Include::Metadata),
            Some("None") => Ok(Include::None),
            Some("Object") => Ok(Include::Object),
            Some(other) => Err(format!(
                "includeObject: Unsupported value: {other:?}: supported values: \"None\", \"Metadata\", \"Object\""
            )),
        }
    }
}

/// The columns of `rt` at `version`: Name, then the CRD's columns (Age when it defines none), or
/// the built-in kind's.
fn custom_columns(rt: &ResourceType, version: &str) -> Vec<PrinterColumn> {
    let defined = rt.columns.get(version).cloned().unwrap_or_default();
    if defined.is_empty() {
        age_column().into_iter().collect()
    } else {
        defined
    }
}

/// The column definitions of `rt` at `version`.
pub fn columns(rt: &ResourceType, version: &str) -> Vec<Column> {
    if !rt.custom {
        return printers::columns(rt);
    }
    std::iter::once(printers::name_column())
        .chain(custom_columns(rt, version).into_iter().map(|c| c.column))
        .collect()
}

/// One row for `object` (as served), with what `include` asks for.
pub fn row(rt: &ResourceType, version: &str, object: &Value, include: Include, now: Timestamp) -> Value {
    let cells: Vec<Value> = if rt.custom {
        let name = object.pointer("/metadata/name").cloned().unwrap_or(Value::Null);
        std::iter::once(name)
            .chain(
                custom_columns(rt, version)
                    .iter()
                    .map(|c| crd_cell(&c.column.type_, c.path.first(object), now)),
            )
            .collect()
    } else {
        printers::cells(rt, object, now)
    };
    let carried = match include {
        Include::None => Value::Null,
        Include::Metadata => metadata_only(object),
        Include::Object => object.clone(),
    };
    json!({"cells": cells, "object": carried})
}

/// A `Table` of `rows`; `headers` false leaves the definitions out (`null`), as watch events
/// after the first do.
pub fn table(rt: &ResourceType, version: &str, rows: Vec<Value>, metadata: Value, headers: bool) -> Value {
    let definitions = if headers {
        Value::Array(columns(rt, version).iter().map(Column::definition).collect())
    } else {
        Value::Null
    };
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": definitions,
        "rows": rows,
    })
}

/// `PartialObjectMetadata` of an object: its metadata only.
pub fn metadata_only(object: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": object.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

/// A cell of a CRD column: the value if it has the column's type (`null` otherwise, or when the
/// path finds nothing), a string column's value as text, a date as the time since.
fn crd_cell(type_: &str, value: Option<&Value>, now: Timestamp) -> Value {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Value::Null;
    };
    match type_ {
        // JSON numbers may arrive as floats; the real server truncates them.
        "integer" => value
            .as_i64()
            .or_else(|| value.as_f64().map(|f| f as i64))
            .map_or(Value::Null, Value::from),
        "number" => value.as_f64().map_or(Value::Null, Value::from),
        "boolean" => value.as_bool().map_or(Value::Null, Value::from),
        "string" => Value::String(match value {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        }),
        "date" => Value::String(
            value
                .as_str()
                .map_or_else(|| "<invalid>".into(), |t| since(t, now)),
        ),
        _ => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_take_the_column_type() {
        let now: Timestamp = "2025-01-01T00:10:00Z".parse().unwrap();
        assert_eq!(crd_cell("integer", Some(&json!(3)), now), json!(3));
        assert_eq!(crd_cell("integer", Some(&json!(3.7)), now), json!(3));
        assert_eq!(crd_cell("integer", Some(&json!("3")), now), Value::Null);
        assert_eq!(crd_cell("boolean", Some(&json!(true)), now), json!(true));
        assert_eq!(crd_cell("string", Some(&json!(false)), now), json!("false"));
        assert_eq!(crd_cell("string", None, now), Value::Null);
        assert_eq!(
            crd_cell("date", Some(&json!("2025-01-01T00:07:55Z")), now),
            json!("2m5s")
        );
        assert_eq!(
            crd_cell("date", Some(&json!("yesterday")), now),
            json!("<invalid>")
        );
    }

    #[test]
    fn includes_are_parsed_as_the_real_server_names_them() {
        assert_eq!(Include::parse(None), Ok(Include::Metadata));
        assert_eq!(Include::parse(Some("None")), Ok(Include::None));
        assert_eq!(Include::parse(Some("Object")), Ok(Include::Object));
        assert!(Include::parse(Some("Everything")).is_err());
    }
}
