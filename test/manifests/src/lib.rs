//! Helpers for the tests of what ships besides the binaries (`config/`, `templates/`,
//! `metadata.yaml`, `test/capd/`, the scripts). Only the standard library: the YAML itself is
//! parsed in the tests, with serde-saphyr.
//!
//! The clusterctl part mirrors how clusterctl processes templates and components (its envsubst
//! library): `${NAME}` and `${NAME:=default}`-style uses are variables, `$$` turns into `$`, and
//! a backslash before `/` or another backslash is dropped. Manifests here must use the first two
//! forms only and contain none of the rewritten sequences, so that what clusterctl applies is
//! exactly what the repository holds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The repository root (this crate lives in `test/manifests`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// A file of the repository, by path relative to the root.
pub fn read_repo_file(relative: &str) -> Result<String, String> {
    let path = repo_root().join(relative);
    std::fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// An executable: `$<ENV_VAR>` if set, else `name` on PATH, else `/usr/bin/<name>`. The error
/// says how to install it.
pub fn find_tool(name: &str, env_var: &str, install_hint: &str) -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(env_var) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "{env_var}={} is not a file; {install_hint}",
                path.display()
            ))
        };
    }
    let on_path = std::env::var_os("PATH")
        .map(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(name))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([PathBuf::from("/usr/bin").join(name)])
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| format!("{name} not found on PATH or in /usr/bin: {install_hint}"))
}

/// How clusterctl sees a template or components file.
pub mod clusterctl {
    use super::BTreeMap;

    /// One `${...}` in a file.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct VariableUse {
        pub name: String,
        /// The text after `:=`, `=`, `:-` or `-`; `None` for a plain `${NAME}` (required).
        pub default: Option<String>,
        /// 1-based line of the use.
        pub line: usize,
    }

    fn is_name_char(c: char) -> bool {
        c.is_ascii_alphanumeric() || c == '_'
    }

    /// Every variable use, in order. Forms other than `${NAME}` and `${NAME<op>default}`
    /// (op one of `:=`, `=`, `:-`, `-`; no `}` or `$` in the default) are errors: clusterctl
    /// would interpret them (substrings, case changes...) in ways these tests do not model.
    pub fn variable_uses(text: &str) -> Result<Vec<VariableUse>, String> {
        let mut uses = Vec::new();
        let mut rest = text;
        let mut consumed = 0;
        while let Some(start) = rest.find("${") {
            let after = &rest[start + 2..];
            let line = text[..consumed + start].matches('\n').count() + 1;
            let close = after
                .find('}')
                .ok_or_else(|| format!("line {line}: unterminated ${{"))?;
            let body = &after[..close];
            let name_len = body.find(|c: char| !is_name_char(c)).unwrap_or(body.len());
            let (name, tail) = body.split_at(name_len);
            if name.is_empty() {
                return Err(format!("line {line}: ${{{body}}} has no variable name"));
            }
            let default = if tail.is_empty() {
                None
            } else {
                let value = [":=", ":-", "=", "-"]
                    .iter()
                    .find_map(|op| tail.strip_prefix(op))
                    .ok_or_else(|| format!("line {line}: unsupported substitution ${{{body}}}"))?;
                if value.contains('$') || value.contains('{') {
                    return Err(format!("line {line}: nested substitution in ${{{body}}}"));
                }
                Some(value.to_string())
            };
            uses.push(VariableUse {
                name: name.to_string(),
                default,
                line,
            });
            let advance = start + 2 + close + 1;
            consumed += advance;
            rest = &rest[advance..];
        }
        Ok(uses)
    }

    /// The text clusterctl would produce with `values`: a value wins, else the default; a
    /// required variable without a value is an error naming every such variable.
    pub fn substitute(text: &str, values: &BTreeMap<String, String>) -> Result<String, String> {
        let uses = variable_uses(text)?;
        let missing: Vec<&str> = uses
            .iter()
            .filter(|u| u.default.is_none() && !values.contains_key(&u.name))
            .map(|u| u.name.as_str())
            .collect();
        if !missing.is_empty() {
            return Err(format!("no value for required variables {missing:?}"));
        }
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            let close = after.find('}').ok_or("unterminated ${")?;
            let body = &after[..close];
            let name_len = body.find(|c: char| !is_name_char(c)).unwrap_or(body.len());
            let (name, tail) = body.split_at(name_len);
            let default = [":=", ":-", "=", "-"].iter().find_map(|op| tail.strip_prefix(op));
            match (values.get(name), default) {
                (Some(value), _) => out.push_str(value),
                (None, Some(default)) => out.push_str(default),
                (None, None) => return Err(format!("no value for {name}")),
            }
            rest = &after[close + 1..];
        }
        out.push_str(rest);
        Ok(out)
    }

    /// Sequences clusterctl's processing would rewrite (`$$`, `\\`, `\/`), with their lines.
    pub fn rewritten_sequences(text: &str) -> Vec<String> {
        let mut found = Vec::new();
        for (i, line) in text.lines().enumerate() {
            for seq in ["$$", "\\\\", "\\/"] {
                if line.contains(seq) {
                    found.push(format!("line {}: {seq:?} in {line:?}", i + 1));
                }
            }
        }
        found
    }
}

/// Variable tables in Markdown (`| Variable | ... | Default | Example | ... |`).
pub mod docs {
    use super::BTreeMap;

    /// One documented variable.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct DocumentedVariable {
        /// `None` when the Default cell says `required`.
        pub default: Option<String>,
        /// The value the tests substitute.
        pub example: String,
        /// The Templates cell, if the table has that column.
        pub templates: Option<String>,
    }

    fn cell_value(cell: &str) -> String {
        let cell = cell.trim();
        if cell == "(empty)" {
            return String::new();
        }
        cell.strip_prefix('`')
            .and_then(|c| c.strip_suffix('`'))
            .unwrap_or(cell)
            .to_string()
    }

    /// The first table whose header has `Variable`, `Default` and `Example` columns. Defaults
    /// and examples are backticked literals, `(empty)`, or `required` (Default only).
    pub fn variables_table(markdown: &str) -> Result<BTreeMap<String, DocumentedVariable>, String> {
        let mut lines = markdown.lines().map(str::trim);
        let header = lines
            .by_ref()
            .find(|l| l.starts_with('|') && l.contains("| Variable") && l.contains("Example"))
            .ok_or("no table with Variable, Default and Example columns")?;
        let columns: Vec<&str> = header.trim_matches('|').split('|').map(str::trim).collect();
        let index = |name: &str| {
            columns
                .iter()
                .position(|c| *c == name)
                .ok_or_else(|| format!("table has no {name} column"))
        };
        let (var_col, default_col, example_col) = (index("Variable")?, index("Default")?, index("Example")?);
        let templates_col = index("Templates").ok();
        let mut table = BTreeMap::new();
        for line in lines.skip(1).take_while(|l| l.starts_with('|')) {
            let cells: Vec<&str> = line.trim_matches('|').split('|').collect();
            if cells.len() != columns.len() {
                return Err(format!(
                    "row has {} cells, header {}: {line}",
                    cells.len(),
                    columns.len()
                ));
            }
            let name = cell_value(cells[var_col]);
            let default = match cells[default_col].trim() {
                "required" => None,
                other => Some(cell_value(other)),
            };
            let entry = DocumentedVariable {
                default,
                example: cell_value(cells[example_col]),
                templates: templates_col.map(|c| cells[c].trim().to_string()),
            };
            if table.insert(name.clone(), entry).is_some() {
                return Err(format!("{name} is documented twice"));
            }
        }
        Ok(table)
    }
}

#[cfg(test)]
mod tests {
    use super::clusterctl::{rewritten_sequences, substitute, variable_uses};
    use super::docs::variables_table;
    use std::collections::BTreeMap;

    #[test]
    fn variables_with_and_without_defaults() {
        let text = "a: ${A}\nb: ${B:=x y}\nc: $(date) $HOME ${C=}\n";
        let uses = variable_uses(text).unwrap();
        let names: Vec<_> = uses
            .iter()
            .map(|u| (u.name.as_str(), u.default.as_deref(), u.line))
            .collect();
        assert_eq!(names, [("A", None, 1), ("B", Some("x y"), 2), ("C", Some(""), 3)]);
        let values = BTreeMap::from([("A".to_string(), "1".to_string())]);
        assert_eq!(
            substitute(text, &values).unwrap(),
            "a: 1\nb: x y\nc: $(date) $HOME \n"
        );
        assert!(substitute(text, &BTreeMap::new()).unwrap_err().contains("\"A\""));
    }

    #[test]
    fn unsupported_forms_are_errors() {
        assert!(variable_uses("${A:0:2}").is_err());
        assert!(variable_uses("${A:=${B}}").is_err());
        assert!(variable_uses("${}").is_err());
        assert!(variable_uses("${A").is_err());
    }

    #[test]
    fn rewritten_sequences_are_found() {
        assert!(rewritten_sequences("a $b c\\.d").is_empty());
        assert_eq!(rewritten_sequences("x\necho $$\n").len(), 1);
        assert_eq!(rewritten_sequences("a\\\\b").len(), 1);
    }

    #[test]
    fn table_parses() {
        let md = "| Variable | Default | Example | Meaning |\n|---|---|---|---|\n\
                  | `A` | required | `a` | x |\n| `B` | `1` | `2` | y |\n| `C` | (empty) | `c` | z |\n\nafter";
        let table = variables_table(md).unwrap();
        assert_eq!(table["A"].default, None);
        assert_eq!(table["B"].default.as_deref(), Some("1"));
        assert_eq!(table["B"].example, "2");
        assert_eq!(table["C"].default.as_deref(), Some(""));
        assert_eq!(table.len(), 3);
    }
}
