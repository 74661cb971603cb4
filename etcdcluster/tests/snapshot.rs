#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The snapshot controller against the in-memory API server, real etcd members and a real S3
//! store (SeaweedFS), playing the EtcdadmCluster controller by writing the cluster's status by
//! hand: on-demand snapshots from a follower, every failure cause named on the snapshot and in an
//! Event, a corrupted stream (a fake member) failing with nothing in the bucket, an interrupted
//! attempt resumed, retention keeping exactly N, and the schedule firing; a hostile store
//! stand-in cut off by the request deadline and never quoted; the snapshot slots; a restore drill
//! of a whole backup and of bad ones.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use etcdadm_etcdcluster::snapshot::{Context, SCHEDULED_FOR_ANNOTATION, reconcile, reconcile_orphan};
use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::conditions;
use etcdadm_shared::api::snapshot::{EtcdadmSnapshot, SnapshotPhase};
use etcdadm_shared::etcd::{EtcdTls, MemberClient};
use etcdadm_shared::names;
use etcdadm_shared::pki::CertificateAuthority;
use etcdadm_shared::store::StoreClient;
use etcdadm_shared::testing::{
    CREDENTIALS_SECRET, HostileStore, Hostility, SeaweedFs, TlsEtcd, TlsEtcdCluster,
};
use etcdadm_sim::fake_etcd::{FakeSnapshot, serve_snapshot};
use etcdadm_sim_apiserver::{ApiServer, fake_client};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const NS: &str = "default";
const ETCD: &str = "c1-etcd";
const BUCKET: &str = "etcd-backups";

fn test_ca() -> &'static CertificateAuthority {
    static CA: std::sync::OnceLock<CertificateAuthority> = std::sync::OnceLock::new();
    CA.get_or_init(|| CertificateAuthority::generate("etcd-ca").unwrap())
}

struct Env {
    _server: ApiServer,
    client: Client,
    ctx: Arc<Context>,
    s3: SeaweedFs,
    bucket: StoreClient,
}

impl Env {
    async fn new() -> Env {
        let (server, client) = fake_client().unwrap();
        let mut ctx = Context::new(client.clone());
        ctx.stream_limits.idle = Duration::from_secs(10);
        let s3 = SeaweedFs::start().await;
        let bucket = s3.create_bucket(BUCKET).await;
        let env = Env {
            _server: server,
            client,
            ctx: Arc::new(ctx),
            s3,
            bucket,
        };
        env.secret(
            &names::ca_secret_name("c1"),
            BTreeMap::from([
                (names::TLS_CERT_KEY.to_string(), test_ca().cert_pem().to_string()),
                (names::TLS_KEY_KEY.to_string(), test_ca().key_pem().to_string()),
            ]),
        )
        .await;
        env.secret(CREDENTIALS_SECRET, env.s3.credentials_secret_data())
            .await;
        env
    }

    async fn secret(&self, name: &str, data: BTreeMap<String, String>) {
        let data: BTreeMap<String, ByteString> = data
            .into_iter()
            .map(|(k, v)| (k, ByteString(v.into_bytes())))
            .collect();
        let secret: Secret =
            serde_json::from_value(json!({"metadata": {"name": name}, "data": data})).unwrap();
        Api::<Secret>::namespaced(self.client.clone(), NS)
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    }

    fn clusters(&self) -> Api<EtcdadmCluster> {
        Api::namespaced(self.client.clone(), NS)
    }

    fn snapshots(&self) -> Api<EtcdadmSnapshot> {
        Api::namespaced(self.client.clone(), NS)
    }

    /// The EtcdadmCluster, backed up to the test bucket (with `backup` merged in), whose status
    /// says what the EtcdadmCluster controller would after checking `members`.
    async fn cluster(&self, backup: Value, members: Vec<Value>) -> EtcdadmCluster {
        let mut spec_backup = json!({"store": {"s3": serde_json::to_value(self.s3.store(BUCKET)).unwrap()}});
        json_patch::merge(&mut spec_backup, &backup);
        let cluster: EtcdadmCluster = serde_json::from_value(json!({
            "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
            "metadata": {"name": ETCD, "labels": {names::CLUSTER_NAME_LABEL: "c1"}},
            "spec": {"replicas": members.len(), "infrastructureTemplate": {"kind": "SimMachineTemplate", "name": "t"},
                     "backup": spec_backup},
        }))
        .unwrap();
        let created = self
            .clusters()
            .create(&PostParams::default(), &cluster)
            .await
            .unwrap();
        self.set_members(created.metadata.generation, members, "True")
            .await
    }

    async fn set_members(
        &self,
        generation: Option<i64>,
        members: Vec<Value>,
        resized: &str,
    ) -> EtcdadmCluster {
        let status = json!({"status": {
            "observedGeneration": generation,
            "conditions": [{"type": "ResizeCompleted", "status": resized, "reason": "Test",
                            "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            "members": members,
        }});
        self.clusters()
            .patch_status(ETCD, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap()
    }

    async fn snapshot(&self, name: &str) -> EtcdadmSnapshot {
        let snapshot: EtcdadmSnapshot = serde_json::from_value(json!({
            "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmSnapshot",
            "metadata": {"name": name}, "spec": {"clusterName": ETCD},
        }))
        .unwrap();
        self.snapshots()
            .create(&PostParams::default(), &snapshot)
            .await
            .unwrap()
    }

    async fn reconcile(&self) -> kube::runtime::controller::Action {
        let cluster = self.clusters().get(ETCD).await.unwrap();
        reconcile(Arc::new(cluster), self.ctx.clone()).await.unwrap()
    }

    async fn get(&self, name: &str) -> EtcdadmSnapshot {
        self.snapshots().get(name).await.unwrap()
    }

    async fn events(&self) -> Vec<(String, String)> {
        let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(self.client.clone(), NS);
        events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
            .collect()
    }

    /// Occurrences of Events with `reason` (repeats of one are counted in its series).
    async fn event_count(&self, reason: &str) -> i32 {
        let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(self.client.clone(), NS);
        events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .map(|e| e.series.map_or(1, |s| s.count))
            .sum()
    }

    async fn objects(&self) -> Vec<(String, u64)> {
        self.bucket
            .list("")
            .await
            .unwrap()
            .into_iter()
            .map(|o| (o.key, o.size))
            .collect()
    }
}

/// A member entry as the EtcdadmCluster controller writes it for a healthy member.
fn member(name: &str, client_url: &str, leader: bool) -> Value {
    json!({"name": name, "machineRef": {"name": name}, "memberID": format!("{:x}", name.len()),
           "clientURL": client_url, "healthy": true, "isLeader": leader,
           "lastHealthyTime": "2026-01-01T00:00:00Z", "etcdVersion": "3.4.23"})
}

fn ready_reason(snapshot: &EtcdadmSnapshot) -> String {
    snapshot
        .status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, "Ready"))
        .and_then(|c| c.reason.clone())
        .unwrap_or_default()
}

fn client_tls() -> EtcdTls {
    EtcdTls::issued_by(test_ca(), "test", Duration::from_secs(600)).unwrap()
}

/// A one-member etcd, healthy, and its entry in the cluster's status.
async fn one_member() -> (TlsEtcd, Value) {
    let etcd = TlsEtcd::start(test_ca());
    healthy(&etcd.client_url).await;
    let entry = member("m0", &etcd.client_url, true);
    (etcd, entry)
}

async fn healthy(url: &str) -> MemberClient {
    let member = MemberClient::new(url, &client_tls(), Duration::from_secs(5)).unwrap();
    for _ in 0..100 {
        if member.health().await.is_ok_and(|h| h.healthy) {
            return member;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{url} never became healthy");
}

#[tokio::test]
async fn an_on_demand_snapshot_is_taken_from_a_follower_during_writes_never_during_a_resize() {
    let env = Env::new().await;
    let etcd = TlsEtcdCluster::start(test_ca(), 3);
    let urls = etcd.client_urls();
    let mut clients = vec![];
    for url in &urls {
        clients.push(healthy(url).await);
    }
    let mut members = vec![];
    for (i, client) in clients.iter().enumerate() {
        let leader = client.status().await.unwrap().is_leader();
        members.push(member(&format!("m{i}"), &urls[i], leader));
    }
    let leader_name = members
        .iter()
        .find(|m| m["isLeader"] == true)
        .map(|m| m["name"].as_str().unwrap().to_string())
        .unwrap();
    let cluster = env.cluster(json!({}), members.clone()).await;
    let mut kv = clients[0].workload_client().await.unwrap();
    for i in 0..1000 {
        kv.put(format!("k{i}"), "v", None).await.unwrap();
    }
    let written = clients[0].local_revision().await.unwrap();

    // A resize in flight: the snapshot waits and says why.
    env.set_members(cluster.metadata.generation, members.clone(), "False")
        .await;
    env.snapshot("s1").await;
    env.reconcile().await;
    let waiting = env.get("s1").await;
    assert_eq!(waiting.phase(), SnapshotPhase::Pending);
    assert_eq!(ready_reason(&waiting), "WaitingForMembershipChange");
    assert!(env.objects().await.is_empty());

    env.set_members(cluster.metadata.generation, members, "True")
        .await;
    env.reconcile().await;
    let taken = env.get("s1").await;
    let status = taken.status.clone().unwrap();
    assert_eq!(taken.phase(), SnapshotPhase::Succeeded, "{status:?}");
    assert_eq!(ready_reason(&taken), "Succeeded");
    assert_ne!(status.member.as_deref(), Some(leader_name.as_str()), "a follower");
    assert_eq!(status.revision, Some(written));
    assert_eq!(status.attempts, Some(1));
    assert_eq!(status.upload_id, None);
    assert_eq!(status.etcd_version.as_deref(), Some("3.4.23"));
    let key = format!("{NS}/{ETCD}/s1.db");
    assert_eq!(
        status.location.as_deref(),
        Some(format!("{BUCKET}/{key}").as_str())
    );
    assert_eq!(status.store.as_ref().unwrap().s3.bucket, BUCKET);
    assert_eq!(env.objects().await, [(key.clone(), status.size.unwrap() as u64)]);
    let body = reqwest::get(env.bucket.presigned_get(&key, Duration::from_secs(60)))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(
        format!("{:x}", Sha256::digest(&body)),
        status.sha256.clone().unwrap()
    );
    let reasons: Vec<String> = env.events().await.into_iter().map(|(r, _)| r).collect();
    assert!(reasons.contains(&"Running".to_string()), "{reasons:?}");
    assert!(reasons.contains(&"Succeeded".to_string()), "{reasons:?}");
    drop(etcd);
}

#[tokio::test]
async fn each_failure_cause_is_named_on_the_snapshot_and_in_an_event() {
    let env = Env::new().await;
    let (etcd, m0) = one_member().await;
    let members = vec![m0];

    // A bucket that does not exist.
    env.cluster(
        json!({"store": {"s3": {"bucket": "no-such-bucket"}}}),
        members.clone(),
    )
    .await;
    env.snapshot("missing-bucket").await;
    env.reconcile().await;
    let failed = env.get("missing-bucket").await;
    assert_eq!(failed.phase(), SnapshotPhase::Failed);
    assert_eq!(ready_reason(&failed), "BucketMissing");

    // Credentials the store refuses (the secret never shows up anywhere).
    let patch = |store: Value| json!({"spec": {"backup": {"store": {"s3": store}}}});
    env.secret(
        "wrong-credentials",
        BTreeMap::from([
            ("AWS_ACCESS_KEY_ID".to_string(), "AKNOBODY".to_string()),
            (
                "AWS_SECRET_ACCESS_KEY".to_string(),
                "never-logged-secret".to_string(),
            ),
        ]),
    )
    .await;
    env.clusters()
        .patch(
            ETCD,
            &PatchParams::default(),
            &Patch::Merge(patch(
                json!({"bucket": BUCKET, "credentialsSecretRef": {"name": "wrong-credentials"}}),
            )),
        )
        .await
        .unwrap();
    let generation = env.clusters().get(ETCD).await.unwrap().metadata.generation;
    env.set_members(generation, members.clone(), "True").await;
    env.snapshot("refused").await;
    env.reconcile().await;
    assert_eq!(ready_reason(&env.get("refused").await), "AuthRefused");

    // A member that does not answer.
    env.clusters()
        .patch(
            ETCD,
            &PatchParams::default(),
            &Patch::Merge(patch(
                json!({"credentialsSecretRef": {"name": CREDENTIALS_SECRET}}),
            )),
        )
        .await
        .unwrap();
    let generation = env.clusters().get(ETCD).await.unwrap().metadata.generation;
    let nowhere = etcdadm_shared::testing::free_loopback_ip();
    env.set_members(
        generation,
        vec![member("m9", &names::client_url(&nowhere.to_string()), true)],
        "True",
    )
    .await;
    env.snapshot("unreachable").await;
    env.reconcile().await;
    let unreachable = env.get("unreachable").await;
    assert_eq!(ready_reason(&unreachable), "MemberUnreachable");
    assert_eq!(unreachable.status.unwrap().upload_id, None);

    let events = env.events().await;
    for cause in ["BucketMissing", "AuthRefused", "MemberUnreachable"] {
        assert!(
            events.iter().any(|(r, _)| r == cause),
            "no {cause} Event in {events:?}"
        );
    }
    for (_, note) in &events {
        assert!(!note.contains("never-logged-secret"), "{note}");
    }
    assert!(env.objects().await.is_empty(), "nothing stored");

    // A snapshot of a cluster that does not exist fails once its grace is over.
    let orphan: EtcdadmSnapshot = serde_json::from_value(json!({
        "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmSnapshot",
        "metadata": {"name": "orphan"}, "spec": {"clusterName": "no-such-cluster"},
    }))
    .unwrap();
    let orphan = env
        .snapshots()
        .create(&PostParams::default(), &orphan)
        .await
        .unwrap();
    let mut ctx = Context::new(env.client.clone());
    ctx.missing_cluster_grace = Duration::ZERO;
    reconcile_orphan(Arc::new(orphan), Arc::new(ctx)).await.unwrap();
    let orphan = env.get("orphan").await;
    assert_eq!(orphan.phase(), SnapshotPhase::Failed);
    assert_eq!(ready_reason(&orphan), "ClusterNotFound");
    drop(etcd);
}

#[tokio::test]
async fn a_corrupted_stream_fails_with_nothing_completed_in_the_bucket() {
    let env = Env::new().await;
    // 3 MiB of database and a checksum that is not its SHA-256.
    let database: Vec<u8> = (0..3 << 20).map(|i: u32| (i % 253) as u8).collect();
    let mut checksum: [u8; 32] = Sha256::digest(&database).into();
    checksum[0] ^= 0xff;
    let ip: IpAddr = etcdadm_shared::testing::free_loopback_ip();
    serve_snapshot(test_ca(), ip, FakeSnapshot::honest(database, checksum, 42))
        .await
        .unwrap();
    env.cluster(
        json!({}),
        vec![member("fake", &names::client_url(&ip.to_string()), true)],
    )
    .await;
    env.snapshot("corrupt").await;
    env.reconcile().await;

    let failed = env.get("corrupt").await;
    assert_eq!(failed.phase(), SnapshotPhase::Failed);
    assert_eq!(ready_reason(&failed), "HashMismatch");
    let status = failed.status.unwrap();
    assert_eq!(status.upload_id, None);
    assert!(status.completion_time.is_some());
    assert!(env.objects().await.is_empty(), "nothing completed in the bucket");
    let events = env.events().await;
    assert!(
        events
            .iter()
            .any(|(r, n)| r == "HashMismatch" && n.contains("corrupted")),
        "{events:?}"
    );
}

/// A member of the cluster's CA that trickles its snapshot (each message within the idle
/// timeout) is cut off by the stream's total deadline, and one that sends more than it
/// announced by that: neither holds a snapshot slot for longer, and nothing is stored.
#[tokio::test]
async fn a_trickling_or_overflowing_member_is_cut_off_by_the_snapshots_deadline() {
    let env = Env::new().await;
    let database: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
    let checksum: [u8; 32] = Sha256::digest(&database).into();
    let trickling = etcdadm_shared::testing::free_loopback_ip();
    serve_snapshot(
        test_ca(),
        trickling,
        FakeSnapshot {
            pace: Duration::from_secs(1),
            ..FakeSnapshot::honest(database.clone(), checksum, 42)
        },
    )
    .await
    .unwrap();
    let overflowing = etcdadm_shared::testing::free_loopback_ip();
    serve_snapshot(
        test_ca(),
        overflowing,
        FakeSnapshot {
            announced: Some(64 << 10),
            ..FakeSnapshot::honest(database, checksum, 42)
        },
    )
    .await
    .unwrap();
    // 3 s plus 1 MiB at 4 MiB/s: far less than the 33 messages a second apart take.
    let mut ctx = Context::new(env.client.clone());
    ctx.stream_limits.idle = Duration::from_secs(10);
    ctx.stream_limits.base = Duration::from_secs(3);
    let ctx = Arc::new(ctx);
    let cluster = env
        .cluster(
            json!({}),
            vec![member(
                "trickling",
                &names::client_url(&trickling.to_string()),
                true,
            )],
        )
        .await;
    env.snapshot("trickled").await;
    let started = std::time::Instant::now();
    reconcile(Arc::new(cluster), ctx.clone()).await.unwrap();
    let cut_off_after = started.elapsed();
    let trickled = env.get("trickled").await;
    assert_eq!(trickled.phase(), SnapshotPhase::Failed);
    assert_eq!(ready_reason(&trickled), "MemberUnreachable");
    let message = conditions::find(&trickled.status.clone().unwrap().conditions, "Ready")
        .and_then(|c| c.message.clone())
        .unwrap_or_default();
    assert!(message.contains("did not answer Snapshot within 3s"), "{message}");
    assert!(
        cut_off_after < Duration::from_secs(25),
        "cut off by the 3 s deadline, not after the whole 33 s trickle: {cut_off_after:?}"
    );

    let generation = env.clusters().get(ETCD).await.unwrap().metadata.generation;
    let cluster = env
        .set_members(
            generation,
            vec![member(
                "overflowing",
                &names::client_url(&overflowing.to_string()),
                true,
            )],
            "True",
        )
        .await;
    env.snapshot("overflowed").await;
    reconcile(Arc::new(cluster), ctx).await.unwrap();
    let overflowed = env.get("overflowed").await;
    assert_eq!(overflowed.phase(), SnapshotPhase::Failed);
    assert_eq!(ready_reason(&overflowed), "EtcdProtocolError");
    let message = conditions::find(&overflowed.status.clone().unwrap().conditions, "Ready")
        .and_then(|c| c.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains("sent more than the 65536 bytes it announced"),
        "{message}"
    );
    assert!(env.objects().await.is_empty(), "nothing stored");
}

/// A store named at a metadata address is refused by the controller's store policy before
/// anything is sent, and the refusal is named on the snapshot and in its Event.
#[tokio::test]
async fn a_store_at_a_metadata_address_is_refused_by_the_store_policy_by_name() {
    let env = Env::new().await;
    let (etcd, m0) = one_member().await;
    env.cluster(
        json!({"store": {"s3": {"endpoint": "https://169.254.169.254", "forcePathStyle": true}}}),
        vec![m0],
    )
    .await;
    env.snapshot("metadata").await;
    env.reconcile().await;
    let failed = env.get("metadata").await;
    assert_eq!(failed.phase(), SnapshotPhase::Failed);
    assert_eq!(ready_reason(&failed), "StorePolicyRefused");
    let message = conditions::find(&failed.status.clone().unwrap().conditions, "Ready")
        .and_then(|c| c.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains("169.254.169.254 is a link-local address (instance metadata lives there), which the controller's store policy refuses"),
        "{message}"
    );
    let events = env.events().await;
    assert!(
        events
            .iter()
            .any(|(r, n)| r == "StorePolicyRefused" && n.contains("169.254.169.254")),
        "{events:?}"
    );
    drop(etcd);
}

#[tokio::test]
async fn an_attempt_a_controller_died_in_is_aborted_and_taken_again() {
    let env = Env::new().await;
    let etcd = TlsEtcd::start(test_ca());
    healthy(&etcd.client_url).await;
    env.cluster(json!({}), vec![member("m0", &etcd.client_url, true)])
        .await;
    env.snapshot("s1").await;
    // What a controller that died while streaming leaves: an open upload with parts, recorded.
    let key = format!("{NS}/{ETCD}/s1.db");
    let upload = env.bucket.create_multipart_upload(&key).await.unwrap();
    env.bucket
        .upload_part(&key, &upload, 1, vec![7; 1024])
        .await
        .unwrap();
    let running = json!({"status": {"phase": "Running", "uploadID": upload, "attempts": 1,
        "location": format!("{BUCKET}/{key}"), "member": "m0",
        "store": {"s3": serde_json::to_value(env.s3.store(BUCKET)).unwrap()}}});
    env.snapshots()
        .patch_status("s1", &PatchParams::default(), &Patch::Merge(&running))
        .await
        .unwrap();

    env.reconcile().await;
    let taken = env.get("s1").await;
    let status = taken.status.clone().unwrap();
    assert_eq!(taken.phase(), SnapshotPhase::Succeeded, "{status:?}");
    assert_eq!(status.attempts, Some(2));
    let err = env
        .bucket
        .complete_multipart_upload(&key, &upload, &["\"x\"".into()])
        .await
        .unwrap_err();
    assert_eq!(
        err.category().as_str(),
        "NoSuchUpload",
        "the dead attempt's upload was aborted: {err}"
    );
    assert_eq!(env.objects().await.len(), 1);
    assert!(env.events().await.iter().any(|(r, _)| r == "Retrying"));
    drop(etcd);
}

#[tokio::test]
async fn retention_keeps_exactly_the_newest_n_and_the_schedule_fires() {
    let env = Env::new().await;
    let (etcd, m0) = one_member().await;
    env.cluster(json!({"retention": {"keep": 2}}), vec![m0.clone()])
        .await;
    for name in ["s1", "s2", "s3", "s4"] {
        env.snapshot(name).await;
        env.reconcile().await;
        assert_eq!(env.get(name).await.phase(), SnapshotPhase::Succeeded);
        // Completion times must differ for "newest" to mean something.
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    env.reconcile().await;
    let mut left: Vec<String> = env
        .snapshots()
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|s| s.name_any())
        .collect();
    left.sort();
    assert_eq!(left, ["s3", "s4"]);
    let keys: Vec<String> = env.objects().await.into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, [format!("{NS}/{ETCD}/s3.db"), format!("{NS}/{ETCD}/s4.db")]);
    assert_eq!(env.event_count("SnapshotRetired").await, 2);

    // Every minute: the first schedule time after the cluster's creation brings a snapshot.
    let schedule = json!({"spec": {"backup": {"schedule": "* * * * *"}}});
    let cluster = env
        .clusters()
        .patch(ETCD, &PatchParams::default(), &Patch::Merge(&schedule))
        .await
        .unwrap();
    env.set_members(cluster.metadata.generation, vec![m0], "True")
        .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(75);
    let scheduled = loop {
        let action = env.reconcile().await;
        let scheduled: Vec<EtcdadmSnapshot> = env
            .snapshots()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|s| s.annotations().contains_key(SCHEDULED_FOR_ANNOTATION))
            .collect();
        if let Some(first) = scheduled.into_iter().next() {
            break first;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no scheduled snapshot within 75 s"
        );
        assert!(
            format!("{action:?}").contains("requeue_after: Some"),
            "{action:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let tick = &scheduled.annotations()[SCHEDULED_FOR_ANNOTATION];
    assert!(tick.ends_with(":00Z"), "{tick}");
    assert!(
        scheduled.name_any().starts_with("c1-etcd-20"),
        "{}",
        scheduled.name_any()
    );
    assert_eq!(
        env.get(&scheduled.name_any()).await.phase(),
        SnapshotPhase::Succeeded
    );
    let left = env
        .snapshots()
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .len();
    assert_eq!(left, 2, "retention still keeps 2");
    drop(etcd);
}

/// A store the tenant controls, which passes the bucket check and then trickles, sends a 1 GiB
/// error body or answers with internal-looking text: each snapshot fails by the request
/// deadline, with only the HTTP status and S3 code in its condition and Event, and the store
/// got to send no more than the answer cap and the socket buffers hold.
#[tokio::test]
async fn a_hostile_store_fails_the_snapshot_by_its_deadline_saying_status_and_code_only() {
    let env = Env::new().await;
    let members = vec![member("m0", "https://127.0.0.1:1", true)];
    let mut ctx = Context::new(env.client.clone());
    ctx.store_request_deadline = Duration::from_secs(2);
    let ctx = Arc::new(ctx);
    let mut cluster_made = false;
    for (i, (hostility, reason, says)) in [
        (
            Hostility::TrickleBody,
            "StoreUnreachable",
            "gave no complete answer to CreateMultipartUpload within 2s",
        ),
        (
            Hostility::HugeErrorBody,
            "StoreError",
            "answered CreateMultipartUpload with HTTP 500 InternalError",
        ),
        (
            Hostility::InternalText,
            "AuthRefused",
            "(CreateMultipartUpload): HTTP 403 AccessDenied;",
        ),
        (
            Hostility::InternalPage,
            "StoreError",
            "answered CreateMultipartUpload with HTTP 500 (no S3 error code)",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let store = HostileStore::start(hostility).await;
        let backup = json!({"store": {"s3": {"endpoint": store.endpoint(), "insecure": true}}});
        if cluster_made {
            env.clusters()
                .patch(
                    ETCD,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"backup": backup}})),
                )
                .await
                .unwrap();
            let generation = env.clusters().get(ETCD).await.unwrap().metadata.generation;
            env.set_members(generation, members.clone(), "True").await;
        } else {
            env.cluster(backup, members.clone()).await;
            cluster_made = true;
        }
        let name = format!("hostile-{i}");
        env.snapshot(&name).await;
        let cluster = env.clusters().get(ETCD).await.unwrap();
        let reconciled =
            tokio::time::timeout(Duration::from_secs(60), reconcile(Arc::new(cluster), ctx.clone())).await;
        assert!(reconciled.is_ok(), "{hostility:?}: the reconcile did not end");
        let failed = env.get(&name).await;
        assert_eq!(failed.phase(), SnapshotPhase::Failed, "{hostility:?}");
        assert_eq!(ready_reason(&failed), reason, "{hostility:?}");
        let message = failed
            .status
            .as_ref()
            .and_then(|s| conditions::find(&s.conditions, "Ready"))
            .and_then(|c| c.message.clone())
            .unwrap();
        assert!(message.contains(says), "{hostility:?}: {message}");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            store.bytes_sent() < 32 << 20,
            "{hostility:?}: {} bytes sent",
            store.bytes_sent()
        );
    }
    for (_, note) in env.events().await {
        assert!(!note.contains("hunter2"), "{note}");
        assert!(!note.contains("admin console"), "{note}");
    }
    for snapshot in env.snapshots().list(&Default::default()).await.unwrap() {
        assert!(!format!("{:?}", snapshot.status).contains("hunter2"));
    }
}

/// Snapshots take one of the controller's slots: with every slot taken, a due snapshot stays
/// Pending and says why, and is taken once a slot frees.
#[tokio::test]
async fn a_snapshot_waits_for_a_free_slot() {
    let env = Env::new().await;
    let (etcd, m0) = one_member().await;
    env.cluster(json!({}), vec![m0]).await;
    env.snapshot("s1").await;
    // Both slots held by other tenants' snapshots.
    let held = [
        env.ctx.snapshot_pool.try_take("tenant-a").unwrap(),
        env.ctx.snapshot_pool.try_take("tenant-b").unwrap(),
    ];
    let action = env.reconcile().await;
    let waiting = env.get("s1").await;
    assert_eq!(waiting.phase(), SnapshotPhase::Pending);
    assert_eq!(ready_reason(&waiting), "WaitingForSnapshotSlot");
    assert_eq!(
        action,
        kube::runtime::controller::Action::requeue(Duration::from_secs(5))
    );
    assert!(env.objects().await.is_empty());
    drop(held);
    env.reconcile().await;
    assert_eq!(env.get("s1").await.phase(), SnapshotPhase::Succeeded);
    drop(etcd);
}

/// A restore drill run by hand on a one-member cluster, its snapshot taken by the controller and
/// one delta after it written here: the whole backup passes; a delta re-signed with a forged
/// value, one naming a key the source never had, one with a key too many, or one shrinking a
/// value the source holds over the answer cap fails naming it; a
/// snapshot whose object does not match its SHA-256 fails naming the object; no etcd binary fails
/// saying how to provide one; and a source compacted past the revision restored is inconclusive.
/// Each drill leaves no scratch directory behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drill_passes_a_whole_backup_and_names_what_a_bad_one_gets_wrong() {
    use etcdadm_etcdcluster::snapshot::{DrillDue, DrillSettings, drill_due, run_drill};
    use etcdadm_shared::api::snapshot::DrillResult;
    use etcdadm_shared::backup::delta::{self, Event, Kind, chain::DeltaName};
    use etcdadm_shared::testing::{TempDir, etcd_tools_dir};

    let env = Env::new().await;
    let (etcd, entry) = one_member().await;
    let cluster = env
        .cluster(
            json!({"verify": {"schedule": "* * * * *", "sampleKeys": 1000}}),
            vec![entry],
        )
        .await;
    let member = healthy(&etcd.client_url).await;
    let mut kv = member.workload_client().await.unwrap();
    for i in 0..20 {
        kv.put(format!("key/{i:02}"), format!("value-{i}"), None)
            .await
            .unwrap();
    }
    env.snapshot("s1").await;
    env.reconcile().await;
    let taken = env.get("s1").await;
    assert_eq!(taken.phase(), SnapshotPhase::Succeeded, "{:?}", taken.status);
    let base = taken.status.as_ref().unwrap().revision.unwrap();
    // After the snapshot: key/00 overwritten, key/new added.
    kv.put("key/00", "after", None).await.unwrap();
    kv.put("key/new", "new", None).await.unwrap();
    // The schedule time is a minute ahead, past the cluster's creation.
    let later = k8s_openapi::jiff::Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(120);
    let DrillDue::Now(want) = drill_due(&cluster, std::slice::from_ref(&taken), later) else {
        panic!("a drill is due");
    };
    let scratch = TempDir::new("drill-scratch");
    let settings = DrillSettings {
        etcd_dir: Some(etcd_tools_dir().unwrap_or_else(|hint| panic!("{hint}"))),
        scratch: scratch.path().to_path_buf(),
        store_deadline: Duration::from_secs(30),
    };
    let name = DeltaName {
        seq: 1,
        first: base + 1,
        last: base + 2,
        first_ms: 1,
        last_ms: 2,
    };
    let delta_key = name.key(&want.key);
    let put = |revision: i64, key: &str, value: &str| Event {
        kind: Kind::Put,
        revision,
        received_ms: 1,
        lease: 0,
        key: key.into(),
        value: value.into(),
    };
    let whole = vec![put(base + 1, "key/00", "after"), put(base + 2, "key/new", "new")];
    let cases = [
        (
            "whole",
            whole.clone(),
            DrillResult::Passed,
            "the same value for 21 sampled keys",
        ),
        (
            "a forged value",
            vec![put(base + 1, "key/00", "forged"), put(base + 2, "key/new", "new")],
            DrillResult::Failed,
            "key key/00 holds another value",
        ),
        (
            "a key the source never had",
            vec![
                put(base + 1, "key/00", "after"),
                put(base + 2, "key/other", "new"),
            ],
            DrillResult::Failed,
            "key key/other is in the restored copy but not in the source",
        ),
        (
            "a key too many",
            vec![
                put(base + 1, "key/00", "after"),
                put(base + 2, "key/new", "new"),
                put(base + 2, "key/more", "x"),
            ],
            DrillResult::Failed,
            "holds 22 keys, the source 21",
        ),
    ];
    for (case, events, result, said) in cases {
        let object = delta::encode(base, &events).unwrap();
        env.bucket.put_object(&delta_key, object).await.unwrap();
        let report = run_drill(&env.client, NS, ETCD, &want, &settings).await;
        assert_eq!(report.result, result, "{case}: {report:?}");
        assert!(report.message.contains(said), "{case}: {report:?}");
        assert_eq!(report.revision, Some(base + 2), "{case}");
        assert_eq!(report.deltas, Some(1), "{case}");
        assert_eq!(
            std::fs::read_dir(scratch.path()).unwrap().count(),
            0,
            "{case}: scratch left"
        );
    }
    env.bucket
        .put_object(&delta_key, delta::encode(base, &whole).unwrap())
        .await
        .unwrap();

    let mut altered = want.clone();
    altered.sha256 = "00".repeat(32);
    let report = run_drill(&env.client, NS, ETCD, &altered, &settings).await;
    assert_eq!(report.result, DrillResult::Failed, "{report:?}");
    assert!(
        report.message.contains(&format!("{BUCKET}/{}", want.key))
            && report.message.contains("altered or damaged"),
        "{report:?}"
    );

    let empty = TempDir::new("drill-no-etcd");
    let without = DrillSettings {
        etcd_dir: Some(empty.path().to_path_buf()),
        ..settings.clone()
    };
    let report = run_drill(&env.client, NS, ETCD, &want, &without).await;
    assert_eq!(report.result, DrillResult::Failed, "{report:?}");
    assert!(
        report.message.contains("no etcd binary in") && report.message.contains("--drill-etcd-dir"),
        "{report:?}"
    );

    // The source compacts past the revision the deltas reach: nothing can be concluded.
    kv.put("key/later", "x", None).await.unwrap();
    member.compact(base + 3, true).await.unwrap();
    let report = run_drill(&env.client, NS, ETCD, &want, &settings).await;
    assert_eq!(report.result, DrillResult::Inconclusive, "{report:?}");
    assert!(
        report
            .message
            .starts_with("the snapshot and 1 delta objects restored; ")
            && report
                .message
                .contains(&format!("compacted revision {}", base + 2)),
        "{report:?}"
    );
    assert_eq!(
        std::fs::read_dir(scratch.path()).unwrap().count(),
        0,
        "scratch left"
    );

    // A value the copy holds small where the source holds one over the controller's answer cap
    // differs: the source's answer is refused for its size, and that says so.
    kv.put("key/big", vec![7u8; 100 << 10], None).await.unwrap();
    env.bucket.delete_object(&delta_key).await.unwrap();
    let longer = DeltaName {
        last: base + 4,
        ..name
    };
    let mut forged = whole.clone();
    forged.extend([put(base + 3, "key/later", "x"), put(base + 4, "key/big", "small")]);
    env.bucket
        .put_object(&longer.key(&want.key), delta::encode(base, &forged).unwrap())
        .await
        .unwrap();
    let report = run_drill(&env.client, NS, ETCD, &want, &settings).await;
    assert_eq!(report.result, DrillResult::Failed, "{report:?}");
    assert!(
        report.message.contains("key key/big holds another value"),
        "{report:?}"
    );
}
