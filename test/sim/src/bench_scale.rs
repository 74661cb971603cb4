//! `etcdadm-sim bench scale`: one etcdadm-controller keeping N established 3-member clusters
//! healthy, whose members are fake etcd responders, so the controller's own cost per cluster
//! is what is measured.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::capi::{Cluster, Machine};
use etcdadm_shared::names;
use etcdadm_shared::pki::CertificateAuthority;

use crate::bench::child_usage;
use crate::error::SimError;
use crate::fake_etcd::{self, FakeCluster, ProbeLog};
use crate::plane::{InMemoryServer, NAMESPACE, serve_in_memory, spawn_controller_with_ports};

const MEMBERS: usize = 3;
const CONTROLLER: &str = "etcdadm-controller";
/// How long the bench waits for every cluster to be Ready before measuring anyway.
const READY_WAIT: Duration = Duration::from_secs(300);

/// The address of member `member` of cluster `cluster`: `127.<20 + c/250>.<c%250>.<member+1>`,
/// clear of the prefixes the tests use.
fn member_ip(cluster: usize, member: usize) -> IpAddr {
    let octet = |v: usize| u8::try_from(v).unwrap_or(u8::MAX);
    IpAddr::V4(Ipv4Addr::new(
        127,
        octet(20 + cluster / 250),
        octet(cluster % 250),
        octet(member + 1),
    ))
}

/// Measure one controller with `clusters` clusters for `window` once all are Ready.
/// `concurrency`, when given, is passed to the controller as `--concurrency`.
pub async fn run_scale(
    work_dir: &Path,
    clusters: usize,
    window: Duration,
    concurrency: Option<u16>,
) -> Result<(), SimError> {
    let setup = |e: &dyn std::fmt::Display| SimError::Setup(e.to_string());
    let _ = std::fs::remove_dir_all(work_dir);
    std::fs::create_dir_all(work_dir).map_err(|e| setup(&e))?;
    let InMemoryServer {
        server,
        served: _serving,
        kubeconfig,
    } = serve_in_memory(work_dir).await?;
    let client = server.client(NAMESPACE);

    // One CA for all clusters: the bench measures health checking, not CA generation.
    let ca = CertificateAuthority::generate("etcd-ca").map_err(|e| setup(&e))?;
    let fakes: Vec<FakeCluster> = (0..clusters)
        .map(|c| FakeCluster {
            members: (0..MEMBERS)
                .map(|m| (format!("scale-{c}-etcd-{m}"), member_ip(c, m)))
                .collect(),
        })
        .collect();
    let log = Arc::new(Mutex::new(ProbeLog::default()));
    fake_etcd::serve(&ca, &fakes, log.clone()).await?;
    for (c, fake) in fakes.iter().enumerate() {
        seed_cluster(&client, &ca, c, fake).await?;
    }

    let started = Instant::now();
    let mut controller = spawn_controller_with_ports(
        CONTROLLER,
        &kubeconfig,
        &work_dir.join(format!("{CONTROLLER}.log")),
        None,
        &concurrency
            .map(|n| format!("--concurrency={n}"))
            .into_iter()
            .collect::<Vec<_>>(),
    )?;
    // Wait for every cluster to be Ready, but not forever: an overloaded controller is measured
    // too, and the report says how many it got to.
    let api: Api<EtcdadmCluster> = Api::namespaced(client.clone(), NAMESPACE);
    let mut ready = 0;
    while ready < clusters && started.elapsed() < READY_WAIT {
        tokio::time::sleep(Duration::from_secs(1)).await;
        ready = api
            .list(&Default::default())
            .await?
            .items
            .iter()
            .filter(|e| e.status.as_ref().is_some_and(|s| s.ready))
            .count();
    }
    let all_ready = started.elapsed();

    // Let the start-up burst pass, then watch a quiet window.
    tokio::time::sleep(Duration::from_secs(20)).await;
    if let Ok(mut log) = log.lock() {
        log.reset();
    }
    let before = child_usage(CONTROLLER);
    let requests_before = server.request_count();
    tokio::time::sleep(window).await;
    let requests = server.request_count() - requests_before;
    let after = child_usage(CONTROLLER);
    let _ = controller.start_kill();

    let (gaps, probed, health_calls, member_list_calls) = match log.lock() {
        Ok(log) => (
            log.gaps().to_vec(),
            log.probed.len(),
            log.health_calls,
            log.member_list_calls,
        ),
        Err(_) => (vec![], 0, 0, 0),
    };
    let seconds = window.as_secs_f64();
    println!(
        "command: etcdadm-sim bench scale --clusters {clusters} --window-seconds {}",
        window.as_secs()
    );
    println!(
        "{clusters} clusters × {MEMBERS} fake members, health interval 10 s; {ready} Ready {:.1} s after start",
        all_ready.as_secs_f64()
    );
    println!(
        "health-check interval achieved per member: {}; {probed} of {} members probed in the window",
        percentiles(&gaps),
        clusters * MEMBERS
    );
    println!(
        "asked of the members per second: /health {:.1}, MemberList {:.1}",
        health_calls as f64 / seconds,
        member_list_calls as f64 / seconds
    );
    match (before, after) {
        (Some(b), Some(a)) => println!(
            "{CONTROLLER}: CPU {:.2} s per minute ({:.3} cores), RSS {:.1} MiB, peak RSS {:.1} MiB",
            (a.cpu_seconds - b.cpu_seconds) * 60.0 / seconds,
            (a.cpu_seconds - b.cpu_seconds) / seconds,
            a.rss_kib as f64 / 1024.0,
            a.peak_rss_kib as f64 / 1024.0
        ),
        _ => println!(
            "{CONTROLLER}: exited during the window; see {}",
            work_dir.display()
        ),
    }
    println!(
        "API requests against the sim API server: {:.1} per second",
        requests as f64 / seconds
    );
    Ok(())
}

/// `median, p99, max` of gaps in seconds.
fn percentiles(gaps: &[f64]) -> String {
    if gaps.is_empty() {
        return "no member was probed twice".into();
    }
    let mut sorted = gaps.to_vec();
    sorted.sort_by(f64::total_cmp);
    let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
    format!(
        "median {:.2} s, p99 {:.2} s, max {:.2} s over {} gaps",
        at(0.5),
        at(0.99),
        at(1.0),
        sorted.len()
    )
}

/// A Cluster with provisioned infrastructure, its CA Secret, an EtcdadmCluster of three and
/// three Machines with the fake members' addresses: an established cluster as the controller
/// would find it after a restart.
async fn seed_cluster(
    client: &Client,
    ca: &CertificateAuthority,
    index: usize,
    fake: &FakeCluster,
) -> Result<(), SimError> {
    let cluster = format!("scale-{index}");
    let etcd = format!("{cluster}-etcd");
    let params = PatchParams::default();
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), NAMESPACE);
    clusters
        .create(
            &Default::default(),
            &serde_json::from_value(json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                "metadata": {"name": cluster}, "spec": {},
            }))?,
        )
        .await?;
    let provisioned = json!({"status": {"initialization": {"infrastructureProvisioned": true}}});
    clusters
        .patch_status(&cluster, &params, &Patch::Merge(&provisioned))
        .await?;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": names::ca_secret_name(&cluster),
                     "labels": {names::CLUSTER_NAME_LABEL: cluster}},
        "stringData": {names::TLS_CERT_KEY: ca.cert_pem(), names::TLS_KEY_KEY: ca.key_pem()},
    }))?;
    Api::<Secret>::namespaced(client.clone(), NAMESPACE)
        .create(&Default::default(), &secret)
        .await?;
    let etcd_cluster = Api::<EtcdadmCluster>::namespaced(client.clone(), NAMESPACE)
        .create(
            &Default::default(),
            &serde_json::from_value(json!({
                "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
                "metadata": {"name": etcd, "labels": {names::CLUSTER_NAME_LABEL: cluster}},
                "spec": {"replicas": MEMBERS, "healthCheck": {"interval": "10s"},
                         "infrastructureTemplate": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
                                                    "kind": "SimMachineTemplate", "name": "scale"}},
            }))?,
        )
        .await?;
    let uid = etcd_cluster.uid().unwrap_or_default();
    let machines: Api<Machine> = Api::namespaced(client.clone(), NAMESPACE);
    for (name, ip) in &fake.members {
        let machine: Machine = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name,
                         "labels": {names::CLUSTER_NAME_LABEL: cluster, names::ETCD_CLUSTER_LABEL: etcd},
                         "ownerReferences": [{"apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1",
                                              "kind": "EtcdadmCluster", "name": etcd, "uid": uid,
                                              "controller": true, "blockOwnerDeletion": true}]},
            "spec": {"clusterName": cluster,
                     "bootstrap": {"dataSecretName": format!("{name}-bootstrap")},
                     "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                           "kind": "SimMachine", "name": name}},
        }))?;
        machines.create(&Default::default(), &machine).await?;
        let status = json!({"status": {
            "addresses": [{"type": "InternalIP", "address": ip.to_string()}],
            "phase": "Running",
            "initialization": {"bootstrapDataSecretCreated": true, "infrastructureProvisioned": true},
        }});
        machines
            .patch_status(name, &params, &Patch::Merge(&status))
            .await?;
    }
    Ok(())
}
