//! The JSONPath of CRD printer columns, as far as CRDs use it: fields (`.a.b`, `['a.b']` with
//! `\.` escapes), indexes (`[0]`, `[-1]`), every item (`[*]`) and equality filters
//! (`[?(@.type=="Ready")]`). Anything else is refused when the CRD is registered.

use serde_json::Value;

/// One step of a path.
#[derive(Clone, Debug, PartialEq)]
enum Step {
    Field(String),
    Index(i64),
    All,
    /// Items whose value at the path equals (or, negated, differs from) the literal.
    Filter {
        path: Vec<String>,
        negate: bool,
        literal: Value,
    },
}

/// A parsed path.
#[derive(Clone, Debug, PartialEq)]
pub struct JsonPath(Vec<Step>);

fn unsupported(text: &str, why: &str) -> String {
    format!("JSONPath {text:?} is not supported by this server: {why}")
}

/// A quoted name inside brackets, up to its closing quote; returns it unescaped and the rest.
fn quoted<'a>(rest: &'a str, text: &str) -> Result<(String, &'a str), String> {
    let mut chars = rest.char_indices();
    let quote = chars.next().map(|(_, c)| c).unwrap_or('\'');
    let mut name = String::new();
    let mut escaped = false;
    for (i, c) in chars {
        match (escaped, c) {
            (true, c) => {
                name.push(c);
                escaped = false;
            }
            (false, '\\') => escaped = true,
            (false, c) if c == quote => return Ok((name, &rest[i + c.len_utf8()..])),
            (false, c) => name.push(c),
        }
    }
    Err(unsupported(text, "unterminated quoted name"))
}

/// `@.a.b=="v"` (or `!=`, single quotes, numbers, booleans) of a filter.
fn filter(expression: &str, text: &str) -> Result<Step, String> {
    let (left, negate, right) = if let Some((l, r)) = expression.split_once("!=") {
        (l, true, r)
    } else if let Some((l, r)) = expression.split_once("==") {
        (l, false, r)
    } else {
        return Err(unsupported(text, "a filter must compare with == or !="));
    };
    let path = left
        .trim()
        .strip_prefix("@.")
        .ok_or_else(|| unsupported(text, "a filter must start with @."))?;
    let path: Vec<String> = path.split('.').map(str::to_string).collect();
    if path.iter().any(|k| k.is_empty() || k.contains(['[', '(', ' '])) {
        return Err(unsupported(text, "a filter compares a plain dotted field"));
    }
    let right = right.trim();
    let literal = if let Some(inner) = right
        .strip_prefix('"')
        .and_then(|r| r.strip_suffix('"'))
        .or_else(|| right.strip_prefix('\'').and_then(|r| r.strip_suffix('\'')))
    {
        Value::String(inner.to_string())
    } else {
        serde_json::from_str(right).map_err(|_| unsupported(text, "a filter compares with a literal"))?
    };
    Ok(Step::Filter {
        path,
        negate,
        literal,
    })
}

impl JsonPath {
    /// Parses `.status.ready`, `{.status.ready}` or `$.status.ready` and the forms above.
    pub fn parse(text: &str) -> Result<JsonPath, String> {
        let mut rest = text.trim();
        if let Some(inner) = rest.strip_prefix('{').and_then(|r| r.strip_suffix('}')) {
            rest = inner.trim();
        }
        rest = rest.strip_prefix('$').unwrap_or(rest);
        let mut steps = Vec::new();
        while !rest.is_empty() {
            if rest.starts_with("..") {
                return Err(unsupported(text, "recursive descent (..)"));
            }
            if let Some(after) = rest.strip_prefix('.') {
                let end = after.find(['.', '[']).unwrap_or(after.len());
                let name = &after[..end];
                if name.is_empty() {
                    return Err(unsupported(text, "an empty field name"));
                }
                steps.push(if name == "*" {
                    Step::All
                } else {
                    Step::Field(name.to_string())
                });
                rest = &after[end..];
            } else if let Some(after) = rest.strip_prefix('[') {
                let (step, after) = if after.starts_with(['\'', '"']) {
                    let (name, after) = quoted(after, text)?;
                    (Step::Field(name), after)
                } else if let Some(expression) = after.strip_prefix("?(") {
                    let end = expression
                        .find(")]")
                        .ok_or_else(|| unsupported(text, "unterminated filter"))?;
                    (filter(&expression[..end], text)?, &expression[end + 1..])
                } else {
                    let end = after
                        .find(']')
                        .ok_or_else(|| unsupported(text, "unterminated brackets"))?;
                    let inside = after[..end].trim();
                    let step = if inside == "*" {
                        Step::All
                    } else {
                        Step::Index(inside.parse().map_err(|_| {
                            unsupported(text, "only names, indexes, * and filters in brackets")
                        })?)
                    };
                    (step, &after[end..])
                };
                rest = after
                    .strip_prefix(']')
                    .ok_or_else(|| unsupported(text, "one name, index or filter per brackets"))?;
                steps.push(step);
            } else {
                return Err(unsupported(text, "a path starts with . or ["));
            }
        }
        Ok(JsonPath(steps))
    }

    /// The first value the path finds in `object`, as the real server's printer columns take.
    pub fn first<'a>(&self, object: &'a Value) -> Option<&'a Value> {
        let mut found = vec![object];
        for step in &self.0 {
            found = found.into_iter().flat_map(|value| apply(step, value)).collect();
        }
        found.into_iter().next()
    }
}

fn apply<'a>(step: &Step, value: &'a Value) -> Vec<&'a Value> {
    match (step, value) {
        (Step::Field(name), Value::Object(map)) => map.get(name).into_iter().collect(),
        (Step::Index(i), Value::Array(items)) => {
            let len = i64::try_from(items.len()).unwrap_or(i64::MAX);
            let at = if *i < 0 { len + i } else { *i };
            usize::try_from(at)
                .ok()
                .and_then(|at| items.get(at))
                .into_iter()
                .collect()
        }
        (Step::All, Value::Array(items)) => items.iter().collect(),
        (Step::All, Value::Object(map)) => map.values().collect(),
        (
            Step::Filter {
                path,
                negate,
                literal,
            },
            Value::Array(items),
        ) => items
            .iter()
            .filter(|item| {
                let field = path.iter().try_fold(*item, |cur, key| cur.get(key));
                field.is_some_and(|f| same(f, literal) != *negate)
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// Equality of a field and a literal; numbers compare by value (`1` equals `1.0`).
fn same(field: &Value, literal: &Value) -> bool {
    match (field.as_f64(), literal.as_f64()) {
        (Some(a), Some(b)) => a == b,
        _ => field == literal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn first(path: &str, object: &Value) -> Option<Value> {
        JsonPath::parse(path).unwrap().first(object).cloned()
    }

    #[test]
    fn finds_what_printer_columns_ask_for() {
        let o = json!({
            "metadata": {"labels": {"cluster.x-k8s.io/cluster-name": "demo"}},
            "spec": {"replicas": 3},
            "status": {"ready": true, "conditions": [
                {"type": "Available", "status": "False"},
                {"type": "Ready", "status": "True", "reason": "Fine"},
            ], "items": [1, 2, 3]},
        });
        assert_eq!(first(".spec.replicas", &o), Some(json!(3)));
        assert_eq!(first("{.status.ready}", &o), Some(json!(true)));
        assert_eq!(
            first(r".metadata.labels['cluster\.x-k8s\.io/cluster-name']", &o),
            Some(json!("demo"))
        );
        assert_eq!(
            first(r#".status.conditions[?(@.type=="Ready")].reason"#, &o),
            Some(json!("Fine"))
        );
        assert_eq!(
            first(".status.conditions[?(@.type != 'Ready')].status", &o),
            Some(json!("False"))
        );
        assert_eq!(first(".status.items[-1]", &o), Some(json!(3)));
        assert_eq!(first(".status.items[*]", &o), Some(json!(1)));
        assert_eq!(first(".status.missing", &o), None);
        assert_eq!(first(".spec.replicas.deeper", &o), None);
    }

    #[test]
    fn refuses_what_it_cannot_evaluate() {
        for path in [
            "..spec",
            ".spec[0:2]",
            ".items['a','b']",
            "spec",
            ".a[?(@.x > 1)]",
            ".a[",
        ] {
            assert!(JsonPath::parse(path).is_err(), "{path}");
        }
    }
}
