//! Objects a controller cannot read (watched through `DeserializeGuard`) are reported on the
//! object itself, a `Ready=False, InvalidObject` condition and a Warning Event, instead of
//! stopping the watch for every other object.

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ApiResource, DynamicObject, Patch};
use kube::core::error_boundary::InvalidObject;
use kube::runtime::events::{Event, EventType};
use kube::{Client, Resource};
use tracing::warn;

use super::events::Recorder;

/// Condition reason (and Event reason) for an object that cannot be read.
pub const INVALID_OBJECT: &str = "InvalidObject";

/// Write the condition (server-side apply of `status.conditions` on `/status`, as
/// `field_manager`, forced: the conditions are the controller's own) and publish the Event,
/// once: an object already reported with the same message gets neither again. Both the read and
/// the write are untyped, since the typed form is exactly what cannot be read.
pub async fn report_invalid_object<K>(
    client: &Client,
    recorder: &Recorder,
    field_manager: &str,
    invalid: &InvalidObject,
) -> Result<(), kube::Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
{
    let name = invalid.metadata.name.clone().unwrap_or_default();
    let namespace = invalid.metadata.namespace.clone().unwrap_or_default();
    let kind = K::kind(&()).into_owned();
    let message = format!("{kind} {namespace}/{name} cannot be read: {}", invalid.error);
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &ApiResource::erase::<K>(&()));
    let Some(current) = api.get_opt(&name).await? else {
        return Ok(());
    };
    if already_reported(&current, &message) {
        return Ok(());
    }
    warn!(%kind, %namespace, %name, error = %invalid.error, "object cannot be read");
    let condition = serde_json::json!({
        "type": "Ready", "status": "False", "severity": "Error", "reason": INVALID_OBJECT,
        "message": message, "lastTransitionTime": Time(k8s_openapi::jiff::Timestamp::now()),
    });
    let body = crate::ssa::configuration::<K>(
        &name,
        serde_json::json!({}),
        serde_json::json!({"status": {"conditions": [condition]}}),
    );
    api.patch_status(
        &name,
        &crate::ssa::params(field_manager, true),
        &Patch::Apply(&body),
    )
    .await?;
    let reference = ObjectReference {
        api_version: Some(K::api_version(&()).into_owned()),
        kind: Some(kind),
        name: Some(name),
        namespace: Some(namespace),
        uid: invalid.metadata.uid.clone(),
        ..Default::default()
    };
    let event = Event {
        type_: EventType::Warning,
        reason: INVALID_OBJECT.into(),
        note: Some(message),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &reference).await {
        warn!(error = %e, "publishing event failed");
    }
    Ok(())
}

/// `Ready=False, InvalidObject` with this message is already on the object.
fn already_reported(object: &DynamicObject, message: &str) -> bool {
    object.data["status"]["conditions"]
        .as_array()
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c["type"] == "Ready" && c["reason"] == INVALID_OBJECT && c["message"] == message)
        })
}
