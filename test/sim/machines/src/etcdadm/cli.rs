//! The upstream etcdadm command line, parsed the way cobra parses it: unknown flags and missing
//! arguments are refused with cobra's messages.

use std::path::PathBuf;

/// Defaults of upstream etcdadm.
pub const DEFAULT_CERTS_DIR: &str = "/etc/etcd/pki";
pub const DEFAULT_DATA_DIR: &str = "/var/lib/etcd";
pub const DEFAULT_INSTALL_DIR: &str = "/opt/bin/";
pub const DEFAULT_RELEASE_URL: &str = "https://github.com/coreos/etcd/releases/download";

/// Flags shared by `init`, `join` and `reset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// `None`: the version of the etcd available locally (see the install module).
    pub version: Option<String>,
    pub release_url: String,
    pub install_dir: PathBuf,
    pub init_system: String,
    pub certs_dir: PathBuf,
    pub data_dir: PathBuf,
    pub name: Option<String>,
    pub bind_address: Option<String>,
    pub retry: bool,
    pub skip_remove_member: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            version: None,
            release_url: DEFAULT_RELEASE_URL.into(),
            install_dir: DEFAULT_INSTALL_DIR.into(),
            init_system: "systemd".into(),
            certs_dir: DEFAULT_CERTS_DIR.into(),
            data_dir: DEFAULT_DATA_DIR.into(),
            name: None,
            bind_address: None,
            retry: true,
            skip_remove_member: false,
        }
    }
}

/// A parsed invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invocation {
    Init(Options),
    Join { endpoint: String, options: Options },
    Reset(Options),
    Help,
}

/// Parse `etcdadm <args>` (program name excluded). Errors are cobra's text, without the
/// `Error: ` prefix.
pub fn parse(args: &[String]) -> Result<Invocation, String> {
    let Some((command, rest)) = args.split_first() else {
        return Ok(Invocation::Help);
    };
    match command.as_str() {
        "init" | "join" | "reset" => {}
        "-h" | "--help" | "help" => return Ok(Invocation::Help),
        other if other.starts_with('-') => return Err(format!("unknown flag: {other}")),
        other => return Err(format!("unknown command {other:?} for \"etcdadm\"")),
    }
    let mut options = Options::default();
    let mut positional = Vec::new();
    let mut iter = rest.iter();
    while let Some(arg) = iter.next() {
        if arg == "-h" || arg == "--help" {
            return Ok(Invocation::Help);
        }
        let Some(flag) = arg.strip_prefix("--") else {
            if arg.starts_with('-') && arg.len() > 1 {
                let shorthand = arg.trim_start_matches('-').chars().next().unwrap_or('-');
                return Err(format!("unknown shorthand flag: '{shorthand}' in {arg}"));
            }
            positional.push(arg.clone());
            continue;
        };
        let (name, inline) = match flag.split_once('=') {
            Some((name, value)) => (name, Some(value.to_string())),
            None => (flag, None),
        };
        if !accepts(command, name) {
            return Err(format!("unknown flag: --{name}"));
        }
        if matches!(name, "retry" | "skip-remove-member") {
            let value = match inline.as_deref() {
                None | Some("true") => true,
                Some("false") => false,
                Some(other) => {
                    return Err(format!(
                        "invalid argument {other:?} for \"--{name}\" flag: strconv.ParseBool: parsing {other:?}: invalid syntax"
                    ));
                }
            };
            if name == "retry" {
                options.retry = value;
            } else {
                options.skip_remove_member = value;
            }
            continue;
        }
        let value = match inline {
            Some(value) => value,
            None => iter
                .next()
                .cloned()
                .ok_or_else(|| format!("flag needs an argument: --{name}"))?,
        };
        match name {
            "version" => options.version = Some(value.trim_start_matches('v').to_string()),
            "release-url" => options.release_url = value,
            "install-dir" => options.install_dir = value.into(),
            "init-system" => options.init_system = value,
            "certs-dir" => options.certs_dir = value.into(),
            "data-dir" => options.data_dir = value.into(),
            "name" => options.name = Some(value),
            "bind-address" => options.bind_address = Some(value),
            _ => return Err(format!("unknown flag: --{name}")),
        }
    }
    match command.as_str() {
        "init" => Ok(Invocation::Init(options)),
        "reset" => Ok(Invocation::Reset(options)),
        _ => match positional.into_iter().next() {
            Some(endpoint) => Ok(Invocation::Join { endpoint, options }),
            None => Err("requires at least 1 arg(s), only received 0".into()),
        },
    }
}

fn accepts(command: &str, flag: &str) -> bool {
    const COMMON: [&str; 8] = [
        "version",
        "release-url",
        "install-dir",
        "init-system",
        "certs-dir",
        "data-dir",
        "name",
        "bind-address",
    ];
    COMMON.contains(&flag)
        || (command == "join" && flag == "retry")
        || (command == "reset" && flag == "skip-remove-member")
}

/// What `--help` and a usage error print after the error line.
pub fn usage() -> &'static str {
    "Usage:\n  etcdadm [command]\n\nAvailable Commands:\n  init        Initialize a new etcd cluster\n  \
     join        Join an existing etcd cluster\n  reset       Remove this etcd member from the cluster and uninstall etcd\n\n\
     Flags (init, join, reset):\n      --version string        etcd version\n      --release-url string    URL used to download etcd\n      \
     --install-dir string    install directory (default \"/opt/bin/\")\n      --init-system string    init system (default \"systemd\")\n      \
     --certs-dir string      certificates directory (default \"/etc/etcd/pki\")\n      --data-dir string       etcd data directory (default \"/var/lib/etcd\")\n      \
     --name string           etcd member name\n      --bind-address string   etcd bind address\n      --retry                 retry join with backoff (join only, default true)\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn parses_what_the_renderer_emits() {
        let parsed = parse(&args(
            "init --init-system systemd --name etcd-a1 --version 3.5.9 --release-url https://m/etcd --install-dir /opt/bin",
        ))
        .unwrap();
        let Invocation::Init(options) = parsed else {
            panic!("{parsed:?}")
        };
        assert_eq!(options.name.as_deref(), Some("etcd-a1"));
        assert_eq!(options.version.as_deref(), Some("3.5.9"));
        assert_eq!(options.install_dir, PathBuf::from("/opt/bin"));
        let parsed = parse(&args("join https://10.0.0.1:2379 --name=m2 --retry=false")).unwrap();
        let Invocation::Join { endpoint, options } = parsed else {
            panic!("{parsed:?}")
        };
        assert_eq!(endpoint, "https://10.0.0.1:2379");
        assert_eq!(options.name.as_deref(), Some("m2"));
        assert!(!options.retry);
    }

    #[test]
    fn refuses_what_cobra_refuses() {
        assert_eq!(
            parse(&args("join https://a:2379 --cipher-suites TLS_X")).unwrap_err(),
            "unknown flag: --cipher-suites"
        );
        assert_eq!(parse(&args("init --retry")).unwrap_err(), "unknown flag: --retry");
        assert_eq!(
            parse(&args("join")).unwrap_err(),
            "requires at least 1 arg(s), only received 0"
        );
        assert_eq!(
            parse(&args("init --name")).unwrap_err(),
            "flag needs an argument: --name"
        );
        assert_eq!(
            parse(&args("grow")).unwrap_err(),
            "unknown command \"grow\" for \"etcdadm\""
        );
        assert!(
            parse(&args("init -x"))
                .unwrap_err()
                .contains("unknown shorthand flag")
        );
    }

    #[test]
    fn defaults_are_upstreams() {
        let Invocation::Reset(options) = parse(&args("reset")).unwrap() else {
            panic!()
        };
        assert_eq!(options, Options::default());
        assert_eq!(options.certs_dir, PathBuf::from("/etc/etcd/pki"));
        assert!(options.retry);
    }
}
