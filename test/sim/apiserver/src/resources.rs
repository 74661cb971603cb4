//! The kinds this server serves: built-in Kubernetes kinds and those registered from CRDs.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

use crate::columns::PrinterColumn;
use crate::event_views;

/// A JSON path such as `.spec.replicas`, split into its keys.
pub type FieldPath = Vec<String>;

/// Where the scale subresource reads and writes replicas.
#[derive(Clone, Debug, PartialEq)]
pub struct ScalePaths {
    /// `specReplicasPath`.
    pub spec_replicas: FieldPath,
    /// `statusReplicasPath`.
    pub status_replicas: FieldPath,
    /// `labelSelectorPath`.
    pub label_selector: Option<FieldPath>,
}

/// How a resource that is a view of another one's objects converts them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Conversion {
    /// Kept as served.
    #[default]
    None,
    /// `events.k8s.io/v1` Events, kept with the core `v1` Events in their form.
    EventsV1,
}

/// One resource (a plural in a group), served at one or more versions from one storage.
#[derive(Clone, Debug, PartialEq)]
pub struct ResourceType {
    /// API group; "" for core.
    pub group: String,
    /// Served versions; the first is the storage version. Without a conversion webhook the real
    /// server only rewrites `apiVersion` between versions, and so does this one.
    pub versions: Vec<String>,
    /// Kind.
    pub kind: String,
    /// Plural (the URL segment).
    pub plural: String,
    /// Singular.
    pub singular: String,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// Short names for kubectl.
    pub short_names: Vec<String>,
    /// Categories for kubectl (`kubectl get cluster-api`).
    pub categories: Vec<String>,
    /// Has a status subresource: main writes ignore `.status`, `/status` writes only `.status`.
    pub status: bool,
    /// Has a scale subresource.
    pub scale: Option<ScalePaths>,
    /// A custom resource: `metadata.generation` is kept and updates need a resourceVersion.
    pub custom: bool,
    /// Verbs served on the collection and items.
    pub verbs: Vec<&'static str>,
    /// The storage version's `openAPIV3Schema`, for pruning custom resources.
    pub schema: Option<serde_json::Value>,
    /// A custom resource's `additionalPrinterColumns`, by version.
    pub columns: BTreeMap<String, Vec<PrinterColumn>>,
    /// Whether its objects are another resource's, converted.
    pub conversion: Conversion,
}

/// All verbs of an ordinary resource; `deletecollection` is not implemented.
pub const ALL_VERBS: &[&str] = &["create", "delete", "get", "list", "patch", "update", "watch"];

impl ResourceType {
    /// `group/version`, or `version` for core.
    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{version}", self.group)
        }
    }

    /// The storage version.
    pub fn storage_version(&self) -> &str {
        self.versions.first().map_or("v1", String::as_str)
    }

    /// The key objects of this resource are stored under: its own, or that of the resource
    /// whose objects it serves converted.
    pub fn storage_key(&self) -> String {
        match self.conversion {
            Conversion::None => self.registry_key(),
            Conversion::EventsV1 => "events.".to_string(),
        }
    }

    /// `<plural>.<group>`: the resource's own name.
    pub fn registry_key(&self) -> String {
        format!("{}.{}", self.plural, self.group)
    }

    /// A stored object as this resource serves it.
    pub fn view(&self, stored: Value) -> Value {
        match self.conversion {
            Conversion::None => stored,
            Conversion::EventsV1 => event_views::to_events_v1(stored),
        }
    }

    /// [`ResourceType::view`] without a copy when there is nothing to convert.
    pub fn viewed<'a>(&self, stored: &'a Value) -> Cow<'a, Value> {
        match self.conversion {
            Conversion::None => Cow::Borrowed(stored),
            Conversion::EventsV1 => Cow::Owned(self.view(stored.clone())),
        }
    }

    /// An object as served, in the form it is stored in.
    pub fn to_stored(&self, served: Value) -> Value {
        match self.conversion {
            Conversion::None => served,
            Conversion::EventsV1 => event_views::to_core(served),
        }
    }

    /// The path of a field selector's field in a served object, if the resource indexes it (as
    /// the real server does: `metadata.name` and `metadata.namespace` everywhere, plus a few per
    /// kind).
    pub fn field_path<'a>(&self, label: &'a str) -> Option<Vec<&'a str>> {
        let path = match (self.group.as_str(), self.kind.as_str(), label) {
            (_, _, "metadata.name" | "metadata.namespace") => label,
            ("", "Event", "involvedObject.kind" | "involvedObject.namespace" | "involvedObject.name")
            | ("", "Event", "involvedObject.uid" | "involvedObject.apiVersion")
            | ("", "Event", "involvedObject.resourceVersion" | "involvedObject.fieldPath")
            | ("", "Event", "reason" | "reportingComponent" | "type") => label,
            ("", "Event", "source") => "source.component",
            ("events.k8s.io", "Event", "regarding.kind" | "regarding.namespace" | "regarding.name")
            | ("events.k8s.io", "Event", "regarding.uid" | "regarding.apiVersion")
            | ("events.k8s.io", "Event", "regarding.resourceVersion" | "regarding.fieldPath")
            | ("events.k8s.io", "Event", "reason" | "reportingController" | "type") => label,
            ("", "Secret", "type") | ("", "Namespace", "status.phase") => label,
            _ => return None,
        };
        Some(path.split('.').collect())
    }

    /// Whether `verb` is served.
    pub fn allows(&self, verb: &str) -> bool {
        self.verbs.contains(&verb)
    }

    fn builtin(group: &str, kind: &str, plural: &str, namespaced: bool, short: &[&str]) -> ResourceType {
        ResourceType {
            group: group.into(),
            versions: vec!["v1".into()],
            kind: kind.into(),
            plural: plural.into(),
            singular: kind.to_lowercase(),
            namespaced,
            short_names: short.iter().map(|s| s.to_string()).collect(),
            categories: Vec::new(),
            status: false,
            scale: None,
            custom: false,
            verbs: ALL_VERBS.to_vec(),
            schema: None,
            columns: BTreeMap::new(),
            conversion: Conversion::None,
        }
    }

    /// The resource a CRD defines, or why it cannot be served.
    pub fn from_crd(crd: &CustomResourceDefinition) -> Result<ResourceType, String> {
        let spec = &crd.spec;
        let mut versions: Vec<String> = Vec::new();
        // Subresources may differ per version; the real server allows that, this one takes them
        // from the storage version (all CRDs here declare the same on every version).
        let mut storage = None;
        for v in spec.versions.iter().filter(|v| v.served) {
            if v.storage {
                versions.insert(0, v.name.clone());
                storage = Some(v);
            } else {
                versions.push(v.name.clone());
            }
        }
        let storage = storage.ok_or("no served version is the storage version")?;
        let subresources = storage.subresources.as_ref();
        let scale = match subresources.and_then(|s| s.scale.as_ref()) {
            Some(s) => Some(ScalePaths {
                spec_replicas: parse_path(&s.spec_replicas_path)?,
                status_replicas: parse_path(&s.status_replicas_path)?,
                label_selector: s.label_selector_path.as_deref().map(parse_path).transpose()?,
            }),
            None => None,
        };
        let names = &spec.names;
        let namespaced = match spec.scope.as_str() {
            "Namespaced" => true,
            "Cluster" => false,
            other => return Err(format!("scope {other:?} is neither Namespaced nor Cluster")),
        };
        let mut columns = BTreeMap::new();
        for v in spec.versions.iter().filter(|v| v.served) {
            let defined = v.additional_printer_columns.as_deref().unwrap_or_default();
            let parsed = defined
                .iter()
                .map(PrinterColumn::from_crd)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("spec.versions[{}].additionalPrinterColumns: {e}", v.name))?;
            columns.insert(v.name.clone(), parsed);
        }
        let expected_name = format!("{}.{}", names.plural, spec.group);
        if crd.metadata.name.as_deref() != Some(expected_name.as_str()) {
            return Err(format!("metadata.name must be {expected_name}"));
        }
        Ok(ResourceType {
            group: spec.group.clone(),
            versions,
            kind: names.kind.clone(),
            plural: names.plural.clone(),
            singular: names
                .singular
                .clone()
                .unwrap_or_else(|| names.kind.to_lowercase()),
            namespaced,
            short_names: names.short_names.clone().unwrap_or_default(),
            categories: names.categories.clone().unwrap_or_default(),
            status: subresources.is_some_and(|s| s.status.is_some()),
            scale,
            custom: true,
            verbs: ALL_VERBS.to_vec(),
            schema: storage
                .schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .and_then(|s| serde_json::to_value(s).ok()),
            columns,
            conversion: Conversion::None,
        })
    }
}

/// `.spec.replicas` → `["spec", "replicas"]`; only plain dotted paths, as CRDs use.
pub fn parse_path(path: &str) -> Result<FieldPath, String> {
    let rest = path
        .strip_prefix('.')
        .ok_or_else(|| format!("path {path:?} must start with '.'"))?;
    let keys: FieldPath = rest.split('.').map(str::to_string).collect();
    if keys.iter().any(|k| k.is_empty() || k.contains('[')) {
        return Err(format!("path {path:?} is not a plain dotted path"));
    }
    Ok(keys)
}

/// The built-in kinds.
pub fn builtin_resources() -> Vec<ResourceType> {
    let mut namespace = ResourceType::builtin("", "Namespace", "namespaces", false, &["ns"]);
    namespace.status = true;
    let event = ResourceType::builtin("", "Event", "events", true, &["ev"]);
    let mut new_event = ResourceType::builtin("events.k8s.io", "Event", "events", true, &["ev"]);
    new_event.conversion = Conversion::EventsV1;
    let mut crd = ResourceType::builtin(
        "apiextensions.k8s.io",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        false,
        &["crd", "crds"],
    );
    crd.verbs = vec!["create", "get", "list", "watch"];
    vec![
        namespace,
        ResourceType::builtin("", "Secret", "secrets", true, &[]),
        ResourceType::builtin("", "ConfigMap", "configmaps", true, &["cm"]),
        event,
        new_event,
        ResourceType::builtin("coordination.k8s.io", "Lease", "leases", true, &[]),
        crd,
    ]
}

/// The served resources, found by group, version and plural.
#[derive(Debug, Default)]
pub struct Registry {
    by_key: BTreeMap<String, Arc<ResourceType>>,
}

impl Registry {
    /// A registry with the built-in kinds.
    pub fn with_builtins() -> Registry {
        let mut registry = Registry::default();
        for rt in builtin_resources() {
            registry.by_key.insert(rt.registry_key(), Arc::new(rt));
        }
        registry
    }

    /// Adds or replaces a resource.
    pub fn insert(&mut self, rt: ResourceType) {
        self.by_key.insert(rt.registry_key(), Arc::new(rt));
    }

    /// The resource served at `group/version` under `plural`.
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.by_key
            .get(&format!("{plural}.{group}"))
            .filter(|rt| rt.versions.iter().any(|v| v == version))
            .cloned()
    }

    /// Every resource, sorted by name.
    pub fn all(&self) -> impl Iterator<Item = &Arc<ResourceType>> {
        self.by_key.values()
    }

    /// Every resource that keeps its own objects (not a converted view of another's).
    pub fn stored(&self) -> impl Iterator<Item = &Arc<ResourceType>> {
        self.all().filter(|rt| rt.conversion == Conversion::None)
    }

    /// Groups with their versions (storage version first), core ("") included, sorted by group.
    pub fn groups(&self) -> BTreeMap<String, Vec<String>> {
        let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for rt in self.by_key.values() {
            let versions = groups.entry(rt.group.clone()).or_default();
            for v in &rt.versions {
                if !versions.contains(v) {
                    versions.push(v.clone());
                }
            }
        }
        groups
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_paths() {
        assert_eq!(parse_path(".spec.replicas").unwrap(), vec!["spec", "replicas"]);
        assert!(parse_path("spec").is_err());
        assert!(parse_path(".spec.items[0]").is_err());
    }

    #[test]
    fn finds_builtins_by_version() {
        let r = Registry::with_builtins();
        assert!(r.find("", "v1", "configmaps").is_some());
        assert!(r.find("", "v2", "configmaps").is_none());
        assert!(r.find("coordination.k8s.io", "v1", "leases").is_some());
    }
}
