#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! An object the controller cannot read is reported once: one condition write and one Event,
//! however often it is reconciled (each timestamped write used to trigger the next report).

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::manager::events::Recorder;
use etcdadm_shared::manager::invalid::{INVALID_OBJECT, report_invalid_object};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kube::core::DeserializeGuard;
use kube::runtime::events::Reporter;

#[tokio::test]
async fn an_unreadable_object_is_reported_once_with_its_reason() {
    let (_server, client) = etcdadm_sim_apiserver::fake_client().unwrap();
    let untyped: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &ApiResource::erase::<EtcdadmCluster>(&()),
    );
    let object: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
        "metadata": {"name": "c1-etcd", "namespace": "default"},
        "spec": {"infrastructureTemplate": {}, "etcdadmConfigSpec": {"format": "ignition"}},
    }))
    .unwrap();
    untyped.create(&PostParams::default(), &object).await.unwrap();

    let guarded: Api<DeserializeGuard<EtcdadmCluster>> = Api::namespaced(client.clone(), "default");
    let Err(invalid) = guarded.get("c1-etcd").await.unwrap().0 else {
        panic!("an unknown format must not deserialize");
    };
    let recorder = Recorder::new(client.clone(), Reporter::from("test-controller"));
    let mut versions = vec![];
    for _ in 0..3 {
        report_invalid_object::<EtcdadmCluster>(&client, &recorder, "test-controller", &invalid)
            .await
            .unwrap();
        versions.push(untyped.get("c1-etcd").await.unwrap().metadata.resource_version);
    }
    assert!(
        versions.windows(2).all(|w| w[0] == w[1]),
        "written once: {versions:?}"
    );

    let reported = untyped.get("c1-etcd").await.unwrap();
    let condition = &reported.data["status"]["conditions"][0];
    assert_eq!(condition["reason"], INVALID_OBJECT);
    let message = condition["message"].as_str().unwrap();
    assert!(
        message.contains("EtcdadmCluster default/c1-etcd cannot be read") && message.contains("ignition"),
        "{message}"
    );
    let events = Api::<Event>::namespaced(client, "default")
        .list(&Default::default())
        .await
        .unwrap();
    let reasons: Vec<_> = events
        .items
        .iter()
        .map(|e| e.reason.clone().unwrap_or_default())
        .collect();
    assert_eq!(reasons, vec![INVALID_OBJECT.to_string()], "one Event");
}
