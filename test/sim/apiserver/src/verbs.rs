//! The verbs on stored objects with the real server's rules: preconditions, generation,
//! subresources, finalizers, validation. Everything here runs under the store's lock.
//!
//! Over 600 lines: every verb runs under the one store lock and shares the preconditions,
//! generation and finalizer checks with the others, in the real server's order; apart, each
//! file would take the lock's state and those checks as arguments.

use base64::Engine;
use k8s_openapi::api::{coordination, core};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::error::{ApiError, Subject};
use crate::meta;
use crate::patch::{self, PatchKind};
use crate::resources::{FieldPath, ResourceType};
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::{Store, ensure_object, finalizers, meta_str, remove_meta, set_meta};

/// Which part of an object a request addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sub {
    /// The object itself.
    Main,
    /// `/status`.
    Status,
    /// `/scale`.
    Scale,
}

/// Filters and paging of a list.
#[derive(Clone, Debug, Default)]
pub struct ListQuery {
    /// `labelSelector`.
    pub labels: LabelSelector,
    /// `fieldSelector`.
    pub fields: FieldSelector,
    /// `limit`; 0 or absent for everything.
    pub limit: Option<usize>,
    /// `continue`.
    pub continue_token: Option<String>,
}

/// One page of a list.
#[derive(Clone, Debug)]
pub struct ListPage {
    /// The objects.
    pub items: Vec<Value>,
    /// The resourceVersion the list was taken at.
    pub rv: u64,
    /// Token for the next page, if any.
    pub continue_token: Option<String>,
    /// Objects on later pages.
    pub remaining: Option<usize>,
}

/// `DeleteOptions` as query parameters or body.
#[derive(Clone, Debug, Default)]
pub struct DeleteOptions {
    /// `propagationPolicy`.
    pub propagation: Option<String>,
    /// `preconditions.uid`.
    pub uid: Option<String>,
    /// `preconditions.resourceVersion`.
    pub resource_version: Option<String>,
}

fn subject<'a>(rt: &'a ResourceType, name: &'a str) -> Subject<'a> {
    Subject {
        group: &rt.group,
        plural: &rt.plural,
        name,
    }
}

fn invalid(rt: &ResourceType, name: &str, causes: &str) -> ApiError {
    ApiError::invalid(&rt.kind, name, &rt.group, causes)
}

fn value_at<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(v, |cur, key| cur.get(key))
}

fn set_at(v: &mut Value, path: &FieldPath, value: Value) {
    let mut cur = v;
    for key in path {
        ensure_object(cur);
        cur = &mut cur[key.as_str()];
    }
    *cur = value;
}

/// What `metadata.generation` tracks: everything but metadata (and status, if a subresource).
fn generation_relevant(rt: &ResourceType, obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Value::Object(map) = &mut v {
        map.remove("metadata");
        map.remove("apiVersion");
        map.remove("kind");
        if rt.status {
            map.remove("status");
        }
    }
    v
}

/// Checks apiVersion and kind against the URL and fills in what the server owns from the URL.
pub fn normalize(
    rt: &ResourceType,
    mut obj: Value,
    ns: &str,
    url_name: Option<&str>,
) -> Result<Value, ApiError> {
    if !obj.is_object() {
        return Err(ApiError::bad_request("the request body must be a JSON object"));
    }
    if let Some(api_version) = obj.get("apiVersion").and_then(Value::as_str)
        && !rt.versions.iter().any(|v| rt.api_version(v) == api_version)
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API version ({})",
            rt.api_version(rt.storage_version())
        )));
    }
    if let Some(kind) = obj.get("kind").and_then(Value::as_str)
        && kind != rt.kind
    {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({kind}) does not match the expected kind ({})",
            rt.kind
        )));
    }
    if obj
        .get("metadata")
        .is_some_and(|m| !m.is_object() && !m.is_null())
    {
        return Err(ApiError::bad_request("metadata must be an object"));
    }
    obj["apiVersion"] = json!(rt.api_version(rt.storage_version()));
    obj["kind"] = json!(rt.kind);
    ensure_object(&mut obj["metadata"]);
    if rt.namespaced {
        match meta_str(&obj, "namespace") {
            Some(given) if !given.is_empty() && given != ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => set_meta(&mut obj, "namespace", json!(ns)),
        }
    } else {
        remove_meta(&mut obj, "namespace");
    }
    if let Some(url_name) = url_name {
        match meta_str(&obj, "name") {
            Some(given) if !given.is_empty() && given != url_name => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({given}) does not match the name on the URL ({url_name})"
                )));
            }
            _ => set_meta(&mut obj, "name", json!(url_name)),
        }
    }
    remove_meta(&mut obj, "managedFields");
    remove_meta(&mut obj, "selfLink");
    Ok(obj)
}

fn typed<T: DeserializeOwned>(obj: &Value) -> Result<(), String> {
    serde_json::from_value::<T>(obj.clone())
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Prunes custom resources to their schema, then answers 422 unless the object is well-formed: a valid name, well-typed metadata and, for the
/// built-in kinds, the shape of the Kubernetes type. Custom resources are not checked against
/// their schema.
fn validate(rt: &ResourceType, obj: &mut Value) -> Result<(), ApiError> {
    if let Some(schema) = &rt.schema {
        crate::pruning::prune_custom_resource(obj, schema);
    }
    let name = meta_str(obj, "name").unwrap_or_default();
    let name_error = if rt.plural == "namespaces" && rt.group.is_empty() {
        meta::dns1123_label_error(name)
    } else {
        meta::dns1123_subdomain_error(name)
    };
    if let Some(why) = name_error {
        return Err(invalid(
            rt,
            name,
            &format!("metadata.name: Invalid value: {name:?}: {why}"),
        ));
    }
    if let Some(metadata) = obj.get("metadata") {
        serde_json::from_value::<ObjectMeta>(metadata.clone())
            .map_err(|e| invalid(rt, name, &format!("metadata: Invalid value: {e}")))?;
    }
    // Events of both APIs are kept in the core form (see `event_views`).
    let shape = match (rt.group.as_str(), rt.kind.as_str()) {
        ("", "ConfigMap") => typed::<core::v1::ConfigMap>(obj),
        ("", "Secret") => typed::<core::v1::Secret>(obj),
        ("", "Namespace") => typed::<core::v1::Namespace>(obj),
        ("", "Event") | ("events.k8s.io", "Event") => typed::<core::v1::Event>(obj),
        ("coordination.k8s.io", "Lease") => typed::<coordination::v1::Lease>(obj),
        ("apiextensions.k8s.io", _) => typed::<CustomResourceDefinition>(obj),
        _ => Ok(()),
    };
    shape.map_err(|e| invalid(rt, name, &e))
}

/// Secrets: `stringData` is write-only and lands base64-encoded in `data`.
fn fold_string_data(rt: &ResourceType, obj: &mut Value) {
    if rt.group.is_empty()
        && rt.kind == "Secret"
        && let Some(Value::Object(string_data)) = obj.as_object_mut().and_then(|o| o.remove("stringData"))
    {
        ensure_object(&mut obj["data"]);
        for (key, value) in string_data {
            let text = value
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| value.to_string());
            obj["data"][key.as_str()] = json!(base64::engine::general_purpose::STANDARD.encode(text));
        }
    }
}

/// The status a CRD gets once registered: names accepted and established at once.
fn crd_status(crd: &Value, storage_version: &str) -> Value {
    let now = meta::now_rfc3339();
    json!({
        "acceptedNames": crd.pointer("/spec/names").cloned().unwrap_or(json!({})),
        "storedVersions": [storage_version],
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
             "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
             "message": "the initial names have been accepted", "lastTransitionTime": now},
        ],
    })
}

impl Store {
    fn existing(&self, rt: &ResourceType, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.get(rt, ns, name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(subject(rt, name)))
    }

    fn check_namespace_open(&self, ns: &str) -> Result<(), ApiError> {
        let namespace = self
            .registry
            .find("", "v1", "namespaces")
            .and_then(|rt| self.get(&rt, "", ns).cloned());
        match namespace {
            None => Err(ApiError::not_found(Subject {
                group: "",
                plural: "namespaces",
                name: ns,
            })),
            Some(obj) if meta_str(&obj, "deletionTimestamp").is_some() => Err(ApiError::forbidden(format!(
                "unable to create new content in namespace {ns} because it is being terminated"
            ))),
            Some(_) => Ok(()),
        }
    }

    /// GET of an object or its subresource.
    pub fn read(&self, rt: &ResourceType, ns: &str, name: &str, sub: Sub) -> Result<Value, ApiError> {
        let obj = self.existing(rt, ns, name)?;
        if sub == Sub::Scale {
            to_scale(rt, &obj)
        } else {
            Ok(rt.view(obj))
        }
    }

    /// LIST, from a snapshot; pages of a limited list are kept until taken or crowded out.
    pub fn list(
        &mut self,
        rt: &ResourceType,
        ns: Option<&str>,
        query: &ListQuery,
    ) -> Result<ListPage, ApiError> {
        let (mut items, rv) = match &query.continue_token {
            Some(token) => self.take_page(token).ok_or_else(|| {
                ApiError::gone(
                    "The provided continue parameter is too old to display a consistent list result. \
                     You can start a new list without the continue parameter.",
                )
            })?,
            None => (
                self.iter(rt, ns)
                    .map(|o| rt.viewed(o))
                    .filter(|o| query.labels.matches(o) && query.fields.matches(o))
                    .map(std::borrow::Cow::into_owned)
                    .collect(),
                self.rv,
            ),
        };
        let mut page = ListPage {
            items: Vec::new(),
            rv,
            continue_token: None,
            remaining: None,
        };
        if let Some(limit) = query.limit.filter(|l| *l > 0 && items.len() > *l) {
            let rest = items.split_off(limit);
            page.remaining = Some(rest.len());
            page.continue_token = Some(self.keep_page(rest, rv));
        }
        page.items = items;
        Ok(page)
    }

    /// POST: create, with generateName, uid, timestamps and the first generation.
    pub fn create(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        body: Value,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let mut obj = normalize(rt, body, ns, None)?;
        let name = match meta_str(&obj, "name").filter(|n| !n.is_empty()) {
            Some(name) => name.to_string(),
            None => {
                let prefix = meta_str(&obj, "generateName")
                    .filter(|p| !p.is_empty())
                    .ok_or_else(|| {
                        invalid(
                            rt,
                            "",
                            "metadata.name: Required value: name or generateName is required",
                        )
                    })?;
                let candidates: Vec<String> = (0..8)
                    .map(|_| format!("{prefix}{}", meta::generated_suffix()))
                    .collect();
                candidates
                    .iter()
                    .find(|c| self.get(rt, ns, c).is_none())
                    .cloned()
                    .unwrap_or_else(|| candidates.first().cloned().unwrap_or_default())
            }
        };
        set_meta(&mut obj, "name", json!(name));
        if rt.namespaced {
            self.check_namespace_open(ns)?;
        }
        if self.get(rt, ns, &name).is_some() {
            return Err(ApiError::already_exists(subject(rt, &name)));
        }
        set_meta(&mut obj, "uid", json!(meta::new_uid()));
        set_meta(&mut obj, "creationTimestamp", json!(meta::now_rfc3339()));
        remove_meta(&mut obj, "deletionTimestamp");
        remove_meta(&mut obj, "deletionGracePeriodSeconds");
        remove_meta(&mut obj, "resourceVersion");
        if rt.custom {
            set_meta(&mut obj, "generation", json!(1));
        } else {
            remove_meta(&mut obj, "generation");
        }
        if rt.custom
            && rt.status
            && let Value::Object(map) = &mut obj
        {
            map.remove("status");
        }
        if rt.group.is_empty() && rt.kind == "Namespace" {
            obj["status"] = json!({"phase": "Active"});
        }
        fold_string_data(rt, &mut obj);
        let mut obj = rt.to_stored(obj);
        if rt.group == "apiextensions.k8s.io" {
            let crd: CustomResourceDefinition =
                serde_json::from_value(obj.clone()).map_err(|e| invalid(rt, &name, &e.to_string()))?;
            let served = ResourceType::from_crd(&crd).map_err(|e| invalid(rt, &name, &e))?;
            obj["status"] = crd_status(&obj, served.storage_version());
            if !dry_run {
                self.registry.insert(served);
            }
        }
        validate(rt, &mut obj)?;
        Ok(rt.view(self.commit(rt, obj, dry_run)))
    }

    /// Registers a CRD as if created through the API, replacing one of the same name.
    pub fn register_crd(&mut self, crd: &CustomResourceDefinition) -> Result<(), ApiError> {
        let Some(crd_rt) = self
            .registry
            .find("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        else {
            return Err(ApiError::internal(
                "the CustomResourceDefinition resource is missing",
            ));
        };
        let body = serde_json::to_value(crd).map_err(|e| ApiError::internal(e.to_string()))?;
        let name = crd.metadata.name.clone().unwrap_or_default();
        if self.get(&crd_rt, "", &name).is_some() {
            self.remove(&crd_rt, "", &name);
        }
        self.create(&crd_rt, "", body, false).map(|_| ())
    }

    /// PUT of an object or a subresource.
    pub fn replace(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        body: Value,
        sub: Sub,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        if sub == Sub::Scale {
            let current = self.existing(rt, ns, name)?;
            return self.write_scale(rt, ns, name, &current, &body, dry_run);
        }
        let incoming = rt.to_stored(normalize(rt, body, ns, Some(name))?);
        let updated = self.update(rt, ns, name, incoming, sub, rt.custom, dry_run)?;
        Ok(rt.view(updated))
    }

    /// The common end of PUT, PATCH and apply: preconditions, what the subresource may change,
    /// finalizer rules, generation, validation, commit. Takes and returns the stored form.
    #[allow(clippy::too_many_arguments)]
    fn update(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        incoming: Value,
        sub: Sub,
        require_rv: bool,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        // The real server's update checks in its order; each depends on the ones before.
        let current = self.existing(rt, ns, name)?;
        match meta_str(&incoming, "resourceVersion").filter(|rv| !rv.is_empty()) {
            Some(rv) if Some(rv) != meta_str(&current, "resourceVersion") => {
                return Err(ApiError::conflict(
                    subject(rt, name),
                    "the object has been modified; please apply your changes to the latest version and try again",
                ));
            }
            None if require_rv => {
                return Err(invalid(
                    rt,
                    name,
                    "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update",
                ));
            }
            _ => {}
        }
        let mut new = if sub == Sub::Status {
            let mut new = current.clone();
            match incoming.get("status") {
                Some(status) => new["status"] = status.clone(),
                None => {
                    if let Value::Object(map) = &mut new {
                        map.remove("status");
                    }
                }
            }
            new
        } else {
            let mut new = incoming;
            for field in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "resourceVersion",
            ] {
                match current.get("metadata").and_then(|m| m.get(field)) {
                    Some(v) => set_meta(&mut new, field, v.clone()),
                    None => remove_meta(&mut new, field),
                }
            }
            if rt.status
                && let Value::Object(map) = &mut new
            {
                match current.get("status") {
                    Some(status) => map.insert("status".into(), status.clone()),
                    None => map.remove("status"),
                };
            }
            new
        };
        if meta_str(&current, "deletionTimestamp").is_some() {
            let before = finalizers(&current);
            if finalizers(&new).iter().any(|f| !before.contains(f)) {
                return Err(invalid(
                    rt,
                    name,
                    "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted",
                ));
            }
        }
        fold_string_data(rt, &mut new);
        if let Some(schema) = &rt.schema {
            crate::pruning::prune_custom_resource(&mut new, schema);
        }
        if rt.custom {
            let generation = current
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            let bumped = generation_relevant(rt, &current) != generation_relevant(rt, &new);
            set_meta(
                &mut new,
                "generation",
                json!(if bumped { generation + 1 } else { generation }),
            );
        }
        validate(rt, &mut new)?;
        Ok(self.commit(rt, new, dry_run))
    }

    /// PATCH of an object or a subresource.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        sub: Sub,
        kind: PatchKind,
        body: &[u8],
        field_manager: Option<&str>,
        force: bool,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        if kind == PatchKind::Strategic && (rt.custom || rt.group == "apiextensions.k8s.io") {
            return Err(ApiError::unsupported_media_type(format!(
                "the body of the request was in an unknown format - accepted media types include: \
                 application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml \
                 (strategic merge patch is not supported for {}.{})",
                rt.plural, rt.group
            )));
        }
        if kind == PatchKind::Apply {
            return self.apply(rt, ns, name, sub, body, field_manager, force, dry_run);
        }
        let current = self.existing(rt, ns, name)?;
        let mut doc = if sub == Sub::Scale {
            to_scale(rt, &current)?
        } else {
            rt.view(current.clone())
        };
        match kind {
            PatchKind::Json => patch::json_patch(&mut doc, body).map_err(|e| invalid(rt, name, &e))?,
            PatchKind::Merge | PatchKind::Strategic | PatchKind::Apply => {
                let patch: Value = serde_json::from_slice(body)
                    .map_err(|e| ApiError::bad_request(format!("the patch is not valid JSON: {e}")))?;
                if kind == PatchKind::Strategic {
                    patch::strategic_merge(&mut doc, &patch).map_err(|e| invalid(rt, name, &e))?;
                } else {
                    patch::merge_patch(&mut doc, &patch);
                }
            }
        }
        if sub == Sub::Scale {
            return self.write_scale(rt, ns, name, &current, &doc, dry_run);
        }
        let incoming = rt.to_stored(normalize(rt, doc, ns, Some(name))?);
        let updated = self.update(rt, ns, name, incoming, sub, false, dry_run)?;
        Ok(rt.view(updated))
    }

    /// Server-side apply (simplified; see [`patch::server_side_apply`]).
    #[allow(clippy::too_many_arguments)]
    fn apply(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        sub: Sub,
        body: &[u8],
        field_manager: Option<&str>,
        force: bool,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let manager = field_manager
            .filter(|m| !m.is_empty())
            .ok_or_else(|| ApiError::bad_request("fieldManager is required for apply requests"))?;
        if sub == Sub::Scale {
            return Err(ApiError::unsupported_media_type(
                "server-side apply to the scale subresource is not supported by this server; use a merge patch",
            ));
        }
        let applied: Value = match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(_) => {
                let text = std::str::from_utf8(body)
                    .map_err(|_| ApiError::bad_request("the apply configuration is not UTF-8"))?;
                serde_saphyr::from_str(text).map_err(|e| {
                    ApiError::bad_request(format!("the apply configuration is not valid YAML: {e}"))
                })?
            }
        };
        if applied.get("apiVersion").is_none() || applied.get("kind").is_none() {
            return Err(ApiError::bad_request(
                "apiVersion and kind must be set in an apply configuration",
            ));
        }
        let applied = normalize(rt, applied, ns, Some(name))?;
        let has_status = rt.status;
        let in_scope = move |p: &[String]| {
            let is_status = p.first().is_some_and(|k| k == "status");
            if sub == Sub::Status {
                is_status
            } else {
                !(has_status && is_status)
            }
        };
        let Some(current) = self.get(rt, ns, name).cloned() else {
            if sub == Sub::Status {
                return Err(ApiError::not_found(subject(rt, name)));
            }
            let leaves = patch::leaf_paths(&applied, &in_scope);
            let created = self.create(rt, ns, applied, dry_run)?;
            if let (false, Some(uid)) = (dry_run, meta_str(&created, "uid")) {
                self.ownership
                    .insert(uid.to_string(), [(manager.to_string(), leaves)].into());
            }
            return Ok(created);
        };
        let uid = meta_str(&current, "uid").unwrap_or_default().to_string();
        let owned = self.ownership.get(&uid).cloned().unwrap_or_default();
        let current = rt.view(current);
        let outcome = patch::server_side_apply(&current, &applied, &owned, manager, force, &in_scope)
            .map_err(|message| ApiError::apply_conflict(subject(rt, name), message))?;
        let mut merged = outcome.object;
        if let Some(rv) = meta_str(&applied, "resourceVersion").filter(|rv| !rv.is_empty()) {
            set_meta(&mut merged, "resourceVersion", json!(rv));
        }
        let updated = self.update(rt, ns, name, rt.to_stored(merged), sub, false, dry_run)?;
        if !dry_run {
            self.ownership.insert(uid, outcome.ownership);
        }
        Ok(rt.view(updated))
    }

    fn write_scale(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        current: &Value,
        scale: &Value,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let paths = rt.scale.as_ref().ok_or_else(|| ApiError::no_route("scale"))?;
        let replicas = scale
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .filter(|r| (0..=i64::from(i32::MAX)).contains(r))
            .ok_or_else(|| {
                ApiError::invalid(
                    "Scale",
                    name,
                    "autoscaling",
                    "spec.replicas: Invalid value: must be an integer >= 0",
                )
            })?;
        let mut new = current.clone();
        set_at(&mut new, &paths.spec_replicas, json!(replicas));
        if let Some(rv) = meta_str(scale, "resourceVersion").filter(|rv| !rv.is_empty()) {
            set_meta(&mut new, "resourceVersion", json!(rv));
        }
        let updated = self.update(rt, ns, name, new, Sub::Main, false, dry_run)?;
        to_scale(rt, &updated)
    }

    /// DELETE: removes at once, or marks for deletion while finalizers remain.
    pub fn delete(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        options: &DeleteOptions,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        // The real server's delete checks in its order (preconditions, finalizers, propagation).
        let current = self.existing(rt, ns, name)?;
        if let Some(uid) = &options.uid
            && Some(uid.as_str()) != meta_str(&current, "uid")
        {
            return Err(ApiError::conflict(
                subject(rt, name),
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(&current, "uid").unwrap_or_default()
                ),
            ));
        }
        if let Some(rv) = &options.resource_version
            && Some(rv.as_str()) != meta_str(&current, "resourceVersion")
        {
            return Err(ApiError::conflict(
                subject(rt, name),
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta_str(&current, "resourceVersion").unwrap_or_default()
                ),
            ));
        }
        let mut obj = current.clone();
        match options.propagation.as_deref() {
            None | Some("Background") => {}
            Some("Orphan") => {
                let mut list = finalizers(&obj);
                if !list.iter().any(|f| f == "orphan") {
                    list.push("orphan".into());
                }
                set_meta(&mut obj, "finalizers", json!(list));
            }
            Some(other) => {
                return Err(invalid(
                    rt,
                    name,
                    &format!(
                        "propagationPolicy: Unsupported value: {other:?}: supported values: \"Background\", \"Orphan\" \
                         (Foreground is not implemented by this server)"
                    ),
                ));
            }
        }
        let is_namespace = rt.group.is_empty() && rt.kind == "Namespace";
        if !is_namespace && finalizers(&obj).is_empty() {
            if dry_run {
                return Ok(rt.view(current));
            }
            return self
                .remove(rt, ns, name)
                .map(|gone| rt.view(gone))
                .ok_or_else(|| ApiError::not_found(subject(rt, name)));
        }
        if meta_str(&obj, "deletionTimestamp").is_none() {
            set_meta(&mut obj, "deletionTimestamp", json!(meta::now_rfc3339()));
            set_meta(&mut obj, "deletionGracePeriodSeconds", json!(0));
            if rt.custom {
                let generation = obj
                    .pointer("/metadata/generation")
                    .and_then(Value::as_i64)
                    .unwrap_or(1);
                set_meta(&mut obj, "generation", json!(generation + 1));
            }
            if is_namespace {
                obj["status"] = json!({"phase": "Terminating"});
            }
        }
        if !dry_run {
            self.garbage_pending = true;
        }
        Ok(rt.view(self.commit(rt, obj, dry_run)))
    }
}

/// The autoscaling/v1 Scale view of an object.
fn to_scale(rt: &ResourceType, obj: &Value) -> Result<Value, ApiError> {
    let paths = rt.scale.as_ref().ok_or_else(|| ApiError::no_route("scale"))?;
    let int_at = |path: &FieldPath| value_at(obj, path).and_then(Value::as_i64).unwrap_or(0);
    let mut status = json!({"replicas": int_at(&paths.status_replicas)});
    if let Some(selector) = paths
        .label_selector
        .as_ref()
        .and_then(|p| value_at(obj, p))
        .and_then(Value::as_str)
    {
        status["selector"] = json!(selector);
    }
    let mut metadata = json!({});
    for field in ["name", "namespace", "uid", "resourceVersion", "creationTimestamp"] {
        if let Some(v) = obj.get("metadata").and_then(|m| m.get(field)) {
            metadata[field] = v.clone();
        }
    }
    Ok(json!({
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": metadata,
        "spec": {"replicas": int_at(&paths.spec_replicas)},
        "status": status,
    }))
}
