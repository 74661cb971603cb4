//! `etcdadm-sim bench steps`: create-to-Ready of one cluster per kind of machine (the etcdadm
//! stand-in, the real etcdadm), in one run on one machine, split into the steps of each member's
//! join as seen from outside: the controller adding the learner, etcdadm installing and
//! configuring (its `etcd.env` appears), etcd starting (the member publishes its name), the
//! learner caught up and promoted, and the member answering `/health`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::api::Api;
use serde_json::{Value, json};

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::capi::Machine;
use etcdadm_shared::etcd::{EtcdTls, Member, MemberClient};
use etcdadm_shared::names;
use etcdadm_sim_machines::network::guard;
use etcdadm_sim_machines::real_etcdadm;

use crate::bench::spread;
use crate::demo::etcd_tls;
use crate::error::SimError;
use crate::manifests::{ManagedCluster, create_managed_cluster};
use crate::plane::{DEFAULT_KCP_ROLLOUT_STEP, Machines, NAMESPACE, Plane, PlaneOptions};

const POLL: Duration = Duration::from_millis(50);
/// The loopback prefix (`127.0.109.N`) of the stand-in run and the lab of the real-etcdadm run:
/// no scenario uses either.
const BENCH_LAB: u8 = 109;

/// When each step of one member's life was first seen, from the start of the run.
#[derive(Clone, Debug, Default)]
pub struct MemberSteps {
    pub created: Option<Duration>,
    /// The Machine names its bootstrap data Secret: its boot starts.
    pub bootstrap_data: Option<Duration>,
    /// The Machine reports an address: the machine boots.
    pub address: Option<Duration>,
    /// Its member is listed (pre-added as a learner by the controller; the first member once
    /// it runs).
    pub listed: Option<Duration>,
    /// `/etc/etcd/etcd.env` exists on the machine: etcdadm installed etcd, issued the
    /// certificates and wrote the configuration.
    pub configured: Option<Duration>,
    /// The member published its name: etcd runs and joined raft.
    pub started: Option<Duration>,
    /// Listed as a voter with its name.
    pub voter: Option<Duration>,
    pub healthy: Option<Duration>,
}

/// One cluster's run.
#[derive(Clone, Debug)]
pub struct StepsRun {
    pub total: Duration,
    /// In creation order; the first is `etcdadm init`.
    pub members: Vec<MemberSteps>,
}

fn between(later: Option<Duration>, earlier: Option<Duration>) -> Option<Duration> {
    Some(later?.saturating_sub(earlier?))
}

/// Create a cluster of `members` on a fresh plane with `machines` and record each step.
pub async fn create_and_record(
    work_dir: &Path,
    machines: Machines,
    members: i32,
    timeout: Duration,
) -> Result<StepsRun, SimError> {
    let _ = std::fs::remove_dir_all(work_dir);
    let config_spec = match machines {
        Machines::StandIn => json!({}),
        Machines::RealEtcdadm { .. } => real_etcdadm::config_spec().map_err(SimError::Setup)?,
    };
    let plane = Plane::start(PlaneOptions {
        work_dir: work_dir.to_path_buf(),
        ip_prefix: [127, 0, BENCH_LAB],
        machines,
        kcp_rollout_step: DEFAULT_KCP_ROLLOUT_STEP,
        ..Default::default()
    })
    .await?;
    let client = plane.client.clone();
    let start = Instant::now();
    create_managed_cluster(
        &client,
        NAMESPACE,
        &ManagedCluster {
            name: "bench",
            replicas: members,
            zones: &["zone-a", "zone-b", "zone-c"],
            config_spec,
            health_check: Value::Null,
            with_kcp: true,
            extra_spec: Value::Null,
        },
    )
    .await?;
    let mut steps: BTreeMap<String, MemberSteps> = BTreeMap::new();
    let mut tls: Option<EtcdTls> = None;
    let total = loop {
        let now = start.elapsed();
        if now > timeout {
            return Err(SimError::Timeout(format!(
                "bench cluster of {members} not Ready after {timeout:?}"
            )));
        }
        if tls.is_none() {
            tls = etcd_tls(&client, NAMESPACE, "bench").await?;
        }
        observe(&client, work_dir, tls.as_ref(), &mut steps, now).await?;
        let etcd = Api::<EtcdadmCluster>::namespaced(client.clone(), NAMESPACE)
            .get("bench-etcd")
            .await?;
        if etcd.status.is_some_and(|s| s.ready) {
            break now;
        }
        tokio::time::sleep(POLL).await;
    };
    drop(plane);
    let mut ordered: Vec<MemberSteps> = steps.into_values().collect();
    ordered.sort_by_key(|s| s.created);
    Ok(StepsRun {
        total,
        members: ordered,
    })
}

pub(crate) async fn observe(
    client: &kube::Client,
    work_dir: &Path,
    tls: Option<&EtcdTls>,
    steps: &mut BTreeMap<String, MemberSteps>,
    now: Duration,
) -> Result<(), SimError> {
    let machines = Api::<Machine>::namespaced(client.clone(), NAMESPACE)
        .list(&Default::default())
        .await?;
    let mut listed: Option<Vec<Member>> = None;
    for machine in &machines.items {
        let name = machine.name_any();
        let entry = steps.entry(name.clone()).or_default();
        entry.created.get_or_insert(now);
        if machine.spec.bootstrap.data_secret_name.is_some() {
            entry.bootstrap_data.get_or_insert(now);
        }
        let Some(address) = machine.etcd_address() else {
            continue;
        };
        entry.address.get_or_insert(now);
        if entry.configured.is_none()
            && work_dir
                .join("machines")
                .join(&name)
                .join("etc/etcd/etcd.env")
                .exists()
        {
            entry.configured = Some(now);
        }
        let (Some(tls), true) = (tls, guard(address).is_ok()) else {
            continue;
        };
        let Ok(member) = MemberClient::new(&names::client_url(address), tls, Duration::from_millis(500))
        else {
            continue;
        };
        if listed.is_none()
            && let Ok(list) = member.member_list().await
        {
            listed = Some(list);
        }
        if entry.healthy.is_none() && member.health().await.is_ok_and(|h| h.healthy) {
            entry.healthy = Some(now);
        }
    }
    let Some(list) = listed else { return Ok(()) };
    for machine in &machines.items {
        let name = machine.name_any();
        let peer = machine.etcd_address().map(names::peer_url);
        let Some(entry) = steps.get_mut(&name) else {
            continue;
        };
        let found = list
            .iter()
            .find(|m| m.name == name || peer.as_ref().is_some_and(|p| m.peer_urls.contains(p)));
        let Some(found) = found else { continue };
        entry.listed.get_or_insert(now);
        if found.name == name {
            entry.started.get_or_insert(now);
            if !found.is_learner {
                entry.voter.get_or_insert(now);
            }
        }
    }
    Ok(())
}

/// Run both kinds of machine for a cluster of `members`, `runs` times each, and print the table.
pub async fn run_steps(work_dir: &Path, members: i32, runs: usize) -> Result<(), SimError> {
    println!(
        "create-to-Ready of {members} members and each join's steps, {runs} run(s) per kind, median (min–max) over the joins; \
         command: etcdadm-sim bench steps --members {members} --runs {runs}"
    );
    println!(
        "{:<14} {:<20} {:<20} {:<22} {:<20} {:<22} {:<20}",
        "machines",
        "create→Ready",
        "init: boot→healthy",
        "join: boot→learner",
        "etcdadm install+conf",
        "etcd start (learner)",
        "catch-up+promotion"
    );
    for (label, machines) in [
        ("stand-in", Machines::StandIn),
        ("real etcdadm", Machines::RealEtcdadm { lab: BENCH_LAB }),
    ] {
        let mut results = vec![];
        for run in 0..runs {
            let dir = work_dir.join(format!("steps-{}-{run}", label.replace(' ', "-")));
            results.push(create_and_record(&dir, machines, members, Duration::from_secs(300)).await?);
            let _ = std::fs::remove_dir_all(&dir);
        }
        let joins: Vec<&MemberSteps> = results.iter().flat_map(|r| r.members.iter().skip(1)).collect();
        let of = |f: &dyn Fn(&MemberSteps) -> Option<Duration>, from: &[&MemberSteps]| {
            from.iter().filter_map(|s| f(s)).collect::<Vec<_>>()
        };
        let inits: Vec<&MemberSteps> = results.iter().filter_map(|r| r.members.first()).collect();
        println!(
            "{:<14} {:<20} {:<20} {:<22} {:<20} {:<22} {:<20}",
            label,
            spread(&results.iter().map(|r| r.total).collect::<Vec<_>>()),
            spread(&of(&|s| between(s.healthy, s.address), &inits)),
            spread(&of(&|s| between(s.listed, s.address), &joins)),
            spread(&of(&|s| between(s.configured, s.listed.max(s.address)), &joins)),
            spread(&of(&|s| between(s.started, s.configured), &joins)),
            spread(&of(&|s| between(s.voter, s.started), &joins)),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_differences_of_seen_times() {
        let s = |secs: u64| Some(Duration::from_secs(secs));
        assert_eq!(between(s(5), s(2)), s(3));
        assert_eq!(between(s(5), None), None);
        assert_eq!(between(s(1), s(2)), s(0));
    }
}
