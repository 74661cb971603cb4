//! The scale benchmark's fake members must speak what the controller's real etcd client speaks,
//! over mutual TLS that refuses strangers; otherwise its figures measure nothing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod lifecycle_support;

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcdadm_shared::etcd::MemberClient;
use etcdadm_shared::names;
use etcdadm_shared::pki::CertificateAuthority;
use etcdadm_sim::fake_etcd::{self, FakeCluster, ProbeLog};
use lifecycle_support::client_tls;

#[tokio::test]
async fn fake_members_answer_the_real_client_and_only_over_mutual_tls() {
    let ca = CertificateAuthority::generate("etcd-ca").unwrap();
    let ips: Vec<IpAddr> = (1..=3)
        .map(|i| format!("127.0.10.{i}").parse().unwrap())
        .collect();
    let cluster = FakeCluster {
        members: ips
            .iter()
            .enumerate()
            .map(|(i, ip)| (format!("m{i}"), *ip))
            .collect(),
    };
    let log = Arc::new(Mutex::new(ProbeLog::default()));
    fake_etcd::serve(&ca, &[cluster], log.clone()).await.unwrap();

    let tls = client_tls(&ca);
    let mut ids = vec![];
    let mut leaders = vec![];
    for ip in &ips {
        let url = names::client_url(&ip.to_string());
        let member = MemberClient::new(&url, &tls, Duration::from_secs(5)).unwrap();
        let health = member.health().await.unwrap();
        assert!(health.healthy, "{url}: {health:?}");
        let status = member.status().await.unwrap();
        ids.push(status.member_id);
        leaders.push(status.leader_id);
        let listed = member.member_list().await.unwrap();
        let names: Vec<&str> = listed.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["m0", "m1", "m2"]);
        assert_eq!(listed[1].peer_urls, [names::peer_url("127.0.10.2")]);
        assert_eq!(listed[1].client_urls, [names::client_url("127.0.10.2")]);
        assert!(member.alarms().await.unwrap().is_empty());
        // A second Status is what the log times.
        member.status().await.unwrap();
    }
    assert_eq!(
        ids.iter().collect::<std::collections::BTreeSet<_>>().len(),
        3,
        "{ids:?}"
    );
    assert!(
        leaders.iter().all(|l| *l == Some(ids[0])),
        "{leaders:?} vs {ids:?}"
    );
    {
        let log = log.lock().unwrap();
        assert_eq!(log.gaps().len(), 3);
        assert_eq!(log.probed.len(), 3);
        assert_eq!(log.health_calls, 3);
        assert_eq!(log.member_list_calls, 3);
    }

    // A client certificate from another CA gets no verdict at all.
    let stranger = CertificateAuthority::generate("other-ca").unwrap();
    let mut foreign = client_tls(&stranger);
    foreign.ca_pem = ca.cert_pem().to_string();
    let member =
        MemberClient::new(&names::client_url("127.0.10.1"), &foreign, Duration::from_secs(5)).unwrap();
    assert!(member.health().await.is_err());
    assert!(member.status().await.is_err());
}
