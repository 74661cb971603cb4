//! Which object stores the controller may reach. A store's endpoint is whatever a tenant names,
//! so without a policy the controller would connect wherever it is told, and a snapshot's
//! status would say whether something answered there: the cloud's metadata service, a
//! link-local address, a Service inside the management cluster. The operator sets the policy
//! with the `--store-*` flags (docs/security.md); link-local and metadata addresses are refused
//! by default. The host is checked as written and every address it resolves to when the
//! controller connects (the resolver refuses the others), so a name that points at a refused
//! address is refused too; the refusal is named in the status.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, OnceLock};

/// A host or a range of addresses, as the flags name them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostRule {
    /// An address range, `10.0.0.0/8` (a single address is a `/32` or `/128`).
    Cidr { network: IpAddr, prefix: u8 },
    /// A host name: exactly this one, or, written `.example.com`, any name under it.
    Name(String),
}

impl HostRule {
    /// Parse one entry of a flag: an address, an address range, a name or `.suffix`.
    pub fn parse(text: &str) -> Result<HostRule, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err("an empty entry".into());
        }
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        if let Ok(ip) = address
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        {
            let ip = canonical(ip);
            let bits = if ip.is_ipv4() { 32 } else { 128 };
            let prefix = match prefix {
                None => bits,
                Some(p) => p
                    .parse::<u8>()
                    .ok()
                    .filter(|p| *p <= bits)
                    .ok_or_else(|| format!("{text:?}: the prefix length must be 0 to {bits}"))?,
            };
            return Ok(HostRule::Cidr {
                network: mask(ip, prefix),
                prefix,
            });
        }
        if prefix.is_some() {
            return Err(format!("{text:?} is neither an address range nor a host name"));
        }
        let name = text.to_ascii_lowercase();
        let labels = name.strip_prefix('.').unwrap_or(&name);
        let plain = labels.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        });
        if !plain {
            return Err(format!("{text:?} is neither an address range nor a host name"));
        }
        Ok(HostRule::Name(name))
    }

    fn matches_ip(&self, ip: IpAddr) -> bool {
        match self {
            HostRule::Cidr { network, prefix } => {
                network.is_ipv4() == ip.is_ipv4() && mask(ip, *prefix) == *network
            }
            HostRule::Name(_) => false,
        }
    }

    fn matches_name(&self, host: &str) -> bool {
        match self {
            HostRule::Name(name) if name.starts_with('.') => host.ends_with(name.as_str()),
            HostRule::Name(name) => host == name,
            HostRule::Cidr { .. } => false,
        }
    }

    /// Whether every address this rule matches is inside `other` (a range).
    fn within(&self, other: &HostRule) -> bool {
        match (self, other) {
            (HostRule::Cidr { network, prefix }, HostRule::Cidr { prefix: outer, .. }) => {
                prefix >= outer && other.matches_ip(*network)
            }
            _ => false,
        }
    }
}

impl std::fmt::Display for HostRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostRule::Cidr { network, prefix } => write!(f, "{network}/{prefix}"),
            HostRule::Name(name) => f.write_str(name),
        }
    }
}

/// An IPv4 address written as IPv6 (`::ffff:169.254.169.254`) is the IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let kept = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(bits & kept))
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let kept = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(bits & kept))
        }
    }
}

/// What is refused unless the operator allows it by an entry inside it: link-local addresses
/// (where clouds serve instance metadata, and nothing a store belongs on) and the other known
/// metadata services.
fn refused_by_default() -> &'static [(HostRule, &'static str)] {
    static RULES: OnceLock<Vec<(HostRule, &'static str)>> = OnceLock::new();
    RULES.get_or_init(|| {
        [
            (
                "169.254.0.0/16",
                "a link-local address (instance metadata lives there)",
            ),
            ("fe80::/10", "a link-local address"),
            ("fd00:ec2::254/128", "the AWS instance metadata service"),
            ("100.100.100.200/32", "the Alibaba Cloud metadata service"),
            ("168.63.129.16/32", "the Azure platform endpoint"),
            ("metadata.google.internal", "the GCE metadata service"),
            ("metadata.goog", "the GCE metadata service"),
        ]
        .into_iter()
        .filter_map(|(rule, why)| HostRule::parse(rule).ok().map(|rule| (rule, why)))
        .collect()
    })
}

/// The operator's store policy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StorePolicy {
    /// Only these hosts are reached (empty: any not refused).
    pub allowed: Vec<HostRule>,
    /// These are never reached.
    pub denied: Vec<HostRule>,
    /// Plain `http://` stores (`insecure: true`) are refused.
    pub deny_insecure: bool,
}

/// Why the policy refuses a store: what it names, never a resolved address (a tenant learns no
/// more of the management cluster's DNS than that a name it chose is refused).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refusal(pub String);

impl StorePolicy {
    /// The policy of this process: the one [`StorePolicy::install`]ed at start, else the default
    /// (link-local and metadata addresses refused, everything else allowed).
    pub fn current() -> Arc<StorePolicy> {
        INSTALLED.get().cloned().unwrap_or_default()
    }

    /// Make `policy` this process's, once, before any store is used (the manager's flags).
    pub fn install(policy: StorePolicy) -> Result<(), String> {
        INSTALLED
            .set(Arc::new(policy))
            .map_err(|_| "a store policy is installed already".to_string())
    }

    /// Whether an endpoint with this scheme and host (as written: a name or an address) may be
    /// reached; addresses it resolves to are checked by [`StorePolicy::check_address`].
    pub fn check_endpoint(&self, scheme: &str, host: &str) -> Result<(), Refusal> {
        if scheme != "https" && self.deny_insecure {
            return Err(Refusal(
                "plain http stores (insecure: true) are not allowed by the controller's store \
                 policy (--store-allow-insecure=false)"
                    .into(),
            ));
        }
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        match host.parse::<IpAddr>() {
            Ok(ip) => self
                .check_address(ip)
                .map_err(|why| Refusal(format!("{host} is {why}"))),
            Err(_) => self.check_name(&host),
        }
    }

    fn check_name(&self, host: &str) -> Result<(), Refusal> {
        let host = host.trim_end_matches('.');
        if let Some(rule) = self.denied.iter().find(|r| r.matches_name(host)) {
            return Err(Refusal(format!(
                "{host} is refused by the controller's store policy (--store-denied-hosts {rule})"
            )));
        }
        let allowed = self.allowed.iter().any(|r| r.matches_name(host));
        if let Some((_, why)) = refused_by_default()
            .iter()
            .find(|(r, _)| r.matches_name(host))
            .filter(|_| !allowed)
        {
            return Err(Refusal(format!(
                "{host} is {why}, which the controller's store policy refuses"
            )));
        }
        // A name the allow list does not name may still resolve into an allowed range.
        let ranges = self.allowed.iter().any(|r| matches!(r, HostRule::Cidr { .. }));
        if !self.allowed.is_empty() && !allowed && !ranges {
            return Err(Refusal(format!(
                "{host} is not among the hosts the controller's store policy allows \
                 (--store-allowed-hosts)"
            )));
        }
        Ok(())
    }

    /// Whether the controller may connect to `ip`; the error completes "<host> is ...".
    pub fn check_address(&self, ip: IpAddr) -> Result<(), String> {
        let ip = canonical(ip);
        if let Some(rule) = self.denied.iter().find(|r| r.matches_ip(ip)) {
            return Err(format!(
                "refused by the controller's store policy (--store-denied-hosts {rule})"
            ));
        }
        let allowing = |inside: Option<&HostRule>| {
            self.allowed
                .iter()
                .any(|r| r.matches_ip(ip) && inside.is_none_or(|outer| r.within(outer)))
        };
        if let Some((_, why)) = refused_by_default()
            .iter()
            .find(|(r, _)| r.matches_ip(ip))
            .filter(|(r, _)| !allowing(Some(r)))
        {
            return Err(format!("{why}, which the controller's store policy refuses"));
        }
        let names_only = self.allowed.iter().all(|r| matches!(r, HostRule::Name(_)));
        if !self.allowed.is_empty() && !names_only && !allowing(None) {
            return Err(
                "outside the addresses the controller's store policy allows (--store-allowed-hosts)".into(),
            );
        }
        Ok(())
    }
}

static INSTALLED: OnceLock<Arc<StorePolicy>> = OnceLock::new();

/// Resolves store host names for the HTTP client, keeping only the addresses the policy allows:
/// the last word on where a request goes, whatever the name resolves to by then.
pub(super) struct PolicyResolver {
    pub(super) policy: Arc<StorePolicy>,
}

impl reqwest::dns::Resolve for PolicyResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.policy.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let resolved: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut refused = None;
            let kept: Vec<SocketAddr> = resolved
                .into_iter()
                .filter(|addr| match policy.check_address(addr.ip()) {
                    Ok(()) => true,
                    Err(why) => {
                        refused = Some(why);
                        false
                    }
                })
                .collect();
            match (kept.is_empty(), refused) {
                (true, Some(why)) => Err(Box::new(Refusal(format!(
                    "{host} resolves to an address that is {why}"
                ))) as Box<dyn std::error::Error + Send + Sync>),
                _ => Ok(Box::new(kept.into_iter()) as reqwest::dns::Addrs),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn rules(entries: &[&str]) -> Vec<HostRule> {
        entries.iter().map(|e| HostRule::parse(e).unwrap()).collect()
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn entries_are_addresses_ranges_names_or_suffixes() {
        assert_eq!(
            HostRule::parse("10.1.2.3/8").unwrap(),
            HostRule::Cidr {
                network: ip("10.0.0.0"),
                prefix: 8
            }
        );
        assert_eq!(HostRule::parse("fd00::1").unwrap().to_string(), "fd00::1/128");
        assert_eq!(
            HostRule::parse("::ffff:169.254.169.254").unwrap().to_string(),
            "169.254.169.254/32"
        );
        assert_eq!(
            HostRule::parse("S3.Example.com").unwrap(),
            HostRule::Name("s3.example.com".into())
        );
        assert_eq!(
            HostRule::parse(".svc.cluster.local").unwrap(),
            HostRule::Name(".svc.cluster.local".into())
        );
        for bad in ["", "10.0.0.0/33", "fd00::/129", "a b", "x/8", "bad_name", "a..b"] {
            assert!(HostRule::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn link_local_and_metadata_addresses_are_refused_by_default_and_named() {
        let policy = StorePolicy::default();
        for (host, words) in [
            (
                "169.254.169.254",
                "169.254.169.254 is a link-local address (instance metadata",
            ),
            ("169.254.170.2", "link-local"),
            ("[fe80::1]", "fe80::1 is a link-local address"),
            ("[fd00:ec2::254]", "the AWS instance metadata service"),
            ("[::ffff:169.254.169.254]", "link-local"),
            ("100.100.100.200", "Alibaba"),
            (
                "metadata.google.internal",
                "metadata.google.internal is the GCE metadata service",
            ),
            ("METADATA.GOOGLE.INTERNAL.", "GCE metadata"),
        ] {
            let refusal = policy.check_endpoint("https", host).unwrap_err().to_string();
            assert!(refusal.contains(words), "{host}: {refusal}");
            assert!(refusal.contains("store policy refuses"), "{host}: {refusal}");
        }
        for host in ["10.0.0.1", "127.0.0.1", "s3.eu-west-1.amazonaws.com", "[fd00::1]"] {
            assert_eq!(policy.check_endpoint("https", host), Ok(()), "{host}");
        }
        assert_eq!(policy.check_endpoint("http", "minio.local"), Ok(()));
    }

    #[test]
    fn the_operator_denies_allows_and_refuses_plain_http() {
        let policy = StorePolicy {
            allowed: rules(&["10.0.0.0/8", ".example.com"]),
            denied: rules(&["10.96.0.0/12", "secret.example.com"]),
            deny_insecure: true,
        };
        assert_eq!(policy.check_endpoint("https", "10.1.2.3"), Ok(()));
        assert_eq!(policy.check_endpoint("https", "s3.example.com"), Ok(()));
        // A name outside the allowed names may resolve into an allowed range.
        assert_eq!(policy.check_endpoint("https", "minio.local"), Ok(()));
        for (scheme, host, words) in [
            (
                "https",
                "10.96.0.10",
                "10.96.0.10 is refused by the controller's store policy (--store-denied-hosts 10.96.0.0/12)",
            ),
            (
                "https",
                "secret.example.com",
                "--store-denied-hosts secret.example.com",
            ),
            (
                "https",
                "192.168.1.1",
                "outside the addresses the controller's store policy allows",
            ),
            ("http", "10.1.2.3", "--store-allow-insecure=false"),
        ] {
            let refusal = policy.check_endpoint(scheme, host).unwrap_err().to_string();
            assert!(refusal.contains(words), "{host}: {refusal}");
        }
        assert!(policy.check_address(ip("192.168.1.1")).is_err());
        assert!(policy.check_address(ip("10.96.1.1")).is_err());
        let names_only = StorePolicy {
            allowed: rules(&["s3.example.com"]),
            ..Default::default()
        };
        assert!(names_only.check_endpoint("https", "s3.example.com").is_ok());
        let refusal = names_only
            .check_endpoint("https", "other.example.com")
            .unwrap_err();
        assert!(refusal.to_string().contains("--store-allowed-hosts"), "{refusal}");
        // Its name allowed, the address it resolves to is checked against the defaults only.
        assert!(names_only.check_address(ip("203.0.113.7")).is_ok());
        assert!(names_only.check_address(ip("169.254.169.254")).is_err());
    }

    #[test]
    fn a_default_refusal_is_lifted_only_by_an_allowed_range_inside_it() {
        let everything = StorePolicy {
            allowed: rules(&["0.0.0.0/0"]),
            ..Default::default()
        };
        assert!(everything.check_address(ip("169.254.169.254")).is_err());
        let link_local_store = StorePolicy {
            allowed: rules(&["169.254.10.0/24", "0.0.0.0/0"]),
            ..Default::default()
        };
        assert!(link_local_store.check_address(ip("169.254.10.5")).is_ok());
        assert!(link_local_store.check_address(ip("169.254.169.254")).is_err());
    }
}
