#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! One tenant cannot hurt another (issue 44; docs/security.md, "A tenant's members cannot hurt
//! the controller"): beside a healthy cluster, two clusters whose only member is replaced by a
//! hostile server holding a certificate of that cluster's CA. One streams every answer without
//! end (`/health`, Status, MemberList, Alarm) to a health check every second; the other looks
//! healthy and trickles two snapshots, holding both snapshot slots. The controller's memory
//! stays within its stated bound, every endless answer is cut off by HTTP/2 flow control and
//! the answer caps, the healthy cluster's dead member is replaced within the time the plain
//! remediation scenario allows, and both trickled snapshots fail by their total deadline.

mod lifecycle_support;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use etcdadm_shared::api::snapshot::{EtcdadmSnapshot, SnapshotPhase};
use etcdadm_shared::etcd::MemberClient;
use etcdadm_shared::testing::{SeaweedFs, TempDir};
use etcdadm_sim::bench::usage_of;
use etcdadm_sim::demo;
use etcdadm_sim::fake_etcd::FakeSnapshot;
use etcdadm_sim::hostile_etcd::{HostileLog, HostileMember, serve_hostile};
use etcdadm_sim::plane::Plane;
use etcdadm_sim_machines::Fault;
use kube::api::{Api, PostParams};
use lifecycle_support::*;
use serde_json::json;
use sha2::{Digest, Sha256};

const TIMEOUT: Duration = Duration::from_secs(150);
/// `fast_health()`'s `unhealthyAfter`, and the margin the remediation scenario allows for
/// detection, removal and a new member's boot and join (`lifecycle_remediation.rs`).
const UNHEALTHY_AFTER: Duration = Duration::from_secs(5);
const MARGIN: Duration = Duration::from_secs(25);
/// The controller's stated bound (docs/security.md): what hostile members can add to its
/// resident memory, whatever they send. Each member connection holds at most its HTTP/2 window
/// (1 MiB) plus one capped answer, and each of the two snapshot slots one message and one part.
const MEMORY_BOUND: u64 = 64 << 20;
/// What one endless answer can get sent before the controller stops reading: the 1 MiB
/// flow-control window, the server's send buffer and a chunk (not the endless stream).
const ANSWER_BOUND: u64 = 2 << 20;
const BUCKET: &str = "etcd-backups";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_members_neither_grow_the_controller_nor_slow_a_neighbours_remediation() {
    let work = TempDir::new("sim-hostile-member");
    let s3 = SeaweedFs::start().await;
    s3.create_bucket(BUCKET).await;
    let plane = start_plane(90, &work, Duration::from_secs(1)).await;
    let client = plane.client.clone();
    store_credentials(&client, &s3).await;
    let store = serde_json::to_value(s3.store(BUCKET)).unwrap();
    create(&client, "h1", 3, false, json!({}), json!({})).await;
    create(&client, "endless", 1, false, json!({}), json!({})).await;
    create(
        &client,
        "trickle",
        1,
        false,
        json!({}),
        json!({"backup": {"store": {"s3": store}}}),
    )
    .await;
    let etcd = wait_settled(&client, "h1", 3, TIMEOUT, &work).await;
    wait_settled(&client, "endless", 1, TIMEOUT, &work).await;
    wait_settled(&client, "trickle", 1, TIMEOUT, &work).await;
    // The trickling member is probed every 10 minutes: the snapshots must find it healthy.
    patch_spec(
        &client,
        "trickle",
        json!({"healthCheck": {"interval": "10m", "timeout": "5s", "unhealthyAfter": "5s"}}),
    )
    .await;

    let pid = plane.controller_pid(CONTROLLER).expect("the controller runs");
    let baseline = usage_of(pid).expect("the controller's /proc usage").rss_kib;

    // Both members replaced by hostile servers at their addresses.
    let endless = turn_hostile(&plane, "endless", true).await;
    let trickle = turn_hostile(&plane, "trickle", false).await;
    let snapshots: Api<EtcdadmSnapshot> = Api::default_namespaced(client.clone());
    for name in ["trickle-1", "trickle-2"] {
        let requested: EtcdadmSnapshot = serde_json::from_value(json!({
            "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmSnapshot",
            "metadata": {"name": name}, "spec": {"clusterName": "trickle-etcd"},
        }))
        .unwrap();
        snapshots
            .create(&PostParams::default(), &requested)
            .await
            .unwrap();
    }
    let started = Instant::now();
    while trickle.snapshots.load(Ordering::Relaxed) < 2
        || endless.endless_answers.load(Ordering::Relaxed) < 20
    {
        assert!(
            started.elapsed() < TIMEOUT,
            "the hostile members were not asked enough: {trickle:?}, {endless:?}\n{}",
            logs(&work)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The neighbour's leader powers off for good, while both slots trickle and the endless
    // member is probed every second.
    let dead = leader(&etcd);
    plane.runtime.fault(&dead, Fault::PowerOff).unwrap();
    let killed = Instant::now();
    loop {
        if settled(&client, "h1", 3).await.is_ok() && !machine_names(&client, "h1").await.contains(&dead) {
            break;
        }
        assert!(
            killed.elapsed() < UNHEALTHY_AFTER + MARGIN,
            "the neighbour's dead member was not replaced in its normal time\n{}",
            logs(&work)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let remediated = killed.elapsed();
    let held = trickle.snapshots.load(Ordering::Relaxed);
    for name in ["trickle-1", "trickle-2"] {
        let snapshot = snapshots.get(name).await.unwrap();
        assert_ne!(
            snapshot.phase(),
            SnapshotPhase::Succeeded,
            "{name} cannot have succeeded"
        );
    }

    // Both trickled snapshots end by their deadline, not by the trickle's end (330 s).
    let trickled_since = Instant::now();
    for name in ["trickle-1", "trickle-2"] {
        let failed = demo::eventually(&format!("{name} Failed"), TIMEOUT, || async {
            let snapshot = snapshots.get(name).await?;
            Ok(match snapshot.phase() {
                SnapshotPhase::Failed => Ok(snapshot),
                _ => Err(format!("{:?}", snapshot.status)),
            })
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", logs(&work)));
        let message = failed
            .status
            .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "Ready"))
            .and_then(|c| c.message)
            .unwrap_or_default();
        assert!(
            message.contains("did not answer Snapshot within"),
            "{name}: {message}"
        );
    }
    let trickles_cut = trickled_since.elapsed();

    // The most it was ever resident (`VmHWM`), the hostile members' time included.
    let peak = usage_of(pid).expect("the controller's /proc usage").peak_rss_kib;
    let grown = peak.saturating_sub(baseline) << 10;
    let longest = endless.longest_answer.load(Ordering::Relaxed);
    let answers = endless.endless_answers.load(Ordering::Relaxed);
    let sent = endless.endless_bytes.load(Ordering::Relaxed);
    println!(
        "hostile members: neighbour's dead member replaced in {:.1}s; controller resident memory \
         {:.1} MiB before, peak {:.1} MiB (+{:.1} MiB) over {answers} endless answers \
         ({:.1} MiB sent in all, at most {} KiB in one); {held} trickled snapshots, cut off \
         {:.1}s after the replacement",
        remediated.as_secs_f64(),
        baseline as f64 / 1024.0,
        peak as f64 / 1024.0,
        grown as f64 / (1 << 20) as f64,
        sent as f64 / (1 << 20) as f64,
        longest >> 10,
        trickles_cut.as_secs_f64(),
    );
    assert!(
        grown <= MEMORY_BOUND,
        "the controller grew {grown} bytes beside hostile members (bound {MEMORY_BOUND})"
    );
    assert!(
        longest <= ANSWER_BOUND,
        "an endless answer got {longest} bytes sent before the controller stopped reading \
         (bound {ANSWER_BOUND})"
    );

    // The endless member is reported for what it does: more than the cap.
    let endless_etcd = etcd_api(&client).get("endless-etcd").await.unwrap();
    let said: Vec<String> = endless_etcd
        .status
        .unwrap()
        .conditions
        .into_iter()
        .filter_map(|c| c.message)
        .collect();
    assert!(said.iter().any(|m| m.contains("more than")), "{said:?}");
    save_logs(&work, "hostile_member");
}

/// Power off `cluster`'s one member and serve a hostile stand-in for it at its address, with
/// a certificate of the cluster's CA: `endless` answers without end, else it impersonates the
/// member, healthy, and trickles its snapshot (a 1 MiB database, a message every 10 s).
async fn turn_hostile(plane: &Plane, cluster: &str, endless: bool) -> Arc<HostileLog> {
    let client = &plane.client;
    let ca = demo::etcd_ca(client, client.default_namespace(), cluster)
        .await
        .unwrap()
        .unwrap();
    let status = etcd_api(client)
        .get(&format!("{cluster}-etcd"))
        .await
        .unwrap()
        .status
        .unwrap();
    let member = status.members.first().unwrap().clone();
    let url = member.client_url.clone().unwrap();
    let real = MemberClient::new(&url, &client_tls(&ca), Duration::from_secs(5))
        .unwrap()
        .status()
        .await
        .unwrap();
    plane.runtime.fault(&member.name, Fault::PowerOff).unwrap();
    let database: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    let checksum: [u8; 32] = Sha256::digest(&database).into();
    let hostile = HostileMember {
        member_id: real.member_id,
        name: member.name.clone(),
        version: real.version,
        ip: url
            .trim_start_matches("https://")
            .rsplit_once(':')
            .unwrap()
            .0
            .parse()
            .unwrap(),
        endless,
        snapshot: FakeSnapshot {
            pace: Duration::from_secs(10),
            ..FakeSnapshot::honest(database, checksum, real.revision)
        },
    };
    let started = Instant::now();
    loop {
        match serve_hostile(&ca, hostile.clone()) {
            Ok(log) => return log,
            Err(e) => assert!(started.elapsed() < Duration::from_secs(10), "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
