#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Rolling replacement on an etcd version change, with both real controller binaries and real
//! etcd, while a client writes and reads through the etcd endpoints every 50 ms:
//! - with a KubeadmControlPlane and `maxSurge: 1`: surge-then-switch, one endpoint update;
//! - with a KubeadmControlPlane and `maxSurge: 0`: never more than N members;
//! - without a control plane: one at a time, never more than N+1 members.
//!
//! The version change is real: the machines' etcdadm stand-in installs etcd by major.minor, so
//! 3.4.22 and 3.4.23 both run the host's etcd 3.4, and the spec change rolls every member.
//! Changing NTP servers or users' SSH keys alone rolls nothing.

mod lifecycle_support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use etcdadm_shared::testing::TempDir;
use kube::ResourceExt;
use lifecycle_support::*;
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(180);
/// The longest a client may wait for an acknowledged write.
const MAX_WRITE_GAP: Duration = Duration::from_secs(2);

fn config(version: &str) -> Value {
    json!({
        "cloudInitConfig": {"version": version},
        "ntp": {"servers": ["0.pool.ntp.org"], "enabled": true},
        "users": [{"name": "ops", "sshAuthorizedKeys": ["ssh-ed25519 AAAAC3Nza one@example"]}],
    })
}

async fn machine_names(client: &kube::Client, cluster: &str) -> BTreeSet<String> {
    machines(client, cluster)
        .await
        .iter()
        .map(|m| m.name_any())
        .collect()
}

struct Outcome {
    wall: Duration,
    peak_members: usize,
    kcp_writes: usize,
    max_gap: Duration,
}

/// Change the spec with `patch`, keep a client busy meanwhile, wait until every Machine was
/// replaced; check the membership rules and what the client saw.
async fn roll(
    plane: &etcdadm_sim::plane::Plane,
    work: &TempDir,
    watchers: &Watchers,
    cluster: &str,
    with_kcp: bool,
    patch: Value,
) -> Outcome {
    let client = &plane.client;
    let old = machine_names(client, cluster).await;
    let (endpoints, follower) = if with_kcp {
        follow_kcp_endpoints(client, cluster)
    } else {
        follow_status_endpoints(client, cluster)
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    let workload = Workload::start(client, cluster, endpoints, watchers.started).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let kcp_before = plane.kcp_record.lock().unwrap().endpoint_changes.len();
    let t0 = watchers.now();
    let started = Instant::now();
    patch_spec(client, cluster, patch).await;
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let etcd = wait_settled(client, cluster, old.len(), TIMEOUT, work).await;
        let now = machine_names(client, cluster).await;
        if now.is_disjoint(&old) {
            let status = etcd.status.unwrap();
            assert!(status.members.iter().all(|m| !old.contains(&m.name)));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "old Machines remain: {now:?}\n{}",
            logs(work)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let wall = started.elapsed();
    let t1 = watchers.now();
    // Let the KCP stand-in take its last look, and the client a few more writes.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let report = workload.finish().await;
    follower.abort();
    let kcp_writes = plane.kcp_record.lock().unwrap().endpoint_changes.len() - kcp_before;
    let history = watchers.history();
    let machine_log = watchers.machines();
    assert!(
        report.lost.is_empty(),
        "acknowledged writes lost: {:?}",
        report.lost
    );
    assert!(report.acked > 50, "the client hardly wrote: {report:?}");
    assert!(
        report.max_gap < MAX_WRITE_GAP,
        "the client waited {:?} for a write (at {:?}): {report:?}\n{history:#?}\n{}",
        report.max_gap,
        report.max_gap_at,
        logs(work)
    );
    for name in &old {
        let life = &machine_log.lives[name];
        assert!(life.gone.is_some(), "old Machine {name} not gone");
    }
    let last: BTreeSet<String> = history
        .last()
        .unwrap()
        .members
        .iter()
        .map(|m| m.1.clone())
        .collect();
    assert!(last.is_disjoint(&old), "old members remain in etcd: {last:?}");
    assert_safe(&history, &machine_log);
    let peak_members = history.max_size_between(t0, t1);
    println!(
        "{cluster}: rolled {} members in {:.1}s; peak {peak_members} members; {kcp_writes} KCP endpoint updates; client: {} writes, longest gap {:?}, {} failed attempts, {} endpoint switches",
        old.len(),
        wall.as_secs_f64(),
        report.acked,
        report.max_gap,
        report.failed_attempts,
        report.endpoint_switches
    );
    Outcome {
        wall,
        peak_members,
        kcp_writes,
        max_gap: report.max_gap,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_change_rolls_every_member_one_change_at_a_time_without_losing_writes() {
    let work = TempDir::new("sim-lifecycle-rollout");
    let plane = start_plane(5, &work, Duration::from_secs(1)).await;
    let client = plane.client.clone();
    create(&client, "r1", 3, true, config("3.4.22"), json!({})).await;
    wait_settled(&client, "r1", 3, TIMEOUT, &work).await;
    let watchers = Watchers::start(&client, "r1").await;

    // NTP servers and SSH keys alone roll nothing.
    let before = machine_names(&client, "r1").await;
    let mut quiet = config("3.4.22");
    quiet["ntp"]["servers"] = json!(["1.pool.ntp.org", "2.pool.ntp.org"]);
    quiet["users"][0]["sshAuthorizedKeys"] = json!(["ssh-ed25519 AAAAC3Nza two@example"]);
    patch_spec(&client, "r1", json!({"etcdadmConfigSpec": quiet})).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let etcd = wait_settled(&client, "r1", 3, TIMEOUT, &work).await;
    assert_eq!(
        machine_names(&client, "r1").await,
        before,
        "an NTP/SSH change rolled Machines"
    );
    assert_eq!(condition(&etcd, "MachinesSpecUpToDate").0, "True");

    // With the KCP, maxSurge 1: 3 → 6 → 3 members, one endpoint update.
    let mut upgrade = quiet.clone();
    upgrade["cloudInitConfig"]["version"] = json!("3.4.23");
    let surge = roll(
        &plane,
        &work,
        &watchers,
        "r1",
        true,
        json!({"etcdadmConfigSpec": upgrade}),
    )
    .await;
    assert_eq!(
        surge.peak_members, 6,
        "surge-then-switch adds every new member first"
    );
    assert_eq!(surge.kcp_writes, 1, "{:?}", plane.kcp_record.lock().unwrap());
    let reasons: Vec<String> = events(&client, "r1").await.into_iter().map(|(r, _)| r).collect();
    assert!(reasons.iter().any(|r| r == "RollingUpdate"), "{reasons:?}");

    // With the KCP, maxSurge 0: never more than 3 members, one control plane rollout each.
    let mut downgrade = quiet.clone();
    downgrade["cloudInitConfig"]["version"] = json!("3.4.22");
    let remove_first = roll(
        &plane,
        &work,
        &watchers,
        "r1",
        true,
        json!({"etcdadmConfigSpec": downgrade, "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0}}}),
    )
    .await;
    assert_eq!(remove_first.peak_members, 3, "maxSurge 0 never exceeds N");
    assert_eq!(remove_first.kcp_writes, 3);
    let (history, machine_log) = watchers.finish();
    assert_safe(&history, &machine_log);

    // Without a control plane, maxSurge 1: never more than N+1.
    create(&client, "r2", 3, false, config("3.4.22"), json!({})).await;
    wait_settled(&client, "r2", 3, TIMEOUT, &work).await;
    let watchers = Watchers::start(&client, "r2").await;
    let mut upgrade = config("3.4.23");
    upgrade["preEtcdadmCommands"] = json!(["echo upgraded"]);
    let alone = roll(
        &plane,
        &work,
        &watchers,
        "r2",
        false,
        json!({"etcdadmConfigSpec": upgrade}),
    )
    .await;
    assert_eq!(alone.peak_members, 4, "one at a time, add first");
    let (history, machine_log) = watchers.finish();
    assert_safe(&history, &machine_log);
    println!(
        "rollout wall time for 3 members: {:.1}s with KCP (maxSurge 1), {:.1}s with KCP (maxSurge 0), {:.1}s without; longest client write gap {:?}",
        surge.wall.as_secs_f64(),
        remove_first.wall.as_secs_f64(),
        alone.wall.as_secs_f64(),
        [surge.max_gap, remove_first.max_gap, alone.max_gap]
            .into_iter()
            .max()
            .unwrap()
    );
    drop(plane);
}
