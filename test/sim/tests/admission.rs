#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Bad input is never silent (docs/operating.md, "Bad input"), in the README demo as a new
//! user meets it (issue 44's repro): on its real kube-apiserver the demo serves and registers
//! the admission webhooks as an install does, so a 1Ki quota is refused by the CRD schema and a
//! defragmentation window whose cron never fires by the webhook, each naming the field; and
//! with the webhooks unregistered the cron gets past admission and the controller says so on
//! the object (`SpecValid` False, `InvalidSpec`, a Warning Event naming the field).

use std::time::Duration;

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::cluster::condition::SPEC_VALID;
use etcdadm_shared::api::conditions;
use etcdadm_shared::testing::TempDir;
use etcdadm_sim::demo::{ApiServerChoice, Demo, DemoOptions, eventually, failure_logs};
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

const ETCD: &str = "demo-etcd";
const WINDOW_START: &str = "spec.maintenance.defragmentation.window.start";

/// Merge-patch `spec` into the demo's EtcdadmCluster: `Ok`, or the API server's message.
async fn patch_spec(api: &Api<EtcdadmCluster>, spec: Value) -> Result<(), String> {
    match api
        .patch(
            ETCD,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": spec})),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) => Err(status.message),
        Err(e) => panic!("patch failed without an answer from the API server: {e}"),
    }
}

fn bad_window() -> Value {
    json!({"maintenance": {"defragmentation": {"window": {"start": "61 25 * * *", "duration": "2h"}}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_refuses_bad_input_at_admission_and_reports_what_gets_past_it() {
    let work = TempDir::new("sim-admission");
    let options = DemoOptions {
        work_dir: work.path().to_path_buf(),
        api_server: ApiServerChoice::Real,
        members: 1,
        ip_prefix: [127, 0, 27],
        timeout: Duration::from_secs(120),
        ..DemoOptions::default()
    };
    let mut demo = Demo::start(&options)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", failure_logs(work.path())));
    assert!(
        demo.webhooks_registered(),
        "the demo on a real kube-apiserver registers its webhooks"
    );
    // The demo's own objects went through the mutating and validating webhooks to get here.
    demo.wait_ready()
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", failure_logs(work.path())));
    let api: Api<EtcdadmCluster> = Api::default_namespaced(demo.plane.client.clone());

    // The schema refuses the quota before any webhook is asked.
    let refused = patch_spec(&api, json!({"etcdadmConfigSpec": {"quotaBackendBytes": "1Ki"}}))
        .await
        .expect_err("a 1Ki quota is refused");
    println!("refused by the schema: {refused}");
    assert!(
        refused.contains("spec.etcdadmConfigSpec.quotaBackendBytes"),
        "{refused}"
    );
    assert!(refused.contains("16.0 MiB to 32.0 GiB"), "{refused}");
    assert!(
        !refused.contains("admission webhook"),
        "the CRD schema refuses it: {refused}"
    );

    // The webhook refuses the cron the schema cannot read.
    let refused = patch_spec(&api, bad_window())
        .await
        .expect_err("a cron that never fires is refused");
    println!("refused by the webhook: {refused}");
    assert!(refused.contains("admission webhook"), "{refused}");
    assert!(refused.contains(WINDOW_START), "{refused}");

    // Without the webhooks it gets in, and the controller says so on the object.
    demo.unregister_webhooks().await.unwrap();
    patch_spec(&api, bad_window())
        .await
        .unwrap_or_else(|e| panic!("without webhooks the schema admits it: {e}"));
    let message = eventually(
        "SpecValid False with InvalidSpec",
        Duration::from_secs(60),
        || async {
            let etcd = api.get(ETCD).await?;
            let status = etcd.status.unwrap_or_default();
            Ok(match conditions::find(&status.conditions, SPEC_VALID) {
                Some(c) if c.reason.as_deref() == Some("InvalidSpec") => {
                    Ok(c.message.clone().unwrap_or_default())
                }
                other => Err(format!("{other:?}")),
            })
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", failure_logs(work.path())));
    println!("SpecValid: {message}");
    assert!(message.contains(WINDOW_START), "{message}");
    let events: Api<Event> = Api::default_namespaced(demo.plane.client.clone());
    let selector = format!("involvedObject.name={ETCD},reason=InvalidSpec");
    let warned = eventually("a Warning Event InvalidSpec", Duration::from_secs(30), || async {
        let listed = events.list(&ListParams::default().fields(&selector)).await?;
        Ok(listed
            .items
            .into_iter()
            .find(|e| e.type_.as_deref() == Some("Warning"))
            .and_then(|e| e.message)
            .ok_or_else(|| "none yet".to_string()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", failure_logs(work.path())));
    println!("Event InvalidSpec: {warned}");
    assert!(warned.contains(WINDOW_START), "{warned}");
    drop(demo);
}
