//! Patch formats: JSON merge (RFC 7386), JSON patch (RFC 6902), a simplified server-side apply and
//! strategic merge for the built-in kinds. All pure functions over `serde_json::Value`.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use crate::resources::FieldPath;

/// The patch types of the `Content-Type` header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchKind {
    /// `application/merge-patch+json`.
    Merge,
    /// `application/json-patch+json`.
    Json,
    /// `application/apply-patch+yaml` (server-side apply).
    Apply,
    /// `application/strategic-merge-patch+json`.
    Strategic,
}

impl PatchKind {
    /// The patch type named by a Content-Type header value, ignoring parameters.
    pub fn from_content_type(content_type: &str) -> Option<PatchKind> {
        match content_type.split(';').next().unwrap_or_default().trim() {
            "application/merge-patch+json" => Some(PatchKind::Merge),
            "application/json-patch+json" => Some(PatchKind::Json),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Some(PatchKind::Apply),
            "application/strategic-merge-patch+json" => Some(PatchKind::Strategic),
            _ => None,
        }
    }
}

/// RFC 7386: objects merge recursively, `null` deletes, everything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch_map) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(target_map) = target {
        for (key, value) in patch_map {
            if value.is_null() {
                target_map.remove(key);
            } else {
                merge_patch(target_map.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

/// RFC 6902, `test` included; the whole patch applies or none of it.
pub fn json_patch(target: &mut Value, body: &[u8]) -> Result<(), String> {
    let patch: json_patch::Patch =
        serde_json::from_slice(body).map_err(|e| format!("invalid JSON patch: {e}"))?;
    json_patch::patch(target, &patch).map_err(|e| e.to_string())
}

/// Strategic merge as the real server does it for the built-in kinds served here: merge patch,
/// except that `metadata.finalizers` merges as a set, `metadata.ownerReferences` merges by
/// `uid`, `$setElementOrder` is ignored and `$deleteFromPrimitiveList` removes values. Other
/// directives are refused.
pub fn strategic_merge(target: &mut Value, patch: &Value) -> Result<(), String> {
    strategic_merge_at(target, patch, &[])
}

fn strategic_merge_at(target: &mut Value, patch: &Value, path: &[&str]) -> Result<(), String> {
    let Value::Object(patch_map) = patch else {
        *target = patch.clone();
        return Ok(());
    };
    if let Some(directive) = patch_map.get("$patch") {
        return match directive.as_str() {
            Some("replace") => {
                let mut replacement = patch_map.clone();
                replacement.remove("$patch");
                *target = Value::Object(replacement);
                Ok(())
            }
            _ => Err(format!(
                "unsupported strategic merge directive $patch: {directive}"
            )),
        };
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(target_map) = target else {
        return Ok(());
    };
    for (key, value) in patch_map {
        if key.starts_with("$setElementOrder/") {
            continue;
        }
        if let Some(list) = key.strip_prefix("$deleteFromPrimitiveList/") {
            let remove: Vec<&Value> = value.as_array().map(|a| a.iter().collect()).unwrap_or_default();
            if let Some(Value::Array(items)) = target_map.get_mut(list) {
                items.retain(|item| !remove.contains(&item));
            }
            continue;
        }
        if key.starts_with('$') {
            return Err(format!("unsupported strategic merge directive {key}"));
        }
        if value.is_null() {
            target_map.remove(key);
            continue;
        }
        let slot = target_map.entry(key.clone()).or_insert(Value::Null);
        match (path, key.as_str(), value) {
            (["metadata"], "finalizers", Value::Array(new)) => {
                let mut merged = slot.as_array().cloned().unwrap_or_default();
                for item in new {
                    if !merged.contains(item) {
                        merged.push(item.clone());
                    }
                }
                *slot = Value::Array(merged);
            }
            (["metadata"], "ownerReferences", Value::Array(new)) => {
                let mut merged = slot.as_array().cloned().unwrap_or_default();
                for item in new {
                    let uid = item.get("uid");
                    let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
                    match merged.iter().position(|m| m.get("uid") == uid) {
                        Some(i) if delete => {
                            merged.remove(i);
                        }
                        Some(i) => merge_patch(&mut merged[i], item),
                        None if delete => {}
                        None => merged.push(item.clone()),
                    }
                }
                *slot = Value::Array(merged);
            }
            _ => {
                let mut child_path = path.to_vec();
                child_path.push(key);
                strategic_merge_at(slot, value, &child_path)?;
            }
        }
    }
    Ok(())
}

/// Which fields each apply field manager owns: leaf paths (objects are walked, lists and
/// scalars are atomic leaves).
pub type Ownership = BTreeMap<String, BTreeSet<FieldPath>>;

/// Metadata fields that identify the object or are set by the server; apply never owns them.
const UNOWNED_METADATA: &[&str] = &[
    "name",
    "namespace",
    "resourceVersion",
    "uid",
    "creationTimestamp",
    "generation",
    "managedFields",
    "selfLink",
];

/// The leaf paths of an applied configuration for which `in_scope` holds.
pub fn leaf_paths(applied: &Value, in_scope: &dyn Fn(&[String]) -> bool) -> BTreeSet<FieldPath> {
    fn walk(v: &Value, path: &mut FieldPath, out: &mut BTreeSet<FieldPath>) {
        match v {
            Value::Object(map) if !map.is_empty() => {
                for (key, child) in map {
                    let skip = (path.is_empty() && (key == "apiVersion" || key == "kind"))
                        || (path.len() == 1
                            && path[0] == "metadata"
                            && UNOWNED_METADATA.contains(&key.as_str()));
                    if !skip {
                        path.push(key.clone());
                        walk(child, path, out);
                        path.pop();
                    }
                }
            }
            _ if !path.is_empty() => {
                out.insert(path.clone());
            }
            _ => {}
        }
    }
    let mut out = BTreeSet::new();
    walk(applied, &mut Vec::new(), &mut out);
    out.retain(|p| in_scope(p));
    out
}

fn value_at<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(v, |cur, key| cur.get(key))
}

fn set_at(v: &mut Value, path: &[String], value: Value) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = v;
    for key in parents {
        if !cur.is_object() {
            *cur = Value::Object(Map::new());
        }
        let Value::Object(map) = cur else { return };
        cur = map.entry(key.clone()).or_insert(Value::Null);
    }
    if !cur.is_object() {
        *cur = Value::Object(Map::new());
    }
    if let Value::Object(map) = cur {
        map.insert(last.clone(), value);
    }
}

/// Remove the field at `path`, and every parent object that removal left empty (as the API
/// server does: an object whose every field was dropped by its manager goes with them).
fn remove_at(v: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let Some(Value::Object(map)) = parents.iter().try_fold(&mut *v, |cur, key| cur.get_mut(key)) else {
        return;
    };
    if map.remove(last).is_some() && map.is_empty() && !parents.is_empty() {
        remove_at(v, parents);
    }
}

fn overlaps(a: &[String], b: &[String]) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

fn dotted(path: &[String]) -> String {
    path.iter().map(|k| format!(".{k}")).collect()
}

/// The outcome of a server-side apply onto an existing object.
#[derive(Debug, PartialEq)]
pub struct Applied {
    /// The merged object.
    pub object: Value,
    /// Ownership after the apply.
    pub ownership: Ownership,
}

/// Server-side apply, simplified: the applied configuration is merged onto `current` (objects
/// merge, lists replace); fields this manager applied before and no longer applies are removed
/// unless another applier owns them; a field another applier owns with a different value is a
/// conflict unless `force`, which takes the field over. Only apply requests own fields.
pub fn server_side_apply(
    current: &Value,
    applied: &Value,
    ownership: &Ownership,
    manager: &str,
    force: bool,
    in_scope: &dyn Fn(&[String]) -> bool,
) -> Result<Applied, String> {
    let leaves = leaf_paths(applied, in_scope);
    let mut ownership = ownership.clone();
    let mut conflicts = Vec::new();
    for (other, owned) in ownership.iter_mut().filter(|(m, _)| m.as_str() != manager) {
        for leaf in &leaves {
            let contested: Vec<FieldPath> = owned.iter().filter(|q| overlaps(q, leaf)).cloned().collect();
            if contested.is_empty() {
                continue;
            }
            if value_at(current, leaf) == value_at(applied, leaf) {
                continue;
            }
            if force {
                for q in contested {
                    owned.remove(&q);
                }
            } else {
                conflicts.push(format!("conflict with \"{other}\": {}", dotted(leaf)));
            }
        }
    }
    if !conflicts.is_empty() {
        return Err(format!(
            "Apply failed with {} conflict{}: {}",
            conflicts.len(),
            if conflicts.len() == 1 { "" } else { "s" },
            conflicts.join("; ")
        ));
    }
    let mut object = current.clone();
    for leaf in &leaves {
        if let Some(value) = value_at(applied, leaf) {
            set_at(&mut object, leaf, value.clone());
        }
    }
    let previously: BTreeSet<FieldPath> = ownership.get(manager).cloned().unwrap_or_default();
    for dropped in previously.difference(&leaves) {
        let still_applied = leaves.iter().any(|l| overlaps(l, dropped));
        let owned_elsewhere = ownership
            .iter()
            .any(|(m, owned)| m != manager && owned.iter().any(|q| overlaps(q, dropped)));
        if !still_applied && !owned_elsewhere {
            remove_at(&mut object, dropped);
        }
    }
    ownership.insert(manager.to_string(), leaves);
    ownership.retain(|_, owned| !owned.is_empty());
    Ok(Applied { object, ownership })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_rfc7386_examples() {
        let mut t = json!({"a": "b", "c": {"d": "e", "f": "g"}});
        merge_patch(&mut t, &json!({"a": "z", "c": {"f": null}}));
        assert_eq!(t, json!({"a": "z", "c": {"d": "e"}}));
        let mut t = json!({"a": [1, 2]});
        merge_patch(&mut t, &json!({"a": [3]}));
        assert_eq!(t, json!({"a": [3]}));
    }

    #[test]
    fn json_patch_test_op_guards_the_patch() {
        let mut t = json!({"metadata": {"resourceVersion": "5"}, "spec": {"x": 1}});
        let ok = br#"[{"op":"test","path":"/metadata/resourceVersion","value":"5"},{"op":"replace","path":"/spec/x","value":2}]"#;
        json_patch(&mut t, ok).unwrap();
        assert_eq!(t["spec"]["x"], 2);
        let stale = br#"[{"op":"test","path":"/metadata/resourceVersion","value":"4"},{"op":"replace","path":"/spec/x","value":3}]"#;
        assert!(json_patch(&mut t, stale).is_err());
        assert_eq!(t["spec"]["x"], 2);
    }

    #[test]
    fn strategic_merge_metadata_lists() {
        let mut t = json!({"metadata": {"finalizers": ["a"], "ownerReferences": [{"uid": "1", "name": "x"}]}, "data": {"k": "v"}});
        strategic_merge(
            &mut t,
            &json!({"metadata": {"finalizers": ["b"], "$setElementOrder/finalizers": ["a", "b"],
                "ownerReferences": [{"uid": "1", "$patch": "delete"}, {"uid": "2", "name": "y"}]},
                "data": {"k": null, "l": "w"}}),
        )
        .unwrap();
        assert_eq!(t["metadata"]["finalizers"], json!(["a", "b"]));
        assert_eq!(
            t["metadata"]["ownerReferences"],
            json!([{"uid": "2", "name": "y"}])
        );
        assert_eq!(t["data"], json!({"l": "w"}));
        strategic_merge(&mut t, &json!({"$deleteFromPrimitiveList/x": [1], "metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}})).unwrap();
        assert_eq!(t["metadata"]["finalizers"], json!(["b"]));
        assert!(strategic_merge(&mut t, &json!({"$retainKeys": ["a"]})).is_err());
    }

    fn all(_: &[String]) -> bool {
        true
    }

    #[test]
    fn a_dropped_object_goes_with_its_last_field() {
        let current = json!({"status": {"ready": true, "recovery": {"phase": "Restoring", "snapshot": "s"}}});
        let mut ownership = Ownership::new();
        ownership.insert("m".into(), leaf_paths(&current, &all));
        let applied = json!({"status": {"ready": true}});
        let out = server_side_apply(&current, &applied, &ownership, "m", false, &all).unwrap();
        assert_eq!(out.object, json!({"status": {"ready": true}}));
    }

    #[test]
    fn apply_merges_removes_dropped_fields_and_detects_conflicts() {
        let current = json!({"metadata": {"name": "a"}, "spec": {"x": 1, "y": 2}});
        let first = server_side_apply(
            &current,
            &json!({"spec": {"x": 1, "z": 3}}),
            &Ownership::new(),
            "m1",
            false,
            &all,
        )
        .unwrap();
        assert_eq!(first.object["spec"], json!({"x": 1, "y": 2, "z": 3}));
        // m1 stops applying z: it is removed; y was never applied by anyone and stays.
        let second = server_side_apply(
            &first.object,
            &json!({"spec": {"x": 1}}),
            &first.ownership,
            "m1",
            false,
            &all,
        )
        .unwrap();
        assert_eq!(second.object["spec"], json!({"x": 1, "y": 2}));
        // m2 applying the same value is fine (shared ownership); a different value conflicts.
        assert!(
            server_side_apply(
                &second.object,
                &json!({"spec": {"x": 1}}),
                &second.ownership,
                "m2",
                false,
                &all
            )
            .is_ok()
        );
        let err = server_side_apply(
            &second.object,
            &json!({"spec": {"x": 9}}),
            &second.ownership,
            "m2",
            false,
            &all,
        )
        .unwrap_err();
        assert!(err.contains("conflict with \"m1\": .spec.x"), "{err}");
        let forced = server_side_apply(
            &second.object,
            &json!({"spec": {"x": 9}}),
            &second.ownership,
            "m2",
            true,
            &all,
        )
        .unwrap();
        assert_eq!(forced.object["spec"]["x"], 9);
        assert!(!forced.ownership.contains_key("m1"));
    }
}
