#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Routine defragmentation (issue 34), with both real controller binaries and real etcd:
//!
//! - a 3-member cluster whose members are fragmented (a client writes 110 MiB and deletes it,
//!   then the history is compacted, as an API server does every 5 minutes) is defragmented on
//!   the default policy (set once every member is fragmented), one member at a time, the leader
//!   last; every database shrinks, and a
//!   client writing every 50 ms throughout loses no acknowledged write;
//! - nothing is defragmented while a rollout is under way (here rolled by an `etcdSettings`
//!   change), though the old members are fragmented and the policy asks for it; once the
//!   cluster is settled again it is.
//!
//! `DASHBOARD_SVG=<path>` writes the dashboard's panels over the first scenario's scrapes of the
//! controller's metrics there (the README's picture). `DEFRAG_MIB=500` runs the first with 500 MiB, and `DEFRAG_KEEP_HALF=1` keeps every other
//! value (half the database live, so etcd's defragment has that much to copy): BENCHMARKS.md.

mod lifecycle_support;

use std::time::{Duration, Instant};

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::etcd::MemberClient;
use etcdadm_shared::testing::TempDir;
use etcdadm_sim::dashboard_svg::{self, Scrape};
use etcdadm_sim::demo;
use etcdadm_sim::plane::Plane;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Patch, PatchParams};
use lifecycle_support::*;
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(300);
/// Values small enough for one request (etcd takes 1.5 MiB at most).
const VALUE_BYTES: usize = 512 << 10;

/// Clients of every voting member of `cluster`, over the controller's CA.
async fn member_clients(client: &kube::Client, cluster: &str, etcd: &EtcdadmCluster) -> Vec<MemberClient> {
    let tls = demo::etcd_tls(client, client.default_namespace(), cluster)
        .await
        .unwrap()
        .unwrap();
    etcd.status
        .as_ref()
        .unwrap()
        .endpoints
        .split(',')
        .map(|url| MemberClient::new(url, &tls, Duration::from_secs(30)).unwrap())
        .collect()
}

/// Write `mib` MiB under `/fragment/`, delete it all (or every other value, with `keep_half`)
/// and compact the history at the last delete: every member's database keeps its size, nearly
/// all (or half) of it free.
async fn fragment(members: &[MemberClient], mib: usize, keep_half: bool) {
    let mut writer = members[0].workload_client().await.unwrap();
    let count = mib * (1 << 20) / VALUE_BYTES;
    let started = Instant::now();
    for i in 0..count {
        let value = vec![u8::try_from(i % 251).unwrap(); VALUE_BYTES];
        writer
            .put(format!("/fragment/{i:06}"), value, None)
            .await
            .unwrap();
    }
    let mut revision = 0;
    for i in (0..count).filter(|i| !keep_half || i % 2 == 1) {
        let deleted = writer.delete(format!("/fragment/{i:06}"), None).await.unwrap();
        revision = deleted.header().map_or(revision, |h| h.revision());
    }
    members[0].compact(revision, true).await.unwrap();
    println!(
        "wrote and deleted {mib} MiB in {:.1}s, compacted at revision {revision}",
        started.elapsed().as_secs_f64()
    );
}

/// Until every member has at least 45 % of a database of at least 100 MiB free (the default
/// policy's threshold), as each says itself.
async fn wait_every_member_fragmented(members: &[MemberClient]) {
    let deadline = Instant::now() + TIMEOUT;
    for member in members {
        loop {
            let status = member.status().await.unwrap();
            let free = status.db_size.saturating_sub(status.db_size_in_use);
            if status.db_size >= 100 << 20 && free * 100 >= status.db_size * 45 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{} is not fragmented: {status:?}",
                member.endpoint()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Each member in one status the controller wrote: its name, whether it was the leader and
/// whether it had been defragmented.
type StatusMembers = Vec<(String, bool, bool)>;

/// Each member in a status the controller wrote for a cluster: a status that records a
/// defragmentation was written by the reconcile that chose the member, so its leader flags are
/// what that choice saw (leadership can move while the members are busy).
fn status_members(etcd: EtcdadmCluster) -> StatusMembers {
    etcd.status
        .unwrap_or_default()
        .members
        .iter()
        .map(|m| (m.name.clone(), m.is_leader, m.last_defragmentation.is_some()))
        .collect()
}

/// The leader rule on what the controller saw: no member was defragmented while it led and a
/// follower was still due. Returns the leaders seen over the run.
fn assert_leader_went_last(statuses: &[StatusMembers]) -> std::collections::BTreeSet<String> {
    let mut first_record: Vec<&str> = vec![];
    for status in statuses {
        for (name, leader, defragmented) in status {
            if *defragmented && !first_record.contains(&name.as_str()) {
                first_record.push(name);
                let due = status.iter().filter(|m| !m.2).count();
                assert!(
                    !*leader || due == 0,
                    "{name} was defragmented while it led and {due} follower(s) were due: {statuses:#?}"
                );
            }
        }
    }
    statuses
        .iter()
        .flatten()
        .filter(|m| m.1)
        .map(|m| m.0.clone())
        .collect()
}

/// How many `MemberDefragmented` Events `<cluster>-etcd` got, and their notes: repeats within
/// six minutes are one Event counted in its series, as client-go does.
async fn defragmented_events(client: &kube::Client, cluster: &str) -> (i32, Vec<String>) {
    let api: kube::Api<Event> = kube::Api::default_namespaced(client.clone());
    let regarding = format!("{cluster}-etcd");
    let found: Vec<Event> = api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("MemberDefragmented")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(regarding.as_str())
        })
        .collect();
    let count = found
        .iter()
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum();
    (count, found.into_iter().filter_map(|e| e.note).collect())
}

/// The controller's metrics now.
async fn scrape(plane: &Plane, since: Instant) -> Scrape {
    Scrape {
        at: since.elapsed().as_secs_f64(),
        text: plane.scrape_metrics(CONTROLLER).await.unwrap(),
    }
}

/// The controller's metrics every half second for `how_long`.
async fn scrape_for(plane: &Plane, since: Instant, how_long: Duration, scrapes: &mut Vec<Scrape>) {
    let until = Instant::now() + how_long;
    while Instant::now() < until {
        scrapes.push(scrape(plane, since).await);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The value of the sample `name{...cluster...}` in the controller's metrics.
fn sample(metrics: &str, name: &str, cluster: &str) -> Option<f64> {
    let label = format!("name=\"{cluster}-etcd\"");
    metrics
        .lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(&label))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fragmented_members_are_defragmented_one_at_a_time_the_leader_last_losing_no_write() {
    let mib: usize = std::env::var("DEFRAG_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(110);
    let keep_half = std::env::var_os("DEFRAG_KEEP_HALF").is_some();
    let work = TempDir::new("sim-maintenance");
    let plane = start_plane(44, &work, Duration::from_secs(1)).await;
    let client = plane.client.clone();
    // Off while the members are fragmented: a member applies the compaction a moment after
    // another, and the policy, asked meanwhile, would rightly take the only one due (the
    // leader, at times). The default policy once every member is fragmented.
    let off = json!({"maintenance": {"defragmentation": {"mode": "Off"}}});
    create(&client, "d1", 3, false, json!({}), off).await;
    let etcd = wait_settled(&client, "d1", 3, TIMEOUT, &work).await;
    let before = machine_names(&client, "d1").await;
    let members = member_clients(&client, "d1", &etcd).await;
    let watchers = Watchers::start(&client, "d1").await;
    let (endpoints, follower) = follow_status_endpoints(&client, "d1");
    let (mut statuses, status_watch) = follow_etcd_cluster(&client, "d1", status_members);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let workload = Workload::start(&client, "d1", endpoints, watchers.started).await;

    // The controller's metrics every half second, for the README's picture of the dashboard.
    let since = Instant::now();
    let mut scrapes = vec![];
    scrape_for(&plane, since, Duration::from_secs(3), &mut scrapes).await;
    let fragmenting = fragment(&members, mib, keep_half);
    tokio::pin!(fragmenting);
    loop {
        tokio::select! {
            () = &mut fragmenting => break,
            () = tokio::time::sleep(Duration::from_millis(500)) => scrapes.push(scrape(&plane, since).await),
        }
    }
    wait_every_member_fragmented(&members).await;
    let default_policy = json!({"spec": {"maintenance": {"defragmentation": null}}});
    etcd_api(&client)
        .patch("d1-etcd", &PatchParams::default(), &Patch::Merge(&default_policy))
        .await
        .unwrap();
    let fragmented = Instant::now();
    let done = loop {
        scrapes.push(scrape(&plane, since).await);
        let etcd = etcd_api(&client).get("d1-etcd").await.unwrap();
        let status = etcd.status.clone().unwrap_or_default();
        if status.members.len() == 3 && status.members.iter().all(|m| m.last_defragmentation.is_some()) {
            break etcd;
        }
        assert!(
            fragmented.elapsed() < TIMEOUT,
            "not every member defragmented: {:?}\n{}",
            status.members,
            logs(&work)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let wall = fragmented.elapsed();
    scrape_for(&plane, since, Duration::from_secs(3), &mut scrapes).await;
    if let Some(path) = std::env::var_os("DASHBOARD_SVG") {
        let dashboard = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/prometheus/dashboard.json"),
        )
        .unwrap();
        let svg = dashboard_svg::render(&serde_json::from_str(&dashboard).unwrap(), &scrapes, "d1-etcd");
        std::fs::write(&path, svg).unwrap();
    }
    let report = workload.finish().await;
    follower.abort();

    let status = done.status.clone().unwrap();
    let mut order: Vec<_> = status
        .members
        .iter()
        .map(|m| {
            (
                m.last_defragmentation.clone().unwrap(),
                m.name.clone(),
                m.is_leader,
            )
        })
        .collect();
    // Times are kept to the second; the revision, which the client's writes move on, orders
    // them finer.
    order.sort_by_key(|(d, ..)| (d.time.0, d.revision));
    for (d, name, _) in &order {
        println!(
            "{name}: {} MiB -> {} MiB at revision {} ({})",
            d.size_before >> 20,
            d.size_after >> 20,
            d.revision,
            d.time.0
        );
        assert!(
            d.size_before >= i64::try_from(mib.min(100) << 20).unwrap(),
            "{name} was not fragmented to the threshold: {d:?}"
        );
        let shrunk = if keep_half {
            d.size_after * 10 < d.size_before * 7
        } else {
            d.size_after * 4 < d.size_before
        };
        assert!(shrunk, "{name} did not shrink: {d:?}");
    }
    let leader = order.iter().filter(|(.., leader)| *leader).count();
    assert_eq!(leader, 1, "one leader: {order:?}");
    status_watch.abort();
    let statuses: Vec<StatusMembers> = std::iter::from_fn(|| statuses.try_recv().ok()).collect();
    let leaders = assert_leader_went_last(&statuses);
    // When leadership stayed put (it can move under load), the leader was the last one.
    if leaders.len() == 1 {
        assert!(order[2].2, "the leader went last: {order:?}");
    } else {
        println!("leadership moved during the run: {leaders:?}");
    }
    assert!(
        order[0].0.revision < order[1].0.revision && order[1].0.revision < order[2].0.revision,
        "one at a time, each after the client wrote again: {order:?}"
    );
    assert!(
        report.lost.is_empty(),
        "acknowledged writes lost: {:?}",
        report.lost
    );
    assert!(report.acked > 20, "the client hardly wrote: {report:?}");
    assert_eq!(machine_names(&client, "d1").await, before, "no Machine replaced");
    let (history, machine_log) = watchers.finish();
    assert_safe(&history, &machine_log);
    let (count, notes) = defragmented_events(&client, "d1").await;
    assert_eq!(count, 3, "one Event per member: {notes:#?}");
    assert!(
        notes
            .iter()
            .all(|n| n.contains("on the maintenance policy") && n.contains("free space")),
        "{notes:#?}"
    );
    let metrics = plane.scrape_metrics(CONTROLLER).await.unwrap();
    let count = sample(&metrics, "etcdadm_defragmentations_total", "d1");
    assert_eq!(count, Some(3.0), "{metrics}");
    let reclaimed = sample(&metrics, "etcdadm_defragmentation_reclaimed_bytes_total", "d1").unwrap();
    let pause = sample(&metrics, "etcdadm_defragmentation_duration_seconds_sum", "d1").unwrap();
    println!(
        "{mib} MiB{}: 3 members defragmented {:.1}s after the compaction ({:.2}s in etcd's defragment calls, {:.2}s per member), {} MiB returned; client: {} writes, longest gap {} ms, {} failed attempts",
        if keep_half { " (half kept)" } else { "" },
        wall.as_secs_f64(),
        pause,
        pause / 3.0,
        reclaimed as u64 >> 20,
        report.acked,
        report.max_gap.as_millis(),
        report.failed_attempts
    );
    save_logs(&work, "maintenance");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_defragmented_during_a_rollout() {
    let work = TempDir::new("sim-maintenance-rollout");
    let plane = start_plane(45, &work, Duration::from_secs(1)).await;
    let client = plane.client.clone();
    // Off while the members are fragmented, so that it is the rollout that holds it back.
    let small = json!({"minimumSize": "4Mi", "interval": "1m"});
    let mut off = small.clone();
    off["mode"] = json!("Off");
    create(
        &client,
        "d2",
        3,
        false,
        json!({}),
        json!({"maintenance": {"defragmentation": off}}),
    )
    .await;
    let etcd = wait_settled(&client, "d2", 3, TIMEOUT, &work).await;
    let old = machine_names(&client, "d2").await;
    fragment(&member_clients(&client, "d2", &etcd).await, 8, false).await;
    // Automatic from now on, and a new etcd setting that replaces every member.
    let mut on = small.clone();
    on["mode"] = json!("Automatic");
    let watchers = Watchers::start(&client, "d2").await;
    let (spy, seen) = defragmentations_while_old_members_remain(&client, "d2", old.clone());
    roll(
        &plane,
        &work,
        &watchers,
        "d2",
        false,
        json!({"maintenance": {"defragmentation": on}, "etcdadmConfigSpec": {"etcdSettings": {"snapshot-count": 50000}}}),
    )
    .await;
    spy.abort();
    let (reads, during) = seen.lock().unwrap().clone();
    assert!(reads > 10, "the rollout was hardly watched ({reads} reads)");
    assert!(
        during.is_empty(),
        "a member was defragmented during the rollout: {during:?}"
    );
    // Settled again: fragmented members are defragmented as the policy says.
    let etcd = wait_settled(&client, "d2", 3, TIMEOUT, &work).await;
    fragment(&member_clients(&client, "d2", &etcd).await, 8, false).await;
    let started = Instant::now();
    loop {
        let etcd = etcd_api(&client).get("d2-etcd").await.unwrap();
        let status = etcd.status.unwrap_or_default();
        if status.members.len() == 3 && status.members.iter().all(|m| m.last_defragmentation.is_some()) {
            break;
        }
        assert!(
            started.elapsed() < TIMEOUT,
            "the policy never defragmented the settled cluster\n{}",
            logs(&work)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (history, machine_log) = watchers.finish();
    assert_safe(&history, &machine_log);
    save_logs(&work, "maintenance-rollout");
}

/// How many reads, and what was found.
type Seen = std::sync::Arc<std::sync::Mutex<(usize, Vec<String>)>>;

/// Read `<cluster>-etcd` every 100 ms until aborted: how often, and every member found
/// defragmented in a status that still lists one of the `old` members (a rollout under way).
fn defragmentations_while_old_members_remain(
    client: &kube::Client,
    cluster: &str,
    old: std::collections::BTreeSet<String>,
) -> (tokio::task::JoinHandle<()>, Seen) {
    let seen = std::sync::Arc::new(std::sync::Mutex::new((0, vec![])));
    let (client, name, record) = (client.clone(), format!("{cluster}-etcd"), seen.clone());
    let task = tokio::spawn(async move {
        loop {
            if let Ok(etcd) = etcd_api(&client).get(&name).await {
                let members = etcd.status.unwrap_or_default().members;
                let rolling = members.iter().any(|m| old.contains(&m.name));
                let mut record = record.lock().unwrap();
                record.0 += 1;
                for m in members
                    .iter()
                    .filter(|m| rolling && m.last_defragmentation.is_some())
                {
                    record.1.push(format!("{}: {:?}", m.name, m.last_defragmentation));
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    (task, seen)
}
