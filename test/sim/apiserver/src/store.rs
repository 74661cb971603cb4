//! The object store: objects by resource, the global resourceVersion counter and the event
//! history watches resume from. Verbs live in `verbs.rs`, garbage collection in `garbage.rs`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::patch::Ownership;
use crate::resources::{Registry, ResourceType};

/// What happened to an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// Created.
    Added,
    /// Changed.
    Modified,
    /// Removed.
    Deleted,
}

impl EventKind {
    /// The watch event type.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Added => "ADDED",
            EventKind::Modified => "MODIFIED",
            EventKind::Deleted => "DELETED",
        }
    }
}

/// One change, as kept in the history.
#[derive(Debug)]
pub struct Change {
    /// The resourceVersion of the change.
    pub rv: u64,
    /// Storage key of the resource.
    pub resource: String,
    /// What happened.
    pub kind: EventKind,
    /// The object after the change (before removal, for deletions).
    pub object: Arc<Value>,
    /// The object before the change, so selector watches see objects enter and leave.
    pub previous: Option<Arc<Value>>,
}

/// Continue tokens of paged lists and the items still to send.
const RETAINED_PAGES: usize = 64;

/// The whole mutable state; one mutex guards it, never held across an await.
pub struct Store {
    /// The last resourceVersion handed out.
    pub rv: u64,
    /// Served resources.
    pub registry: Registry,
    /// Objects by storage key, then (namespace, name); cluster-scoped objects have namespace "".
    pub objects: HashMap<String, BTreeMap<(String, String), Value>>,
    /// Recent changes, oldest first.
    pub history: VecDeque<Arc<Change>>,
    /// How many changes the history keeps.
    pub history_limit: usize,
    /// Changes up to and including this resourceVersion may be gone from the history.
    pub compacted_rv: u64,
    /// Field ownership of server-side apply, by object uid.
    pub ownership: HashMap<String, Ownership>,
    /// Remaining items of paged lists.
    pub pages: VecDeque<(String, Vec<Value>, u64)>,
    /// Set when something was removed, so owners' dependents must be looked at.
    pub garbage_pending: bool,
    /// Wakes watches; carries the latest resourceVersion.
    pub notify: tokio::sync::watch::Sender<u64>,
}

/// Replaces `v` by an empty object unless it is one, so indexing by key cannot panic.
pub fn ensure_object(v: &mut Value) {
    if !v.is_object() {
        *v = Value::Object(Map::new());
    }
}

/// Sets `metadata.<field>`.
pub fn set_meta(obj: &mut Value, field: &str, value: Value) {
    ensure_object(obj);
    ensure_object(&mut obj["metadata"]);
    obj["metadata"][field] = value;
}

/// Removes `metadata.<field>`.
pub fn remove_meta(obj: &mut Value, field: &str) {
    if let Some(Value::Object(meta)) = obj.get_mut("metadata") {
        meta.remove(field);
    }
}

/// `metadata.<field>` as a string.
pub fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

/// `metadata.finalizers`.
pub fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default()
}

/// The uids of `metadata.ownerReferences`.
pub fn owner_uids(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|r| r.get("uid")?.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether two stored objects differ in more than their resourceVersion.
fn same_but_version(a: &Value, b: &Value) -> bool {
    let mut a = a.clone();
    let mut b = b.clone();
    remove_meta(&mut a, "resourceVersion");
    remove_meta(&mut b, "resourceVersion");
    a == b
}

impl Store {
    /// An empty store with the built-in kinds and a history of `history_limit` changes.
    pub fn new(history_limit: usize) -> Store {
        Store {
            rv: 0,
            registry: Registry::with_builtins(),
            objects: HashMap::new(),
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            compacted_rv: 0,
            ownership: HashMap::new(),
            pages: VecDeque::new(),
            garbage_pending: false,
            notify: tokio::sync::watch::channel(0).0,
        }
    }

    /// The stored object, if any.
    pub fn get(&self, rt: &ResourceType, ns: &str, name: &str) -> Option<&Value> {
        self.objects
            .get(&rt.storage_key())?
            .get(&(ns.to_string(), name.to_string()))
    }

    /// Objects of a resource, in one namespace or all, sorted by namespace and name.
    pub fn iter<'a>(
        &'a self,
        rt: &ResourceType,
        ns: Option<&'a str>,
    ) -> impl Iterator<Item = &'a Value> + 'a {
        self.objects
            .get(&rt.storage_key())
            .into_iter()
            .flat_map(|m| m.iter())
            .filter(move |((obj_ns, _), _)| ns.is_none_or(|n| n == obj_ns))
            .map(|(_, v)| v)
    }

    fn record(&mut self, resource: String, kind: EventKind, object: Value, previous: Option<Value>) {
        self.history.push_back(Arc::new(Change {
            rv: self.rv,
            resource,
            kind,
            object: Arc::new(object),
            previous: previous.map(Arc::new),
        }));
        while self.history.len() > self.history_limit {
            if let Some(dropped) = self.history.pop_front() {
                self.compacted_rv = dropped.rv;
            }
        }
        self.notify.send_replace(self.rv);
    }

    /// Stores `new` under its namespace and name with a fresh resourceVersion, recording the
    /// change; an object whose deletion waited only on finalizers is removed instead. A write
    /// that changes nothing returns the stored object and bumps nothing, as the real server.
    pub fn commit(&mut self, rt: &ResourceType, mut new: Value, dry_run: bool) -> Value {
        let ns = meta_str(&new, "namespace").unwrap_or_default().to_string();
        let name = meta_str(&new, "name").unwrap_or_default().to_string();
        let key = rt.storage_key();
        let old = self
            .objects
            .get(&key)
            .and_then(|m| m.get(&(ns.clone(), name.clone())))
            .cloned();
        if let Some(old) = &old
            && same_but_version(old, &new)
        {
            return old.clone();
        }
        let finished = meta_str(&new, "deletionTimestamp").is_some() && finalizers(&new).is_empty();
        if dry_run {
            return new;
        }
        if finished && rt.plural != "namespaces" {
            if old.is_some() {
                return self.remove(rt, &ns, &name).unwrap_or(new);
            }
            return new;
        }
        self.rv += 1;
        set_meta(&mut new, "resourceVersion", json!(self.rv.to_string()));
        self.objects
            .entry(key.clone())
            .or_default()
            .insert((ns, name), new.clone());
        let kind = if old.is_some() {
            EventKind::Modified
        } else {
            EventKind::Added
        };
        self.record(key, kind, new.clone(), old);
        new
    }

    /// Removes an object now, recording a deletion; returns it as last seen.
    pub fn remove(&mut self, rt: &ResourceType, ns: &str, name: &str) -> Option<Value> {
        let key = rt.storage_key();
        let mut gone = self
            .objects
            .get_mut(&key)?
            .remove(&(ns.to_string(), name.to_string()))?;
        self.rv += 1;
        set_meta(&mut gone, "resourceVersion", json!(self.rv.to_string()));
        if let Some(uid) = meta_str(&gone, "uid") {
            self.ownership.remove(uid);
        }
        self.garbage_pending = true;
        self.record(key, EventKind::Deleted, gone.clone(), None);
        Some(gone)
    }

    /// Keeps the rest of a paged list under a new continue token.
    pub fn keep_page(&mut self, rest: Vec<Value>, rv: u64) -> String {
        let token = crate::meta::new_uid();
        self.pages.push_back((token.clone(), rest, rv));
        while self.pages.len() > RETAINED_PAGES {
            self.pages.pop_front();
        }
        token
    }

    /// Takes the rest of a paged list and its resourceVersion, if the token is still known.
    pub fn take_page(&mut self, token: &str) -> Option<(Vec<Value>, u64)> {
        let i = self.pages.iter().position(|(t, _, _)| t == token)?;
        self.pages.remove(i).map(|(_, rest, rv)| (rest, rv))
    }
}
