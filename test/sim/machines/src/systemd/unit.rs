//! Reading unit files and environment files: pure text to values.

use std::path::PathBuf;
use std::time::Duration;

/// How the manager decides a unit has started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceType {
    Simple,
    Exec,
    Notify,
    Oneshot,
}

/// When the main process is started again after it exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartPolicy {
    No,
    /// Non-zero exit or death by signal; a clean exit 0 is final.
    OnFailure,
    Always,
}

impl RestartPolicy {
    /// Whether an exit (`failed`: non-zero status or killed by a signal) leads to a restart.
    pub fn restarts(self, failed: bool) -> bool {
        match self {
            RestartPolicy::No => false,
            RestartPolicy::OnFailure => failed,
            RestartPolicy::Always => true,
        }
    }
}

/// The parts of a `.service` unit the sim honours.
#[derive(Debug, Clone, PartialEq)]
pub struct Unit {
    pub name: String,
    pub description: Option<String>,
    pub exec_start: Vec<String>,
    /// Paths with whether they are optional (`-` prefix).
    pub environment_files: Vec<(PathBuf, bool)>,
    pub environment: Vec<(String, String)>,
    pub service_type: ServiceType,
    pub restart: RestartPolicy,
    pub restart_sec: Duration,
    /// `None`: wait for readiness forever (`TimeoutStartSec=0` or `infinity`).
    pub timeout_start: Option<Duration>,
    pub timeout_stop: Duration,
}

/// `etcd` → `etcd.service`; names with a unit suffix are kept.
pub fn unit_name(argument: &str) -> String {
    const SUFFIXES: [&str; 6] = [".service", ".socket", ".target", ".timer", ".mount", ".path"];
    if SUFFIXES.iter().any(|suffix| argument.ends_with(suffix)) {
        argument.to_string()
    } else {
        format!("{argument}.service")
    }
}

/// Parse a unit from its main file followed by its drop-ins, in order.
pub fn parse_unit(name: &str, texts: &[String]) -> Result<Unit, String> {
    // One match over systemd's unit keys, in section order: a table, read at once.
    let mut unit = Unit {
        name: name.to_string(),
        description: None,
        exec_start: Vec::new(),
        environment_files: Vec::new(),
        environment: Vec::new(),
        service_type: ServiceType::Simple,
        restart: RestartPolicy::No,
        restart_sec: Duration::from_millis(100),
        timeout_start: Some(Duration::from_secs(90)),
        timeout_stop: Duration::from_secs(90),
    };
    for text in texts {
        let mut section = String::new();
        for raw in text.lines() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            if line.starts_with('[') && line.ends_with(']') {
                section = line[1..line.len() - 1].to_string();
                continue;
            }
            let Some((key, value)) = line.split_once('=') else {
                return Err(format!("{name}: line {line:?} is not `Key=Value`"));
            };
            let (key, value) = (key.trim(), value.trim());
            match (section.as_str(), key) {
                ("Unit", "Description") => unit.description = Some(value.to_string()),
                ("Service", "ExecStart") => {
                    let words = split_command_line(value);
                    unit.exec_start = match words.split_first() {
                        Some((first, rest)) => {
                            let program = first.trim_start_matches(['-', '@', ':', '+', '!']).to_string();
                            std::iter::once(program).chain(rest.iter().cloned()).collect()
                        }
                        None => Vec::new(),
                    };
                }
                ("Service", "EnvironmentFile") => match value.strip_prefix('-') {
                    Some(path) => unit.environment_files.push((PathBuf::from(path), true)),
                    None => unit.environment_files.push((PathBuf::from(value), false)),
                },
                ("Service", "Environment") => {
                    for assignment in split_command_line(value) {
                        if let Some((k, v)) = assignment.split_once('=') {
                            unit.environment.push((k.to_string(), v.to_string()));
                        }
                    }
                }
                ("Service", "Type") => {
                    unit.service_type = match value {
                        "simple" => ServiceType::Simple,
                        "exec" => ServiceType::Exec,
                        "notify" => ServiceType::Notify,
                        "oneshot" => ServiceType::Oneshot,
                        other => return Err(format!("{name}: Type={other} is not supported by the sim")),
                    }
                }
                ("Service", "Restart") => {
                    unit.restart = match value {
                        "no" => RestartPolicy::No,
                        "on-failure" => RestartPolicy::OnFailure,
                        "always" => RestartPolicy::Always,
                        other => return Err(format!("{name}: Restart={other} is not supported by the sim")),
                    }
                }
                ("Service", "RestartSec") => unit.restart_sec = duration_value(name, key, value)?,
                ("Service", "TimeoutStartSec") => unit.timeout_start = timeout_value(name, key, value)?,
                ("Service", "TimeoutStopSec") => {
                    unit.timeout_stop = timeout_value(name, key, value)?.unwrap_or(Duration::from_secs(90));
                }
                ("Service", "TimeoutSec") => {
                    unit.timeout_start = timeout_value(name, key, value)?;
                    unit.timeout_stop = unit.timeout_start.unwrap_or(Duration::from_secs(90));
                }
                _ => {}
            }
        }
    }
    if unit.exec_start.is_empty() {
        return Err(format!("{name} has no ExecStart= setting, refusing"));
    }
    Ok(unit)
}

fn duration_value(unit: &str, key: &str, value: &str) -> Result<Duration, String> {
    parse_duration(value).ok_or_else(|| format!("{unit}: {key}={value} is not a time span"))
}

fn timeout_value(unit: &str, key: &str, value: &str) -> Result<Option<Duration>, String> {
    if value == "infinity" {
        return Ok(None);
    }
    let duration = duration_value(unit, key, value)?;
    Ok((!duration.is_zero()).then_some(duration))
}

/// A systemd time span: `5`, `5s`, `100ms`, `1min 30s`, `2h`.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let mut total = Duration::ZERO;
    let mut any = false;
    for part in text.split_whitespace() {
        let split = part
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(part.len());
        let (number, unit) = part.split_at(split);
        let number: f64 = number.parse().ok()?;
        let seconds = match unit {
            "" | "s" | "sec" | "second" | "seconds" => number,
            "ms" | "msec" => number / 1000.0,
            "us" | "usec" => number / 1_000_000.0,
            "m" | "min" | "minute" | "minutes" => number * 60.0,
            "h" | "hr" | "hour" | "hours" => number * 3600.0,
            _ => return None,
        };
        total += Duration::try_from_secs_f64(seconds).ok()?;
        any = true;
    }
    any.then_some(total)
}

/// Split a command line on whitespace, honouring double and single quotes.
pub fn split_command_line(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut current = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), '\\') => {
                if let Some(next) = chars.next() {
                    current.push(next);
                }
            }
            (Some(_), c) => current.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut current));
                    in_word = false;
                }
            }
            (None, c) => {
                current.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(current);
    }
    words
}

/// The environment a unit's main process gets, as systemd builds it: `Environment=` first, then
/// each `EnvironmentFile=` in order, whose settings override `Environment=`'s and earlier
/// files' (systemd.exec(5)). A missing file is an error unless it is optional (`-`).
pub fn unit_environment(
    unit: &Unit,
    read: impl Fn(&std::path::Path) -> std::io::Result<String>,
) -> Result<Vec<(String, String)>, String> {
    let mut environment: Vec<(String, String)> = Vec::new();
    let mut set = |(key, value): (String, String)| {
        environment.retain(|(k, _)| *k != key);
        environment.push((key, value));
    };
    unit.environment.iter().cloned().for_each(&mut set);
    for (path, optional) in &unit.environment_files {
        match read(path) {
            Ok(text) => parse_env_file(&text).into_iter().for_each(&mut set),
            Err(_) if *optional => {}
            Err(e) => return Err(format!("Failed to load environment file {}: {e}", path.display())),
        }
    }
    Ok(environment)
}

/// Read an `EnvironmentFile`: `KEY=VALUE` lines, `#`/`;` comments, optional quotes around the
/// value. Later assignments win, as in systemd.
pub fn parse_env_file(text: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for raw in text.lines() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim().to_string();
        let value = value.trim();
        let value = match (value.chars().next(), value.chars().last()) {
            (Some(first @ ('"' | '\'')), Some(last)) if value.len() >= 2 && first == last => {
                &value[1..value.len() - 1]
            }
            _ => value,
        };
        out.retain(|(k, _)| *k != key);
        out.push((key, value.to_string()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const ETCD_UNIT: &str = "[Unit]\nDescription=etcd\nDocumentation=https://github.com/etcd-io/etcd\n\n[Service]\nEnvironmentFile=/etc/etcd/etcd.env\nExecStart=/opt/bin/etcd\n\nType=notify\nTimeoutStartSec=0\nRestart=on-failure\nRestartSec=5s\n\nLimitNOFILE=65536\n\n[Install]\nWantedBy=multi-user.target\n";

    #[test]
    fn parses_the_etcd_unit() {
        let unit = parse_unit("etcd.service", &[ETCD_UNIT.to_string()]).unwrap();
        assert_eq!(unit.description.as_deref(), Some("etcd"));
        assert_eq!(unit.exec_start, vec!["/opt/bin/etcd".to_string()]);
        assert_eq!(
            unit.environment_files,
            vec![(PathBuf::from("/etc/etcd/etcd.env"), false)]
        );
        assert_eq!(unit.service_type, ServiceType::Notify);
        assert_eq!(unit.restart, RestartPolicy::OnFailure);
        assert_eq!(unit.restart_sec, Duration::from_secs(5));
        assert_eq!(unit.timeout_start, None);
    }

    #[test]
    fn drop_ins_add_environment() {
        let drop_in = "[Service]\nEnvironment=\"HTTP_PROXY=http://p:3128\" \"NO_PROXY=a,b\"\nEnvironmentFile=-/etc/x.env\n";
        let unit = parse_unit(
            "c.service",
            &["[Service]\nExecStart=/bin/c --x \"a b\"\n".into(), drop_in.into()],
        )
        .unwrap();
        assert_eq!(unit.exec_start, vec!["/bin/c", "--x", "a b"]);
        assert_eq!(
            unit.environment,
            vec![
                ("HTTP_PROXY".into(), "http://p:3128".into()),
                ("NO_PROXY".into(), "a,b".into())
            ]
        );
        assert_eq!(unit.environment_files, vec![(PathBuf::from("/etc/x.env"), true)]);
    }

    #[test]
    fn environment_files_override_environment_lines_as_in_systemd() {
        // etcdadm's unit reads etcd.env; a drop-in adds settings etcdadm has no flag for.
        let drop_in = "[Service]\nEnvironment=\"ETCD_QUOTA_BACKEND_BYTES=1\" \"ETCD_NAME=drop-in\"\n\
                       EnvironmentFile=-/etc/missing.env\n";
        let unit = parse_unit("etcd.service", &[ETCD_UNIT.to_string(), drop_in.to_string()]).unwrap();
        let env = unit_environment(&unit, |path| {
            if path == Path::new("/etc/etcd/etcd.env") {
                Ok("ETCD_NAME=m1\nETCD_DATA_DIR=/var/lib/etcd\n".to_string())
            } else {
                Err(std::io::Error::from(std::io::ErrorKind::NotFound))
            }
        })
        .unwrap();
        assert_eq!(
            env,
            vec![
                ("ETCD_QUOTA_BACKEND_BYTES".to_string(), "1".to_string()),
                ("ETCD_NAME".into(), "m1".into()),
                ("ETCD_DATA_DIR".into(), "/var/lib/etcd".into()),
            ]
        );
        let missing = unit_environment(&unit, |_| Err(std::io::Error::from(std::io::ErrorKind::NotFound)));
        assert!(
            missing
                .unwrap_err()
                .starts_with("Failed to load environment file /etc/etcd/etcd.env")
        );
    }

    #[test]
    fn units_without_exec_start_or_with_unknown_types_are_refused() {
        assert!(parse_unit("x.service", &["[Service]\nType=notify\n".into()]).is_err());
        assert!(parse_unit("x.service", &["[Service]\nExecStart=/x\nType=forking\n".into()]).is_err());
    }

    #[test]
    fn restart_policies() {
        assert!(RestartPolicy::OnFailure.restarts(true));
        assert!(!RestartPolicy::OnFailure.restarts(false));
        assert!(RestartPolicy::Always.restarts(false));
        assert!(!RestartPolicy::No.restarts(true));
    }

    #[test]
    fn durations_and_names() {
        assert_eq!(parse_duration("5s"), Some(Duration::from_secs(5)));
        assert_eq!(parse_duration("100ms"), Some(Duration::from_millis(100)));
        assert_eq!(parse_duration("1min 30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("7"), Some(Duration::from_secs(7)));
        assert_eq!(parse_duration("soon"), None);
        assert_eq!(unit_name("etcd"), "etcd.service");
        assert_eq!(unit_name("etcd.service"), "etcd.service");
    }

    #[test]
    fn env_files_read_like_systemd() {
        let env = parse_env_file("# c\nETCD_NAME=m1\n\nQUOTED=\"a b\"\n;x\nETCD_NAME=m2\nnot a line\n");
        assert_eq!(
            env,
            vec![("QUOTED".into(), "a b".into()), ("ETCD_NAME".into(), "m2".into())]
        );
    }
}
