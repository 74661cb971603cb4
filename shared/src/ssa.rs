//! Server-side apply configurations, built as JSON holding only the fields an apply site owns:
//! the CAPI types here are partial, and a typed body would send defaults for fields it does
//! not know, taking them over. Each site applies as a manager of its own
//! (`<binary>/<scope>`), so one site's apply never drops what another applied.

use kube::Resource;
use kube::api::PatchParams;
use serde_json::{Value, json};

/// The apply configuration of `K` `name`: its identity, with `metadata` (an object) merged into
/// its metadata and `rest` (an object) beside it.
pub fn configuration<K: Resource<DynamicType = ()>>(name: &str, metadata: Value, rest: Value) -> Value {
    let mut metadata = match metadata {
        Value::Object(fields) => fields,
        _ => serde_json::Map::new(),
    };
    metadata.insert("name".into(), json!(name));
    let mut body = serde_json::Map::new();
    body.insert("apiVersion".into(), json!(K::api_version(&())));
    body.insert("kind".into(), json!(K::kind(&())));
    body.insert("metadata".into(), Value::Object(metadata));
    if let Value::Object(rest) = rest {
        body.extend(rest);
    }
    Value::Object(body)
}

/// Apply as `manager`; `force` takes over fields another manager holds, which only a site that
/// alone decides those fields may do.
pub fn params(manager: &str, force: bool) -> PatchParams {
    let mut params = PatchParams::apply(manager);
    params.force = force;
    params
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::EtcdadmCluster;

    #[test]
    fn a_configuration_holds_the_identity_and_the_given_fields_only() {
        let body = configuration::<EtcdadmCluster>(
            "e1",
            json!({"finalizers": ["f"]}),
            json!({"status": {"ready": true}}),
        );
        assert_eq!(
            body,
            json!({
                "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
                "metadata": {"name": "e1", "finalizers": ["f"]},
                "status": {"ready": true},
            })
        );
        let forced = params("etcdadm-controller/status", true);
        assert_eq!(
            (forced.field_manager.as_deref(), forced.force),
            (Some("etcdadm-controller/status"), true)
        );
    }
}
