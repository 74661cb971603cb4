//! Parsing cloud-config user data: the `## template: jinja` header, the few Jinja variables
//! machine images use, and the `#cloud-config` YAML modules the sim executes or records.
//!
//! Pure: text in, a [`CloudConfig`] out. Anything the sim cannot honour faithfully (another
//! Jinja variable, a control block) is an error naming it, rather than a silent difference;
//! string literal expressions are printed, as the renderer uses them to keep braces literal.

use serde::Deserialize;

use crate::error::MachineError;

/// Where a machine's bootstrap reports success (CAPI's sentinel file), relative to its root: the
/// user data writes it last, and the runtime reads it.
pub const BOOTSTRAP_SUCCESS_MARKER: &str = "run/cluster-api/bootstrap-success.complete";

const JINJA_HEADER: &str = "## template: jinja";
const CLOUD_CONFIG_HEADER: &str = "#cloud-config";
/// Jinja variables cloud-init offers that this sim answers, all with the machine name.
const HOSTNAME_VARIABLES: [&str; 4] = [
    "ds.meta_data.hostname",
    "ds.meta_data.local_hostname",
    "v1.local_hostname",
    "v1.hostname",
];

/// The cloud-config modules the sim knows about. Unknown modules are ignored, as cloud-init
/// ignores modules it has no handler for.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct CloudConfig {
    pub write_files: Vec<WriteFile>,
    pub runcmd: Vec<RunCommand>,
    /// Recorded in the machine log, never applied.
    pub users: Option<serde_json::Value>,
    /// Recorded in the machine log, never applied.
    pub ntp: Option<serde_json::Value>,
}

/// One `write_files` entry.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct WriteFile {
    pub path: String,
    #[serde(default)]
    pub content: String,
    #[serde(default)]
    pub encoding: Option<String>,
    #[serde(default)]
    pub permissions: Option<Permissions>,
    /// Recorded, never applied: every machine process runs as root.
    #[serde(default)]
    pub owner: Option<String>,
    #[serde(default)]
    pub append: bool,
}

/// File mode as written in YAML: usually a quoted octal string (`"0640"`), sometimes a bare
/// number whose digits are read as octal, as cloud-init does.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Permissions {
    Text(String),
    Number(u64),
}

impl Permissions {
    /// The mode bits, or an error naming the bad value.
    pub fn mode(&self) -> Result<u32, MachineError> {
        let digits = match self {
            Permissions::Text(text) => text.trim().to_string(),
            Permissions::Number(n) => n.to_string(),
        };
        let digits = digits.strip_prefix("0o").unwrap_or(&digits);
        u32::from_str_radix(digits, 8)
            .ok()
            .filter(|mode| *mode <= 0o7777)
            .ok_or_else(|| {
                MachineError::UserData(format!("permissions {digits:?} is not an octal file mode"))
            })
    }
}

/// One `runcmd` entry: a string runs through `sh -c`, a list is an argv run directly.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum RunCommand {
    Shell(String),
    Argv(Vec<String>),
}

impl RunCommand {
    /// The argv that executes this entry.
    pub fn argv(&self) -> Vec<String> {
        match self {
            RunCommand::Shell(line) => vec!["sh".into(), "-c".into(), line.clone()],
            RunCommand::Argv(argv) => argv.clone(),
        }
    }

    /// How the entry reads in logs.
    pub fn display(&self) -> String {
        match self {
            RunCommand::Shell(line) => line.clone(),
            RunCommand::Argv(argv) => format!("{argv:?}"),
        }
    }
}

/// Parse user data for the machine called `hostname`: expand the Jinja template if the header
/// asks for it, check the `#cloud-config` header, then read the YAML.
pub fn parse_user_data(user_data: &str, hostname: &str) -> Result<CloudConfig, MachineError> {
    let expanded = match user_data.strip_prefix(JINJA_HEADER) {
        Some(rest) if rest.starts_with('\n') || rest.starts_with("\r\n") => {
            expand_jinja(rest.trim_start_matches(['\r', '\n']), hostname)?
        }
        _ => user_data.to_string(),
    };
    let first_line = expanded.lines().next().unwrap_or_default().trim_end();
    if first_line != CLOUD_CONFIG_HEADER {
        return Err(MachineError::UserData(format!(
            "the first line must be `{CLOUD_CONFIG_HEADER}` (after an optional `{JINJA_HEADER}` \
             line), found {first_line:?}"
        )));
    }
    if expanded
        .lines()
        .skip(1)
        .all(|line| line.trim().is_empty() || line.trim_start().starts_with('#'))
    {
        return Ok(CloudConfig::default());
    }
    serde_saphyr::from_str(&expanded)
        .map_err(|e| MachineError::UserData(format!("cloud-config YAML does not parse: {e}")))
}

/// Replace the hostname variables and print string literals (`{{ '{%' }}`, how the renderer
/// keeps braces from Jinja); refuse every other Jinja construct, naming it. Delimiters inside
/// an expression's string are part of the expression, as in Jinja.
pub fn expand_jinja(template: &str, hostname: &str) -> Result<String, MachineError> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = ["{{", "{%", "{#"].iter().filter_map(|o| rest.find(o)).min() {
        out.push_str(&rest[..start]);
        let opener = &rest[start..start + 2];
        if opener != "{{" {
            let snippet: String = rest[start..].chars().take(40).collect();
            return Err(MachineError::UserData(format!(
                "Jinja construct {snippet:?} is not supported by the sim (only {{{{ {} }}}}, its \
                 aliases and string literals are)",
                HOSTNAME_VARIABLES[0]
            )));
        }
        let after = &rest[start + 2..];
        let end = after.find("}}").ok_or_else(|| {
            MachineError::UserData("unterminated Jinja expression: `{{` without `}}`".into())
        })?;
        let expression = after[..end].trim();
        let literal = expression
            .strip_prefix('\'')
            .and_then(|e| e.strip_suffix('\''))
            .filter(|inner| !inner.contains('\'') && !inner.contains('\\'));
        if let Some(literal) = literal {
            out.push_str(literal);
        } else if HOSTNAME_VARIABLES.contains(&expression) {
            out.push_str(hostname);
        } else {
            return Err(MachineError::UserData(format!(
                "Jinja expression {{{{ {expression} }}}} is not supported by the sim; supported: {} \
                 and string literals",
                HOSTNAME_VARIABLES.join(", ")
            )));
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "## template: jinja\n#cloud-config\nwrite_files:\n  - path: \"/etc/etcd/pki/ca.crt\"\n    owner: \"root:root\"\n    permissions: \"0640\"\n    content: |\n      CERT\n  - path: /etc/x.b64\n    encoding: base64\n    content: aGVsbG8K\n    append: true\nruncmd:\n  - \"echo \\\"pre: {{ ds.meta_data.hostname }}\\\" > /tmp/pre\"\n  - [echo, \"{{v1.local_hostname}}\"]\nntp:\n  enabled: false\nusers:\n  - name: ops\n";

    #[test]
    fn parses_the_spec_shape_and_expands_the_hostname() {
        let config = parse_user_data(SAMPLE, "m1").unwrap();
        assert_eq!(config.write_files.len(), 2);
        assert_eq!(config.write_files[0].path, "/etc/etcd/pki/ca.crt");
        assert_eq!(config.write_files[0].content, "CERT\n");
        assert_eq!(
            config.write_files[0]
                .permissions
                .as_ref()
                .unwrap()
                .mode()
                .unwrap(),
            0o640
        );
        assert_eq!(config.write_files[0].owner.as_deref(), Some("root:root"));
        assert!(config.write_files[1].append);
        assert_eq!(config.write_files[1].encoding.as_deref(), Some("base64"));
        assert_eq!(
            config.runcmd,
            vec![
                RunCommand::Shell("echo \"pre: m1\" > /tmp/pre".into()),
                RunCommand::Argv(vec!["echo".into(), "m1".into()]),
            ]
        );
        assert!(config.ntp.is_some());
        assert!(config.users.is_some());
    }

    #[test]
    fn without_the_jinja_header_braces_are_kept() {
        let config = parse_user_data("#cloud-config\nruncmd:\n  - \"echo {{ x }}\"\n", "m1").unwrap();
        assert_eq!(config.runcmd, vec![RunCommand::Shell("echo {{ x }}".into())]);
    }

    #[test]
    fn other_jinja_is_refused_by_name() {
        let err = expand_jinja("a {{ ds.meta_data.instance_id }} b", "m1").unwrap_err();
        assert!(err.to_string().contains("ds.meta_data.instance_id"), "{err}");
        let err = expand_jinja("{% if x %}y{% endif %}", "m1").unwrap_err();
        assert!(err.to_string().contains("{% if x %}"), "{err}");
        let err = expand_jinja("{{ ds.meta_data.hostname", "m1").unwrap_err();
        assert!(err.to_string().contains("unterminated"), "{err}");
    }

    #[test]
    fn string_literals_print_what_the_renderer_kept_from_jinja() {
        assert_eq!(
            expand_jinja("a {{ '{{' }} b {{ '{%' }} endraw %}{{ '{#' }} c", "m1").unwrap(),
            "a {{ b {% endraw %}{# c"
        );
        let err = expand_jinja("{{ 'it''s' }}", "m1").unwrap_err();
        assert!(err.to_string().contains("not supported"), "{err}");
    }

    #[test]
    fn missing_cloud_config_header_is_an_error() {
        let err = parse_user_data("runcmd: []\n", "m1").unwrap_err();
        assert!(err.to_string().contains("#cloud-config"), "{err}");
        assert_eq!(
            parse_user_data("#cloud-config\n", "m1").unwrap(),
            CloudConfig::default()
        );
    }

    #[test]
    fn permissions_accept_strings_and_bare_octal_digits() {
        assert_eq!(Permissions::Text("0600".into()).mode().unwrap(), 0o600);
        assert_eq!(Permissions::Number(644).mode().unwrap(), 0o644);
        assert!(Permissions::Text("rw".into()).mode().is_err());
        assert!(Permissions::Number(99999).mode().is_err());
    }
}
