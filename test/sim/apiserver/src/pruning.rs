//! Pruning of fields a CRD's structural schema does not declare, as the real server does on
//! every write, so a controller that writes undeclared fields sees them vanish here too.

use serde_json::{Map, Value};

fn preserves_unknown(schema: &Value) -> bool {
    schema
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        == Some(true)
}

/// Prunes `value` in place against an OpenAPI v3 structural schema.
pub fn prune(value: &mut Value, schema: &Value) {
    match value {
        Value::Object(map) => prune_object(map, schema),
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for item in items {
                    prune(item, item_schema);
                }
            }
        }
        _ => {}
    }
}

fn prune_object(map: &mut Map<String, Value>, schema: &Value) {
    let properties = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties").filter(|a| a.is_object());
    let embedded = schema
        .get("x-kubernetes-embedded-resource")
        .and_then(Value::as_bool)
        == Some(true);
    let keep_unknown =
        preserves_unknown(schema) || schema.get("additionalProperties") == Some(&Value::Bool(true));
    map.retain(|key, child| {
        if let Some(child_schema) = properties.and_then(|p| p.get(key)) {
            prune(child, child_schema);
            true
        } else if let Some(child_schema) = additional {
            prune(child, child_schema);
            true
        } else {
            keep_unknown || embedded && matches!(key.as_str(), "apiVersion" | "kind" | "metadata")
        }
    });
}

/// Prunes a whole custom resource: `apiVersion`, `kind` and `metadata` are always kept.
pub fn prune_custom_resource(obj: &mut Value, schema: &Value) {
    let Value::Object(map) = obj else { return };
    let kept: Vec<(String, Value)> = ["apiVersion", "kind", "metadata"]
        .iter()
        .filter_map(|k| map.remove(*k).map(|v| (k.to_string(), v)))
        .collect();
    prune_object(map, schema);
    map.extend(kept);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prunes_undeclared_fields_and_keeps_preserved_ones() {
        let schema = json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "replicas": {"type": "integer"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "items": {"type": "array", "items": {"type": "object", "properties": {"a": {"type": "string"}}}},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            }},
        }});
        let mut obj = json!({
            "apiVersion": "g/v1", "kind": "K", "metadata": {"name": "n"},
            "spec": {"replicas": 1, "typo": 2, "labels": {"x": "y"}, "items": [{"a": "1", "b": "2"}],
                "free": {"anything": {"nested": true}}},
            "extra": 1,
        });
        prune_custom_resource(&mut obj, &schema);
        assert_eq!(
            obj,
            json!({
                "apiVersion": "g/v1", "kind": "K", "metadata": {"name": "n"},
                "spec": {"replicas": 1, "labels": {"x": "y"}, "items": [{"a": "1"}],
                    "free": {"anything": {"nested": true}}},
            })
        );
    }
}
