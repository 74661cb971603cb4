#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! A CORRUPT alarm (issue 43, item 2), with both real controller binaries and real etcd: the
//! controller confirms it with the members' own `HashKV` before replacing anything. A forged
//! alarm (raised through etcd's Alarm API with a client certificate of the cluster's CA, as a
//! compromised API server could) finds every hash equal: disarmed, nothing replaced, said. A
//! member whose data really differs (a value's bytes rewritten in its database file while its
//! etcd was stopped, as a failing disk would; etcd then serves the changed value) is replaced,
//! alone, and the alarm disarmed once it is gone.

mod lifecycle_support;

use std::time::{Duration, Instant};

use etcd_client::{AlarmAction, AlarmOptions, AlarmType};
use etcdadm_shared::api::EtcdadmClusterStatus;
use etcdadm_shared::etcd::{MemberClient, Refusal, member_id_hex};
use etcdadm_shared::testing::TempDir;
use etcdadm_sim::demo;
use lifecycle_support::*;
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(180);
const KEYS: usize = 20;

/// A value of key `i` that occurs nowhere else in a database file.
fn value_of(i: usize) -> String {
    format!("precious-value-{i:04}-abcdefghijklmnopqrstuvwxyz")
}

/// Clients of every member at the status' endpoints.
async fn clients(client: &kube::Client, status: &EtcdadmClusterStatus) -> Vec<MemberClient> {
    let tls = demo::etcd_tls(client, client.default_namespace(), "c1")
        .await
        .unwrap()
        .unwrap();
    status
        .endpoints
        .split(',')
        .map(|url| MemberClient::new(url, &tls, Duration::from_secs(5)).unwrap())
        .collect()
}

/// Raise CORRUPT on member `named` through etcd's Alarm API, as anyone with a client
/// certificate of the cluster's CA can; then etcd refuses writes.
async fn raise_corrupt(via: &MemberClient, named: u64) {
    let mut raw = via.workload_client().await.unwrap();
    let mut options = AlarmOptions::new();
    options.with_member(named);
    raw.alarm(AlarmAction::Activate, AlarmType::Corrupt, Some(options))
        .await
        .unwrap();
    let refused = raw.put("/corrupt/refused", "x", None).await.unwrap_err();
    assert_eq!(
        Refusal::from_message(&refused.to_string()),
        Refusal::Corrupt,
        "{refused}"
    );
}

/// Write every key; then every member holds it.
async fn write_keys(member: &MemberClient) {
    let mut writer = member.workload_client().await.unwrap();
    for i in 0..KEYS {
        writer
            .put(format!("/corrupt/k{i}"), value_of(i), None)
            .await
            .unwrap();
    }
}

/// Until a write is accepted again: how long it took.
async fn wait_writable(member: &MemberClient, work: &TempDir) -> Duration {
    let started = Instant::now();
    let mut writer = member.workload_client().await.unwrap();
    loop {
        if writer.put("/corrupt/after", "x", None).await.is_ok() {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < TIMEOUT,
            "still refusing writes\n{}",
            logs(work)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every key, read through every member, holds the value written.
async fn assert_every_key(members: &[MemberClient]) {
    for member in members {
        let mut reader = member.workload_client().await.unwrap();
        for i in 0..KEYS {
            let got = reader.get(format!("/corrupt/k{i}"), None).await.unwrap();
            let value = got.kvs().first().map(|kv| kv.value().to_vec());
            assert_eq!(
                value.as_deref(),
                Some(value_of(i).as_bytes()),
                "{}: /corrupt/k{i}",
                member.endpoint()
            );
        }
    }
}

fn member_id(status: &EtcdadmClusterStatus, machine: &str) -> u64 {
    let hex = status
        .members
        .iter()
        .find(|m| m.name == machine)
        .and_then(|m| m.member_id.clone())
        .unwrap();
    u64::from_str_radix(&hex, 16).unwrap()
}

fn a_follower(status: &EtcdadmClusterStatus) -> String {
    status
        .members
        .iter()
        .find(|m| !m.is_leader && !m.is_learner)
        .map(|m| m.name.clone())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_corrupt_alarm_replaces_nothing_and_the_cluster_is_writable_again() {
    let work = TempDir::new("sim-corrupt-forged");
    let plane = start_plane(43, &work, Duration::from_secs(1)).await;
    let client = plane.client.clone();
    create(&client, "c1", 3, false, json!({}), json!({})).await;
    let etcd = wait_settled(&client, "c1", 3, TIMEOUT, &work).await;
    let status = etcd.status.clone().unwrap();
    let members = clients(&client, &status).await;
    write_keys(&members[0]).await;
    let before = machine_names(&client, "c1").await;
    let watchers = Watchers::start(&client, "c1").await;

    let named = a_follower(&status);
    raise_corrupt(&members[0], member_id(&status, &named)).await;
    let took = wait_writable(&members[0], &work).await;
    println!(
        "forged CORRUPT on {named}: writes accepted again after {:.1}s",
        took.as_secs_f64()
    );

    let etcd = wait_settled(&client, "c1", 3, TIMEOUT, &work).await;
    let status = etcd.status.clone().unwrap();
    assert_eq!(machine_names(&client, "c1").await, before, "no Machine replaced");
    let unconfirmed = status.unconfirmed_corrupt.clone().unwrap();
    assert_eq!(unconfirmed.count, 1, "{unconfirmed:?}");
    assert!(status.members.iter().all(|m| m.alarms.is_empty()), "{status:?}");
    let events = events(&client, "c1").await;
    let said = events
        .iter()
        .find(|(reason, _)| reason == "CorruptAlarmNotConfirmed")
        .unwrap_or_else(|| panic!("no CorruptAlarmNotConfirmed Event: {events:#?}"));
    assert!(said.1.contains("hashes the same"), "{said:?}");
    assert!(
        !events.iter().any(|(reason, _)| reason == "MemberRemediation"),
        "{events:#?}"
    );
    let (history, machine_log) = watchers.finish();
    assert_safe(&history, &machine_log);
    assert_every_key(&members).await;
    save_logs(&work, "corrupt-forged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_data_differs_is_replaced_alone() {
    let work = TempDir::new("sim-corrupt-real");
    let plane = start_plane(47, &work, Duration::from_secs(1)).await;
    let client = plane.client.clone();
    // etcd's own start-up check would refuse to start the member we damage (it is not what is
    // tested here): off, so the damaged member serves, as one whose disk failed after its start.
    create(
        &client,
        "c1",
        3,
        false,
        json!({"corruptionChecks": "Disabled"}),
        json!({}),
    )
    .await;
    let etcd = wait_settled(&client, "c1", 3, TIMEOUT, &work).await;
    let status = etcd.status.clone().unwrap();
    let members = clients(&client, &status).await;
    write_keys(&members[0]).await;
    let before = machine_names(&client, "c1").await;

    // One follower's database file has key 7's value rewritten while its etcd is stopped.
    let damaged = a_follower(&status);
    let runtime = plane.built_in.as_ref().unwrap();
    let env = runtime.etcd_environment(&damaged).unwrap();
    let data_dir = env
        .iter()
        .find(|(k, _)| k == "ETCD_DATA_DIR")
        .map_or_else(|| "/var/lib/etcd".to_string(), |(_, v)| v.clone());
    let (from, to) = (value_of(7), value_of(7).replace("precious", "damaged!"));
    assert_eq!(from.len(), to.len());
    let script = format!(
        "systemctl stop etcd && perl -0777 -pi -e 's/{from}/{to}/g' {data_dir}/member/snap/db && grep -c {to} {data_dir}/member/snap/db && systemctl start etcd"
    );
    let output = runtime.run_in_machine(&damaged, &script).unwrap();
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    // It serves the changed value.
    let damaged_id = member_id(&status, &damaged);
    let damaged_client = {
        let url = status
            .members
            .iter()
            .find(|m| m.name == damaged)
            .and_then(|m| m.client_url.clone())
            .unwrap();
        members.iter().find(|m| m.endpoint() == url).unwrap()
    };
    let started = Instant::now();
    loop {
        let served = async {
            let mut c = damaged_client.workload_client().await.ok()?;
            let got = c
                .get(
                    "/corrupt/k7",
                    Some(etcd_client::GetOptions::new().with_serializable()),
                )
                .await
                .ok()?;
            got.kvs().first().map(|kv| kv.value().to_vec())
        }
        .await;
        if served.as_deref() == Some(to.as_bytes()) {
            break;
        }
        assert!(
            started.elapsed() < TIMEOUT,
            "the damaged member serves {served:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let watchers = Watchers::start(&client, "c1").await;

    // CORRUPT raised on it, as etcd's corruption check would.
    let healthy = members
        .iter()
        .find(|m| m.endpoint() != damaged_client.endpoint())
        .unwrap();
    raise_corrupt(healthy, damaged_id).await;
    let took = wait_writable(healthy, &work).await;
    println!(
        "CORRUPT on {damaged} (data differs): writes accepted again after {:.1}s",
        took.as_secs_f64()
    );

    let etcd = wait_settled(&client, "c1", 3, TIMEOUT, &work).await;
    let status = etcd.status.clone().unwrap();
    let after = machine_names(&client, "c1").await;
    let gone: Vec<&String> = before.difference(&after).collect();
    assert_eq!(gone, [&damaged], "only the damaged member's Machine replaced");
    assert_eq!(after.len(), 3);
    assert!(status.unconfirmed_corrupt.is_none(), "{status:?}");
    assert!(status.members.iter().all(|m| m.alarms.is_empty()), "{status:?}");
    assert!(
        !status
            .members
            .iter()
            .any(|m| m.member_id.as_deref() == Some(member_id_hex(damaged_id).as_str())),
        "{status:?}"
    );
    let (history, machine_log) = watchers.finish();
    assert_safe(&history, &machine_log);
    assert_every_key(&clients(&client, &status).await).await;
    save_logs(&work, "corrupt-real");
}
