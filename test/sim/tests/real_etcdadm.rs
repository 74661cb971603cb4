#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The user data, run by the tool it is written for: machines that run the real (upstream)
//! etcdadm, each in a network namespace of its own whose default route goes through a bridge,
//! with both real controller binaries on the sim's in-memory API server. Create with learner
//! joins, scale, a rolling replacement under writes, remediation, a restore from SeaweedFS (its
//! revisions raised by an etcdutl 3.5.16 the machine image carries), and machines whose default
//! route is on a second interface.
//!
//! Every test has a lab of its own (bridge `eadmbr<lab>`, `10.213.<lab>.0/24`): they run
//! concurrently. Needs root, iproute2, and what `.ci/setup` puts under target/ (the etcdadm
//! binary, the etcd release archive, etcdutl 3.5.16); without them the tests fail saying so.

mod lifecycle_support;

use std::time::{Duration, Instant};

use etcdadm_shared::etcd::MemberClient;
use etcdadm_shared::names;
use etcdadm_shared::testing::{SeaweedFs, TempDir};
use etcdadm_sim::demo;
use etcdadm_sim::plane::Plane;
use etcdadm_sim_machines::Fault;
use etcdadm_sim_machines::network::{self, guard};
use kube::ResourceExt;
use lifecycle_support::real_etcdadm::{config, start_plane, start_plane_with_image_tools};
use lifecycle_support::*;
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(240);
/// Cipher suites the first scenario renders (upstream etcdadm has no flag: the env file).
const CIPHERS: &str = "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384";

/// The value of `key` in the environment member `name`'s etcd process runs with.
fn etcd_setting(plane: &Plane, name: &str, key: &str) -> Option<String> {
    let runtime = plane.built_in.as_ref().expect("built-in runtime");
    runtime
        .etcd_environment(name)
        .unwrap_or_else(|e| panic!("reading {name}'s etcd environment: {e}"))
        .into_iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
}

/// Every member Machine's address is in the plane's lab, and its etcd advertises exactly that.
async fn assert_members_advertise_machine_addresses(plane: &Plane, cluster: &str) {
    let lab = plane.lab.as_ref().unwrap();
    for machine in machines(&plane.client, cluster).await {
        let name = machine.name_any();
        let address = machine.etcd_address().unwrap().to_string();
        let ip: std::net::Ipv4Addr = address.parse().unwrap();
        assert_eq!(
            ip.octets()[..3],
            [network::PRIMARY_NET[0], network::PRIMARY_NET[1], lab.id()]
        );
        assert_eq!(
            etcd_setting(plane, &name, "ETCD_ADVERTISE_CLIENT_URLS").as_deref(),
            Some(names::client_url(&address).as_str()),
            "{name}'s etcd advertises another address than its Machine's"
        );
        assert_eq!(
            etcd_setting(plane, &name, "ETCD_INITIAL_ADVERTISE_PEER_URLS").as_deref(),
            Some(names::peer_url(&address).as_str())
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_three_with_learner_joins_then_scale_to_five_and_back() {
    let work = TempDir::new("sim-real-create");
    let plane = start_plane(61, &work, Duration::from_secs(1)).await;
    let client = plane.client.clone();
    let started = Instant::now();
    create(
        &client,
        "e1",
        3,
        true,
        config(json!({"cipherSuites": CIPHERS, "quotaBackendBytes": "64Mi",
                      "etcdSettings": {"snapshot-count": 20000, "experimental-corrupt-check-time": "3h"}})),
        json!({}),
    )
    .await;
    let watchers = Watchers::start(&client, "e1").await;
    let etcd = wait_settled(&client, "e1", 3, TIMEOUT, &work).await;
    println!(
        "real etcdadm: 3 members Ready in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    assert_learner_joins(&watchers.history(), 2);
    let status = etcd.status.unwrap();
    assert!(
        status.members.iter().all(|m| m.healthy && !m.is_learner),
        "{status:?}"
    );

    // What etcd runs with, read from each member: the addresses etcdadm chose on the machine's
    // own interface, the cipher suites, the backend quota, the corruption check and the etcd
    // settings the user data set before etcdadm (etcd's own metric says the quota it enforces),
    // and the quota status reports.
    assert_members_advertise_machine_addresses(&plane, "e1").await;
    let runtime = plane.built_in.as_ref().unwrap();
    for member in &status.members {
        // Every setting reached etcd before its first start (a drop-in the user data writes
        // before etcdadm runs): no member was restarted after its init or join.
        assert_eq!(
            runtime.etcd_starts(&member.name).unwrap(),
            1,
            "{}'s etcd was started more than once",
            member.name
        );
        assert_eq!(
            etcd_setting(&plane, &member.name, "ETCD_CIPHER_SUITES").as_deref(),
            Some(CIPHERS),
            "{}",
            member.name
        );
        let quota = runtime
            .etcd_metric(&member.name, "etcd_server_quota_backend_bytes")
            .unwrap();
        assert_eq!(quota, 64.0 * 1024.0 * 1024.0, "{}'s quota", member.name);
        assert_eq!(member.quota_backend_bytes, Some(64 << 20), "{member:?}");
        // The corruption check a new member gets by default (etcd 3.5.1 has the initial one,
        // not yet the compacted-revision hash check) and the etcdSettings, as etcd reads them.
        for (key, value) in [
            ("ETCD_EXPERIMENTAL_INITIAL_CORRUPT_CHECK", Some("true")),
            ("ETCD_EXPERIMENTAL_COMPACT_HASH_CHECK_ENABLED", None),
            ("ETCD_SNAPSHOT_COUNT", Some("20000")),
            ("ETCD_EXPERIMENTAL_CORRUPT_CHECK_TIME", Some("3h0m0s")),
        ] {
            assert_eq!(
                etcd_setting(&plane, &member.name, key).as_deref(),
                value,
                "{}: {key}",
                member.name
            );
        }
    }

    let kcp_writes = || plane.kcp_record.lock().unwrap().endpoint_changes.len();
    for (from, to) in [(3, 5), (5, 3)] {
        let writes = kcp_writes();
        let t0 = watchers.now();
        let started = Instant::now();
        patch_spec(&client, "e1", json!({"replicas": to})).await;
        wait_settled(&client, "e1", to, TIMEOUT, &work).await;
        println!(
            "real etcdadm: scaled {from} → {to} in {:.1}s",
            started.elapsed().as_secs_f64()
        );
        let history = watchers.history();
        assert_eq!(
            history.max_size_between(t0, watchers.now()),
            from.max(to),
            "membership went past the larger size: {history:#?}"
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        while kcp_writes() == writes && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            kcp_writes(),
            writes + 1,
            "one control plane endpoint update per resize"
        );
    }
    let (history, machine_log) = watchers.finish();
    assert_safe(&history, &machine_log);
    assert_learner_joins(&history, 4);
    assert_members_advertise_machine_addresses(&plane, "e1").await;
    save_logs(&work, "real-etcdadm-create");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_replacement_under_writes_loses_no_acknowledged_write() {
    let work = TempDir::new("sim-real-rollout");
    let plane = start_plane(62, &work, Duration::from_secs(1)).await;
    let client = plane.client.clone();
    create(&client, "e2", 3, true, config(json!({})), json!({})).await;
    wait_settled(&client, "e2", 3, TIMEOUT, &work).await;
    let watchers = Watchers::start(&client, "e2").await;
    let changed = config(json!({"preEtcdadmCommands": ["echo rolled"]}));
    let outcome = roll(
        &plane,
        &work,
        &watchers,
        "e2",
        true,
        json!({"etcdadmConfigSpec": changed}),
    )
    .await;
    assert_eq!(
        outcome.peak_members, 6,
        "surge-then-switch adds every new member first"
    );
    assert_eq!(outcome.kcp_writes, 1);
    let (history, machine_log) = watchers.finish();
    assert_safe(&history, &machine_log);
    assert_members_advertise_machine_addresses(&plane, "e2").await;
    save_logs(&work, "real-etcdadm-rollout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_member_is_remediated() {
    let work = TempDir::new("sim-real-remediation");
    let plane = start_plane(63, &work, Duration::from_secs(1)).await;
    let client = plane.client.clone();
    create(&client, "e3", 3, true, config(json!({})), json!({})).await;
    let etcd = wait_settled(&client, "e3", 3, TIMEOUT, &work).await;
    let watchers = Watchers::start(&client, "e3").await;
    let dead = leader(&etcd);
    plane.runtime.fault(&dead, Fault::PowerOff).unwrap();
    let killed = Instant::now();
    let deadline = killed + TIMEOUT;
    let mut seen_unhealthy = false;
    loop {
        let etcd = etcd_api(&client).get("e3-etcd").await.unwrap();
        let members = etcd.status.map(|s| s.members).unwrap_or_default();
        seen_unhealthy |= members.iter().any(|m| m.name == dead && !m.healthy);
        let names = machine_names(&client, "e3").await;
        if !names.contains(&dead) && settled(&client, "e3", 3).await.is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "{dead} not replaced\n{}", logs(&work));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "real etcdadm: the leader's machine powered off, replaced and Ready in {:.1}s",
        killed.elapsed().as_secs_f64()
    );
    assert!(seen_unhealthy, "{dead} was never reported unhealthy");
    let events = events(&client, "e3").await;
    assert!(
        events
            .iter()
            .any(|(reason, note)| reason == "MemberRemediation" && note.contains(&dead)),
        "no MemberRemediation Event for {dead}: {events:?}"
    );
    let (history, machine_log) = watchers.finish();
    assert_safe(&history, &machine_log);
    save_logs(&work, "real-etcdadm-remediation");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_restored_from_a_snapshot_in_seaweedfs_has_every_key_at_raised_revisions() {
    const BUCKET: &str = "etcd-backups";
    const KEYS: usize = 300;
    /// Writes the old cluster serves after the snapshot: lost by the restore.
    const LATER: usize = 50;
    let work = TempDir::new("sim-real-restore");
    // The image carries an etcdutl that can raise a restored revision (etcd 3.5.10+), as an
    // image built for restores would; etcdadm itself installs etcd 3.5.1.
    let etcdutl =
        etcdadm_sim_machines::real_etcdadm::bumping_etcdutl().unwrap_or_else(|hint| panic!("{hint}"));
    let plane = start_plane_with_image_tools(64, &work, Duration::from_secs(1), vec![etcdutl]).await;
    let client = plane.client.clone();
    // The store lives on the lab too: the machines download the snapshot from it.
    let store_ns = plane
        .lab
        .as_ref()
        .unwrap()
        .add_namespace("s3", network::LAST_MACHINE_HOST + 1, false)
        .unwrap();
    let s3 = SeaweedFs::start_at(&store_ns.address.to_string(), &store_ns.enter_command()).await;
    s3.create_bucket(BUCKET).await;
    store_credentials(&client, &s3).await;
    let store = serde_json::to_value(s3.store(BUCKET)).unwrap();
    create(
        &client,
        "b1",
        1,
        false,
        config(json!({})),
        json!({"backup": {"store": {"s3": store}}}),
    )
    .await;
    let source = wait_settled(&client, "b1", 1, TIMEOUT, &work).await;
    let (_, written) = write_keys(&client, "b1", &source, KEYS).await;
    let taken = take_snapshot(&client, "b1", "b1-nightly", &work).await;
    assert_eq!(taken.status.unwrap().revision, Some(written));
    let (_, old_last) = write_keys(&client, "b1", &source, LATER).await;
    assert!(old_last >= written + LATER as i64);

    let started = Instant::now();
    create(
        &client,
        "r1",
        3,
        false,
        config(json!({})),
        json!({"restore": {"snapshot": {"name": "b1-nightly"}}}),
    )
    .await;
    let restored = wait_settled(&client, "r1", 3, TIMEOUT, &work).await;
    println!(
        "real etcdadm: a cluster of 3 restored from SeaweedFS (etcdadm init --snapshot) Ready in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let status = restored.status.clone().unwrap();
    let from = status.restored_from.clone().expect("status.restoredFrom");
    assert_eq!(from.revision, Some(written));
    let tls = demo::etcd_tls(&client, client.default_namespace(), "r1")
        .await
        .unwrap()
        .unwrap();
    for m in &status.members {
        let url = m.client_url.as_deref().unwrap();
        guard(url).unwrap();
        let member = MemberClient::new(url, &tls, Duration::from_secs(5)).unwrap();
        let mut kv = member.workload_client().await.unwrap();
        for i in 0..KEYS {
            let got = kv.get(format!("app/{i:04}"), None).await.unwrap();
            let values: Vec<&str> = got.kvs().iter().map(|pair| pair.value_str().unwrap()).collect();
            assert_eq!(
                values,
                [format!("value-{i}")],
                "app/{i:04} read through {}",
                m.name
            );
        }
        let now = member.local_revision().await.unwrap();
        assert!(
            now > old_last + 900_000_000,
            "{}: revision {now}, the old cluster served {old_last}",
            m.name
        );
    }
    // Raised by the restore Secret's margin, the older history marked compacted: a watch from
    // the old cluster's last revision is told so, and the condition says it.
    assert_eq!(from.revision_bumped, Some(true), "{from:?}");
    let (state, reason, message) = condition(&restored, "RevisionsBumped");
    assert_eq!(
        (state.as_str(), reason.as_str()),
        ("True", "RevisionsBumped"),
        "{message}"
    );
    let url = status.members[0].client_url.as_deref().unwrap();
    let member = MemberClient::new(url, &tls, Duration::from_secs(5)).unwrap();
    let compacted = compact_revision_seen_from(&member, "app/", old_last).await;
    assert!(
        compacted > old_last,
        "a watch from {old_last} was told the history is compacted up to {compacted}"
    );
    // One member restored with `etcdadm init --snapshot`, the others joined: their logs say so.
    let runtime = plane.built_in.as_ref().unwrap();
    let restoring: Vec<&str> = status
        .members
        .iter()
        .map(|m| m.name.as_str())
        .filter(|name| {
            let log = runtime
                .run_in_machine(name, "cat /var/log/cloud-init-output.log")
                .unwrap();
            let log = String::from_utf8_lossy(&log.stdout).into_owned();
            log.contains("etcdadm init") && log.contains("--snapshot")
        })
        .collect();
    assert_eq!(
        restoring.len(),
        1,
        "members restored with etcdadm init --snapshot: {restoring:?}"
    );
    save_logs(&work, "real-etcdadm-restore");
    drop(s3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machines_routing_through_a_second_interface_join_at_the_address_their_machine_reports() {
    let work = TempDir::new("sim-real-two-interfaces");
    let plane = start_plane(65, &work, Duration::from_secs(1)).await;
    let client = plane.client.clone();
    create(&client, "t1", 1, false, config(json!({})), json!({})).await;
    wait_settled(&client, "t1", 1, TIMEOUT, &work).await;
    let first: Vec<String> = machine_names(&client, "t1").await.into_iter().collect();

    // From now on a machine's default route is on eth1 (10.214.x), while its Machine reports
    // eth0's address (10.213.x): etcdadm alone would advertise eth1's.
    plane.set_default_route_on_second_interface(true);
    let watchers = Watchers::start(&client, "t1").await;
    patch_spec(&client, "t1", json!({"replicas": 3})).await;
    let etcd = wait_settled(&client, "t1", 3, TIMEOUT, &work).await;
    let (history, machine_log) = watchers.finish();
    assert_safe(&history, &machine_log);
    assert_learner_joins(&history, 2);
    let reasons: Vec<String> = events(&client, "t1").await.into_iter().map(|(r, _)| r).collect();
    assert!(
        !reasons.iter().any(|r| r == "MemberJoinFailed"),
        "a join failed: {reasons:?}"
    );
    assert_members_advertise_machine_addresses(&plane, "t1").await;
    let runtime = plane.built_in.as_ref().unwrap();
    let joined: Vec<String> = etcd
        .status
        .unwrap()
        .members
        .iter()
        .map(|m| m.name.clone())
        .filter(|n| !first.contains(n))
        .collect();
    assert_eq!(joined.len(), 2);
    for name in &joined {
        let route = runtime.run_in_machine(name, "ip -4 route show default").unwrap();
        let route = String::from_utf8_lossy(&route.stdout);
        assert!(route.contains("dev eth1"), "{name}: default route {route}");
        let chosen = runtime
            .run_in_machine(name, "cat /run/cluster-api/etcd-member-address")
            .unwrap();
        let chosen = String::from_utf8_lossy(&chosen.stdout).trim().to_string();
        let machine = machines(&client, "t1")
            .await
            .into_iter()
            .find(|m| m.name_any() == *name)
            .unwrap();
        assert_eq!(Some(chosen.as_str()), machine.etcd_address());
    }
    save_logs(&work, "real-etcdadm-two-interfaces");
}
