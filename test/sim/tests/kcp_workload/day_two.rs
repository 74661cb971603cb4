//! Day-2 etcd changes under the real Cluster API, each followed until the cluster settles with
//! the real KCP rolled out: an etcd Machine deleted by hand (the real Machine controller waits on
//! our pre-terminate hook until its member is removed), a dead member remediated, a rolling
//! replacement.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kube::api::{Api, DeleteParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use etcdadm_shared::api::capi::Machine;
use etcdadm_sim::plane::Plane;
use etcdadm_sim::real_capi::RealCapi;
use etcdadm_sim_machines::Fault;

use super::{CLUSTER, Change, follow_change, lifecycle_support};

/// The etcd Machines' names.
async fn etcd_machines(client: &Client) -> BTreeSet<String> {
    lifecycle_support::machine_names(client, CLUSTER).await
}

/// While `machine` is being deleted, whether the real Machine controller left its
/// infrastructure alone until our pre-terminate hook was released: the SimMachine exists, with
/// no deletion under way, as long as the Machine carries the hook.
async fn hook_held(client: &Client, machine: &str) -> Result<bool, String> {
    let machines: Api<Machine> = Api::default_namespaced(client.clone());
    let Some(current) = machines.get_opt(machine).await.map_err(|e| e.to_string())? else {
        return Ok(true);
    };
    let hooked = current
        .annotations()
        .keys()
        .any(|k| k.starts_with(etcdadm_shared::names::PRE_TERMINATE_HOOK_PREFIX));
    if !current.is_deleting() || !hooked {
        return Ok(true);
    }
    let sims: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        client.default_namespace(),
        &etcdadm_sim::infra::sim_machine_resource(),
    );
    let sim = sims.get_opt(machine).await.map_err(|e| e.to_string())?;
    Ok(sim.is_some_and(|s| s.metadata.deletion_timestamp.is_none()))
}

/// `kubectl delete machine` of an etcd Machine: the real Machine controller waits on our
/// pre-terminate hook (its infrastructure untouched) until the member is removed; a replacement
/// joins. The history's "no Machine gone before its member" rule checks the order.
pub async fn delete_a_machine(client: &Client, real: &RealCapi) -> Change {
    let victim = etcd_machines(client)
        .await
        .into_iter()
        .next()
        .expect("an etcd Machine");
    let watch_client = client.clone();
    let watched = victim.clone();
    let watch = tokio::spawn(async move {
        let deadline = Instant::now() + Duration::from_secs(600);
        while Instant::now() < deadline {
            if let Ok(false) = hook_held(&watch_client, &watched).await {
                return false;
            }
            if Api::<Machine>::default_namespaced(watch_client.clone())
                .get_opt(&watched)
                .await
                .ok()
                .flatten()
                .is_none()
            {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        true
    });
    let machines: Api<Machine> = Api::default_namespaced(client.clone());
    let change = follow_change(
        client,
        &format!("etcd Machine {victim} deleted by hand"),
        3,
        real,
        || async {
            machines.delete(&victim, &DeleteParams::default()).await.unwrap();
        },
    )
    .await;
    assert!(
        watch.await.unwrap(),
        "the real Machine controller touched {victim}'s infrastructure while our hook held it"
    );
    assert!(!etcd_machines(client).await.contains(&victim));
    change
}

/// An etcd machine powered off (every process gone): after `unhealthyAfter` the controller
/// replaces it, its member removed first (the other two keep quorum).
pub async fn remediate_a_dead_member(client: &Client, plane: &Plane, real: &RealCapi) -> Change {
    let dead = etcd_machines(client)
        .await
        .into_iter()
        .next_back()
        .expect("an etcd Machine");
    let machines: Api<Machine> = Api::default_namespaced(client.clone());
    let change = follow_change(
        client,
        &format!("etcd Machine {dead} powered off"),
        3,
        real,
        || async {
            plane.runtime.fault(&dead, Fault::PowerOff).unwrap();
            // Until its remediation begins the cluster still looks settled: wait for it.
            let deadline = Instant::now() + Duration::from_secs(300);
            while machines
                .get_opt(&dead)
                .await
                .unwrap()
                .is_some_and(|m| !m.is_deleting())
            {
                assert!(
                    Instant::now() < deadline,
                    "{dead} was never remediated\n{}",
                    real.logs()
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        },
    )
    .await;
    assert!(
        !etcd_machines(client).await.contains(&dead),
        "the dead Machine was replaced"
    );
    let events = lifecycle_support::events(client, CLUSTER).await;
    assert!(
        events
            .iter()
            .any(|(reason, note)| reason == "MemberRemediation" && note.contains(&dead)),
        "no Event names the remediation of {dead}: {events:?}"
    );
    change
}

/// `spec.rolloutAfter` now: every member is replaced; with a KCP, every new member joins first,
/// the control plane is given their endpoints once, then the old ones are removed.
pub async fn roll(client: &Client, real: &RealCapi) -> Change {
    let old = etcd_machines(client).await;
    let now = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let patch = json!({"rolloutAfter": now});
    let change = follow_change(client, "rolling replacement (rolloutAfter)", 3, real, || {
        lifecycle_support::patch_spec(client, CLUSTER, patch.clone())
    })
    .await;
    let current = etcd_machines(client).await;
    assert!(current.is_disjoint(&old), "old Machines remain: {current:?}");
    change
}
