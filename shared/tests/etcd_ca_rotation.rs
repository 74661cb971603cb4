//! The trust sequence of a CA rotation (docs/security.md, "Rotating the etcd CA") on a real
//! three-member etcd cluster: each member is replaced, one at a time as the rolling replacement
//! does (learner added, promoted, then the old member removed), by one whose `ca.crt` is the
//! next bundle of the rotation (trust both signed by the old CA, then signed by the new CA
//! trusting both, then the new CA alone), while a client writes all along through a client
//! identity from each CA. No acknowledged write is lost, every member answers the client in
//! every mixture of adjacent phases, each member presents a certificate from the CA its bundle
//! names first, and at the end a client from the old CA alone is refused. Prints the wall time
//! of the whole roll and the longest gap between acknowledged writes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcdadm_shared::etcd::{EtcdError, EtcdTls, MemberClient, Refusal};
use etcdadm_shared::pki::CertificateAuthority;
use etcdadm_shared::testing::{EtcdMemberProcess, TlsEtcdCluster};

const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Long enough for elections and joins on a loaded 2-core machine.
const CONVERGE: Duration = Duration::from_secs(90);
const WRITE_EVERY: Duration = Duration::from_millis(25);

/// [`TlsEtcdCluster::eventually`] within [`CONVERGE`].
async fn eventually<T, F, Fut>(what: &str, cluster: &TlsEtcdCluster, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    cluster.eventually(what, CONVERGE, probe).await
}

/// Acknowledged writes by sequence number, with when each was acknowledged.
type Acknowledged = Arc<Mutex<BTreeMap<u64, Instant>>>;

/// Writes `w/<n>` every [`WRITE_EVERY`] to whichever of `endpoints` answers, noting each
/// acknowledged write, until `stop`.
fn spawn_writer(
    tls: Arc<rustls::ClientConfig>,
    endpoints: Arc<Mutex<Vec<String>>>,
    acknowledged: Acknowledged,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut clients: BTreeMap<String, MemberClient> = BTreeMap::new();
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let urls = endpoints.lock().unwrap().clone();
            for url in &urls {
                let client = clients
                    .entry(url.clone())
                    .or_insert_with(|| MemberClient::with_config(url, tls.clone(), CALL_TIMEOUT).unwrap());
                let put = async {
                    let mut etcd = client.workload_client().await.map_err(|e| e.to_string())?;
                    etcd.put(format!("w/{n:08}"), n.to_string(), None)
                        .await
                        .map_err(|e| e.to_string())
                };
                if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(2), put).await {
                    acknowledged.lock().unwrap().insert(n, Instant::now());
                    break;
                }
                // This member is gone or refused: a fresh connection next time.
                clients.remove(url);
            }
            n += 1;
            tokio::time::sleep(WRITE_EVERY).await;
        }
    })
}

/// Replace the member at index `old` by a new one whose `ca.crt` and certificates come from
/// `bundle` (its first certificate signs), as the rolling replacement does: learner added,
/// started, promoted, clients sent to it instead, leadership moved off the old member, then the
/// old member removed. Returns the new member's index.
async fn replace(
    cluster: &mut TlsEtcdCluster,
    via_url: &str,
    tls: &Arc<rustls::ClientConfig>,
    endpoints: &Mutex<Vec<String>>,
    old: usize,
    bundle: &CertificateAuthority,
) -> usize {
    let via = MemberClient::with_config(via_url, tls.clone(), CALL_TIMEOUT).unwrap();
    let joiner = EtcdMemberProcess::prepare(bundle);
    let peer_url = joiner.peer_url.clone();
    let learner = eventually("learner added", cluster, || async {
        match via.member_add(std::slice::from_ref(&peer_url), true).await {
            Ok(member) => Ok(member),
            Err(err) if err.refusal().is_some() => Err(err.to_string()),
            Err(other) => Err(format!("member add: {other}")),
        }
    })
    .await;
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
    eventually("learner promoted", cluster, || async {
        match via.member_promote(learner.id).await {
            Ok(()) => Ok(()),
            Err(err) if err.refusal() == Some(Refusal::LearnerNotReady) => Err(err.to_string()),
            Err(other) => Err(format!("promote: {other}")),
        }
    })
    .await;
    let old_name = cluster.members[old].name.clone();
    let old_id = list
        .iter()
        .find(|m| m.name == old_name)
        .unwrap_or_else(|| panic!("{old_name} is not a member: {list:?}"))
        .id;
    let (old_url, new_url) = (
        cluster.members[old].client_url.clone(),
        cluster.members[joined].client_url.clone(),
    );
    for url in endpoints.lock().unwrap().iter_mut() {
        if *url == old_url {
            *url = new_url.clone();
        }
    }
    let newcomer = MemberClient::with_config(&new_url, tls.clone(), CALL_TIMEOUT).unwrap();
    let leaving = MemberClient::with_config(&old_url, tls.clone(), CALL_TIMEOUT).unwrap();
    eventually("leadership off the old member", cluster, || async {
        let status = leaving.status().await.map_err(|e| e.to_string())?;
        if status.leader_id != Some(old_id) {
            return Ok(());
        }
        leaving.move_leader(learner.id).await.map_err(|e| e.to_string())?;
        Err("leadership moved; checking".into())
    })
    .await;
    eventually("old member removed", cluster, || async {
        match newcomer.member_remove(old_id).await {
            Ok(()) => Ok(()),
            Err(err) if err.refusal() == Some(Refusal::MemberNotFound) => Ok(()),
            Err(err) => Err(err.to_string()),
        }
    })
    .await;
    let exit = tokio::task::block_in_place(|| cluster.members[old].wait_exit(CONVERGE));
    if exit.is_none() {
        cluster.members[old].stop();
    }
    joined
}

/// Every member in `live` is healthy to `tls`, and presented a server certificate signed by
/// `signer`.
async fn check_members(
    what: &str,
    cluster: &TlsEtcdCluster,
    live: &[usize],
    tls: &Arc<rustls::ClientConfig>,
    signer: &CertificateAuthority,
) {
    for i in live {
        let url = cluster.members[*i].client_url.clone();
        let client = MemberClient::with_config(&url, tls.clone(), CALL_TIMEOUT).unwrap();
        eventually(&format!("{what}: {url} healthy"), cluster, || async {
            match client.health().await {
                Ok(h) if h.healthy => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
        let presented = client.server_certificate().unwrap();
        assert!(
            signer.signed(&presented),
            "{what}: {url} is not signed by the expected CA"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_roll_through_the_trust_bundles_without_losing_a_write() {
    let old = CertificateAuthority::generate("etcd-ca").unwrap();
    // The next CA's name differs: members name the CAs they accept by subject, and a client of
    // both tells them apart by it.
    let new = CertificateAuthority::generate("etcd-ca-rotated").unwrap();
    let phases = [
        (
            "trust both, signed by the old CA",
            old.trusting(&[&new]).unwrap(),
            &old,
        ),
        (
            "signed by the new CA, trusting both",
            new.trusting(&[&old]).unwrap(),
            &new,
        ),
        ("the new CA alone", new.trusting(&[]).unwrap(), &new),
    ];
    let mut cluster = TlsEtcdCluster::start(&old, 3);
    let mut live: Vec<usize> = vec![0, 1, 2];
    let tls =
        EtcdTls::issued_by_each(&[&old, &new], "ca-rotation-writer", Duration::from_secs(3600)).unwrap();
    let old_only = EtcdTls::issued_by(&old, "old-ca-client", Duration::from_secs(3600))
        .unwrap()
        .client_config()
        .unwrap();
    check_members("before", &cluster, &live, &tls, &old).await;

    let endpoints = Arc::new(Mutex::new(cluster.client_urls()));
    let acknowledged: Acknowledged = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(tls.clone(), endpoints.clone(), acknowledged.clone(), stop.clone());
    eventually("the first write", &cluster, || async {
        if acknowledged.lock().unwrap().is_empty() {
            Err("no write yet".to_string())
        } else {
            Ok(())
        }
    })
    .await;

    let started = Instant::now();
    for (phase, bundle, signer) in &phases {
        for slot in 0..live.len() {
            let via = cluster.members[live[(slot + 1) % live.len()]].client_url.clone();
            let joined = replace(&mut cluster, &via, &tls, &endpoints, live[slot], bundle).await;
            live[slot] = joined;
            // Every member answers in this mixture of two adjacent phases.
            for i in &live {
                let client =
                    MemberClient::with_config(&cluster.members[*i].client_url, tls.clone(), CALL_TIMEOUT)
                        .unwrap();
                eventually(
                    &format!("{phase}: member {i} healthy mid-phase"),
                    &cluster,
                    || async {
                        match client.health().await {
                            Ok(h) if h.healthy => Ok(()),
                            other => Err(format!("{other:?}")),
                        }
                    },
                )
                .await;
            }
        }
        check_members(phase, &cluster, &live, &tls, signer).await;
        println!(
            "phase \"{phase}\" done {:.1} s after the roll began",
            started.elapsed().as_secs_f64()
        );
    }
    let wall = started.elapsed();

    // Keep writing a little on the rotated cluster, then stop.
    let before = acknowledged.lock().unwrap().len();
    eventually("writes after the roll", &cluster, || async {
        if acknowledged.lock().unwrap().len() > before + 10 {
            Ok(())
        } else {
            Err("waiting for writes".into())
        }
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();

    // No acknowledged write lost.
    let reader =
        MemberClient::with_config(&cluster.members[live[0]].client_url, tls.clone(), CALL_TIMEOUT).unwrap();
    let mut etcd = reader.workload_client().await.unwrap();
    let stored = etcd
        .get("w/", Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .unwrap();
    let stored: std::collections::BTreeSet<u64> = stored
        .kvs()
        .iter()
        .map(|kv| kv.value_str().unwrap().parse().unwrap())
        .collect();
    let acknowledged = acknowledged.lock().unwrap().clone();
    let lost: Vec<&u64> = acknowledged.keys().filter(|n| !stored.contains(n)).collect();
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    let times: Vec<Instant> = acknowledged.values().copied().collect();
    let longest_gap = times
        .windows(2)
        .map(|w| w[1].duration_since(w[0]))
        .max()
        .unwrap_or_default();
    println!(
        "CA rotation trust sequence, 3 members, 9 replacements: {:.1} s, {} acknowledged writes, none lost, longest gap between acknowledged writes {:.2} s",
        wall.as_secs_f64(),
        acknowledged.len(),
        longest_gap.as_secs_f64()
    );

    // The old CA no longer opens the cluster.
    let refused = MemberClient::with_config(&cluster.members[live[0]].client_url, old_only, CALL_TIMEOUT)
        .unwrap()
        .health()
        .await;
    assert!(
        matches!(
            refused,
            Err(EtcdError::Tls { .. } | EtcdError::Unreachable { .. })
        ),
        "a client of the old CA alone got {refused:?}"
    );
    // And a plain member client of the new CA alone is served.
    let new_only = EtcdTls::issued_by(&new, "new-ca-client", Duration::from_secs(3600))
        .unwrap()
        .client_config()
        .unwrap();
    let health = MemberClient::with_config(&cluster.members[live[0]].client_url, new_only, CALL_TIMEOUT)
        .unwrap()
        .health()
        .await
        .unwrap();
    assert!(health.healthy, "{health:?}");
}
