//! Reading Bottlerocket user data the way a Bottlerocket machine and the EKS Anywhere bootstrap
//! image read it: the TOML settings, the `kubeadm-bootstrap` host container's base64 user data
//! (YAML: `write_files` and a one-string `runcmd`), and the `EtcdadmInit`/`EtcdadmJoin` words.
//!
//! Pure: text in, [`BottlerocketMachine`] out. What the image would refuse (a missing word, a
//! list where it expects one string) is an error naming it.

use base64::Engine;
use serde::Deserialize;

use crate::error::MachineError;

/// The host container the bootstrap image runs as.
pub const BOOTSTRAP_CONTAINER: &str = "kubeadm-bootstrap";

/// What the sim takes from the settings.
#[derive(Debug, Clone, PartialEq)]
pub struct BottlerocketMachine {
    /// `settings.network.hostname`.
    pub hostname: Option<String>,
    /// The kubeadm-bootstrap host container's decoded user data.
    pub bootstrap: BootstrapUserData,
}

/// The bootstrap image's user data: only these keys are read.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct BootstrapUserData {
    #[serde(default)]
    pub write_files: Vec<BootstrapFile>,
    pub runcmd: String,
}

/// One file the image writes: content as is (it knows no encodings), permissions in octal
/// (`0640` when absent), the owner looked up in the container's user database.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct BootstrapFile {
    pub path: String,
    #[serde(default)]
    pub owner: String,
    #[serde(default)]
    pub permissions: String,
    #[serde(default)]
    pub content: String,
}

impl BootstrapFile {
    /// The mode bits (`0640` when absent, as the image defaults).
    pub fn mode(&self) -> Result<u32, MachineError> {
        let digits = if self.permissions.is_empty() {
            "0640"
        } else {
            &self.permissions
        };
        u32::from_str_radix(digits, 8)
            .ok()
            .filter(|mode| *mode <= 0o7777)
            .ok_or_else(|| {
                MachineError::UserData(format!(
                    "write_files {}: permissions {digits:?} is not an octal file mode",
                    self.path
                ))
            })
    }
}

/// The `runcmd` line, split as the image splits it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EtcdadmWords {
    Init {
        repository: String,
        version: String,
        cipher_suites: String,
    },
    Join {
        repository: String,
        version: String,
        cipher_suites: String,
        endpoint: String,
    },
}

impl EtcdadmWords {
    /// Parse `EtcdadmInit <repository> <version> <cipher suites>` or `EtcdadmJoin ... <endpoint>`:
    /// exactly those word counts, as the image requires.
    pub fn parse(runcmd: &str) -> Result<EtcdadmWords, MachineError> {
        let words: Vec<&str> = runcmd.split_whitespace().collect();
        let invalid = |what: &str| {
            MachineError::UserData(format!("invalid bootstrap etcdadm {what} command [{runcmd}]"))
        };
        match words.as_slice() {
            ["EtcdadmInit", repository, version, cipher_suites] => Ok(EtcdadmWords::Init {
                repository: repository.to_string(),
                version: version.to_string(),
                cipher_suites: cipher_suites.to_string(),
            }),
            ["EtcdadmInit", ..] => Err(invalid("init")),
            ["EtcdadmJoin", repository, version, cipher_suites, endpoint] => Ok(EtcdadmWords::Join {
                repository: repository.to_string(),
                version: version.to_string(),
                cipher_suites: cipher_suites.to_string(),
                endpoint: endpoint.to_string(),
            }),
            ["EtcdadmJoin", ..] => Err(invalid("join")),
            _ => Err(invalid("bootstrap")),
        }
    }

    pub fn version(&self) -> &str {
        match self {
            EtcdadmWords::Init { version, .. } | EtcdadmWords::Join { version, .. } => version,
        }
    }

    pub fn cipher_suites(&self) -> &str {
        match self {
            EtcdadmWords::Init { cipher_suites, .. } | EtcdadmWords::Join { cipher_suites, .. } => {
                cipher_suites
            }
        }
    }
}

/// Whether `user_data` is Bottlerocket settings rather than cloud-config (which must start with
/// `#cloud-config` or `## template: jinja`).
pub fn is_bottlerocket(user_data: &str) -> bool {
    user_data
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty())
        .is_some_and(|line| line.starts_with('['))
}

/// Parse the settings and decode the bootstrap container's user data.
pub fn parse_user_data(user_data: &str) -> Result<BottlerocketMachine, MachineError> {
    let settings: toml::Table = toml::from_str(user_data)
        .map_err(|e| MachineError::UserData(format!("Bottlerocket user data is not TOML: {e}")))?;
    let settings = settings.get("settings");
    let hostname = settings
        .and_then(|s| s.get("network"))
        .and_then(|n| n.get("hostname"))
        .and_then(toml::Value::as_str)
        .map(str::to_string);
    let container = settings
        .and_then(|s| s.get("host-containers"))
        .and_then(|h| h.get(BOOTSTRAP_CONTAINER))
        .ok_or_else(|| {
            MachineError::UserData(format!(
                "no [settings.host-containers.{BOOTSTRAP_CONTAINER}]: nothing would bootstrap this machine"
            ))
        })?;
    for (key, expected) in [("enabled", true), ("superpowered", true)] {
        if container.get(key).and_then(toml::Value::as_bool) != Some(expected) {
            return Err(MachineError::UserData(format!(
                "[settings.host-containers.{BOOTSTRAP_CONTAINER}] must have {key} = {expected}"
            )));
        }
    }
    let encoded = container
        .get("user-data")
        .and_then(toml::Value::as_str)
        .ok_or_else(|| MachineError::UserData(format!("{BOOTSTRAP_CONTAINER} has no user-data")))?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|e| MachineError::UserData(format!("{BOOTSTRAP_CONTAINER} user-data is not base64: {e}")))?;
    let text = String::from_utf8(decoded)
        .map_err(|e| MachineError::UserData(format!("{BOOTSTRAP_CONTAINER} user-data is not UTF-8: {e}")))?;
    let bootstrap: BootstrapUserData = serde_saphyr::from_str(&text).map_err(|e| {
        MachineError::UserData(format!(
            "{BOOTSTRAP_CONTAINER} user-data is not what the bootstrap image reads (write_files, runcmd as one string): {e}"
        ))
    })?;
    Ok(BottlerocketMachine { hostname, bootstrap })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(container_user_data: &str) -> String {
        let encoded = base64::engine::general_purpose::STANDARD.encode(container_user_data);
        format!(
            "[settings.host-containers.admin]\nenabled = true\nsuperpowered = true\n\n\
             [settings.host-containers.kubeadm-bootstrap]\nenabled = true\nsuperpowered = true\n\
             source = \"b:v1\"\nuser-data = \"{encoded}\"\n\n[settings.network]\nhostname = \"m1\"\n"
        )
    }

    #[test]
    fn reads_the_hostname_files_and_line() {
        let inner = "#cloud-config\nwrite_files:\n  - path: \"/var/lib/etcd/pki/ca.crt\"\n    owner: \"root:root\"\n    \
                     permissions: \"0600\"\n    content: |\n      CERT\nruncmd: \"EtcdadmInit r/etcd 3.4.23 TLS_A,TLS_B\"\n";
        let machine = parse_user_data(&settings(inner)).unwrap();
        assert!(is_bottlerocket(&settings(inner)));
        assert_eq!(machine.hostname.as_deref(), Some("m1"));
        assert_eq!(machine.bootstrap.write_files[0].content, "CERT\n");
        assert_eq!(machine.bootstrap.write_files[0].mode().unwrap(), 0o600);
        assert_eq!(
            EtcdadmWords::parse(&machine.bootstrap.runcmd).unwrap(),
            EtcdadmWords::Init {
                repository: "r/etcd".into(),
                version: "3.4.23".into(),
                cipher_suites: "TLS_A,TLS_B".into()
            }
        );
    }

    #[test]
    fn what_the_image_refuses_is_refused() {
        let list = "#cloud-config\nruncmd:\n  - EtcdadmInit r 3.4.23 TLS_A\n";
        assert!(
            parse_user_data(&settings(list)).is_err(),
            "runcmd must be one string"
        );
        for bad in [
            "EtcdadmInit r 3.4.23",
            "EtcdadmJoin r 3.4.23 TLS_A",
            "etcdadm init",
            "",
        ] {
            assert!(EtcdadmWords::parse(bad).is_err(), "{bad}");
        }
        assert!(!is_bottlerocket("## template: jinja\n#cloud-config\n"));
        let without = "[settings.network]\nhostname = \"m1\"\n";
        assert!(
            parse_user_data(without)
                .unwrap_err()
                .to_string()
                .contains("kubeadm-bootstrap")
        );
        let mode = BootstrapFile {
            path: "/x".into(),
            owner: String::new(),
            permissions: String::new(),
            content: String::new(),
        };
        assert_eq!(mode.mode().unwrap(), 0o640);
    }
}
