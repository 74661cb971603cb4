#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! An EtcdadmCluster with `format: bottlerocket`, with both real controller binaries and real
//! etcd: the EtcdadmCluster passes the format to every member's EtcdadmConfig, the bootstrap
//! controller writes Bottlerocket settings (not cloud-config) into the init and join data
//! Secrets, and the process machines bootstrap from them as the EKS Anywhere bootstrap container
//! would, until the cluster is Ready with three members named after their Machines.

mod lifecycle_support;

use std::collections::BTreeSet;
use std::time::Duration;

use etcdadm_shared::api::EtcdadmConfig;
use etcdadm_shared::names;
use etcdadm_shared::testing::TempDir;
use etcdadm_sim_machines::bottlerocket::{EtcdadmWords, parse_user_data};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::Api;
use lifecycle_support::*;
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(180);
const CIPHER_SUITES: &str = "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384";

fn secret_text(secret: &Secret, key: &str) -> String {
    let bytes = &secret.data.as_ref().unwrap()[key].0;
    String::from_utf8(bytes.clone()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bottlerocket_cluster_of_three_bootstraps_from_bottlerocket_data_secrets() {
    let work = TempDir::new("sim-bottlerocket");
    let plane = start_plane(22, &work, Duration::from_secs(1)).await;
    let client = plane.client.clone();
    // What EKS Anywhere applies for etcd on Bottlerocket; the tag names the host's etcd 3.4.
    let config_spec = json!({
        "format": "bottlerocket",
        "bottlerocketConfig": {
            "etcdImage": "public.ecr.aws/eks-distro/etcd-io/etcd:v3.4.23-eks-1-28-9",
            "bootstrapImage": "public.ecr.aws/l0g8r8j6/bottlerocket-bootstrap:v1-28-9-eks-a-60",
            "pauseImage": "public.ecr.aws/eks-distro/kubernetes/pause:v1.28.9-eks-1-28-9",
        },
        "cipherSuites": CIPHER_SUITES,
        "users": [{"name": "ec2-user", "sshAuthorizedKeys": ["ssh-ed25519 AAAA ops"], "sudo": "ALL=(ALL) NOPASSWD:ALL"}],
    });
    create(&client, "br", 3, true, config_spec, json!({})).await;
    let etcd = wait_settled(&client, "br", 3, TIMEOUT, &work).await;
    let status = etcd.status.clone().unwrap();
    assert!(status.initialized);
    assert_eq!(status.members.iter().filter(|m| m.is_leader).count(), 1);

    let machines = machines(&client, "br").await;
    let machine_names: BTreeSet<String> = machines.iter().map(|m| m.name_any()).collect();
    let member_names: BTreeSet<String> = status.members.iter().map(|m| m.name.clone()).collect();
    assert_eq!(
        member_names, machine_names,
        "member names come from the hostname setting"
    );

    let configs = Api::<EtcdadmConfig>::default_namespaced(client.clone());
    let secrets = Api::<Secret>::default_namespaced(client.clone());
    let mut inits = vec![];
    let mut joins = vec![];
    for machine in &machines {
        let name = machine.name_any();
        let config = configs.get(&name).await.unwrap();
        assert_eq!(
            config.spec.format().as_str(),
            "bottlerocket",
            "the EtcdadmCluster passed the format through"
        );
        let data_secret = config
            .status
            .as_ref()
            .and_then(|s| s.data_secret_name.clone())
            .unwrap();
        let secret = secrets.get(&data_secret).await.unwrap();
        assert_eq!(
            secret_text(&secret, names::DATA_SECRET_FORMAT_KEY),
            "bottlerocket"
        );
        let user_data = secret_text(&secret, names::DATA_SECRET_VALUE_KEY);
        assert!(
            user_data.starts_with("[settings.host-containers.admin]\n"),
            "Bottlerocket settings, not cloud-config: {user_data}"
        );
        let parsed = parse_user_data(&user_data).unwrap_or_else(|e| panic!("{name}: {e}\n{user_data}"));
        assert_eq!(parsed.hostname.as_deref(), Some(name.as_str()));
        let paths: Vec<&str> = parsed
            .bootstrap
            .write_files
            .iter()
            .map(|f| f.path.as_str())
            .collect();
        assert_eq!(paths, ["/var/lib/etcd/pki/ca.crt", "/var/lib/etcd/pki/ca.key"]);
        let words = EtcdadmWords::parse(&parsed.bootstrap.runcmd).unwrap();
        assert_eq!(words.version(), "3.4.23-eks-1-28-9");
        assert_eq!(words.cipher_suites(), CIPHER_SUITES);
        match words {
            EtcdadmWords::Init { .. } => inits.push(name.clone()),
            EtcdadmWords::Join { endpoint, .. } => {
                assert!(
                    endpoint.starts_with("https://127.0.22.") && endpoint.ends_with(":2379"),
                    "{endpoint}"
                );
                joins.push(name.clone());
            }
        }

        // The machine ran it: etcd under /var/lib/etcd, started once, with the cipher suites.
        let root = work.path().join(format!("machines/{name}"));
        assert!(root.join("var/lib/etcd/data/member").is_dir(), "{name}: data dir");
        let runtime = plane.built_in.as_ref().unwrap();
        let env = runtime.etcd_environment(&name).unwrap();
        assert!(
            env.contains(&("ETCD_CIPHER_SUITES".to_string(), CIPHER_SUITES.to_string())),
            "{name}: {env:?}"
        );
        assert_eq!(
            runtime.etcd_starts(&name).unwrap(),
            1,
            "{name}: etcd was restarted"
        );
    }
    assert_eq!(
        (inits.len(), joins.len()),
        (1, 2),
        "init {inits:?} join {joins:?}"
    );
    drop(plane);
}
