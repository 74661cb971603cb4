//! The files etcdadm leaves on a member: `/etc/etcd/etcd.env`, the etcd unit and
//! `/etc/etcd/etcdctl.env`, with upstream's keys and layout. Pure rendering.

use std::path::Path;

use etcdadm_shared::names::{client_url, peer_url};

/// Where upstream etcdadm writes its files.
pub const ENV_FILE: &str = "/etc/etcd/etcd.env";
pub const ETCDCTL_ENV_FILE: &str = "/etc/etcd/etcdctl.env";
pub const UNIT_FILE: &str = "/etc/systemd/system/etcd.service";
pub const UNIT_NAME: &str = "etcd.service";

/// How the member enters its cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterState {
    /// `init`: a new one-member cluster with this token.
    New { token: String },
    /// `join`: an existing cluster.
    Existing,
}

/// Everything `etcd.env` says about a member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberConfig {
    pub name: String,
    /// Address etcd advertises (the machine IP).
    pub advertise_address: String,
    /// Address etcd listens on (the machine IP unless `--bind-address` says otherwise).
    pub listen_address: String,
    pub certs_dir: String,
    pub data_dir: String,
    /// `name=peerURL,...` including this member.
    pub initial_cluster: String,
    pub state: ClusterState,
    pub gomaxprocs: usize,
}

impl MemberConfig {
    pub fn peer_url(&self) -> String {
        peer_url(&self.advertise_address)
    }

    pub fn client_url(&self) -> String {
        client_url(&self.advertise_address)
    }
}

/// `/etc/etcd/etcd.env`.
pub fn render_env_file(config: &MemberConfig) -> String {
    let (state, token) = match &config.state {
        ClusterState::New { token } => ("new", format!("ETCD_INITIAL_CLUSTER_TOKEN={token}\n")),
        ClusterState::Existing => ("existing", String::new()),
    };
    let certs = config.certs_dir.trim_end_matches('/');
    format!(
        "ETCD_NAME={name}\n\n\
         # Initial cluster configuration\n\
         ETCD_INITIAL_CLUSTER={initial_cluster}\n\
         {token}\
         ETCD_INITIAL_CLUSTER_STATE={state}\n\n\
         # Peer configuration\n\
         ETCD_INITIAL_ADVERTISE_PEER_URLS={advertise_peer}\n\
         ETCD_LISTEN_PEER_URLS={listen_peer}\n\n\
         ETCD_CLIENT_CERT_AUTH=true\n\
         ETCD_PEER_CERT_FILE={certs}/peer.crt\n\
         ETCD_PEER_KEY_FILE={certs}/peer.key\n\
         ETCD_PEER_TRUSTED_CA_FILE={certs}/ca.crt\n\n\
         # Client/server configuration\n\
         ETCD_ADVERTISE_CLIENT_URLS={advertise_client}\n\
         ETCD_LISTEN_CLIENT_URLS={listen_client}\n\n\
         ETCD_PEER_CLIENT_CERT_AUTH=true\n\
         ETCD_CERT_FILE={certs}/server.crt\n\
         ETCD_KEY_FILE={certs}/server.key\n\
         ETCD_TRUSTED_CA_FILE={certs}/ca.crt\n\n\
         # Other\n\
         ETCD_DATA_DIR={data_dir}\n\
         ETCD_STRICT_RECONFIG_CHECK=true\n\
         GOMAXPROCS={gomaxprocs}\n",
        name = config.name,
        initial_cluster = config.initial_cluster,
        advertise_peer = config.peer_url(),
        listen_peer = peer_url(&config.listen_address),
        advertise_client = config.client_url(),
        listen_client = client_url(&config.listen_address),
        data_dir = config.data_dir,
        gomaxprocs = config.gomaxprocs,
    )
}

/// The etcd systemd unit, as upstream writes it.
pub fn render_unit_file(etcd_executable: &Path) -> String {
    format!(
        "[Unit]\nDescription=etcd\nDocumentation=https://github.com/coreos/etcd\n\
         Conflicts=etcd-member.service\nConflicts=etcd2.service\n\n\
         [Service]\nEnvironmentFile={ENV_FILE}\nExecStart={}\n\n\
         Type=notify\nTimeoutStartSec=0\nRestart=on-failure\nRestartSec=5s\n\n\
         LimitNOFILE=65536\nNice=-10\nIOSchedulingClass=best-effort\nIOSchedulingPriority=2\n\n\
         [Install]\nWantedBy=multi-user.target\n",
        etcd_executable.display()
    )
}

/// `/etc/etcd/etcdctl.env`.
pub fn render_etcdctl_env(certs_dir: &str) -> String {
    let certs = certs_dir.trim_end_matches('/');
    format!(
        "export ETCDCTL_API=3\n\nexport ETCDCTL_CACERT={certs}/ca.crt\n\
         export ETCDCTL_CERT={certs}/etcdctl-etcd-client.crt\n\
         export ETCDCTL_KEY={certs}/etcdctl-etcd-client.key\n\nexport ETCDCTL_DIAL_TIMEOUT=3s\n"
    )
}

/// `name=peerURL` for every peer URL of every member, comma separated, as etcd expects.
pub fn initial_cluster<'a>(members: impl IntoIterator<Item = (&'a str, &'a [String])>) -> String {
    members
        .into_iter()
        .flat_map(|(name, urls)| urls.iter().map(move |url| format!("{name}={url}")))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::systemd::unit::{RestartPolicy, ServiceType, parse_env_file, parse_unit};

    fn config(state: ClusterState) -> MemberConfig {
        MemberConfig {
            name: "m1".into(),
            advertise_address: "127.0.1.5".into(),
            listen_address: "127.0.1.5".into(),
            certs_dir: "/etc/etcd/pki".into(),
            data_dir: "/var/lib/etcd".into(),
            initial_cluster: "m1=https://127.0.1.5:2380".into(),
            state,
            gomaxprocs: 2,
        }
    }

    #[test]
    fn init_env_file_has_upstreams_keys() {
        let env = parse_env_file(&render_env_file(&config(ClusterState::New {
            token: "t1".into(),
        })));
        let get = |key: &str| env.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
        assert_eq!(get("ETCD_NAME"), Some("m1"));
        assert_eq!(get("ETCD_INITIAL_CLUSTER_STATE"), Some("new"));
        assert_eq!(get("ETCD_INITIAL_CLUSTER_TOKEN"), Some("t1"));
        assert_eq!(get("ETCD_LISTEN_CLIENT_URLS"), Some("https://127.0.1.5:2379"));
        assert_eq!(get("ETCD_ADVERTISE_CLIENT_URLS"), Some("https://127.0.1.5:2379"));
        assert_eq!(get("ETCD_LISTEN_PEER_URLS"), Some("https://127.0.1.5:2380"));
        assert_eq!(get("ETCD_CLIENT_CERT_AUTH"), Some("true"));
        assert_eq!(get("ETCD_PEER_CLIENT_CERT_AUTH"), Some("true"));
        assert_eq!(get("ETCD_STRICT_RECONFIG_CHECK"), Some("true"));
        assert_eq!(get("ETCD_PEER_TRUSTED_CA_FILE"), Some("/etc/etcd/pki/ca.crt"));
        assert_eq!(get("ETCD_DATA_DIR"), Some("/var/lib/etcd"));
    }

    #[test]
    fn join_env_file_has_no_token() {
        let env = render_env_file(&config(ClusterState::Existing));
        assert!(env.contains("ETCD_INITIAL_CLUSTER_STATE=existing\n"));
        assert!(!env.contains("TOKEN"));
    }

    #[test]
    fn unit_file_reads_back_as_notify_with_restart_on_failure() {
        let unit = parse_unit(UNIT_NAME, &[render_unit_file(Path::new("/opt/bin/etcd"))]).unwrap();
        assert_eq!(unit.service_type, ServiceType::Notify);
        assert_eq!(unit.restart, RestartPolicy::OnFailure);
        assert_eq!(unit.exec_start, vec!["/opt/bin/etcd".to_string()]);
    }

    #[test]
    fn initial_cluster_lists_every_peer_url() {
        let a = vec!["https://a:2380".to_string()];
        let b = vec!["https://b:2380".to_string()];
        assert_eq!(
            initial_cluster([("a", a.as_slice()), ("b", b.as_slice())]),
            "a=https://a:2380,b=https://b:2380"
        );
    }
}
