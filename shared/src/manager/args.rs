//! The flags every manager binary shares, with Cluster API's names and defaults, checked before
//! anything starts so a bad value fails at startup with the flag's name.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::duration;

/// Flags of a manager binary's `run` subcommand; `#[command(flatten)]` them in.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct ManagerArgs {
    /// Elect a leader through a coordination.k8s.io/v1 Lease; only the leader runs controllers.
    #[arg(long)]
    pub leader_elect: bool,

    /// How long a lease is valid after its last renewal: followers wait this long for a silent
    /// leader before taking over.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,

    /// How long the leader keeps trying to renew before giving up; it then exits non-zero.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub leader_elect_renew_deadline: Duration,

    /// How often leaders renew and candidates retry.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub leader_elect_retry_period: Duration,

    /// Name of the Lease (default: one per binary).
    #[arg(long)]
    pub leader_election_id: Option<String>,

    /// Namespace of the Lease (default: $POD_NAMESPACE, else "default").
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub leader_election_namespace: String,

    /// Watch only these namespaces, comma-separated (default: all namespaces). With RBAC
    /// granted in these namespaces only (config/namespaced sets WATCH_NAMESPACE), nothing
    /// elsewhere is read.
    #[arg(long, env = "WATCH_NAMESPACE", value_delimiter = ',')]
    pub namespace: Vec<String>,

    /// Reconcile only objects labelled `cluster.x-k8s.io/watch-filter=<value>`; others are ignored.
    #[arg(long)]
    pub watch_filter: Option<String>,

    /// Objects reconciled in parallel by each controller. A reconcile spends most of its time
    /// waiting (on the API server, on etcd members up to the health timeout), so slots are
    /// cheap; with fewer than clusters ÷ interval × round time, rounds queue (in the order they
    /// fell due) and the interval stretches (1,000 clusters at a 10 s interval need about 15).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: u16,

    /// Every object is reconciled again at least this often, even without a change.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub sync_period: Duration,

    /// `/healthz` and `/readyz` listen here (`:9440` = all interfaces; `0` disables).
    #[arg(long, default_value = ":9440", value_parser = parse_listen_address)]
    pub health_addr: ListenAddress,

    /// `/metrics` listens here, over HTTPS, answering only callers whose bearer token the API
    /// server accepts and allows `get` on `/metrics` (TokenReview, SubjectAccessReview); `0`
    /// disables.
    #[arg(long, default_value = ":8443", value_parser = parse_listen_address)]
    pub diagnostics_address: ListenAddress,

    /// Serve `/metrics` as plain HTTP to anyone who reaches the port, without authentication or
    /// authorization: for local use (tests, the sim, a port-forward), not in a cluster.
    #[arg(long)]
    pub insecure_diagnostics: bool,

    /// HTTPS port of the admission webhooks; 0 disables them.
    #[arg(long, default_value_t = 9443)]
    pub webhook_port: u16,

    /// Directory holding the webhook serving certificate as `tls.crt` and `tls.key`; re-read
    /// every 30 s, so rotated certificates are picked up without a restart.
    #[arg(long, default_value = "/tmp/k8s-webhook-server/serving-certs")]
    pub webhook_cert_dir: PathBuf,

    /// Average requests per second to the Kubernetes API (default: unlimited).
    #[arg(long)]
    pub kube_api_qps: Option<f64>,

    /// Most requests sent back to back before `--kube-api-qps` paces them (default: the QPS,
    /// rounded up).
    #[arg(long)]
    pub kube_api_burst: Option<u32>,

    /// Log line format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// More log detail: -v debug, -vv trace (RUST_LOG, when set, wins).
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count)]
    pub verbosity: u8,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Where a server listens, or that it is off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListenAddress {
    Disabled,
    At(SocketAddr),
}

impl ListenAddress {
    /// The socket address, unless disabled.
    pub fn socket_addr(self) -> Option<SocketAddr> {
        match self {
            ListenAddress::Disabled => None,
            ListenAddress::At(addr) => Some(addr),
        }
    }
}

/// A flag value that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--{flag}: {message}")]
pub struct ArgsError {
    pub flag: &'static str,
    pub message: String,
}

impl ArgsError {
    fn new(flag: &'static str, message: impl Into<String>) -> Self {
        ArgsError {
            flag,
            message: message.into(),
        }
    }
}

/// The label [`ManagerArgs::watch_filter`] selects on.
pub const WATCH_FILTER_LABEL: &str = "cluster.x-k8s.io/watch-filter";

impl ManagerArgs {
    /// Cross-flag checks clap cannot express.
    pub fn validate(&self) -> Result<(), ArgsError> {
        // Every cross-flag rule in one place, in flag order: a list of checks, read top to bottom.
        let lease = self.leader_elect_lease_duration;
        let renew = self.leader_elect_renew_deadline;
        let retry = self.leader_elect_retry_period;
        if retry.is_zero() {
            return Err(ArgsError::new("leader-elect-retry-period", "must be positive"));
        }
        // client-go's rule: a renewal attempt (retry period plus jitter) fits in the deadline,
        // and the deadline ends before the lease can expire under followers' eyes.
        if renew.as_secs_f64() <= retry.as_secs_f64() * 1.2 {
            return Err(ArgsError::new(
                "leader-elect-renew-deadline",
                format!(
                    "{} must be longer than 1.2 × --leader-elect-retry-period ({})",
                    duration::format(renew),
                    duration::format(retry)
                ),
            ));
        }
        if lease <= renew {
            return Err(ArgsError::new(
                "leader-elect-lease-duration",
                format!(
                    "{} must be longer than --leader-elect-renew-deadline ({})",
                    duration::format(lease),
                    duration::format(renew)
                ),
            ));
        }
        if let Some(id) = &self.leader_election_id
            && !is_dns_subdomain(id)
        {
            return Err(ArgsError::new(
                "leader-election-id",
                format!("{id:?} is not a valid Lease name (lower-case DNS subdomain)"),
            ));
        }
        if !is_dns_label(&self.leader_election_namespace) {
            return Err(ArgsError::new(
                "leader-election-namespace",
                format!("{:?} is not a namespace name", self.leader_election_namespace),
            ));
        }
        if let Some(ns) = self.namespace.iter().find(|ns| !is_dns_label(ns)) {
            return Err(ArgsError::new(
                "namespace",
                format!("{ns:?} is not a namespace name"),
            ));
        }
        if let Some(twice) = self
            .namespace
            .iter()
            .enumerate()
            .find(|(i, ns)| self.namespace[..*i].contains(ns))
            .map(|(_, ns)| ns)
        {
            return Err(ArgsError::new("namespace", format!("{twice:?} is named twice")));
        }
        if let Some(filter) = &self.watch_filter
            && !is_label_value(filter)
        {
            return Err(ArgsError::new(
                "watch-filter",
                format!(
                    "{filter:?} is not a label value (up to 63 of [A-Za-z0-9_.-], starting and ending alphanumeric)"
                ),
            ));
        }
        if self.sync_period.is_zero() {
            return Err(ArgsError::new("sync-period", "must be positive"));
        }
        if let Some(qps) = self.kube_api_qps
            && !(qps.is_finite() && qps > 0.0)
        {
            return Err(ArgsError::new(
                "kube-api-qps",
                format!("{qps} must be a positive number"),
            ));
        }
        if self.kube_api_burst == Some(0) {
            return Err(ArgsError::new("kube-api-burst", "must be at least 1"));
        }
        if self.kube_api_burst.is_some() && self.kube_api_qps.is_none() {
            return Err(ArgsError::new(
                "kube-api-burst",
                "only limits bursts above --kube-api-qps, which is not set (requests are unlimited)",
            ));
        }
        Ok(())
    }

    /// The Lease name: `--leader-election-id`, else the binary's default.
    pub fn lease_name(&self, default: &str) -> String {
        self.leader_election_id
            .clone()
            .unwrap_or_else(|| default.to_string())
    }

    /// The label selector for `--watch-filter`, if set.
    pub fn watch_filter_selector(&self) -> Option<String> {
        self.watch_filter
            .as_ref()
            .map(|value| format!("{WATCH_FILTER_LABEL}={value}"))
    }
}

fn parse_duration(value: &str) -> Result<Duration, String> {
    duration::parse(value).map_err(|e| e.to_string())
}

/// Go's listen address forms: `:9440` (all interfaces), `127.0.0.1:9440`, `[::1]:9440`, and `0`
/// for off, as controller-runtime reads it.
pub fn parse_listen_address(value: &str) -> Result<ListenAddress, String> {
    let value = value.trim();
    if value == "0" {
        return Ok(ListenAddress::Disabled);
    }
    if let Some(port) = value.strip_prefix(':') {
        let port: u16 = port
            .parse()
            .map_err(|_| format!("{value:?}: the port must be a number up to 65535"))?;
        return Ok(ListenAddress::At(SocketAddr::new(
            IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            port,
        )));
    }
    if let Some(port) = value.strip_prefix("localhost:") {
        let port: u16 = port
            .parse()
            .map_err(|_| format!("{value:?}: the port must be a number up to 65535"))?;
        return Ok(ListenAddress::At(SocketAddr::new(
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            port,
        )));
    }
    value.parse().map(ListenAddress::At).map_err(|_| {
        format!("{value:?} is not an address to listen on: use :PORT, IP:PORT, [IPv6]:PORT or 0 (off)")
    })
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// A Kubernetes label value (empty is allowed by Kubernetes, but selects nothing useful here).
fn is_label_value(s: &str) -> bool {
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    !s.is_empty()
        && s.len() <= 63
        && alnum(s.chars().next())
        && alnum(s.chars().last())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ManagerArgs,
    }

    fn parse(extra: &[&str]) -> Result<ManagerArgs, clap::Error> {
        let mut argv = vec!["test"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).map(|cli| cli.args)
    }

    #[test]
    fn defaults_are_cluster_api_defaults() {
        let args = parse(&[]).unwrap();
        assert!(!args.leader_elect);
        assert_eq!(args.leader_elect_lease_duration, Duration::from_secs(15));
        assert_eq!(args.leader_elect_renew_deadline, Duration::from_secs(10));
        assert_eq!(args.leader_elect_retry_period, Duration::from_secs(2));
        assert_eq!(args.concurrency, 50);
        assert_eq!(args.sync_period, Duration::from_secs(600));
        assert_eq!(
            args.health_addr,
            ListenAddress::At("0.0.0.0:9440".parse().unwrap())
        );
        assert_eq!(
            args.diagnostics_address,
            ListenAddress::At("0.0.0.0:8443".parse().unwrap())
        );
        assert_eq!(args.webhook_port, 9443);
        assert!(
            !args.insecure_diagnostics,
            "metrics are guarded unless asked otherwise"
        );
        assert_eq!(
            args.webhook_cert_dir,
            PathBuf::from("/tmp/k8s-webhook-server/serving-certs")
        );
        assert_eq!(args.log_format, LogFormat::Text);
        assert_eq!(args.verbosity, 0);
        args.validate().unwrap();
    }

    #[test]
    fn flags_parse() {
        let args = parse(&[
            "--leader-elect",
            "--leader-elect-lease-duration=4s",
            "--leader-elect-renew-deadline=3s",
            "--leader-elect-retry-period=500ms",
            "--leader-election-id=my-lease",
            "--leader-election-namespace=capi-system",
            "--namespace=team-a",
            "--watch-filter=blue",
            "--concurrency=3",
            "--sync-period=1m",
            "--health-addr=127.0.0.1:0",
            "--diagnostics-address=0",
            "--insecure-diagnostics",
            "--webhook-port=0",
            "--webhook-cert-dir=/certs",
            "--kube-api-qps=20",
            "--kube-api-burst=30",
            "--log-format=json",
            "-vv",
        ])
        .unwrap();
        args.validate().unwrap();
        assert_eq!(args.leader_elect_retry_period, Duration::from_millis(500));
        assert_eq!(args.lease_name("default-id"), "my-lease");
        assert_eq!(args.namespace, ["team-a"]);
        let several = parse(&["--namespace=team-a,team-b", "--namespace=team-c"]).unwrap();
        several.validate().unwrap();
        assert_eq!(several.namespace, ["team-a", "team-b", "team-c"]);
        assert_eq!(
            args.watch_filter_selector().as_deref(),
            Some("cluster.x-k8s.io/watch-filter=blue")
        );
        assert_eq!(args.diagnostics_address, ListenAddress::Disabled);
        assert!(args.insecure_diagnostics);
        assert_eq!(args.log_format, LogFormat::Json);
        assert_eq!(args.verbosity, 2);
        assert_eq!(args.kube_api_qps, Some(20.0));
    }

    #[test]
    fn bad_values_name_their_flag() {
        assert!(parse(&["--sync-period=10"]).is_err());
        assert!(parse(&["--concurrency=0"]).is_err());
        assert!(parse(&["--health-addr=somewhere"]).is_err());
        for (flags, flag) in [
            (
                vec!["--leader-elect-renew-deadline=20s"],
                "leader-elect-lease-duration",
            ),
            (
                vec!["--leader-elect-retry-period=9s"],
                "leader-elect-renew-deadline",
            ),
            (vec!["--watch-filter=-x"], "watch-filter"),
            (vec!["--namespace=Team"], "namespace"),
            (vec!["--namespace=a,Team"], "namespace"),
            (vec!["--namespace=a,b,a"], "namespace"),
            (vec!["--namespace=a,,b"], "namespace"),
            (vec!["--leader-election-id=a_b"], "leader-election-id"),
            (vec!["--kube-api-qps=0"], "kube-api-qps"),
            (vec!["--kube-api-burst=5"], "kube-api-burst"),
            (vec!["--sync-period=0s"], "sync-period"),
        ] {
            let err = parse(&flags).unwrap().validate().unwrap_err();
            assert_eq!(err.flag, flag, "{flags:?}: {err}");
            assert!(err.to_string().starts_with(&format!("--{flag}: ")), "{err}");
        }
    }

    #[test]
    fn listen_addresses() {
        assert_eq!(parse_listen_address("0"), Ok(ListenAddress::Disabled));
        assert_eq!(
            parse_listen_address(":8080"),
            Ok(ListenAddress::At("0.0.0.0:8080".parse().unwrap()))
        );
        assert_eq!(
            parse_listen_address("localhost:1"),
            Ok(ListenAddress::At("127.0.0.1:1".parse().unwrap()))
        );
        assert_eq!(
            parse_listen_address("[::1]:2"),
            Ok(ListenAddress::At("[::1]:2".parse().unwrap()))
        );
        for bad in [":", ":99999", "host:1", "1.2.3.4"] {
            assert!(parse_listen_address(bad).is_err(), "{bad}");
        }
    }
}
