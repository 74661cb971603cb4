#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The Event recorder on a real kube-apiserver: a new Event is created, its repeat is accepted as
//! a series update (events.k8s.io validates updates), another reason is another Event, and a
//! repeat of a deleted Event is a new one.

use etcdadm_envtest::KubeApiServer;
use etcdadm_shared::manager::events::Recorder;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::api::{Api, DeleteParams, ListParams};
use kube::runtime::events::{Event, EventType, Reporter};

#[tokio::test]
async fn a_repeat_is_counted_in_the_series_of_the_first_event() {
    let server = KubeApiServer::start().await.unwrap_or_else(|e| panic!("{e}"));
    let client = server.client().await.unwrap();
    let recorder = Recorder::new(client.clone(), Reporter::from("etcdadm-controller"));
    let regarding = ObjectReference {
        api_version: Some("etcdcluster.cluster.x-k8s.io/v1beta1".into()),
        kind: Some("EtcdadmCluster".into()),
        namespace: Some("default".into()),
        name: Some("c1-etcd".into()),
        uid: Some("5f0c5b7e-0000-4000-8000-000000000001".into()),
        ..ObjectReference::default()
    };
    let event = |reason: &str, note: &str| Event {
        type_: EventType::Warning,
        reason: reason.into(),
        note: Some(note.into()),
        action: "Reconcile".into(),
        secondary: None,
    };
    for note in ["first", "second", "third"] {
        recorder
            .publish(&event("MembershipChangeDeferred", note), &regarding)
            .await
            .unwrap_or_else(|e| panic!("publish {note}: {e}\n{}", server.log()));
    }
    recorder
        .publish(&event("MemberUnhealthy", "m1"), &regarding)
        .await
        .unwrap();

    let events: Api<K8sEvent> = Api::namespaced(client, "default");
    let mut listed: Vec<K8sEvent> = (events.list(&ListParams::default()).await.unwrap().items)
        .into_iter()
        .filter(|e| e.reporting_controller.as_deref() == Some("etcdadm-controller"))
        .collect();
    listed.sort_by_key(|e| e.reason.clone());
    let summary: Vec<(Option<String>, Option<String>, Option<i32>)> = listed
        .iter()
        .map(|e| {
            (
                e.reason.clone(),
                e.note.clone(),
                e.series.as_ref().map(|s| s.count),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (Some("MemberUnhealthy".into()), Some("m1".into()), None),
            (
                Some("MembershipChangeDeferred".into()),
                Some("first".into()),
                Some(3)
            ),
        ]
    );
    let deferred = &listed[1];
    assert_eq!(deferred.regarding.as_ref(), Some(&regarding));
    assert_eq!(
        deferred.reporting_controller.as_deref(),
        Some("etcdadm-controller")
    );
    assert_eq!(deferred.type_.as_deref(), Some("Warning"));

    // An Event deleted meanwhile: its next repeat is a new Event, not an error.
    let first = deferred.metadata.name.clone().unwrap();
    events.delete(&first, &DeleteParams::default()).await.unwrap();
    recorder
        .publish(&event("MembershipChangeDeferred", "fourth"), &regarding)
        .await
        .unwrap();
    let notes: Vec<(Option<String>, Option<i32>)> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("MembershipChangeDeferred"))
        .map(|e| (e.note, e.series.map(|s| s.count)))
        .collect();
    assert_eq!(notes, vec![(Some("fourth".into()), None)]);
}
