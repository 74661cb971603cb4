//! The etcd client layer against real multi-member etcd clusters over mutual TLS: what the
//! controller's health checks and membership changes will see from etcd itself.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use etcdadm_shared::etcd::{EtcdError, EtcdTls, Member, MemberClient, Refusal, member_id_hex};
use etcdadm_shared::names::ETCD_CLIENT_PORT;
use etcdadm_shared::pki::{CertificateAuthority, LeafRequest};
use etcdadm_shared::testing::{EtcdMemberProcess, TlsEtcdCluster, free_loopback_ip};

const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Long enough for elections and joins on a loaded 2-core machine.
const CONVERGE: Duration = Duration::from_secs(60);

fn client_tls(ca: &CertificateAuthority, trusted_ca_pem: &str) -> EtcdTls {
    let leaf = ca
        .issue(&LeafRequest::in_memory_client(
            "etcdadm-controller",
            Duration::from_secs(3600),
        ))
        .unwrap();
    EtcdTls {
        ca_pem: trusted_ca_pem.to_string(),
        cert_pem: leaf.cert_pem,
        key_pem: leaf.key_pem,
    }
}

fn clients(cluster: &TlsEtcdCluster, tls: &EtcdTls) -> Vec<MemberClient> {
    cluster
        .client_urls()
        .iter()
        .map(|url| MemberClient::new(url, tls, CALL_TIMEOUT).unwrap())
        .collect()
}

/// [`TlsEtcdCluster::eventually`] within [`CONVERGE`].
async fn eventually<T, F, Fut>(what: &str, cluster: &TlsEtcdCluster, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    cluster.eventually(what, CONVERGE, probe).await
}

async fn wait_healthy(what: &str, cluster: &TlsEtcdCluster, members: &[&MemberClient]) {
    eventually(what, cluster, || async {
        for client in members {
            match client.health().await {
                Ok(h) if h.healthy => {}
                other => return Err(format!("{}: {other:?}", client.endpoint())),
            }
        }
        Ok(())
    })
    .await
}

/// The leader every given member reports, once they all agree on one.
async fn agreed_leader(cluster: &TlsEtcdCluster, members: &[&MemberClient]) -> u64 {
    eventually("members agree on a leader", cluster, || async {
        let mut leaders = BTreeSet::new();
        for client in members {
            let status = client.status().await.map_err(|e| e.to_string())?;
            leaders.insert(status.leader_id);
        }
        match leaders.iter().collect::<Vec<_>>()[..] {
            [Some(leader)] => Ok(*leader),
            _ => Err(format!("leaders reported: {leaders:?}")),
        }
    })
    .await
}

fn assert_tls_or_unreachable(result: Result<impl std::fmt::Debug, EtcdError>, what: &str) {
    match result {
        Err(err @ (EtcdError::Tls { .. } | EtcdError::Unreachable { .. })) => {
            assert!(!err.to_string().is_empty());
        }
        other => panic!("{what}: expected a TLS or unreachable error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_health_status_leadership_tls_and_quorum_loss() {
    let ca = CertificateAuthority::generate("etcd-ca").unwrap();
    let mut cluster = TlsEtcdCluster::start(&ca, 3);
    let tls = client_tls(&ca, ca.cert_pem());
    let members = clients(&cluster, &tls);
    let all: Vec<&MemberClient> = members.iter().collect();
    wait_healthy("3 members healthy", &cluster, &all).await;

    // Status: every member answers for itself, and all follow the same leader.
    let leader = agreed_leader(&cluster, &all).await;
    let mut ids = Vec::new();
    for client in &members {
        let status = client.status().await.unwrap();
        assert!(status.version.starts_with("3."), "{status:?}");
        assert!(!status.is_learner && status.raft_term > 0 && status.raft_index > 0);
        assert!(status.db_size > 0 && status.errors.is_empty(), "{status:?}");
        assert_eq!(status.is_leader(), status.member_id == leader);
        ids.push(status.member_id);
    }
    assert_eq!(ids.iter().collect::<BTreeSet<_>>().len(), 3, "{ids:?}");
    assert!(members[0].alarms().await.unwrap().is_empty());

    // Membership: every member lists the same three started voters, matching our processes.
    for client in &members {
        let mut list = client.member_list().await.unwrap();
        list.sort_by_key(|m| m.id);
        let listed_ids: BTreeSet<_> = list.iter().map(|m| m.id).collect();
        assert_eq!(listed_ids, ids.iter().copied().collect());
        for m in &list {
            assert!(m.is_started() && !m.is_learner, "{m:?}");
            let process = cluster
                .members
                .iter()
                .find(|p| p.name == m.name)
                .unwrap_or_else(|| panic!("unknown member {m:?}"));
            assert_eq!(m.peer_urls, std::slice::from_ref(&process.peer_url));
            assert_eq!(m.client_urls, std::slice::from_ref(&process.client_url));
        }
    }
    let leader_index = ids.iter().position(|id| *id == leader).unwrap();
    let followers: Vec<usize> = (0..3).filter(|i| *i != leader_index).collect();
    let target = ids[followers[0]];

    // MoveLeader sent to a follower is refused, saying to go to the leader.
    let err = members[followers[1]].move_leader(target).await.unwrap_err();
    assert_eq!(err.refusal(), Some(Refusal::NotLeader), "{err}");
    assert!(err.to_string().contains("etcdserver: not leader"), "{err}");
    assert!(err.to_string().contains("current leader"), "{err}");
    assert_eq!(err.category().as_str(), "EtcdRefused");

    // Sent to the leader it moves leadership, and every member sees the new leader.
    members[leader_index].move_leader(target).await.unwrap();
    let now_leading = eventually("leadership moved", &cluster, || async {
        let leader = agreed_leader(&cluster, &all).await;
        if leader == target {
            Ok(leader)
        } else {
            Err(format!("leader still {}", member_id_hex(leader)))
        }
    })
    .await;
    assert_eq!(now_leading, target);

    // A client certificate from another CA gets no answer, only an error.
    let other_ca = CertificateAuthority::generate("other-ca").unwrap();
    let foreign = MemberClient::new(
        &cluster.members[0].client_url,
        &client_tls(&other_ca, ca.cert_pem()),
        CALL_TIMEOUT,
    )
    .unwrap();
    assert_tls_or_unreachable(foreign.health().await, "health with a foreign client cert");
    assert_tls_or_unreachable(foreign.status().await, "status with a foreign client cert");

    // Trusting the wrong CA fails our own verification of the member: a TLS error.
    let distrustful = MemberClient::new(
        &cluster.members[0].client_url,
        &client_tls(&ca, other_ca.cert_pem()),
        CALL_TIMEOUT,
    )
    .unwrap();
    for result in [
        distrustful.health().await.map(drop),
        distrustful.status().await.map(drop),
    ] {
        assert!(matches!(result, Err(EtcdError::Tls { .. })), "{result:?}");
    }

    // Reaching a member through an address its certificate does not name fails: the IP SAN
    // is verified.
    let proxy = forward_to(SocketAddr::new(cluster.members[0].ip, ETCD_CLIENT_PORT)).await;
    let misnamed = MemberClient::new(&format!("https://{proxy}"), &tls, CALL_TIMEOUT).unwrap();
    for result in [
        misnamed.health().await.map(drop),
        misnamed.status().await.map(drop),
    ] {
        match result {
            Err(err @ EtcdError::Tls { .. }) => assert_eq!(err.category().as_str(), "EtcdTLSError"),
            other => panic!("connecting through a misnamed address: {other:?}"),
        }
    }

    // Quorum loss: with two of three members dead, the survivor answers /health with 503 and
    // that is an unhealthy verdict with etcd's reason, not an error and not healthy.
    let survivor = followers[1];
    let dead: Vec<usize> = (0..3).filter(|i| *i != survivor).collect();
    // One shuts down cleanly, the other crashes.
    tokio::task::block_in_place(|| cluster.stop(dead[0]));
    cluster.kill(dead[1]);
    let verdict = eventually("survivor reports unhealthy", &cluster, || async {
        match members[survivor].health().await {
            Ok(h) if !h.healthy => Ok(h),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let reason = verdict.reason.expect("an unhealthy verdict carries a reason");
    assert!(!reason.is_empty());

    // One member back restores quorum, and the survivor is healthy again.
    tokio::task::block_in_place(|| cluster.restart(dead[0]));
    wait_healthy(
        "quorum restored",
        &cluster,
        &[&members[survivor], &members[dead[0]]],
    )
    .await;
}

/// The health check's handshake says when the member's server certificate expires, also when a
/// later connection resumes the TLS session instead of receiving the certificate again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handshake_tells_the_server_certificate_expiry_also_on_resumed_sessions() {
    let ca = CertificateAuthority::generate("etcd-ca").unwrap();
    let cluster = TlsEtcdCluster::start(&ca, 1);
    let expected = etcdadm_shared::pki::cert_not_after(&cluster.members[0].server_cert_pem()).unwrap();
    let config = client_tls(&ca, ca.cert_pem()).client_config().unwrap();
    let url = &cluster.client_urls()[0];
    for connection in ["first", "resumed"] {
        let client = MemberClient::with_config(url, config.clone(), CALL_TIMEOUT).unwrap();
        assert_eq!(
            client.server_certificate_expiry(),
            None,
            "{connection}: nothing dialled yet"
        );
        eventually(&format!("{connection} connection healthy"), &cluster, || async {
            match client.health().await {
                Ok(h) if h.healthy => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
        assert_eq!(client.server_certificate_expiry(), Some(expected), "{connection}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn learner_join_promote_remove_and_refused_second_changes() {
    let ca = CertificateAuthority::generate("etcd-ca").unwrap();
    let mut cluster = TlsEtcdCluster::start(&ca, 3);
    let tls = client_tls(&ca, ca.cert_pem());
    let members = clients(&cluster, &tls);
    let all: Vec<&MemberClient> = members.iter().collect();
    wait_healthy("3 members healthy", &cluster, &all).await;
    let via = &members[0];

    // A voter added but not started leaves the cluster "unhealthy" for etcd's strict
    // reconfiguration check: the next add is refused, and etcd's words are kept.
    let unstarted_peer = format!("https://{}:2380", free_loopback_ip());
    // Right after the cluster formed, its peers have not been connected long enough for the
    // check either; etcd refuses until they have.
    let pending = add_when_allowed(&cluster, via, &unstarted_peer, false).await;
    assert!(!pending.is_started() && !pending.is_learner, "{pending:?}");
    assert_eq!(pending.peer_urls, [unstarted_peer]);
    let second_peer = format!("https://{}:2380", free_loopback_ip());
    let err = via.member_add(&[second_peer], false).await.unwrap_err();
    match &err {
        EtcdError::Refused { refusal, message, .. } => {
            assert!(
                matches!(
                    refusal,
                    Refusal::UnhealthyCluster | Refusal::NotEnoughStartedMembers
                ),
                "{err}"
            );
            assert!(message.starts_with("etcdserver:"), "{err}");
        }
        other => panic!("second add while one is pending: {other:?}"),
    }
    via.member_remove(pending.id).await.unwrap();
    let err = via.member_remove(pending.id).await.unwrap_err();
    assert_eq!(err.refusal(), Some(Refusal::MemberNotFound), "{err}");

    // Add the new member as a learner; etcd allows only one learner at a time.
    let joiner = EtcdMemberProcess::prepare(&ca);
    let learner = add_when_allowed(&cluster, via, &joiner.peer_url, true).await;
    assert!(learner.is_learner && !learner.is_started(), "{learner:?}");
    let another = format!("https://{}:2380", free_loopback_ip());
    let err = via.member_add(&[another], true).await.unwrap_err();
    assert_eq!(err.refusal(), Some(Refusal::TooManyLearners), "{err}");
    assert!(
        err.to_string().contains("promote or remove the existing learner"),
        "{err}"
    );
    // A learner that has not started has nothing in sync: promotion is refused, not failed.
    let err = via.member_promote(learner.id).await.unwrap_err();
    assert_eq!(err.refusal(), Some(Refusal::LearnerNotReady), "{err}");
    assert!(err.to_string().contains("in sync with leader"), "{err}");

    // Start its process against the existing cluster, then promote once it has caught up.
    let list = via.member_list().await.unwrap();
    let initial_cluster = list
        .iter()
        .flat_map(|m| {
            let name = if m.id == learner.id {
                joiner.name.clone()
            } else {
                m.name.clone()
            };
            m.peer_urls.iter().map(move |url| format!("{name}={url}"))
        })
        .collect::<Vec<_>>()
        .join(",");
    let joined = cluster.join(joiner, &initial_cluster);
    // The started learner answers for itself but serves no membership call: ask a voter.
    let learner_client = MemberClient::new(&cluster.members[joined].client_url, &tls, CALL_TIMEOUT).unwrap();
    let refused = eventually("the learner serves and refuses MemberList", &cluster, || async {
        match learner_client.member_list().await {
            Err(err) if err.refusal() == Some(Refusal::NotForLearners) => Ok(err),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(refused.to_string().contains("ask a voting member"), "{refused}");
    eventually("learner promoted", &cluster, || async {
        match via.member_promote(learner.id).await {
            Ok(()) => Ok(()),
            Err(err) if err.refusal() == Some(Refusal::LearnerNotReady) => Err(err.to_string()),
            Err(other) => panic!("promote failed unexpectedly: {other}"),
        }
    })
    .await;
    let list = eventually("4 started voting members", &cluster, || async {
        let list = via.member_list().await.map_err(|e| e.to_string())?;
        if list.len() == 4 && list.iter().all(|m| m.is_started() && !m.is_learner) {
            Ok(list)
        } else {
            Err(format!("{list:?}"))
        }
    })
    .await;
    assert!(list.iter().any(|m| m.name == cluster.members[joined].name));
    let newcomer = MemberClient::new(&cluster.members[joined].client_url, &tls, CALL_TIMEOUT).unwrap();
    let mut four = all.clone();
    four.push(&newcomer);
    wait_healthy("4 members healthy", &cluster, &four).await;
    let status = newcomer.status().await.unwrap();
    assert_eq!(status.member_id, learner.id);
    assert!(!status.is_learner);
    assert_eq!(agreed_leader(&cluster, &four).await, status.leader_id.unwrap());

    // Remove the newcomer: three voters remain and its process exits on its own.
    eventually("newcomer removed", &cluster, || async {
        match via.member_remove(learner.id).await {
            Ok(()) => Ok(()),
            Err(err @ EtcdError::Refused { .. }) if err.refusal() == Some(Refusal::UnhealthyCluster) => {
                Err(err.to_string())
            }
            Err(other) => panic!("remove failed unexpectedly: {other}"),
        }
    })
    .await;
    let list = via.member_list().await.unwrap();
    assert_eq!(list.len(), 3, "{list:?}");
    assert!(list.iter().all(|m| m.id != learner.id));
    let exit = tokio::task::block_in_place(|| cluster.members[joined].wait_exit(CONVERGE));
    assert!(
        exit.is_some(),
        "removed member still runs; log:\n{}",
        cluster.members[joined].log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_and_silent_members_fail_within_the_timeout() {
    let ca = CertificateAuthority::generate("etcd-ca").unwrap();
    let tls = client_tls(&ca, ca.cert_pem());
    let timeout = Duration::from_secs(2);
    let slack = Duration::from_secs(2);

    // Nothing listens: connection refused, reported as unreachable, fast.
    let nobody = free_loopback_ip();
    let client = MemberClient::new(&format!("https://{nobody}:2379"), &tls, timeout).unwrap();
    let started = Instant::now();
    let err = client.health().await.unwrap_err();
    assert!(matches!(err, EtcdError::Unreachable { .. }), "{err}");
    assert_eq!(err.category().as_str(), "EtcdUnreachable");
    let err = client.status().await.unwrap_err();
    assert!(
        matches!(err, EtcdError::Unreachable { .. } | EtcdError::Timeout { .. }),
        "{err}"
    );
    assert!(started.elapsed() < 2 * timeout + slack, "{:?}", started.elapsed());

    // Something accepts connections but never speaks: every call ends at the deadline.
    let silent_ip = free_loopback_ip();
    let _silent = std::net::TcpListener::bind(SocketAddr::new(silent_ip, ETCD_CLIENT_PORT)).unwrap();
    let client = MemberClient::new(&format!("https://{silent_ip}:2379"), &tls, timeout).unwrap();
    for call in ["health", "status", "member_list"] {
        let started = Instant::now();
        let err = match call {
            "health" => client.health().await.map(drop),
            "status" => client.status().await.map(drop),
            _ => client.member_list().await.map(drop),
        }
        .unwrap_err();
        let elapsed = started.elapsed();
        assert!(matches!(err, EtcdError::Timeout { .. }), "{call}: {err}");
        assert_eq!(err.category().as_str(), "EtcdTimeout");
        assert!(elapsed < timeout + slack, "{call} took {elapsed:?}");
    }
}

/// `MemberAdd`, retried while etcd's strict reconfiguration check refuses it.
async fn add_when_allowed(
    cluster: &TlsEtcdCluster,
    via: &MemberClient,
    peer_url: &str,
    learner: bool,
) -> Member {
    eventually("member added", cluster, || async {
        match via.member_add(&[peer_url.to_string()], learner).await {
            Ok(member) => Ok(member),
            Err(err) if err.refusal() == Some(Refusal::UnhealthyCluster) => Err(err.to_string()),
            Err(other) => panic!("member add failed unexpectedly: {other}"),
        }
    })
    .await
}

/// A plain TCP forwarder on a fresh loopback address to `target`, so a client can reach a
/// member under an address its certificate does not name.
async fn forward_to(target: SocketAddr) -> SocketAddr {
    let ip: IpAddr = free_loopback_ip();
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(ip, ETCD_CLIENT_PORT))
        .await
        .unwrap();
    let local = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    local
}
