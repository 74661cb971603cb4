//! Background deletion: dependents whose owners are all gone, orphaning, namespace contents.
//!
//! The real garbage collector and namespace controller run apart from the API server and act
//! shortly after the fact; this pass runs in a task spawned after a deletion, with the same rules.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::resources::ResourceType;
use crate::store::{Store, finalizers, meta_str, owner_uids, set_meta};
use crate::verbs::DeleteOptions;

/// (resource, namespace, name) of a stored object.
type ObjectRef = (Arc<ResourceType>, String, String);

impl Store {
    fn all_objects(&self) -> Vec<(Arc<ResourceType>, Value)> {
        self.registry
            .stored()
            .flat_map(|rt| self.iter(rt, None).map(move |obj| (rt.clone(), obj.clone())))
            .collect()
    }

    /// Runs passes until nothing changes.
    pub fn collect_garbage(&mut self) {
        self.garbage_pending = false;
        // Each pass changes at least one object or stops; the bound only guards against a bug.
        for _ in 0..10_000 {
            if !self.garbage_pass() {
                break;
            }
        }
    }

    fn garbage_pass(&mut self) -> bool {
        // One pass of the garbage collector over every owner reference: its checks share the object list.
        let objects = self.all_objects();
        let uids: HashSet<&str> = objects.iter().filter_map(|(_, o)| meta_str(o, "uid")).collect();
        let name_of = |rt: &Arc<ResourceType>, o: &Value| -> ObjectRef {
            (
                rt.clone(),
                meta_str(o, "namespace").unwrap_or_default().to_string(),
                meta_str(o, "name").unwrap_or_default().to_string(),
            )
        };
        let mut orphaning: Vec<(ObjectRef, String)> = Vec::new();
        let mut abandoned: Vec<ObjectRef> = Vec::new();
        let mut terminating: Vec<String> = Vec::new();
        for (rt, obj) in &objects {
            let deleting = meta_str(obj, "deletionTimestamp").is_some();
            if deleting && finalizers(obj).iter().any(|f| f == "orphan") {
                orphaning.push((
                    name_of(rt, obj),
                    meta_str(obj, "uid").unwrap_or_default().to_string(),
                ));
            }
            if deleting && rt.group.is_empty() && rt.kind == "Namespace" {
                terminating.push(meta_str(obj, "name").unwrap_or_default().to_string());
            }
            let owners = owner_uids(obj);
            if !deleting && !owners.is_empty() && owners.iter().all(|u| !uids.contains(u.as_str())) {
                abandoned.push(name_of(rt, obj));
            }
        }
        let mut changed = false;
        for ((rt, ns, name), uid) in orphaning {
            for (dep_rt, dep) in &objects {
                if !owner_uids(dep).contains(&uid) {
                    continue;
                }
                let mut freed = dep.clone();
                if let Some(Value::Array(refs)) = freed.pointer_mut("/metadata/ownerReferences") {
                    refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(uid.as_str()));
                }
                self.commit(dep_rt, freed, false);
            }
            if let Some(obj) = self.get(&rt, &ns, &name).cloned() {
                let rest: Vec<String> = finalizers(&obj).into_iter().filter(|f| f != "orphan").collect();
                let mut obj = obj;
                set_meta(&mut obj, "finalizers", json!(rest));
                self.commit(&rt, obj, false);
            }
            changed = true;
        }
        for (rt, ns, name) in abandoned {
            if self.get(&rt, &ns, &name).is_some() {
                // Errors cannot happen for an object just seen; nothing to report to anyone.
                let _ = self.delete(&rt, &ns, &name, &DeleteOptions::default(), false);
                changed = true;
            }
        }
        for ns in terminating {
            let contents: Vec<(Arc<ResourceType>, Value)> = objects
                .iter()
                .filter(|(rt, o)| rt.namespaced && meta_str(o, "namespace") == Some(ns.as_str()))
                .cloned()
                .collect();
            for (rt, obj) in &contents {
                if meta_str(obj, "deletionTimestamp").is_none() {
                    let name = meta_str(obj, "name").unwrap_or_default();
                    let _ = self.delete(rt, &ns, name, &DeleteOptions::default(), false);
                    changed = true;
                }
            }
            let empty = self
                .registry
                .all()
                .filter(|rt| rt.namespaced)
                .all(|rt| self.iter(rt, Some(&ns)).next().is_none());
            if empty && let Some(ns_rt) = self.registry.find("", "v1", "namespaces") {
                self.remove(&ns_rt, "", &ns);
                changed = true;
            }
        }
        changed
    }
}
