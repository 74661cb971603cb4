#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Quorum-loss recovery with both real controller binaries, real etcd and a real S3 store
//! (SeaweedFS). Refusals: on a healthy cluster the `recover` annotation is refused and changes
//! nothing (Ready stays, same Machines, members and CA); once two of three machines are powered
//! off for good, `latest` without an object store is refused saying a store is needed, and still
//! nothing is deleted; the annotation stays until the user removes it, and its answer goes with
//! it. Recoveries: two of three machines powered off for good, `latest` snapshots the survivor
//! and brings the cluster back with three new members, every acknowledged key, the same CA and
//! at most one control plane endpoint update; then the same from a named snapshot, which loses the
//! writes after it; and with the controller SIGKILLed at every phase of the sequence (seeded,
//! `SIM_RECOVERY_KILL_RUNS` recoveries in a row, default 2) it still converges to one cluster.

mod lifecycle_support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::cluster::RecoveryPhase;
use etcdadm_shared::api::snapshot::{EtcdadmSnapshot, SnapshotPhase};
use etcdadm_shared::etcd::MemberClient;
use etcdadm_shared::testing::{SeaweedFs, TempDir};
use etcdadm_sim::demo;
use etcdadm_sim::plane::Plane;
use etcdadm_sim_machines::Fault;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use lifecycle_support::*;
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(120);
const RECOVER: &str = "etcdcluster.cluster.x-k8s.io/recover";

/// One scenario at a time in this binary: each runs real etcd members on the machine's two cores.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn annotate(client: &kube::Client, value: Option<&str>) {
    annotate_cluster(client, "q1", value).await;
}

async fn annotate_cluster(client: &kube::Client, cluster: &str, value: Option<&str>) {
    annotate_etcd_cluster(client, cluster, RECOVER, value).await;
}

/// Wait until the `Recovery` condition's message contains `says`; its reason.
async fn answer(client: &kube::Client, says: &str, work: &TempDir) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let etcd = etcd_api(client).get("q1-etcd").await.unwrap();
        let (_, reason, message) = condition(&etcd, "Recovery");
        if message.contains(says) {
            return reason;
        }
        assert!(
            Instant::now() < deadline,
            "no Recovery answer saying {says:?}: {reason} {message}\n{}",
            logs(work)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Machine names, member IDs and the CA, which a refused recovery never changes.
async fn fingerprint(client: &kube::Client) -> (BTreeSet<String>, BTreeSet<String>, Option<String>) {
    fingerprint_of(client, "q1").await
}

async fn fingerprint_of(
    client: &kube::Client,
    cluster: &str,
) -> (BTreeSet<String>, BTreeSet<String>, Option<String>) {
    let machines = machines(client, cluster)
        .await
        .iter()
        .map(|m| m.name_any())
        .collect();
    let etcd = etcd_api(client).get(&format!("{cluster}-etcd")).await.unwrap();
    let members = etcd
        .status
        .unwrap()
        .members
        .into_iter()
        .filter_map(|m| m.member_id)
        .collect();
    let ca = Api::<Secret>::default_namespaced(client.clone())
        .get(&format!("{cluster}-managed-etcd"))
        .await
        .unwrap()
        .data
        .and_then(|d| {
            d.get("tls.crt")
                .map(|v| String::from_utf8_lossy(&v.0).into_owned())
        });
    (machines, members, ca)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_is_refused_unless_quorum_is_lost_and_a_store_is_set_and_nothing_is_deleted() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let work = TempDir::new("sim-recovery-refusals");
    let plane = start_plane_on(None, 17, &work, Duration::from_secs(1)).await;
    let client = plane.client.clone();
    create(&client, "q1", 3, false, json!({}), json!({})).await;
    let etcd = wait_settled(&client, "q1", 3, TIMEOUT, &work).await;
    let before = fingerprint(&client).await;

    // (d) On a healthy cluster: refused, and nothing changes.
    annotate(&client, Some("latest")).await;
    assert_eq!(
        answer(&client, "quorum is not lost", &work).await,
        "RecoveryRefused"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    settled(&client, "q1", 3).await.unwrap();
    assert_eq!(fingerprint(&client).await, before);
    let etcd_now = etcd_api(&client).get("q1-etcd").await.unwrap();
    assert_eq!(
        etcd_now.annotations().get(RECOVER).map(String::as_str),
        Some("latest")
    );
    let warnings: Vec<String> = events(&client, "q1")
        .await
        .into_iter()
        .filter(|(reason, _)| reason == "RecoveryRefused")
        .map(|(_, note)| note)
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("quorum is not lost"), "{}", warnings[0]);

    // Two of three machines gone for good: `latest` has no store to put a snapshot in.
    let members = etcd.status.unwrap().members;
    for m in members.iter().filter(|m| !m.is_leader).take(2) {
        plane.runtime.fault(&m.name, Fault::PowerOff).unwrap();
    }
    let reason = answer(&client, "needs an object store", &work).await;
    assert_eq!(reason, "RecoveryRefused");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = fingerprint(&client).await;
    assert_eq!(
        (&after.0, &after.2),
        (&before.0, &before.2),
        "nothing deleted, same CA"
    );
    assert!(
        machines(&client, "q1").await.iter().all(|m| m
            .annotations()
            .contains_key("pre-terminate.delete.hook.machine.cluster.x-k8s.io/etcdadm-cluster")
            && m.metadata.deletion_timestamp.is_none()),
        "every Machine kept, with its hook"
    );

    // Removed by the user: the answer goes with it, and quorum loss is reported as before.
    annotate(&client, None).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let etcd = etcd_api(&client).get("q1-etcd").await.unwrap();
        let gone = etcd
            .status
            .as_ref()
            .is_some_and(|s| !s.conditions.iter().any(|c| c.type_ == "Recovery"));
        if gone && condition(&etcd, "Ready").1 == "QuorumLost" {
            break;
        }
        assert!(Instant::now() < deadline, "{:?}", etcd.status);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    save_logs(&work, "recovery-refusals");
}

const BUCKET: &str = "etcd-backups";

/// SeaweedFS with [`BUCKET`], a plane, and its Ready cluster `cluster` of three (with a
/// KubeadmControlPlane) backed up to the bucket.
async fn backed_up(prefix: u8, cluster: &str, work: &TempDir) -> (SeaweedFs, Plane) {
    let s3 = SeaweedFs::start().await;
    s3.create_bucket(BUCKET).await;
    let plane = start_plane_on(None, prefix, work, Duration::from_secs(1)).await;
    store_credentials(&plane.client, &s3).await;
    let store = serde_json::to_value(s3.store(BUCKET)).unwrap();
    create(
        &plane.client,
        cluster,
        3,
        true,
        json!({}),
        json!({"backup": {"store": {"s3": store}}}),
    )
    .await;
    wait_settled(&plane.client, cluster, 3, TIMEOUT, work).await;
    (s3, plane)
}

/// Keys `<prefix>/NNNN` written through the leader of `etcd`, each with the revision its write
/// was acknowledged at.
async fn write_keys(
    client: &kube::Client,
    cluster: &str,
    etcd: &EtcdadmCluster,
    prefix: &str,
    count: usize,
) -> Vec<(String, i64)> {
    let tls = demo::etcd_tls(client, client.default_namespace(), cluster)
        .await
        .unwrap()
        .unwrap();
    let leader = etcd
        .status
        .clone()
        .unwrap()
        .members
        .into_iter()
        .find(|m| m.is_leader)
        .unwrap();
    let member = MemberClient::new(
        leader.client_url.as_deref().unwrap(),
        &tls,
        Duration::from_secs(5),
    )
    .unwrap();
    let mut kv = member.workload_client().await.unwrap();
    let mut written = Vec::new();
    for i in 0..count {
        let key = format!("{prefix}/{i:04}");
        let put = kv.put(key.clone(), format!("value-{i}"), None).await.unwrap();
        written.push((key, put.header().unwrap().revision()));
    }
    written
}

/// Which of `keys` every member of `etcd` has.
async fn present_everywhere(
    client: &kube::Client,
    cluster: &str,
    etcd: &EtcdadmCluster,
    keys: &[(String, i64)],
) -> Vec<bool> {
    let tls = demo::etcd_tls(client, client.default_namespace(), cluster)
        .await
        .unwrap()
        .unwrap();
    let mut everywhere = vec![true; keys.len()];
    for m in &etcd.status.clone().unwrap().members {
        let member =
            MemberClient::new(m.client_url.as_deref().unwrap(), &tls, Duration::from_secs(5)).unwrap();
        let mut kv = member.workload_client().await.unwrap();
        for (i, (key, _)) in keys.iter().enumerate() {
            let got = kv.get(key.clone(), None).await.unwrap();
            everywhere[i] &= got.kvs().len() == 1;
        }
    }
    everywhere
}

/// Power off every member Machine of `etcd` but the leader; the leader's Machine.
async fn lose_quorum(plane: &Plane, cluster: &str, etcd: &EtcdadmCluster, work: &TempDir) -> String {
    let members = etcd.status.clone().unwrap().members;
    for m in members.iter().filter(|m| !m.is_leader) {
        plane.runtime.fault(&m.name, Fault::PowerOff).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let etcd = etcd_api(&plane.client)
            .get(&format!("{cluster}-etcd"))
            .await
            .unwrap();
        if condition(&etcd, "Ready").1 == "QuorumLost" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no QuorumLost: {:?}\n{}",
            etcd.status,
            logs(work)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    members.into_iter().find(|m| m.is_leader).unwrap().name
}

/// Every change of `<cluster>-etcd`'s `status.recovery.phase`, in order, from a watch: a
/// phase can pass between two polls (Replacing takes well under a second on a quick machine).
struct PhaseFollower {
    changes: tokio::sync::mpsc::UnboundedReceiver<Option<RecoveryPhase>>,
    task: tokio::task::JoinHandle<()>,
}

impl PhaseFollower {
    /// Started before the recovery is asked for, so its first phase is seen too.
    fn start(client: &kube::Client, cluster: &str) -> PhaseFollower {
        let (changes, task) = follow_etcd_cluster(client, cluster, |etcd| {
            etcd.status.and_then(|s| s.recovery).map(|r| r.phase)
        });
        PhaseFollower { changes, task }
    }
}

impl Drop for PhaseFollower {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Wait until `cluster`'s recovery finished (the annotation gone, the phase over as `follower`
/// saw it, three members settled): the cluster then, and the phases it went through. With
/// `kill`, the controller is SIGKILLed as each phase begins or a little into it, and at once
/// should the next phase begin meanwhile (which is then killed into as well).
async fn wait_recovered(
    plane: &mut Plane,
    cluster: &str,
    work: &TempDir,
    follower: &mut PhaseFollower,
    mut kill: Option<&mut Rng>,
) -> (EtcdadmCluster, Vec<RecoveryPhase>) {
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut phases: Vec<RecoveryPhase> = Vec::new();
    let mut now = None;
    let mut queued = std::collections::VecDeque::new();
    loop {
        while let Ok(change) = follower.changes.try_recv() {
            queued.push_back(change);
        }
        while let Some(change) = queued.pop_front() {
            now = change;
            let Some(phase) = change else { continue };
            phases.push(phase);
            if let Some(rng) = kill.as_deref_mut() {
                let next = tokio::time::timeout(rng.millis(1500), follower.changes.recv()).await;
                if let Ok(Some(next)) = next {
                    queued.push_back(next);
                }
                plane.kill_controller(CONTROLLER).await.unwrap();
                tokio::time::sleep(Duration::from_millis(300)).await;
                plane.restart_controller(CONTROLLER).unwrap();
            }
        }
        let etcd = etcd_api(&plane.client)
            .get(&format!("{cluster}-etcd"))
            .await
            .unwrap();
        if !phases.is_empty()
            && now.is_none()
            && !etcd.annotations().contains_key(RECOVER)
            && let Ok(etcd) = settled(&plane.client, cluster, 3).await
        {
            return (etcd, phases);
        }
        assert!(
            Instant::now() < deadline,
            "not recovered within 240 s (phases {phases:?}): {:?}\n{}",
            etcd.status,
            logs(work)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn kcp_generation(kcp: &serde_json::Value) -> i64 {
    kcp["metadata"]["generation"].as_i64().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_that_lost_quorum_is_recovered_from_its_survivor_then_from_a_named_snapshot() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let work = TempDir::new("sim-recovery");
    let (_s3, mut plane) = backed_up(18, "q2", &work).await;
    let client = plane.client.clone();
    let etcd = etcd_api(&client).get("q2-etcd").await.unwrap();
    let (_, before_members, ca) = fingerprint_of(&client, "q2").await;
    let old_machines: BTreeSet<String> = machines(&client, "q2")
        .await
        .iter()
        .map(|m| m.name_any())
        .collect();
    let kcp_before = serde_json::to_value(kcp(&client, "q2").await.unwrap()).unwrap();

    // (a) A client's writes, two machines gone for good, `latest`.
    let keys = write_keys(&client, "q2", &etcd, "a", 300).await;
    let survivor = lose_quorum(&plane, "q2", &etcd, &work).await;
    let mut follower = PhaseFollower::start(&client, "q2");
    let started = Instant::now();
    annotate_cluster(&client, "q2", Some("latest")).await;
    let (etcd, phases) = wait_recovered(&mut plane, "q2", &work, &mut follower, None).await;
    println!(
        "recovered from latest: annotation to Ready in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(
        phases,
        [
            RecoveryPhase::Snapshotting,
            RecoveryPhase::Replacing,
            RecoveryPhase::Restoring
        ]
    );
    let status = etcd.status.clone().unwrap();
    let last = status.last_recovery.clone().expect("status.lastRecovery");
    assert_eq!(
        (last.requested.as_str(), last.source.clone()),
        ("latest", format!("member/{survivor}"))
    );
    let restored = last.revision.unwrap();
    let acknowledged = keys.last().unwrap().1;
    assert!(
        restored >= acknowledged,
        "restored revision {restored} < last acknowledged {acknowledged}"
    );
    assert_eq!(last.revisions_lost, Some(0));
    assert!(last.started.is_some() && last.time.is_some());
    let present = present_everywhere(&client, "q2", &etcd, &keys).await;
    let missing: Vec<&String> = keys
        .iter()
        .zip(&present)
        .filter(|((_, rev), here)| *rev <= restored && !**here)
        .map(|((k, _), _)| k)
        .collect();
    assert!(
        missing.is_empty(),
        "acknowledged keys missing after the recovery: {missing:?}"
    );
    let (machines_now, members_now, ca_now) = fingerprint_of(&client, "q2").await;
    assert_eq!(ca_now, ca, "the CA is kept");
    assert!(
        machines_now.is_disjoint(&old_machines) && members_now.is_disjoint(&before_members),
        "a new cluster of new Machines"
    );
    let snapshot = Api::<EtcdadmSnapshot>::default_namespaced(client.clone())
        .get(&status.last_recovery.unwrap().snapshot)
        .await
        .unwrap();
    assert_eq!(
        (snapshot.phase(), snapshot.spec.member.as_deref()),
        (SnapshotPhase::Succeeded, Some(survivor.as_str()))
    );
    // The control plane is rolled once after the recovery, from its start (docs/day2.md,
    // "Revisions after a restore"), and status says whether the revisions were raised.
    let deadline = Instant::now() + Duration::from_secs(30);
    let last = loop {
        let last = etcd_api(&client)
            .get("q2-etcd")
            .await
            .unwrap()
            .status
            .and_then(|s| s.last_recovery)
            .unwrap();
        if last.control_plane_rollout.is_some() {
            break last;
        }
        assert!(
            Instant::now() < deadline,
            "no control plane rollout after the recovery\n{}",
            logs(&work)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(last.control_plane_rollout, last.started);
    assert!(last.revision_bumped.is_some(), "{last:?}");
    let kcp_after = serde_json::to_value(kcp(&client, "q2").await.unwrap()).unwrap();
    assert_eq!(
        kcp_after["spec"]["rollout"]["after"].as_str(),
        last.started.as_ref().map(|t| t.0.to_string()).as_deref(),
        "{kcp_after:#}"
    );
    // The rollout, and at most one endpoint update (none when the new Machines got the
    // addresses the old ones had).
    let updates = kcp_generation(&kcp_after) - kcp_generation(&kcp_before);
    assert!(
        (1..=2).contains(&updates),
        "{updates} control plane updates:\n{kcp_after:#}"
    );
    let mut endpoints: Vec<String> = status.endpoints.split(',').map(String::from).collect();
    endpoints.sort();
    let mut given: Vec<String> = serde_json::from_value(
        kcp_after["spec"]["kubeadmConfigSpec"]["clusterConfiguration"]["etcd"]["external"]["endpoints"]
            .clone(),
    )
    .unwrap();
    given.sort();
    assert_eq!(given, endpoints);
    let reasons: Vec<String> = events(&client, "q2")
        .await
        .into_iter()
        .map(|(reason, _)| reason)
        .collect();
    for expected in [
        "RecoverySnapshot",
        "RecoveryReplacingMachines",
        "RecoveryRestoring",
        "Recovered",
    ] {
        assert!(
            reasons.iter().any(|r| r == expected),
            "no {expected} Event: {reasons:?}"
        );
    }

    // (b) A named snapshot, then writes it does not hold, then quorum lost: `snapshot/<name>`.
    let before = write_keys(&client, "q2", &etcd, "b", 100).await;
    let named: EtcdadmSnapshot = serde_json::from_value(json!({
        "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmSnapshot",
        "metadata": {"name": "q2-nightly"}, "spec": {"clusterName": "q2-etcd"},
    }))
    .unwrap();
    let snapshots: Api<EtcdadmSnapshot> = Api::default_namespaced(client.clone());
    snapshots.create(&PostParams::default(), &named).await.unwrap();
    let taken = loop {
        let s = snapshots.get("q2-nightly").await.unwrap();
        assert_ne!(s.phase(), SnapshotPhase::Failed, "{:?}", s.status);
        if s.phase() == SnapshotPhase::Succeeded {
            break s.status.unwrap().revision.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let after = write_keys(&client, "q2", &etcd, "c", 50).await;
    lose_quorum(&plane, "q2", &etcd, &work).await;
    let started = Instant::now();
    annotate_cluster(&client, "q2", Some("snapshot/q2-nightly")).await;
    let (etcd, phases) = wait_recovered(&mut plane, "q2", &work, &mut follower, None).await;
    println!(
        "recovered from a named snapshot: annotation to Ready in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(
        phases.first(),
        Some(&RecoveryPhase::Replacing),
        "no survivor snapshot: {phases:?}"
    );
    let last = etcd.status.clone().unwrap().last_recovery.unwrap();
    assert_eq!(
        (last.source.as_str(), last.revision),
        ("snapshot/q2-nightly", Some(taken))
    );
    let lost = last.revisions_lost.unwrap();
    assert!(
        lost >= 50,
        "the 50 writes after the snapshot are counted lost: {lost}"
    );
    assert!(
        present_everywhere(&client, "q2", &etcd, &before)
            .await
            .iter()
            .all(|here| *here)
    );
    assert!(
        present_everywhere(&client, "q2", &etcd, &after)
            .await
            .iter()
            .all(|here| !*here)
    );
    assert_eq!(fingerprint_of(&client, "q2").await.2, ca, "the CA is kept");
    save_logs(&work, "recovery");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_converges_to_one_cluster_when_the_controller_is_sigkilled_at_every_phase() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let runs = std::env::var("SIM_RECOVERY_KILL_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2u64);
    let seed = std::env::var("SIM_KILL_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed_0020_u64);
    println!("{runs} recoveries, SIM_KILL_SEED={seed}");
    let work = TempDir::new("sim-recovery-kills");
    let (_s3, mut plane) = backed_up(19, "q3", &work).await;
    let client = plane.client.clone();
    let ca = fingerprint_of(&client, "q3").await.2;
    let mut follower = PhaseFollower::start(&client, "q3");
    for run in 0..runs {
        let mut rng = Rng::new(seed.wrapping_add(run));
        let etcd = etcd_api(&client).get("q3-etcd").await.unwrap();
        let keys = write_keys(&client, "q3", &etcd, &format!("run{run}"), 50).await;
        lose_quorum(&plane, "q3", &etcd, &work).await;
        annotate_cluster(&client, "q3", Some("latest")).await;
        let started = Instant::now();
        let (etcd, phases) = wait_recovered(&mut plane, "q3", &work, &mut follower, Some(&mut rng)).await;
        println!(
            "run {run} (seed {}): killed at {phases:?}, recovered in {:.1}s",
            seed.wrapping_add(run),
            started.elapsed().as_secs_f64()
        );
        assert_eq!(
            phases,
            [
                RecoveryPhase::Snapshotting,
                RecoveryPhase::Replacing,
                RecoveryPhase::Restoring
            ]
        );
        assert_eq!(
            machines(&client, "q3").await.len(),
            3,
            "one cluster of three Machines"
        );
        assert!(
            present_everywhere(&client, "q3", &etcd, &keys)
                .await
                .iter()
                .all(|here| *here)
        );
        assert_eq!(fingerprint_of(&client, "q3").await.2, ca, "the CA is kept");
        // One survivor snapshot per recovery, whatever the kills.
        let recovery_snapshots = Api::<EtcdadmSnapshot>::default_namespaced(client.clone())
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|s| s.spec.member.is_some())
            .count();
        assert_eq!(recovery_snapshots, usize::try_from(run + 1).unwrap());
    }
    save_logs(&work, "recovery-kills");
}

/// SeaweedFS, a plane, and Ready cluster `cluster` of three (no control plane) backed up to the
/// bucket with automatic recovery on (`after: 10m`), a Succeeded EtcdadmSnapshot of it, and 100
/// keys written after that snapshot.
async fn automatic_with_keys_after_a_snapshot(
    prefix: u8,
    cluster: &str,
    work: &TempDir,
) -> (SeaweedFs, Plane, Vec<(String, i64)>) {
    let s3 = SeaweedFs::start().await;
    s3.create_bucket(BUCKET).await;
    let plane = start_plane_on(None, prefix, work, Duration::from_secs(1)).await;
    let client = plane.client.clone();
    store_credentials(&client, &s3).await;
    let store = serde_json::to_value(s3.store(BUCKET)).unwrap();
    create(
        &client,
        cluster,
        3,
        false,
        json!({}),
        json!({"backup": {"store": {"s3": store}}, "recovery": {"automatic": true, "after": "10m"}}),
    )
    .await;
    let etcd = wait_settled(&client, cluster, 3, TIMEOUT, work).await;
    let name = format!("{cluster}-nightly");
    let snapshot: EtcdadmSnapshot = serde_json::from_value(json!({
        "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmSnapshot",
        "metadata": {"name": name}, "spec": {"clusterName": format!("{cluster}-etcd")},
    }))
    .unwrap();
    let snapshots: Api<EtcdadmSnapshot> = Api::default_namespaced(client.clone());
    snapshots.create(&PostParams::default(), &snapshot).await.unwrap();
    let deadline = Instant::now() + TIMEOUT;
    while snapshots.get(&name).await.unwrap().phase() != SnapshotPhase::Succeeded {
        assert!(Instant::now() < deadline, "no Succeeded snapshot\n{}", logs(work));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let keys = write_keys(&client, cluster, &etcd, "after-the-snapshot", 100).await;
    (s3, plane, keys)
}

/// Wait for `Ready`'s reason `reason`.
async fn wait_ready_reason(client: &kube::Client, cluster: &str, reason: &str, work: &TempDir) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let etcd = etcd_api(client).get(&format!("{cluster}-etcd")).await.unwrap();
        if condition(&etcd, "Ready").1 == reason {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "Ready never said {reason}: {:?}\n{}",
            etcd.status,
            logs(work)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The automatic recovery's clock past due: as if no member had served clients for an hour
/// (`EndpointsAvailable` False since then). Set again whenever a status write of the controller,
/// computed from an earlier read, put the real time back.
async fn an_hour_unserved(client: &kube::Client, cluster: &str) {
    use etcdadm_shared::api::cluster::condition::ENDPOINTS_AVAILABLE;
    let name = format!("{cluster}-etcd");
    let etcd = etcd_api(client).get(&name).await.unwrap();
    let mut conditions = etcd.status.clone().unwrap().conditions;
    let now = k8s_openapi::jiff::Timestamp::now();
    let half_an_hour_ago = now - k8s_openapi::jiff::SignedDuration::from_mins(30);
    let mut changed = false;
    for c in conditions.iter_mut().filter(|c| c.type_ == ENDPOINTS_AVAILABLE) {
        assert_eq!(c.status, etcdadm_shared::api::ConditionStatus::False, "{c:?}");
        if c.last_transition_time.0 > half_an_hour_ago {
            c.last_transition_time = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                now - k8s_openapi::jiff::SignedDuration::from_hours(1),
            );
            changed = true;
        }
    }
    if changed {
        etcd_api(client)
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"conditions": conditions}})),
            )
            .await
            .unwrap();
    }
}

/// The non-leader members of `etcd`.
fn followers(etcd: &EtcdadmCluster) -> Vec<String> {
    etcd.status
        .clone()
        .unwrap()
        .members
        .into_iter()
        .filter(|m| !m.is_leader)
        .map(|m| m.name)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stalled_members_cost_nothing_though_an_automatic_recovery_is_due() {
    let work = TempDir::new("sim-recovery-stall");
    let (_s3, plane, keys) = automatic_with_keys_after_a_snapshot(50, "q4", &work).await;
    let client = plane.client.clone();
    let etcd = etcd_api(&client).get("q4-etcd").await.unwrap();
    let (machines_before, members_before, _) = fingerprint_of(&client, "q4").await;

    // Two of three members stall (SIGSTOP) while their Machines stand: the one left answers
    // and follows no leader, which is all the minority side of a partition would see too.
    let stalled = followers(&etcd);
    for name in &stalled {
        plane.runtime.fault(name, Fault::Pause).unwrap();
    }
    wait_ready_reason(&client, "q4", "QuorumLost", &work).await;
    let waiting = answer_of(&client, "q4", "WaitingForEvidenceOfQuorumLoss", &work).await;
    println!("Recovery while two members are stalled: {waiting}");
    assert!(
        waiting.contains("the Machines of 3 standing") && waiting.contains("(2 of 3) gone or failed"),
        "{waiting}"
    );
    // Past due, for many health rounds: nothing deleted, no recovery begun, no snapshot taken.
    let snapshots: Api<EtcdadmSnapshot> = Api::default_namespaced(client.clone());
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        an_hour_unserved(&client, "q4").await;
        let etcd = etcd_api(&client).get("q4-etcd").await.unwrap();
        let status = etcd.status.clone().unwrap();
        assert!(
            status.recovery.is_none(),
            "a recovery began: {:?}",
            status.recovery
        );
        for m in machines(&client, "q4").await {
            assert!(
                !m.is_deleting(),
                "{} is being deleted\n{}",
                m.name_any(),
                logs(&work)
            );
        }
        let names: Vec<String> = snapshots
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|s| s.name_any())
            .collect();
        assert_eq!(names, ["q4-nightly"], "{}", logs(&work));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // They resume: Ready on the same Machines, with the same members and every key.
    for name in &stalled {
        plane.runtime.fault(name, Fault::Resume).unwrap();
    }
    let etcd = wait_settled(&client, "q4", 3, TIMEOUT, &work).await;
    let (machines_after, members_after, _) = fingerprint_of(&client, "q4").await;
    assert_eq!((machines_after, members_after), (machines_before, members_before));
    let present = present_everywhere(&client, "q4", &etcd, &keys).await;
    assert!(present.iter().all(|here| *here), "keys lost: {present:?}");
    assert!(etcd.status.unwrap().last_recovery.is_none());
    save_logs(&work, "recovery-stall");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_machines_the_infrastructure_reports_failed_are_recovered_automatically() {
    let work = TempDir::new("sim-recovery-failed");
    let (_s3, mut plane, keys) = automatic_with_keys_after_a_snapshot(51, "q5", &work).await;
    let client = plane.client.clone();
    let etcd = etcd_api(&client).get("q5-etcd").await.unwrap();
    let (machines_before, ..) = fingerprint_of(&client, "q5").await;
    let failed = followers(&etcd);
    for name in &failed {
        plane.runtime.fault(name, Fault::Fail).unwrap();
    }
    wait_ready_reason(&client, "q5", "QuorumLost", &work).await;
    let mut follower = PhaseFollower::start(&client, "q5");
    let started = Instant::now();
    // Past due until the recovery begins.
    loop {
        an_hour_unserved(&client, "q5").await;
        let etcd = etcd_api(&client).get("q5-etcd").await.unwrap();
        if etcd.status.and_then(|s| s.recovery).is_some() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no automatic recovery began\n{}",
            logs(&work)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (etcd, phases) = wait_recovered(&mut plane, "q5", &work, &mut follower, None).await;
    println!(
        "recovered automatically from {failed:?} reported failed: {:.1}s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(
        phases,
        [
            RecoveryPhase::Snapshotting,
            RecoveryPhase::Replacing,
            RecoveryPhase::Restoring
        ]
    );
    let last = etcd.status.clone().unwrap().last_recovery.unwrap();
    assert_eq!(last.requested, "automatic");
    assert_eq!(last.revisions_lost, Some(0), "{last:?}");
    let present = present_everywhere(&client, "q5", &etcd, &keys).await;
    assert!(present.iter().all(|here| *here), "keys lost: {present:?}");
    let (machines_after, ..) = fingerprint_of(&client, "q5").await;
    assert!(machines_after.is_disjoint(&machines_before));
    save_logs(&work, "recovery-failed");
}

/// Wait until cluster `cluster`'s `Recovery` condition has reason `reason`, the automatic
/// recovery's clock kept past due meanwhile; its message.
async fn answer_of(client: &kube::Client, cluster: &str, reason: &str, work: &TempDir) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        an_hour_unserved(client, cluster).await;
        let etcd = etcd_api(client).get(&format!("{cluster}-etcd")).await.unwrap();
        let (_, seen, message) = condition(&etcd, "Recovery");
        if seen == reason {
            return message;
        }
        assert!(
            Instant::now() < deadline,
            "no Recovery {reason}: {seen} {message}\n{}",
            logs(work)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
