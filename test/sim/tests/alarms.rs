#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! A full database (issue 33), with both real controller binaries and real etcd: a 3-member
//! cluster with a small backend quota, filled by a client overwriting a few keys (the space is
//! history, as with an API server's writes) until etcd raises NOSPACE and refuses writes. The
//! controller names it, compacts, defragments each member and disarms: the cluster ends
//! writable, with no Machine deleted and every acknowledged write present.
//!
//! The quota is 16 MiB; `ALARM_QUOTA=256Mi` runs the same scenario at 256 MiB (BENCHMARKS.md).
//! The same repair holds for a 16 MiB quota set by hand in `etcd.env` (`postEtcdadmCommands`,
//! as before the typed field existed), which the controller does not believe (it believes
//! etcd's default, 2 GiB) and reads from each member's `/metrics` (issue 43, item 4).

mod lifecycle_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use etcdadm_shared::api::quantity::parse_bytes;
use etcdadm_shared::etcd::{MemberClient, Refusal};
use etcdadm_shared::testing::TempDir;
use etcdadm_sim::demo;
use lifecycle_support::*;
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(180);
/// Large enough to fill a quota in a few dozen writes, small enough for one request.
const VALUE_BYTES: usize = 1 << 20;
const KEYS: u32 = 4;

/// The value of write `round`: its number, repeated to [`VALUE_BYTES`].
fn value_of(round: u32) -> Vec<u8> {
    format!("{round:08}").into_bytes().repeat(VALUE_BYTES / 8)
}

/// Reads every 50 ms while the repair runs: the longest time without a successful read.
fn watch_reads(members: Vec<MemberClient>, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Duration> {
    tokio::spawn(async move {
        let mut longest = Duration::ZERO;
        let mut last = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            for member in &members {
                let Ok(mut client) = member.workload_client().await else {
                    continue;
                };
                let read = tokio::time::timeout(Duration::from_secs(1), client.get("/alarms/k0", None)).await;
                if matches!(read, Ok(Ok(_))) {
                    longest = longest.max(last.elapsed());
                    last = Instant::now();
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        longest.max(last.elapsed())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_database_is_repaired_without_deleting_anything() {
    let quota_text = std::env::var("ALARM_QUOTA").unwrap_or_else(|_| "16Mi".into());
    let quota = parse_bytes(&quota_text).unwrap();
    let work = TempDir::new("sim-alarms");
    let plane = start_plane(40, &work, Duration::from_secs(1)).await;
    let config = json!({"quotaBackendBytes": quota_text});
    let status = fill_and_repair(&plane.client, &work, config, &quota_text, quota).await;
    assert!(
        status
            .members
            .iter()
            .all(|m| m.quota_backend_bytes == Some(i64::try_from(quota).unwrap())),
        "the quota each member runs with: {:?}",
        status.members
    );
    save_logs(&work, "alarms");
}

/// The cluster: 16 MiB set by hand in every member's `etcd.env`, etcd restarted to read
/// it; the EtcdadmConfig says nothing, so the controller believes 2 GiB. Before, it disarmed
/// NOSPACE without compacting (16.1 MiB of 2.0 GiB) again and again and etcd never took a write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_set_by_hand_is_repaired_as_etcd_runs_it_not_as_believed() {
    let work = TempDir::new("sim-alarms-by-hand");
    let plane = start_plane(42, &work, Duration::from_secs(1)).await;
    let config = json!({"postEtcdadmCommands": [
        "printf '\\nETCD_QUOTA_BACKEND_BYTES=16777216\\n' >> /etc/etcd/etcd.env",
        "systemctl restart etcd",
    ]});
    let status = fill_and_repair(&plane.client, &work, config, "16Mi by hand", 16 << 20).await;
    // Each member was compacted and defragmented before the one disarm, which spent them.
    assert!(
        status.members.iter().all(|m| m
            .last_defragmentation
            .as_ref()
            .is_some_and(|d| d.disarmed.is_some() && d.size_after < d.size_before)),
        "{:?}",
        status.members
    );
    let events: Vec<(String, String)> = events(&plane.client, "a1").await;
    let disarms = events.iter().filter(|(r, _)| r == "AlarmDisarmed").count();
    assert_eq!(disarms, 1, "one disarm, after the repair: {events:#?}");
    save_logs(&work, "alarms-by-hand");
}

/// Cluster `a1` made with `config`, filled until etcd raises NOSPACE, then repaired by the
/// controller, whose condition names each member's size against `quota` as the member reports
/// it: writable again, nothing deleted, every acknowledged write there. Its status once settled
/// again.
async fn fill_and_repair(
    client: &kube::Client,
    work: &TempDir,
    config: serde_json::Value,
    quota_text: &str,
    quota: u64,
) -> etcdadm_shared::api::EtcdadmClusterStatus {
    let client = client.clone();
    create(&client, "a1", 3, false, config, json!({})).await;
    let etcd = wait_settled(&client, "a1", 3, TIMEOUT, work).await;
    let status = etcd.status.clone().unwrap();
    let before = machine_names(&client, "a1").await;
    let watchers = Watchers::start(&client, "a1").await;

    let tls = demo::etcd_tls(&client, client.default_namespace(), "a1")
        .await
        .unwrap()
        .unwrap();
    let members: Vec<MemberClient> = status
        .endpoints
        .split(',')
        .map(|url| MemberClient::new(url, &tls, Duration::from_secs(5)).unwrap())
        .collect();

    // Overwrite a few keys until etcd refuses: NOSPACE. (The write that crosses the quota is
    // applied all the same and answered NOSPACE: its key may hold it or the acknowledged one.)
    let mut acked: BTreeMap<String, u32> = BTreeMap::new();
    let mut writer = members[0].workload_client().await.unwrap();
    let mut round = 0u32;
    let (refused, refused_write) = loop {
        round += 1;
        let key = format!("/alarms/k{}", round % KEYS);
        match writer.put(key.clone(), value_of(round), None).await {
            Ok(_) => {
                acked.insert(key, round);
            }
            Err(e) => break (e.to_string(), (key, round)),
        }
    };
    let raised = Instant::now();
    assert_eq!(Refusal::from_message(&refused), Refusal::NoSpace, "{refused}");
    println!("etcd refused writes: {refused}");

    // Reads go on during the repair; a write is tried every 100 ms until accepted.
    let stop = Arc::new(AtomicBool::new(false));
    let reads = watch_reads(
        status
            .endpoints
            .split(',')
            .map(|url| MemberClient::new(url, &tls, Duration::from_secs(5)).unwrap())
            .collect(),
        stop.clone(),
    );
    let mut reasons = Vec::new();
    let mut messages: Vec<String> = Vec::new();
    let writable = loop {
        let etcd = etcd_api(&client).get("a1-etcd").await.unwrap();
        let (_, reason, message) = condition(&etcd, "Ready");
        if messages.last() != Some(&message) {
            println!(
                "{:>5.1}s Ready: {reason}: {message}",
                raised.elapsed().as_secs_f64()
            );
            if reason == "DatabaseQuotaExceeded" {
                messages.push(message.clone());
            }
        }
        if reasons.last() != Some(&reason) {
            reasons.push(reason);
        }
        if writer.put("/alarms/after", "x", None).await.is_ok() {
            break raised.elapsed();
        }
        assert!(
            raised.elapsed() < TIMEOUT,
            "still refusing writes: {:?}\n{}",
            etcd.status,
            logs(work)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    stop.store(true, Ordering::Relaxed);
    let longest_read_gap = reads.await.unwrap();
    println!(
        "quota {quota_text}: NOSPACE raised -> writes accepted in {:.1}s; longest time without a successful read {} ms",
        writable.as_secs_f64(),
        longest_read_gap.as_millis()
    );
    assert!(
        reasons.iter().any(|r| r == "DatabaseQuotaExceeded"),
        "the condition named the full database: {reasons:?}"
    );
    // A member's quota is read from its /metrics as soon as the cluster's alarm list shows
    // NOSPACE: the repair's first words already name the quota etcd runs with.
    let reported = format!(" of {}", etcdadm_shared::api::quantity::human(quota));
    let first = messages.first().expect("a DatabaseQuotaExceeded message");
    assert!(
        first.contains(&reported) && !first.contains("believed"),
        "the first message of the repair did not name the quota etcd runs with: {messages:#?}"
    );

    // Ready again, the alarm gone from status, nothing deleted, every acknowledged key there.
    let etcd = wait_settled(&client, "a1", 3, TIMEOUT, work).await;
    let status = etcd.status.clone().unwrap();
    assert!(status.members.iter().all(|m| m.alarms.is_empty()), "{status:?}");
    assert!(
        status.members.iter().all(|m| m.last_defragmentation.is_some()),
        "every member defragmented once: {:?}",
        status.members
    );
    assert_eq!(machine_names(&client, "a1").await, before, "no Machine replaced");
    let (history, machine_log) = watchers.finish();
    assert_safe(&history, &machine_log);
    let mut reader = members[1].workload_client().await.unwrap();
    for (key, round) in &acked {
        let got = reader.get(key.as_str(), None).await.unwrap();
        let value = got.kvs().first().map(|kv| kv.value().to_vec());
        let refused_here = (key == &refused_write.0).then(|| value_of(refused_write.1));
        assert!(
            value == Some(value_of(*round)) || (value.is_some() && value == refused_here),
            "{key}: neither the last acknowledged write ({round}) nor the refused one ({refused_write:?})"
        );
    }
    let events: Vec<(String, String)> = events(&client, "a1").await;
    let reasons: Vec<&str> = events.iter().map(|(r, _)| r.as_str()).collect();
    for wanted in [
        "AlarmRaised",
        "HistoryCompacted",
        "MemberDefragmented",
        "AlarmDisarmed",
        "AlarmCleared",
    ] {
        assert!(reasons.contains(&wanted), "no {wanted} Event: {events:#?}");
    }
    let raised_events = reasons.iter().filter(|r| **r == "AlarmRaised").count();
    assert_eq!(raised_events, 1, "{events:#?}");
    status
}
