//! The upstream etcdadm command line, parsed the way cobra parses it: unknown flags and missing
//! arguments are refused with cobra's messages.

use std::path::PathBuf;

use super::phases::{Phase, Verb};

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
    /// `--server-cert-extra-sans`: more DNS names or IPs for the server certificate.
    pub server_cert_extra_sans: Vec<String>,
    pub retry: bool,
    pub skip_remove_member: bool,
    /// `init --snapshot`: the etcd v3 snapshot file the member's data is restored from.
    pub snapshot: Option<PathBuf>,
    /// `init --skip-hash-check`: restore a snapshot without etcd's integrity hash (a copied
    /// database file has none).
    pub skip_hash_check: bool,
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
            server_cert_extra_sans: Vec::new(),
            retry: true,
            skip_remove_member: false,
            snapshot: None,
            skip_hash_check: false,
        }
    }
}

/// Where `init` or `join` is pointed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Init,
    Join { endpoint: String },
}

impl Command {
    pub fn verb(&self) -> Verb {
        match self {
            Command::Init => Verb::Init,
            Command::Join { .. } => Verb::Join,
        }
    }
}

/// A parsed invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invocation {
    /// `init`/`join` (every phase), or `init|join phase <name>` (that phase and what it needs).
    Run {
        command: Command,
        options: Options,
        phases: Vec<Phase>,
    },
    Reset(Options),
    /// Print this help and exit 0.
    Help(String),
}

/// Why an invocation does not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CliError {
    /// cobra's refusal (exit 1, usage printed), without the `Error: ` prefix.
    Usage(String),
    /// A Go runtime panic upstream runs into (exit 2), without the `panic: ` prefix.
    Panic(String),
}

/// Parse `etcdadm <args>` (program name excluded).
pub fn parse(args: &[String]) -> Result<Invocation, CliError> {
    // etcdadm's flags in one match, as its CLI defines them: a table, read at once.
    let usage_error = |message: String| Err(CliError::Usage(message));
    let Some((command, rest)) = args.split_first() else {
        return Ok(Invocation::Help(usage().into()));
    };
    let verb = match command.as_str() {
        "init" => Some(Verb::Init),
        "join" => Some(Verb::Join),
        "reset" => None,
        "-h" | "--help" | "help" => return Ok(Invocation::Help(usage().into())),
        other if other.starts_with('-') => return usage_error(format!("unknown flag: {other}")),
        other => return usage_error(format!("unknown command {other:?} for \"etcdadm\"")),
    };
    let mut options = Options::default();
    let mut positional = Vec::new();
    let mut iter = rest.iter();
    while let Some(arg) = iter.next() {
        if arg == "-h" || arg == "--help" {
            return Ok(Invocation::Help(usage().into()));
        }
        let Some(flag) = arg.strip_prefix("--") else {
            if arg.starts_with('-') && arg.len() > 1 {
                let shorthand = arg.trim_start_matches('-').chars().next().unwrap_or('-');
                return usage_error(format!("unknown shorthand flag: '{shorthand}' in {arg}"));
            }
            positional.push(arg.clone());
            continue;
        };
        let (name, inline) = match flag.split_once('=') {
            Some((name, value)) => (name, Some(value.to_string())),
            None => (flag, None),
        };
        if !accepts(command, name) {
            return usage_error(format!("unknown flag: --{name}"));
        }
        if matches!(name, "retry" | "skip-remove-member" | "skip-hash-check") {
            let value = match inline.as_deref() {
                None | Some("true") => true,
                Some("false") => false,
                Some(other) => {
                    return usage_error(format!(
                        "invalid argument {other:?} for \"--{name}\" flag: strconv.ParseBool: parsing {other:?}: invalid syntax"
                    ));
                }
            };
            match name {
                "retry" => options.retry = value,
                "skip-remove-member" => options.skip_remove_member = value,
                _ => options.skip_hash_check = value,
            }
            continue;
        }
        let value = match inline {
            Some(value) => value,
            None => iter
                .next()
                .cloned()
                .ok_or_else(|| CliError::Usage(format!("flag needs an argument: --{name}")))?,
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
            // A cobra string slice: comma separated, and repeated flags add up.
            "server-cert-extra-sans" => options.server_cert_extra_sans.extend(
                value
                    .split(',')
                    .map(str::trim)
                    .filter(|san| !san.is_empty())
                    .map(String::from),
            ),
            "snapshot" => options.snapshot = Some(value.into()),
            // Accepted as upstream accepts them; nothing the stand-in does depends on them.
            "disk-priorities"
            | "image-repository"
            | "kubelet-pod-manifest-path"
            | "log-level"
            | "download-connect-timeout" => {}
            _ => return usage_error(format!("unknown flag: --{name}")),
        }
    }
    let Some(verb) = verb else {
        return Ok(Invocation::Reset(options));
    };
    let single = positional.first().map(String::as_str) == Some("phase");
    let (phases, arguments) = if single {
        // `phase` has no action of its own: cobra prints its help for a missing or unknown
        // phase name and exits 0.
        let Some(phase) = positional.get(1).and_then(|name| verb.phase(name)) else {
            return Ok(Invocation::Help(phase_usage(verb)));
        };
        (verb.single(phase), &positional[2..])
    } else {
        (verb.phases().to_vec(), &positional[..])
    };
    let command = match (verb, arguments.first()) {
        (Verb::Init, _) => Command::Init,
        (Verb::Join, Some(endpoint)) => Command::Join {
            endpoint: endpoint.clone(),
        },
        // A phase subcommand takes any arguments; upstream's join setup then reads the first
        // one unchecked.
        (Verb::Join, None) if single => {
            return Err(CliError::Panic(
                "runtime error: index out of range [0] with length 0".into(),
            ));
        }
        (Verb::Join, None) => return usage_error("requires at least 1 arg(s), only received 0".into()),
    };
    Ok(Invocation::Run {
        command,
        options,
        phases,
    })
}

fn accepts(command: &str, flag: &str) -> bool {
    const COMMON: [&str; 13] = [
        "version",
        "release-url",
        "install-dir",
        "init-system",
        "certs-dir",
        "data-dir",
        "name",
        "bind-address",
        "server-cert-extra-sans",
        "disk-priorities",
        "image-repository",
        "kubelet-pod-manifest-path",
        "log-level",
    ];
    COMMON.contains(&flag)
        || (command == "join" && flag == "retry")
        || (command == "init" && matches!(flag, "snapshot" | "skip-hash-check" | "download-connect-timeout"))
        || (command == "reset" && flag == "skip-remove-member")
}

/// What `<verb> phase` prints: the phases `phase <name>` accepts.
pub fn phase_usage(verb: Verb) -> String {
    let mut text = format!(
        "Use this command to invoke single phase of the {} command\n\nUsage:\n  etcdadm {} phase [command]\n\nAvailable Commands:\n",
        verb.name(),
        verb.name()
    );
    for phase in verb.phases() {
        text.push_str(&format!("  {:<24}Run {} phase\n", phase.name(), phase.name()));
    }
    text
}

/// What `--help` and a usage error print after the error line.
pub fn usage() -> &'static str {
    "Usage:\n  etcdadm [command]\n\nAvailable Commands:\n  init        Initialize a new etcd cluster\n  \
     join        Join an existing etcd cluster\n  reset       Remove this etcd member from the cluster and uninstall etcd\n\n\
     Single phases: etcdadm init phase <name>, etcdadm join phase <name> <endpoint>\n\n\
     Flags (init, join, reset):\n      --version string        etcd version\n      --release-url string    URL used to download etcd\n      \
     --install-dir string    install directory (default \"/opt/bin/\")\n      --init-system string    init system (default \"systemd\")\n      \
     --certs-dir string      certificates directory (default \"/etc/etcd/pki\")\n      --data-dir string       etcd data directory (default \"/var/lib/etcd\")\n      \
     --name string           etcd member name\n      --bind-address string   etcd bind address\n      \
     --server-cert-extra-sans strings   extra Subject Alternative Names for the server certificate\n      --retry                 retry join with backoff (join only, default true)\n      \
     --snapshot string       etcd v3 snapshot file used to initialize member (init only)\n      \
     --skip-hash-check       ignore snapshot integrity hash value (init only)\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_string).collect()
    }

    fn run(text: &str) -> (Command, Options, Vec<Phase>) {
        match parse(&args(text)).unwrap() {
            Invocation::Run {
                command,
                options,
                phases,
            } => (command, options, phases),
            other => panic!("{text}: {other:?}"),
        }
    }

    #[test]
    fn parses_what_the_renderer_emits() {
        let (command, options, phases) = run(
            "init --init-system systemd --name etcd-a1 --version 3.5.9 --release-url https://m/etcd --install-dir /opt/bin",
        );
        assert_eq!(command, Command::Init);
        assert_eq!(phases, Verb::Init.phases());
        assert_eq!(options.name.as_deref(), Some("etcd-a1"));
        assert_eq!(options.version.as_deref(), Some("3.5.9"));
        assert_eq!(options.install_dir, PathBuf::from("/opt/bin"));
        let (command, options, phases) = run("join https://10.0.0.1:2379 --name=m2 --retry=false");
        assert_eq!(
            command,
            Command::Join {
                endpoint: "https://10.0.0.1:2379".into()
            }
        );
        assert_eq!(phases, Verb::Join.phases());
        assert_eq!(options.name.as_deref(), Some("m2"));
        assert!(!options.retry);
        let (_, options, _) =
            run("init --name m1 --snapshot /var/lib/etcd-restore/snapshot.db --skip-hash-check");
        assert_eq!(
            options.snapshot,
            Some(PathBuf::from("/var/lib/etcd-restore/snapshot.db"))
        );
        assert!(options.skip_hash_check);
        assert!(!run("init --snapshot=/s.db").1.skip_hash_check);
        let (_, options, _) = run(
            "join https://10.0.0.1:2379 --bind-address 10.0.0.7 --server-cert-extra-sans 10.0.0.7,m.example --server-cert-extra-sans=10.0.0.8",
        );
        assert_eq!(options.bind_address.as_deref(), Some("10.0.0.7"));
        assert_eq!(
            options.server_cert_extra_sans,
            ["10.0.0.7", "m.example", "10.0.0.8"]
        );
    }

    #[test]
    fn a_single_phase_takes_the_commands_flags_and_runs_after_its_prerequisites() {
        let (command, options, phases) =
            run("join phase health https://10.0.0.1:2379 --init-system systemd --name m2");
        assert_eq!(
            command,
            Command::Join {
                endpoint: "https://10.0.0.1:2379".into()
            }
        );
        assert_eq!(phases, [Phase::Health]);
        assert_eq!(options.name.as_deref(), Some("m2"));
        let (_, _, phases) = run("join --name m2 phase start https://10.0.0.1:2379");
        assert_eq!(phases, [Phase::Membership, Phase::Start]);
        let (command, _, phases) = run("init phase health");
        assert_eq!((command, phases), (Command::Init, vec![Phase::Health]));
        // The endpoint comes first: `phase` after it is just another argument.
        let (_, _, phases) = run("join https://10.0.0.1:2379 phase health");
        assert_eq!(phases, Verb::Join.phases());
    }

    #[test]
    fn phase_names_upstream_lacks_print_help_as_cobra_does() {
        for text in [
            "join phase",
            "join phase bogus https://a:2379",
            "init phase membership",
        ] {
            match parse(&args(text)).unwrap() {
                Invocation::Help(help) => assert!(help.contains("Run health phase"), "{help}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        assert!(
            matches!(parse(&args("join phase")).unwrap(), Invocation::Help(h) if h.contains("Run membership phase"))
        );
    }

    #[test]
    fn refuses_what_cobra_refuses() {
        let usage = |text: &str| match parse(&args(text)) {
            Err(CliError::Usage(message)) => message,
            other => panic!("{text}: {other:?}"),
        };
        assert_eq!(
            usage("join https://a:2379 --cipher-suites TLS_X"),
            "unknown flag: --cipher-suites"
        );
        assert_eq!(
            usage("join phase health https://a:2379 --cipher-suites TLS_X"),
            "unknown flag: --cipher-suites"
        );
        assert_eq!(usage("init --retry"), "unknown flag: --retry");
        assert_eq!(
            usage("join https://a:2379 --snapshot /s.db"),
            "unknown flag: --snapshot"
        );
        assert_eq!(usage("join"), "requires at least 1 arg(s), only received 0");
        assert_eq!(usage("init --name"), "flag needs an argument: --name");
        assert_eq!(usage("grow"), "unknown command \"grow\" for \"etcdadm\"");
        assert!(usage("init -x").contains("unknown shorthand flag"));
        // Upstream's join phases read the endpoint without checking there is one.
        assert_eq!(
            parse(&args("join phase health")),
            Err(CliError::Panic(
                "runtime error: index out of range [0] with length 0".into()
            ))
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
