//! Label and field selectors of list and watch requests.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::resources::ResourceType;

/// One requirement of a label selector.
#[derive(Clone, Debug, PartialEq)]
enum Requirement {
    Exists(String),
    NotExists(String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LabelSelector(Vec<Requirement>);

/// Splits on commas outside parentheses.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 316
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn value_set(list: &str) -> Result<BTreeSet<String>, String> {
    let inner = list
        .trim()
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| format!("expected a parenthesized value list, found {list:?}"))?;
    Ok(inner.split(',').map(|v| v.trim().to_string()).collect())
}

fn parse_requirement(raw: &str) -> Result<Requirement, String> {
    let req = raw.trim();
    if let Some(key) = req.strip_prefix('!') {
        let key = key.trim();
        return if valid_key(key) {
            Ok(Requirement::NotExists(key.into()))
        } else {
            Err(format!("invalid key {key:?}"))
        };
    }
    for (op, negate) in [("!=", true), ("==", false), ("=", false)] {
        if let Some((key, value)) = req.split_once(op) {
            let key = key.trim();
            if !valid_key(key) {
                return Err(format!("invalid key {key:?}"));
            }
            let values = BTreeSet::from([value.trim().to_string()]);
            return Ok(if negate {
                Requirement::NotIn(key.into(), values)
            } else {
                Requirement::In(key.into(), values)
            });
        }
    }
    let mut words = req.splitn(2, char::is_whitespace);
    let key = words.next().unwrap_or_default().trim();
    let rest = words.next().unwrap_or_default().trim();
    if !valid_key(key) {
        return Err(format!("invalid key {key:?}"));
    }
    if rest.is_empty() {
        return Ok(Requirement::Exists(key.into()));
    }
    if let Some(list) = rest.strip_prefix("notin") {
        return Ok(Requirement::NotIn(key.into(), value_set(list)?));
    }
    if let Some(list) = rest.strip_prefix("in") {
        return Ok(Requirement::In(key.into(), value_set(list)?));
    }
    Err(format!("unknown operator in {req:?}"))
}

impl LabelSelector {
    /// Parses `a=b,c!=d,e in (f,g),h notin (i),j,!k`.
    pub fn parse(s: &str) -> Result<LabelSelector, String> {
        if s.trim().is_empty() {
            return Ok(LabelSelector::default());
        }
        split_top_level(s)
            .into_iter()
            .map(parse_requirement)
            .collect::<Result<_, _>>()
            .map(LabelSelector)
    }

    /// Whether an object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        // Looked up key by key: a list matches every object of its kind, and a JSON pointer
        // would parse its path for each.
        let labels = object.get("metadata").and_then(|m| m.get("labels"));
        let label = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
        self.0.iter().all(|req| match req {
            Requirement::Exists(k) => label(k).is_some(),
            Requirement::NotExists(k) => label(k).is_none(),
            Requirement::In(k, values) => label(k).is_some_and(|v| values.contains(v)),
            Requirement::NotIn(k, values) => label(k).is_none_or(|v| !values.contains(v)),
        })
    }
}

/// A parsed field selector: each term a field's path in the served object, `!=` or not, and the
/// value.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FieldSelector(Vec<(Vec<String>, bool, String)>);

impl FieldSelector {
    /// Parses `metadata.name=x,metadata.namespace!=y`, with the fields `rt` indexes (see
    /// [`ResourceType::field_path`]); other fields are refused as the real server refuses them.
    pub fn parse(s: &str, rt: &ResourceType) -> Result<FieldSelector, String> {
        let mut terms = Vec::new();
        for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, negate, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, true, v)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, false, v)
            } else {
                return Err(format!("invalid field selector term {term:?}"));
            };
            let label = field.trim();
            let path = rt
                .field_path(label)
                .ok_or_else(|| format!("field label not supported: {label}"))?;
            terms.push((
                path.into_iter().map(str::to_string).collect(),
                negate,
                value.trim().to_string(),
            ));
        }
        Ok(FieldSelector(terms))
    }

    /// Whether the object satisfies every term.
    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|(path, negate, value)| {
            let actual = path
                .iter()
                .try_fold(object, |cur, key| cur.get(key))
                .and_then(Value::as_str)
                .unwrap_or("");
            (actual == value) != *negate
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "n1", "namespace": "ns1", "labels": labels}})
    }

    #[test]
    fn label_selector_operators() {
        let o = obj(json!({"app": "etcd", "tier": "db"}));
        let yes = [
            "",
            "app=etcd",
            "app==etcd",
            "app!=web",
            "app in (etcd, web)",
            "tier notin (web)",
            "app",
            "!zone",
            "app=etcd,tier in (db),!zone",
            "zone notin (a)",
            "zone!=a",
        ];
        for s in yes {
            assert!(LabelSelector::parse(s).unwrap().matches(&o), "{s}");
        }
        let no = [
            "app=web",
            "app!=etcd",
            "app in (web)",
            "app notin (etcd,web)",
            "zone",
            "!app",
            "app=etcd,zone",
        ];
        for s in no {
            assert!(!LabelSelector::parse(s).unwrap().matches(&o), "{s}");
        }
        assert!(LabelSelector::parse("app ~ x").is_err());
        assert!(LabelSelector::parse("a b c").is_err());
    }

    fn resource(group: &str, plural: &str) -> std::sync::Arc<ResourceType> {
        crate::resources::Registry::with_builtins()
            .find(group, "v1", plural)
            .unwrap()
    }

    #[test]
    fn field_selector_name_and_namespace() {
        let o = obj(json!({}));
        let cm = resource("", "configmaps");
        assert!(FieldSelector::parse("metadata.name=n1", &cm).unwrap().matches(&o));
        assert!(
            FieldSelector::parse("metadata.name==n1,metadata.namespace=ns1", &cm)
                .unwrap()
                .matches(&o)
        );
        assert!(
            !FieldSelector::parse("metadata.namespace!=ns1", &cm)
                .unwrap()
                .matches(&o)
        );
        assert!(FieldSelector::parse("spec.x=1", &cm).is_err());
        assert!(FieldSelector::parse("involvedObject.name=x", &cm).is_err());
    }

    #[test]
    fn field_selector_of_events_in_both_apis() {
        let core = json!({"metadata": {"name": "e1"}, "involvedObject": {"kind": "EtcdadmCluster", "name": "c1"},
                          "reason": "MemberJoined", "source": {"component": "etcdadm-controller"}});
        let events = resource("", "events");
        let selector = "involvedObject.kind=EtcdadmCluster,involvedObject.name=c1,reason=MemberJoined";
        assert!(FieldSelector::parse(selector, &events).unwrap().matches(&core));
        assert!(
            FieldSelector::parse("source=etcdadm-controller", &events)
                .unwrap()
                .matches(&core)
        );
        assert!(
            !FieldSelector::parse("involvedObject.name=c2", &events)
                .unwrap()
                .matches(&core)
        );
        let new_events = resource("events.k8s.io", "events");
        let viewed = new_events.view(core);
        assert!(
            FieldSelector::parse("regarding.name=c1,reason=MemberJoined", &new_events)
                .unwrap()
                .matches(&viewed)
        );
        assert!(FieldSelector::parse("involvedObject.name=c1", &new_events).is_err());
    }
}
