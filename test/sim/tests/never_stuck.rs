#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Never stuck: a join whose target stalls waits it out (scale-up and both rollout modes, real
//! etcd, both real binaries), with the membership rules and the client's writes checked on what
//! really happened. With learner joins the node waits until its learner is listed, and the
//! learner is added only once every member is healthy again, so the stall delays the join
//! instead of failing it (as voter joins did, for users whose target stalled). A join that never
//! completes is replaced past its deadline: `learners.rs` powers a joining machine off.

mod lifecycle_support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use etcdadm_shared::api::capi::Machine;
use etcdadm_shared::testing::TempDir;
use etcdadm_sim::plane::Plane;
use etcdadm_sim_machines::Fault;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::{Client, ResourceExt};
use lifecycle_support::*;
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(240);
/// How long the join target stays stopped, from the moment the new Machine has its data: past
/// the 3 s before etcdadm runs and its 5 s member list, which failed a voter join.
const STALL: Duration = Duration::from_secs(12);

/// The join URL in a Machine's bootstrap data (`etcdadm join <url>`), once it has some.
async fn join_url(client: &Client, machine: &Machine) -> Option<String> {
    let secret_name = machine.spec.bootstrap.data_secret_name.clone()?;
    let secret = Api::<Secret>::default_namespaced(client.clone())
        .get_opt(&secret_name)
        .await
        .ok()??;
    let value = secret.data?.get("value")?.0.clone();
    let text = String::from_utf8(value).ok()?;
    // A learner join's helper also mentions `etcdadm join` (its health phase, its messages):
    // the join itself is the one followed by a URL.
    let url = text
        .split("etcdadm join ")
        .skip(1)
        .filter_map(|after| after.split_whitespace().next())
        .find(|word| word.trim_start_matches(['\'', '"']).starts_with("https://"))?;
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
        assert!(
            Instant::now() < deadline,
            "no new Machine of {cluster} got bootstrap data"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
/// target, and wait until the cluster settles at `replicas` with that Machine's join done.
async fn stall_during(
    plane: &Plane,
    work: &TempDir,
    cluster: &str,
    what: &str,
    patch: Value,
    replicas: usize,
) {
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

    // The stalled Machine's join waited the stall out: its learner was added after the target
    // came back, then promoted; nothing failed.
    let failures = join_failures(client, cluster).await;
    let promoted = history
        .joins()
        .iter()
        .all(|(_, learner, voter)| *learner && *voter);
    assert!(
        failures.is_empty() && history.ever_member(&stalled) && promoted,
        "{what}: the join of {stalled} through {target} should have waited and completed: {failures:?} {:?}\n\
         --- {stalled}'s cloud-init output\n{}\n{}",
        history.joins(),
        std::fs::read_to_string(
            work.path()
                .join(format!("machines/{stalled}/var/log/cloud-init-output.log"))
        )
        .unwrap_or_default(),
        logs(work)
    );
    assert!(
        machine_names(client, cluster).await.contains(&stalled),
        "{what}: {stalled} was replaced"
    );
    assert_safe(&history, &machine_log);
    let pending = history.changes_while_a_failed_join_was_pending();
    assert!(pending.is_empty(), "{what}: {pending:?}\n{history:#?}");
    assert!(
        report.lost.is_empty(),
        "{what}: acknowledged writes lost: {:?}",
        report.lost
    );
    assert!(report.acked > 20, "{what}: the client hardly wrote: {report:?}");
    println!(
        "{what}: settled at {replicas} in {:.1}s; join of {stalled} through {target} waited out the stall; \
         client: {} writes, longest gap {:?}",
        wall.as_secs_f64(),
        report.acked,
        report.max_gap,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_through_a_stalled_member_waits_it_out_in_scale_up_and_both_rollout_modes() {
    let work = TempDir::new("sim-never-stuck");
    let plane = start_plane(7, &work, Duration::from_secs(1)).await;
    let client = plane.client.clone();
    // A short pause before etcdadm runs leaves time to stop the join target first.
    create(
        &client,
        "j1",
        3,
        true,
        json!({"preEtcdadmCommands": ["sleep 3"]}),
        json!({}),
    )
    .await;
    wait_settled(&client, "j1", 3, TIMEOUT, &work).await;

    stall_during(&plane, &work, "j1", "scale 3 → 5", json!({"replicas": 5}), 5).await;
    patch_spec(&client, "j1", json!({"replicas": 3})).await;
    wait_settled(&client, "j1", 3, TIMEOUT, &work).await;
    let now = || k8s_openapi::jiff::Timestamp::now().to_string();
    stall_during(
        &plane,
        &work,
        "j1",
        "rollout, maxSurge 1",
        json!({"rolloutAfter": now()}),
        3,
    )
    .await;
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

/// Poll `check` (which returns what it is still waiting for) until it passes; panics with the
/// last answer and the logs after `timeout`.
async fn until<F, Fut>(what: &str, timeout: Duration, work: &TempDir, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let started = Instant::now();
    loop {
        match check().await {
            Ok(()) => return started.elapsed(),
            Err(last) if started.elapsed() > timeout => {
                panic!("{what}: not within {timeout:?}: {last}\n{}", logs(work))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// `(reason, message)` of the Ready condition of `<cluster>-etcd`, as read untyped (an
/// unreadable object must be reported readably).
async fn ready_reason(client: &Client, cluster: &str) -> (String, String, Option<String>) {
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        client.default_namespace(),
        &kube::api::ApiResource::erase::<etcdadm_shared::api::EtcdadmCluster>(&()),
    );
    let Ok(object) = api.get(&format!("{cluster}-etcd")).await else {
        return Default::default();
    };
    let ready = object.data["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
        .cloned()
        .unwrap_or_default();
    let text = |k: &str| ready[k].as_str().unwrap_or_default().to_string();
    (text("reason"), text("message"), object.metadata.resource_version)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_and_missing_objects_get_an_answer_that_names_them() {
    let work = TempDir::new("sim-never-silent");
    let plane = start_plane(9, &work, Duration::from_secs(1)).await;
    let client = plane.client.clone();

    // An EtcdadmCluster the controller cannot read (an unknown format; the sim's API server,
    // like one without our CRD schema, lets it in): reported once, nothing loops.
    let untyped: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        client.default_namespace(),
        &kube::api::ApiResource::erase::<etcdadm_shared::api::EtcdadmCluster>(&()),
    );
    let unreadable = serde_json::from_value(json!({
        "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
        "metadata": {"name": "u1-etcd", "namespace": client.default_namespace()},
        "spec": {"infrastructureTemplate": {"kind": "SimMachineTemplate", "name": "x"},
                 "etcdadmConfigSpec": {"format": "ignition"}},
    }))
    .unwrap();
    untyped.create(&Default::default(), &unreadable).await.unwrap();
    until(
        "the unreadable object is reported",
        Duration::from_secs(30),
        &work,
        || async {
            match ready_reason(&client, "u1").await {
                (reason, message, _) if reason == "InvalidObject" && message.contains("ignition") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let (_, _, version) = ready_reason(&client, "u1").await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        ready_reason(&client, "u1").await.2,
        version,
        "the report is written once"
    );
    let reports: Vec<_> = events(&client, "u1")
        .await
        .into_iter()
        .filter(|(r, _)| r == "InvalidObject")
        .collect();
    assert_eq!(reports.len(), 1, "one Event: {reports:?}");

    // A missing infrastructure template is named, and used as soon as it appears.
    let missing = json!({"infrastructureTemplate": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
                         "kind": "SimMachineTemplate", "name": "t1-later", "namespace": client.default_namespace()}});
    create(&client, "t1", 1, false, json!({}), missing).await;
    until(
        "the missing template is named",
        Duration::from_secs(30),
        &work,
        || async {
            let (reason, message, _) = ready_reason(&client, "t1").await;
            let template = format!("SimMachineTemplate {}/t1-later", client.default_namespace());
            let named = message.contains(&template);
            let evented = events(&client, "t1")
                .await
                .iter()
                .any(|(r, n)| r == "InfrastructureTemplateNotFound" && n.contains(&template));
            (reason == "InfrastructureTemplateNotFound" && named && evented)
                .then_some(())
                .ok_or(format!("{reason}: {message}"))
        },
    )
    .await;
    assert!(machines(&client, "t1").await.is_empty());
    let templates: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        client.default_namespace(),
        &etcdadm_sim::capi::sim_machine_template_resource(),
    );
    let mut template = templates.get("t1-etcd").await.unwrap();
    template.metadata = kube::api::ObjectMeta {
        name: Some("t1-later".into()),
        namespace: Some(client.default_namespace().into()),
        ..Default::default()
    };
    templates.create(&Default::default(), &template).await.unwrap();
    let seen = until(
        "a Machine from the template that appeared",
        Duration::from_secs(30),
        &work,
        || async {
            (!machines(&client, "t1").await.is_empty())
                .then_some(())
                .ok_or_else(|| "no Machine yet".to_string())
        },
    )
    .await;
    println!("template appeared → first Machine in {:.1}s", seen.as_secs_f64());

    // A member spec admission would refuse (a 1 MiB version) creates no Machine, and the answer
    // names the field without copying the value.
    create(
        &client,
        "v1",
        1,
        false,
        json!({"cloudInitConfig": {"version": "9".repeat(1 << 20)}}),
        json!({}),
    )
    .await;
    until(
        "the invalid member spec is named",
        Duration::from_secs(30),
        &work,
        || async {
            let (reason, message, _) = ready_reason(&client, "v1").await;
            (reason == "InvalidSpec" && message.contains("spec.etcdadmConfigSpec.cloudInitConfig.version"))
                .then_some(())
                .ok_or(format!(
                    "{reason}: {}",
                    message.chars().take(300).collect::<String>()
                ))
        },
    )
    .await;
    assert!(
        machines(&client, "v1").await.is_empty(),
        "no Machine from an invalid spec"
    );
    let etcd = untyped.get("v1-etcd").await.unwrap();
    let status = serde_json::to_string(&etcd.data["status"]).unwrap();
    assert!(status.len() < 16 * 1024, "status is {} bytes", status.len());

    // The Secrets the controller reads are watched: with a 30 s health interval (and observations
    // otherwise reused for at least 5 minutes), a deleted CA is reported within one interval, and once
    // restored, a scale-up it held back starts at once.
    let slow = json!({"interval": "30s", "timeout": "5s", "unhealthyAfter": "5m"});
    etcdadm_sim::manifests::create_managed_cluster(
        &client,
        client.default_namespace(),
        &etcdadm_sim::manifests::ManagedCluster {
            name: "w1",
            replicas: 1,
            zones: &[],
            config_spec: json!({}),
            health_check: slow,
            with_kcp: false,
            extra_spec: json!({}),
        },
    )
    .await
    .unwrap();
    wait_settled(&client, "w1", 1, TIMEOUT, &work).await;
    let secrets: Api<Secret> = Api::default_namespaced(client.clone());
    let ca_name = etcdadm_shared::names::ca_secret_name("w1");
    let mut ca = secrets.get(&ca_name).await.unwrap();
    secrets.delete(&ca_name, &Default::default()).await.unwrap();
    let reported = until(
        "the deleted CA is reported",
        Duration::from_secs(30),
        &work,
        || async {
            let (reason, message, _) = ready_reason(&client, "w1").await;
            (reason == "EtcdCAMissing")
                .then_some(())
                .ok_or(format!("{reason}: {message}"))
        },
    )
    .await;
    patch_spec(&client, "w1", json!({"replicas": 3})).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        machines(&client, "w1").await.len(),
        1,
        "nothing grows without the CA"
    );
    ca.metadata = kube::api::ObjectMeta {
        name: ca.metadata.name.clone(),
        namespace: ca.metadata.namespace.clone(),
        labels: ca.metadata.labels.clone(),
        owner_references: ca.metadata.owner_references.clone(),
        ..Default::default()
    };
    secrets.create(&Default::default(), &ca).await.unwrap();
    let acted = until(
        "the restored CA lets the scale-up go on",
        Duration::from_secs(30),
        &work,
        || async {
            let n = machines(&client, "w1").await.len();
            (n > 1).then_some(()).ok_or(format!("{n} Machines"))
        },
    )
    .await;
    println!(
        "deleted CA reported in {:.1}s, restored CA → next Machine in {:.1}s (health interval 30 s)",
        reported.as_secs_f64(),
        acted.as_secs_f64()
    );
    save_logs(&work, "never-silent");
}
