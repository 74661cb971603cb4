#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Never stuck: a join whose target stalls is replaced past its deadline (scale-up and both
//! rollout modes, real etcd, both real binaries), with the membership rules and the client's
//! writes checked on what really happened.

mod lifecycle_support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use etcdadm_shared::api::capi::Machine;
use etcdadm_shared::testing::TempDir;
use etcdadm_sim::plane::{NAMESPACE, Plane};
use etcdadm_sim_machines::Fault;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::{Client, ResourceExt};
use lifecycle_support::*;
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(240);
/// How long the join target stays stopped, from the moment the new Machine has its data: past
/// the 3 s before etcdadm runs and its 5 s member list, so the join fails, as it did for users
/// whose target stalled.
const STALL: Duration = Duration::from_secs(12);

/// The join URL in a Machine's bootstrap data (`etcdadm join <url>`), once it has some.
async fn join_url(client: &Client, machine: &Machine) -> Option<String> {
    let secret_name = machine.spec.bootstrap.data_secret_name.clone()?;
    let secret = Api::<Secret>::namespaced(client.clone(), NAMESPACE)
        .get_opt(&secret_name)
        .await
        .ok()??;
    let value = secret.data?.get("value")?.0.clone();
    let text = String::from_utf8(value).ok()?;
    let after = text.split("etcdadm join ").nth(1)?;
    let url = after.split_whitespace().next()?;
    Some(url.trim_matches(|c| c == '\'' || c == '"').to_string())
}

/// Wait for the next Machine of `cluster` that is not in `known` to get its bootstrap data, then
/// stop the member it is told to join through for [`STALL`]. Returns (new Machine, target).
async fn stall_the_next_join(plane: &Plane, cluster: &str, known: &BTreeSet<String>) -> (String, String) {
    let client = &plane.client;
    let deadline = Instant::now() + TIMEOUT;
    loop {
        for machine in machines(client, cluster).await {
            if known.contains(&machine.name_any()) {
                continue;
            }
            let Some(url) = join_url(client, &machine).await else {
                continue;
            };
            let etcd = etcd_api(client).get(&format!("{cluster}-etcd")).await.unwrap();
            let target = etcd
                .status
                .unwrap_or_default()
                .members
                .into_iter()
                .find(|m| m.client_url.as_deref() == Some(url.as_str()))
                .unwrap_or_else(|| panic!("no member serves the join URL {url}"))
                .name;
            plane.runtime.fault(&target, Fault::Pause).unwrap();
            let runtime = plane.runtime.clone();
            let resumed = target.clone();
            tokio::spawn(async move {
                tokio::time::sleep(STALL).await;
                runtime.fault(&resumed, Fault::Resume).unwrap();
            });
            return (machine.name_any(), target);
        }
        assert!(Instant::now() < deadline, "no new Machine of {cluster} got bootstrap data");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn machine_names(client: &Client, cluster: &str) -> BTreeSet<String> {
    machines(client, cluster).await.iter().map(|m| m.name_any()).collect()
}

async fn join_failures(client: &Client, cluster: &str) -> Vec<String> {
    events(client, cluster)
        .await
        .into_iter()
        .filter(|(reason, _)| reason == "MemberJoinFailed")
        .map(|(_, note)| note)
        .collect()
}

/// Change the spec with `patch` while a client writes, stall the first new Machine's join
/// target, and wait until the cluster settles at `replicas` with the failed join replaced.
async fn stall_during(plane: &Plane, work: &TempDir, cluster: &str, what: &str, patch: Value, replicas: usize) {
    let client = &plane.client;
    let watchers = Watchers::start(client, cluster).await;
    let (endpoints, follower) = follow_kcp_endpoints(client, cluster);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let workload = Workload::start(client, cluster, endpoints, watchers.started).await;
    let known = machine_names(client, cluster).await;
    let started = Instant::now();
    patch_spec(client, cluster, patch).await;
    let (stalled, target) = stall_the_next_join(plane, cluster, &known).await;
    wait_settled(client, cluster, replicas, TIMEOUT, work).await;
    let wall = started.elapsed();
    let report = workload.finish().await;
    follower.abort();
    let (history, machine_log) = watchers.finish();

    // The stalled Machine never became a member (a member's name is set when it starts), is
    // gone, and a MemberJoinFailed Event says why (the recorder folds repeats into one Event).
    let failures = join_failures(client, cluster).await;
    assert!(
        !failures.is_empty() && !history.ever_member(&stalled),
        "{what}: the join of {stalled} through {target} should have failed and been replaced: {failures:?}\n\
         --- {stalled}'s cloud-init output\n{}\n{}",
        std::fs::read_to_string(work.path().join(format!("machines/{stalled}/var/log/cloud-init-output.log")))
            .unwrap_or_default(),
        logs(work)
    );
    assert!(!machine_names(client, cluster).await.contains(&stalled), "{what}: {stalled} is still there");
    assert_safe(&history, &machine_log);
    let pending = history.changes_while_a_failed_join_was_pending();
    assert!(pending.is_empty(), "{what}: {pending:?}\n{history:#?}");
    assert!(report.lost.is_empty(), "{what}: acknowledged writes lost: {:?}", report.lost);
    assert!(report.acked > 20, "{what}: the client hardly wrote: {report:?}");
    println!(
        "{what}: settled at {replicas} in {:.1}s; join of {stalled} through {target} failed and was replaced; \
         failed joins undone in etcd: {}; client: {} writes, longest gap {:?}",
        wall.as_secs_f64(),
        history.failed_joins().len(),
        report.acked,
        report.max_gap,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_through_a_stalled_member_is_replaced_in_scale_up_and_both_rollout_modes() {
    let work = TempDir::new("sim-never-stuck");
    let plane = start_plane(7, &work, Duration::from_secs(1)).await;
    let client = plane.client.clone();
    // A short pause before etcdadm runs leaves time to stop the join target first.
    create(&client, "j1", 3, true, json!({"preEtcdadmCommands": ["sleep 3"]}), json!({})).await;
    wait_settled(&client, "j1", 3, TIMEOUT, &work).await;

    stall_during(&plane, &work, "j1", "scale 3 → 5", json!({"replicas": 5}), 5).await;
    patch_spec(&client, "j1", json!({"replicas": 3})).await;
    wait_settled(&client, "j1", 3, TIMEOUT, &work).await;
    let now = || k8s_openapi::jiff::Timestamp::now().to_string();
    stall_during(&plane, &work, "j1", "rollout, maxSurge 1", json!({"rolloutAfter": now()}), 3).await;
    stall_during(
        &plane,
        &work,
        "j1",
        "rollout, maxSurge 0",
        json!({"rolloutAfter": now(), "rolloutStrategy": {"rollingUpdate": {"maxSurge": 0}}}),
        3,
    )
    .await;
    save_logs(&work, "never-stuck");
}
