//! Building blocks for admission handlers: read the object as a typed resource, deny with every
//! field error (path and message, as the API server's own validation reports them), or allow
//! with a JSON patch that fills absent fields with their defaults.

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation};
use kube::core::Status;
use kube::core::response::{StatusCause, StatusDetails};
use serde::de::DeserializeOwned;
use serde_json::Value;

pub use kube::core::DynamicObject;
pub use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};

use crate::validation::FieldError;

/// The request's object as `K`; `Ok(None)` when there is none (DELETE, CONNECT).
pub fn object<K: DeserializeOwned>(req: &AdmissionRequest<DynamicObject>) -> Result<Option<K>, String> {
    let Some(object) = &req.object else {
        return Ok(None);
    };
    let value = serde_json::to_value(object).map_err(|e| e.to_string())?;
    serde_json::from_value(value)
        .map(Some)
        .map_err(|e| format!("{} cannot be read: {e}", describe(req)))
}

/// `Kind namespace/name` of the request's object, for messages.
pub fn describe(req: &AdmissionRequest<DynamicObject>) -> String {
    let name = req
        .object
        .as_ref()
        .and_then(|o| {
            o.metadata
                .name
                .clone()
                .or_else(|| o.metadata.generate_name.clone())
        })
        .unwrap_or_else(|| req.name.clone());
    match &req.namespace {
        Some(ns) => format!("{} {ns}/{name}", req.kind.kind),
        None => format!("{} {name}", req.kind.kind),
    }
}

/// Allow when `errors` is empty; otherwise deny with 422 Invalid, every error in the message
/// (`<Kind> ns/name is invalid: path: message; path: message`) and one cause per error.
pub fn validated(req: &AdmissionRequest<DynamicObject>, errors: &[FieldError]) -> AdmissionResponse {
    let response = AdmissionResponse::from(req);
    if errors.is_empty() {
        return response;
    }
    let listed: Vec<String> = errors.iter().map(ToString::to_string).collect();
    let message = format!("{} is invalid: {}", describe(req), listed.join("; "));
    let mut status = Status::failure(&message, "Invalid").with_code(422);
    status.details = Some(StatusDetails {
        name: req.name.clone(),
        group: req.kind.group.clone(),
        kind: req.kind.kind.clone(),
        uid: String::new(),
        causes: errors
            .iter()
            .map(|e| StatusCause {
                reason: "FieldValueInvalid".into(),
                message: e.message.clone(),
                field: e.path.clone(),
            })
            .collect(),
        retry_after_seconds: 0,
    });
    let mut response = response.deny(&message);
    response.result = status;
    response
}

/// `response` with `warnings` shown to the client (kubectl prints them), if there are any.
pub fn with_warnings(mut response: AdmissionResponse, warnings: Vec<String>) -> AdmissionResponse {
    if !warnings.is_empty() {
        response.warnings = Some(warnings);
    }
    response
}

/// Deny a request that could not be understood at all.
pub fn rejected(req: &AdmissionRequest<DynamicObject>, message: impl Into<String>) -> AdmissionResponse {
    let message = message.into();
    let mut response = AdmissionResponse::from(req).deny(&message);
    response.result = Status::failure(&message, "BadRequest").with_code(400);
    response
}

/// Allow, with a JSON patch that sets each `(path, value)` whose field is absent or null;
/// missing parent objects are created. Fields present with a value are left alone.
pub fn with_defaults(
    req: &AdmissionRequest<DynamicObject>,
    defaults: &[(&[&str], Value)],
) -> AdmissionResponse {
    let response = AdmissionResponse::from(req);
    let Some(object) = &req.object else {
        return response;
    };
    let mut document = match serde_json::to_value(object) {
        Ok(document) => document,
        Err(e) => return rejected(req, format!("{} cannot be read: {e}", describe(req))),
    };
    // Each default is computed on the document with the earlier ones applied, so two defaults
    // under one missing parent do not overwrite each other.
    let mut operations: Vec<PatchOperation> = vec![];
    for (path, value) in defaults {
        let Some(operation) = default_operation(&document, path, value) else {
            continue;
        };
        if let Err(e) = json_patch::patch(&mut document, std::slice::from_ref(&operation)) {
            return rejected(req, format!("applying default {}: {e}", path.join(".")));
        }
        operations.push(operation);
    }
    if operations.is_empty() {
        return response;
    }
    match response.with_patch(Patch(operations)) {
        Ok(patched) => patched,
        Err(e) => rejected(req, format!("encoding the defaulting patch failed: {e}")),
    }
}

/// The `add` that sets `path` to `value` in `document` if it is absent or null, creating the
/// first missing parent with the rest nested inside; `None` if nothing is to be done or a parent
/// is not an object (schema validation will report that).
fn default_operation(document: &Value, path: &[&str], value: &Value) -> Option<PatchOperation> {
    let mut current = document;
    for (depth, key) in path.iter().enumerate() {
        let object = current.as_object()?;
        match object.get(*key) {
            Some(next) if !next.is_null() => current = next,
            _ => {
                let nested = path[depth + 1..]
                    .iter()
                    .rev()
                    .fold(value.clone(), |inner, key| serde_json::json!({ *key: inner }));
                return Some(PatchOperation::Add(AddOperation {
                    path: PointerBuf::from_tokens(path[..=depth].iter().copied()),
                    value: nested,
                }));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn op(document: Value, path: &[&str]) -> Option<Value> {
        default_operation(&document, path, &json!("x")).map(|op| serde_json::to_value(op).unwrap())
    }

    #[test]
    fn defaults_only_absent_or_null_fields() {
        assert_eq!(
            op(json!({"spec": {}}), &["spec", "format"]),
            Some(json!({"op": "add", "path": "/spec/format", "value": "x"}))
        );
        assert_eq!(
            op(json!({"spec": {"format": null}}), &["spec", "format"]),
            Some(json!({"op": "add", "path": "/spec/format", "value": "x"}))
        );
        assert_eq!(op(json!({"spec": {"format": "y"}}), &["spec", "format"]), None);
        assert_eq!(
            op(json!({}), &["spec", "template", "spec", "format"]),
            Some(json!({"op": "add", "path": "/spec", "value": {"template": {"spec": {"format": "x"}}}}))
        );
        assert_eq!(op(json!({"spec": "oops"}), &["spec", "format"]), None);
    }
}
