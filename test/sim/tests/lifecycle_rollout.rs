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

use std::time::Duration;

use etcdadm_shared::testing::TempDir;
use lifecycle_support::*;
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(180);

fn config(version: &str) -> Value {
    json!({
        "cloudInitConfig": {"version": version},
        "ntp": {"servers": ["0.pool.ntp.org"], "enabled": true},
        "users": [{"name": "ops", "sshAuthorizedKeys": ["ssh-ed25519 AAAAC3Nza one@example"]}],
    })
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
