#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! A whole etcd CA rotation (docs/security.md, "Rotating the etcd CA") with both real controller
//! binaries, real etcd, and a KubeadmControlPlane stand-in: three members, a client writing
//! every 50 ms all along (with what the control plane is given, taken up at each control plane
//! rollout, as its API servers would), the controller SIGKILLed and restarted twice mid-way.
//! At the end no acknowledged write is lost, the membership rules held, every member is signed
//! by the new CA and refuses a client of the old one, the control plane trusts the new CA alone
//! and holds a client certificate from it, and every phase left its Event.

mod lifecycle_support;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcdadm_shared::contract::ca::ca_from_secret;
use etcdadm_shared::contract::secret_text;
use etcdadm_shared::etcd::{EtcdTls, MemberClient};
use etcdadm_shared::names;
use etcdadm_shared::pki::{CertificateAuthority, certificates_der};
use etcdadm_shared::testing::TempDir;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use lifecycle_support::real_etcdadm;
use lifecycle_support::*;
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(900);
const CLUSTER: &str = "c1";
const REQUEST: &str = "one";
/// How long the membership recorder waits on one member before it asks the next.
const RECORDER_PATIENCE: Duration = Duration::from_millis(500);

/// The CA Secret `name` as a CA, once it exists and is usable.
async fn read_ca(secrets: &Api<Secret>, name: &str) -> Option<CertificateAuthority> {
    let secret = secrets.get_opt(name).await.ok()??;
    ca_from_secret(&secret, &secret.namespace().unwrap_or_default(), name).ok()
}

/// Give `tls` a client of both CAs as soon as `<cluster>-managed-etcd-next` exists: what the
/// membership recorder reads etcd with, through every phase.
fn follow_next_ca(
    client: &Client,
    current: CertificateAuthority,
    tls: Arc<Mutex<Option<Arc<rustls::ClientConfig>>>>,
) -> tokio::task::JoinHandle<()> {
    let secrets: Api<Secret> = Api::default_namespaced(client.clone());
    tokio::spawn(async move {
        loop {
            if let Some(next) = read_ca(&secrets, &names::next_ca_secret_name(CLUSTER)).await {
                let both =
                    EtcdTls::issued_by_each(&[&current, &next], "sim-recorder", Duration::from_secs(3600));
                *tls.lock().unwrap() = Some(both.unwrap());
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// The phases in order.
const PHASES: [&str; 6] = [
    "Generating",
    "Trusting",
    "ControlPlane",
    "Signing",
    "Dropping",
    "Finishing",
];

/// Where `phase` comes in [`PHASES`].
fn order(phase: &str) -> usize {
    PHASES
        .iter()
        .position(|p| *p == phase)
        .unwrap_or_else(|| panic!("unknown phase {phase}"))
}

/// `status.caRotation.phase`, None when no rotation is recorded.
async fn phase(client: &Client) -> Option<String> {
    let etcd = etcd_api(client).get(&format!("{CLUSTER}-etcd")).await.ok()?;
    Some(etcd.status?.ca_rotation?.phase)
}

/// The rotation is done: the CA Secret is marked for the request, the next one is gone and the
/// status records no rotation.
async fn done(client: &Client) -> bool {
    let secrets: Api<Secret> = Api::default_namespaced(client.clone());
    let marked = secrets
        .get_opt(&names::ca_secret_name(CLUSTER))
        .await
        .ok()
        .flatten()
        .is_some_and(|s| {
            s.annotations()
                .get(names::CA_ROTATED_FOR_ANNOTATION)
                .map(String::as_str)
                == Some(REQUEST)
        });
    let next_gone = secrets
        .get_opt(&names::next_ca_secret_name(CLUSTER))
        .await
        .is_ok_and(|s| s.is_none());
    marked && next_gone && phase(client).await.is_none()
}

/// Whether a client of `ca` alone (trusting it, its identity issued by it) is served by the
/// member at `url`.
async fn served(url: &str, ca: &CertificateAuthority) -> Result<(), String> {
    let tls = EtcdTls::issued_by(ca, "sim-check", Duration::from_secs(600)).unwrap();
    let member = MemberClient::new(url, &tls, Duration::from_secs(3)).map_err(|e| e.to_string())?;
    member.member_list().await.map(|_| ()).map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_rotation_rolls_every_member_and_the_control_plane_onto_the_new_ca_without_losing_a_write() {
    let work = TempDir::new("sim-ca-rotation");
    let plane = start_plane(88, &work, Duration::from_millis(300)).await;
    rotate_under_writes(plane, &work, json!({}), "ca-rotation").await;
}

/// The same on machines running the upstream etcdadm (each in a network namespace of its own):
/// it signs each member's certificates on the node with the first CA of the bundle in `ca.crt`
/// and the key in `ca.key`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_rotation_on_the_real_etcdadm_loses_no_write() {
    let work = TempDir::new("sim-real-ca-rotation");
    let plane = real_etcdadm::start_plane(66, &work, Duration::from_secs(1)).await;
    rotate_under_writes(
        plane,
        &work,
        real_etcdadm::config(json!({})),
        "real-etcdadm-ca-rotation",
    )
    .await;
}

/// Create three members (with `config_spec`) and a control plane on `plane`, rotate their CA
/// under a writing client with the controller killed twice, and check the outcome (the module's
/// comment); `label` names the saved logs.
// One scenario read top to bottom: create, rotate with two kills, then every check of the end.
async fn rotate_under_writes(
    mut plane: etcdadm_sim::plane::Plane,
    work: &TempDir,
    config_spec: serde_json::Value,
    label: &str,
) {
    let client = plane.client.clone();
    let secrets: Api<Secret> = Api::default_namespaced(client.clone());
    create(&client, CLUSTER, 3, true, config_spec, json!({})).await;
    wait_settled(&client, CLUSTER, 3, Duration::from_secs(300), work).await;
    let old = read_ca(&secrets, &names::ca_secret_name(CLUSTER)).await.unwrap();

    let tls = Arc::new(Mutex::new(Some(
        EtcdTls::issued_by(&old, "sim-recorder", Duration::from_secs(3600))
            .unwrap()
            .client_config()
            .unwrap(),
    )));
    // A member whose machine is gone (its namespace with it, on the real etcdadm's machines)
    // holds a read until it times out: the recorder passes over it soon, so that two removals
    // a second apart are seen apart.
    let watchers = Watchers::following(&client, CLUSTER, tls.clone(), RECORDER_PATIENCE).await;
    let follower = follow_next_ca(
        &client,
        CertificateAuthority::from_pem(old.cert_pem(), old.key_pem()).unwrap(),
        tls,
    );
    let (endpoints, endpoint_follower) = follow_kcp_endpoints(&client, CLUSTER);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let workload = Workload::start(&client, CLUSTER, endpoints, watchers.started).await;
    let reloader = workload.follow_control_plane_rollouts(&client, CLUSTER);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let old_machines = machine_names(&client, CLUSTER).await;

    let started = Instant::now();
    let annotate = json!({"metadata": {"annotations": {names::ROTATE_CA_ANNOTATION: REQUEST}}});
    etcd_api(&client)
        .patch(
            &format!("{CLUSTER}-etcd"),
            &PatchParams::default(),
            &Patch::Merge(&annotate),
        )
        .await
        .unwrap();

    // The controller is killed once members trust both CAs, and again once the control plane
    // has them; each restart picks the rotation up from what it finds.
    let mut kill_at = vec!["ControlPlane", "Signing"];
    let mut phases_seen: Vec<String> = Vec::new();
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(now) = phase(&client).await {
            if phases_seen.last() != Some(&now) {
                phases_seen.push(now.clone());
            }
            if kill_at.first().is_some_and(|at| order(at) <= order(&now)) {
                kill_at.remove(0);
                plane.kill_controller(CONTROLLER).await.unwrap();
                tokio::time::sleep(Duration::from_millis(500)).await;
                plane.restart_controller(CONTROLLER).unwrap();
            }
        }
        if done(&client).await {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the rotation is not done after {TIMEOUT:?} (phases seen {phases_seen:?})\n{}",
            logs(work)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        kill_at.is_empty(),
        "the controller was not killed at {kill_at:?}: phases seen {phases_seen:?}"
    );
    // Each phase once, in order: none came back (the status is written before each step).
    assert!(
        phases_seen.windows(2).all(|w| order(&w[0]) < order(&w[1])),
        "phases out of order: {phases_seen:?}"
    );
    let etcd = wait_settled(&client, CLUSTER, 3, Duration::from_secs(120), work).await;
    let wall = started.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let report = workload.finish().await;
    reloader.abort();
    endpoint_follower.abort();
    follower.abort();
    let (history, machine_log) = watchers.finish();

    assert!(
        report.lost.is_empty(),
        "acknowledged writes lost: {:?}",
        report.lost
    );
    assert!(report.acked > 50, "the client hardly wrote: {report:?}");
    assert_safe(&history, &machine_log);

    // The CA Secret holds the new CA; every member was replaced, is signed by it, serves a
    // client of it and refuses one of the old CA.
    let new = read_ca(&secrets, &names::ca_secret_name(CLUSTER)).await.unwrap();
    assert_ne!(new.fingerprint().unwrap(), old.fingerprint().unwrap());
    let now_machines = machine_names(&client, CLUSTER).await;
    assert!(
        now_machines.is_disjoint(&old_machines),
        "{now_machines:?} {old_machines:?}"
    );
    let urls: BTreeSet<String> = etcd
        .status
        .as_ref()
        .unwrap()
        .endpoints
        .split(',')
        .map(String::from)
        .collect();
    assert_eq!(urls.len(), 3, "{urls:?}");
    for url in &urls {
        served(url, &new)
            .await
            .unwrap_or_else(|e| panic!("{url} refuses a client of the new CA: {e}"));
        let refused = served(url, &old).await;
        assert!(refused.is_err(), "{url} still serves a client of the old CA");
        let tls = EtcdTls::issued_by(&new, "sim-check", Duration::from_secs(600)).unwrap();
        let member = MemberClient::new(url, &tls, Duration::from_secs(3)).unwrap();
        member.status().await.unwrap();
        let presented = member.server_certificate().unwrap();
        assert!(new.signed(&presented), "{url} is not signed by the new CA");
    }

    // The control plane trusts the new CA alone and its client certificate is the new CA's.
    let kcp_ca = secrets
        .get(&names::kcp_etcd_ca_secret_name(CLUSTER))
        .await
        .unwrap();
    let trusted = certificates_der(&secret_text(&kcp_ca, names::TLS_CERT_KEY).unwrap()).unwrap();
    assert_eq!(trusted.len(), 1);
    assert_eq!(
        etcdadm_shared::pki::der_fingerprint(&trusted[0]),
        new.fingerprint().unwrap()
    );
    let client_cert = secrets
        .get(&names::apiserver_client_secret_name(CLUSTER))
        .await
        .unwrap();
    let leaf = certificates_der(&secret_text(&client_cert, names::TLS_CERT_KEY).unwrap()).unwrap();
    assert!(
        new.signed(&leaf[0]),
        "the API server client certificate is not the new CA's"
    );

    let events = events(&client, CLUSTER).await;
    for phase in PHASES {
        assert!(
            events
                .iter()
                .any(|(reason, note)| *reason == format!("CARotation{phase}")
                    && note.starts_with(&format!("CA rotation phase {phase}:"))),
            "no Event for phase {phase}: {events:?}"
        );
    }
    for reason in ["CARotationStarted", "CARotated", "CARotationCleanedUp"] {
        assert!(
            events.iter().any(|(r, _)| r == reason),
            "no {reason} Event: {events:?}"
        );
    }
    let rollouts = plane.kcp_record.lock().unwrap().rollout_requests.len();
    println!(
        "rotated the etcd CA of 3 members in {:.1}s (controller killed twice; phases seen {phases_seen:?}); {rollouts} control plane rollout request(s); client: {} writes, longest gap {:?} (at {:?}), {} failed attempts",
        wall.as_secs_f64(),
        report.acked,
        report.max_gap,
        report.max_gap_at,
        report.failed_attempts
    );
    save_logs(work, label);
    drop(plane);
}
