//! OpenAPI v3 documents of the custom resources, built from their CRDs' schemas as the real server
//! builds them: one document per group and version, listed at `/openapi/v3`, each schema named
//! after its reversed group and marked with its group, version and kind, with `apiVersion`,
//! `kind` and `metadata` (ObjectMeta) added, and the path that reads one object (kubectl finds a
//! resource's kind there). That is what `kubectl explain` reads. The built-in kinds have no
//! documents here, and the paths list only that read, none of the other operations.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::{Map, Value, json};

use crate::store::Store;

/// One custom kind served at a group and version.
struct Served {
    kind: String,
    plural: String,
    namespaced: bool,
    /// Its `openAPIV3Schema`.
    schema: Value,
}

/// The custom kinds, by group and version.
type Schemas = BTreeMap<(String, String), Vec<Served>>;

fn custom_schemas(store: &Store) -> Schemas {
    let mut schemas = Schemas::new();
    let Some(crds) = store
        .registry
        .find("apiextensions.k8s.io", "v1", "customresourcedefinitions")
    else {
        return schemas;
    };
    for crd in store.iter(&crds, None) {
        let text = |pointer: &str| crd.pointer(pointer).and_then(Value::as_str).unwrap_or_default();
        let (group, kind, plural) = (
            text("/spec/group"),
            text("/spec/names/kind"),
            text("/spec/names/plural"),
        );
        let namespaced = text("/spec/scope") == "Namespaced";
        let versions = crd.pointer("/spec/versions").and_then(Value::as_array);
        for version in versions.into_iter().flatten() {
            let served = version.get("served").and_then(Value::as_bool) == Some(true);
            let name = version.get("name").and_then(Value::as_str).unwrap_or_default();
            if let (true, Some(schema)) = (served, version.pointer("/schema/openAPIV3Schema")) {
                schemas
                    .entry((group.to_string(), name.to_string()))
                    .or_default()
                    .push(Served {
                        kind: kind.to_string(),
                        plural: plural.to_string(),
                        namespaced,
                        schema: schema.clone(),
                    });
            }
        }
    }
    schemas
}

/// `etcdcluster.cluster.x-k8s.io` → `io.x-k8s.cluster.etcdcluster`.
fn reversed(group: &str) -> String {
    group.rsplit('.').collect::<Vec<_>>().join(".")
}

/// A content hash for the document's URL, so clients that cache by URL see a change.
fn hash(document: &Value) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    document.to_string().hash(&mut hasher);
    format!("{:016X}", hasher.finish())
}

/// `/openapi/v3`: where each group and version's document is.
pub fn index(store: &Store) -> Value {
    let mut paths = Map::new();
    for (group, version) in custom_schemas(store).keys() {
        let path = format!("apis/{group}/{version}");
        let url = document(store, group, version)
            .map(|doc| format!("/openapi/v3/{path}?hash={}", hash(&doc)))
            .unwrap_or_default();
        paths.insert(path, json!({"serverRelativeURL": url}));
    }
    json!({"paths": paths})
}

/// The standard properties every object has (`apiVersion`, `kind`, `metadata` referring to
/// ObjectMeta), and the schemas they refer to, as the Kubernetes API defines them.
fn standard_properties() -> (Map<String, Value>, Map<String, Value>) {
    let mut generator = schemars::generate::SchemaSettings::openapi3().into_generator();
    let reference = generator.subschema_for::<ConfigMap>();
    let mut definitions = generator.take_definitions(true);
    let name = reference
        .as_value()
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.rsplit('/').next())
        .unwrap_or_default()
        .to_string();
    let object = definitions.remove(&name).unwrap_or_default();
    let mut properties = Map::new();
    for key in ["apiVersion", "kind", "metadata"] {
        if let Some(property) = object.pointer(&format!("/properties/{key}")) {
            properties.insert(key.to_string(), property.clone());
        }
    }
    (properties, definitions)
}

/// The document of `group`/`version`, if custom resources are served there.
pub fn document(store: &Store, group: &str, version: &str) -> Option<Value> {
    let kinds = custom_schemas(store).remove(&(group.to_string(), version.to_string()))?;
    let (standard, mut components) = standard_properties();
    let mut paths = Map::new();
    for Served {
        kind,
        plural,
        namespaced,
        mut schema,
    } in kinds
    {
        let schema_name = format!("{}.{version}.{kind}", reversed(group));
        let gvk = json!({"group": group, "version": version, "kind": kind});
        let path = match namespaced {
            true => format!("/apis/{group}/{version}/namespaces/{{namespace}}/{plural}/{{name}}"),
            false => format!("/apis/{group}/{version}/{plural}/{{name}}"),
        };
        let reference = json!({"schema": {"$ref": format!("#/components/schemas/{schema_name}")}});
        paths.insert(
            path,
            json!({"get": {
                "description": format!("read the specified {kind}"),
                "responses": {"200": {"description": "OK", "content": {"application/json": reference}}},
                "x-kubernetes-action": "get",
                "x-kubernetes-group-version-kind": gvk,
            }}),
        );
        if let Some(object) = schema.as_object_mut() {
            let properties = object.entry("properties").or_insert_with(|| json!({}));
            if let Some(properties) = properties.as_object_mut() {
                for (key, property) in &standard {
                    properties.entry(key.clone()).or_insert_with(|| property.clone());
                }
            }
            object.insert(
                "x-kubernetes-group-version-kind".into(),
                json!([{"group": group, "kind": kind, "version": version}]),
            );
        }
        components.insert(schema_name, schema);
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "etcdadm-sim", "version": crate::discovery::version()["gitVersion"]},
        "paths": paths,
        "components": {"schemas": components},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_reversed_as_the_real_server_names_schemas() {
        assert_eq!(
            reversed("etcdcluster.cluster.x-k8s.io"),
            "io.x-k8s.cluster.etcdcluster"
        );
    }

    #[test]
    fn metadata_refers_to_object_meta_which_comes_along() {
        let (properties, components) = standard_properties();
        let metadata = &properties["metadata"];
        let reference = metadata
            .pointer("/allOf/0/$ref")
            .or_else(|| metadata.get("$ref"))
            .and_then(Value::as_str)
            .unwrap();
        assert_eq!(
            reference,
            "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
        );
        assert!(metadata["description"].as_str().is_some_and(|d| !d.is_empty()));
        assert!(components.contains_key("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"));
        assert_eq!(properties["apiVersion"]["type"], "string");
    }
}
