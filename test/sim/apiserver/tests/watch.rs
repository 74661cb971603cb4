#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Watch semantics: kube-runtime watchers and controllers, resume, bookmarks, 410 Gone, leaks.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcdadm_sim_apiserver::{ApiServer, fake_client};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;

fn cm(name: &str, labels: &[(&str, &str)]) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels.iter().cloned().collect::<BTreeMap<_, _>>()},
    }))
    .unwrap()
}

const DEADLINE: Duration = Duration::from_secs(10);

async fn next_event<S>(stream: &mut S) -> WatchEvent<ConfigMap>
where
    S: futures::Stream<Item = kube::Result<WatchEvent<ConfigMap>>> + Unpin,
{
    tokio::time::timeout(DEADLINE, stream.next())
        .await
        .expect("no event in time")
        .expect("stream ended")
        .unwrap()
}

/// The next event that is not a bookmark.
async fn next_change<S>(stream: &mut S) -> WatchEvent<ConfigMap>
where
    S: futures::Stream<Item = kube::Result<WatchEvent<ConfigMap>>> + Unpin,
{
    loop {
        match next_event(stream).await {
            WatchEvent::Bookmark(_) => continue,
            other => return other,
        }
    }
}

async fn eventually<F: FnMut() -> bool>(what: &str, mut check: F) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn kube_runtime_watcher_sees_create_update_delete() {
    let (_server, client) = fake_client().unwrap();
    let api: Api<ConfigMap> = Api::default_namespaced(client.clone());
    api.create(&PostParams::default(), &cm("before", &[]))
        .await
        .unwrap();
    let mut events = watcher(api.clone(), watcher::Config::default()).boxed();
    // The initial list.
    let mut initial = Vec::new();
    loop {
        match tokio::time::timeout(DEADLINE, events.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            watcher::Event::Init => {}
            watcher::Event::InitApply(o) => initial.push(o.name_any()),
            watcher::Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(initial, vec!["before"]);
    api.create(&PostParams::default(), &cm("new", &[])).await.unwrap();
    api.patch(
        "new",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "v"}})),
    )
    .await
    .unwrap();
    api.delete("new", &DeleteParams::default()).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        match tokio::time::timeout(DEADLINE, events.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            watcher::Event::Apply(o) => seen.push(format!("apply {} {:?}", o.name_any(), o.data)),
            watcher::Event::Delete(o) => seen.push(format!("delete {}", o.name_any())),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(
        seen,
        vec![
            "apply new None".to_string(),
            "apply new Some({\"k\": \"v\"})".to_string(),
            "delete new".to_string()
        ]
    );
}

#[tokio::test]
async fn streaming_list_watcher_gets_initial_events_then_changes() {
    let (_server, client) = fake_client().unwrap();
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    api.create(&PostParams::default(), &cm("before", &[]))
        .await
        .unwrap();
    let mut events = watcher(api.clone(), watcher::Config::default().streaming_lists()).boxed();
    let mut initial = Vec::new();
    loop {
        match tokio::time::timeout(DEADLINE, events.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            watcher::Event::Init => {}
            watcher::Event::InitApply(o) => initial.push(o.name_any()),
            watcher::Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(initial, vec!["before"]);
    api.create(&PostParams::default(), &cm("after", &[]))
        .await
        .unwrap();
    match tokio::time::timeout(DEADLINE, events.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
    {
        watcher::Event::Apply(o) => assert_eq!(o.name_any(), "after"),
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn controller_reconciles_created_objects() {
    let (_server, client) = fake_client().unwrap();
    let api: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let reconciled = Arc::new(AtomicUsize::new(0));
    let counter = reconciled.clone();
    let controller = tokio::spawn(
        Controller::new(api.clone(), watcher::Config::default())
            .run(
                |obj: Arc<ConfigMap>, ctx: Arc<(Api<ConfigMap>, Arc<AtomicUsize>)>| async move {
                    // Mark the object so the test can see the reconcile landed.
                    let marked = json!({"metadata": {"annotations": {"reconciled": "yes"}}});
                    ctx.0
                        .patch(&obj.name_any(), &PatchParams::default(), &Patch::Merge(marked))
                        .await?;
                    ctx.1.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, kube::Error>(Action::await_change())
                },
                |_, _, _| Action::requeue(Duration::from_secs(1)),
                Arc::new((api.clone(), counter)),
            )
            .for_each(|_| async {}),
    );
    api.create(&PostParams::default(), &cm("target", &[]))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let obj = api.get("target").await.unwrap();
        if obj.annotations().get("reconciled").is_some_and(|v| v == "yes") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "controller never reconciled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(reconciled.load(Ordering::SeqCst) >= 1);
    controller.abort();
}

#[tokio::test]
async fn watch_resumes_from_a_resource_version_and_follows_selectors() {
    let (_server, client) = fake_client().unwrap();
    let api: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let first = api
        .create(&PostParams::default(), &cm("a", &[("app", "etcd")]))
        .await
        .unwrap();
    api.create(&PostParams::default(), &cm("b", &[])).await.unwrap();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"x": "1"}})),
    )
    .await
    .unwrap();

    // From the first object's version: the later changes, in order.
    let rv = first.resource_version().unwrap();
    let mut stream = api
        .watch(&WatchParams::default().disable_bookmarks(), &rv)
        .await
        .unwrap()
        .boxed();
    match next_change(&mut stream).await {
        WatchEvent::Added(o) => assert_eq!(o.name_any(), "b"),
        other => panic!("{other:?}"),
    }
    match next_change(&mut stream).await {
        WatchEvent::Modified(o) => assert_eq!(o.data.unwrap()["x"], "1"),
        other => panic!("{other:?}"),
    }

    // A selector watch: objects entering are ADDED, leaving are DELETED.
    let latest = api
        .list(&Default::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut selected = api
        .watch(&WatchParams::default().labels("app=etcd"), &latest)
        .await
        .unwrap()
        .boxed();
    api.patch(
        "b",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "etcd"}}})),
    )
    .await
    .unwrap();
    api.patch(
        "b",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "web"}}})),
    )
    .await
    .unwrap();
    match next_change(&mut selected).await {
        WatchEvent::Added(o) => assert_eq!(o.name_any(), "b"),
        other => panic!("{other:?}"),
    }
    match next_change(&mut selected).await {
        WatchEvent::Deleted(o) => assert_eq!(o.name_any(), "b"),
        other => panic!("{other:?}"),
    }

    // All-namespaces watch from "0" starts with the current state.
    let all: Api<ConfigMap> = Api::all(client);
    let mut everything = all.watch(&WatchParams::default(), "0").await.unwrap().boxed();
    let mut names = Vec::new();
    for _ in 0..2 {
        match next_change(&mut everything).await {
            WatchEvent::Added(o) => names.push(o.name_any()),
            other => panic!("{other:?}"),
        }
    }
    names.sort();
    assert_eq!(names, vec!["a", "b"]);
}

#[tokio::test]
async fn bookmarks_arrive_when_asked_and_timeout_ends_the_watch() {
    let (_server, client) = fake_client().unwrap();
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    let created = api.create(&PostParams::default(), &cm("a", &[])).await.unwrap();
    let rv = created.resource_version().unwrap();
    let mut stream = api
        .watch(&WatchParams::default().timeout(3), &rv)
        .await
        .unwrap()
        .boxed();
    match next_event(&mut stream).await {
        WatchEvent::Bookmark(b) => {
            assert!(b.metadata.resource_version.parse::<u64>().unwrap() >= rv.parse().unwrap())
        }
        other => panic!("{other:?}"),
    }
    let ended = tokio::time::timeout(DEADLINE, async {
        while let Some(event) = stream.next().await {
            event.unwrap();
        }
    })
    .await;
    assert!(ended.is_ok(), "the watch outlived its timeoutSeconds");
}

#[tokio::test]
async fn too_old_resource_version_gets_410_gone_and_watcher_recovers() {
    let server = ApiServer::with_history(5);
    let client: Client = server.client("default");
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    let first = api
        .create(&PostParams::default(), &cm("first", &[]))
        .await
        .unwrap();
    for i in 0..10 {
        api.create(&PostParams::default(), &cm(&format!("c{i}"), &[]))
            .await
            .unwrap();
    }
    let rv = first.resource_version().unwrap();
    let mut stream = api.watch(&WatchParams::default(), &rv).await.unwrap().boxed();
    match next_event(&mut stream).await {
        WatchEvent::Error(e) => {
            assert_eq!(e.code, 410);
            assert_eq!(e.reason, "Expired");
        }
        other => panic!("expected 410, got {other:?}"),
    }
    assert!(
        tokio::time::timeout(DEADLINE, stream.next())
            .await
            .unwrap()
            .is_none(),
        "stream ends after the error"
    );

    // kube-runtime relists after a 410 and carries on.
    let store_events = watcher(api.clone(), watcher::Config::default()).boxed();
    let (reader, writer) = kube::runtime::reflector::store();
    let reflected = tokio::spawn(kube::runtime::reflector(writer, store_events).for_each(|_| async {}));
    eventually("the reflector to list 11 objects", || reader.state().len() == 11).await;
    for i in 10..20 {
        api.create(&PostParams::default(), &cm(&format!("c{i}"), &[]))
            .await
            .unwrap();
    }
    eventually("the reflector to see 21 objects", || reader.state().len() == 21).await;
    reflected.abort();
}

#[tokio::test]
async fn watches_end_when_clients_go_away() {
    let (server, client) = fake_client().unwrap();
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    let baseline = server.open_watch_count();
    let stream = api.watch(&WatchParams::default(), "0").await.unwrap().boxed();
    let second = api
        .watch(&WatchParams::default().disable_bookmarks(), "0")
        .await
        .unwrap()
        .boxed();
    // Poll so the server side subscribes.
    api.create(&PostParams::default(), &cm("a", &[])).await.unwrap();
    eventually("two watches open", || server.open_watch_count() == baseline + 2).await;
    drop(stream);
    drop(second);
    eventually("the watches to end", || server.open_watch_count() == baseline).await;
}

#[tokio::test]
async fn metadata_lists_and_watches_carry_metadata_only() {
    let (_server, client) = fake_client().unwrap();
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    let mut with_data = cm("settings", &[("app", "etcd")]);
    with_data.data = Some([("key".to_string(), "value".to_string())].into());
    api.create(&PostParams::default(), &with_data).await.unwrap();

    let listed = api.list_metadata(&Default::default()).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].name_any(), "settings");
    assert_eq!(listed.items[0].labels()["app"], "etcd");
    let kind = listed.items[0].types.as_ref().map(|t| t.kind.clone());
    assert_eq!(kind.as_deref(), Some("PartialObjectMetadata"));

    let mut events = api
        .watch_metadata(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    let added = tokio::time::timeout(DEADLINE, events.try_next())
        .await
        .expect("no event in time")
        .unwrap()
        .unwrap();
    match added {
        WatchEvent::Added(meta) => {
            assert_eq!(meta.name_any(), "settings");
            assert_eq!(
                meta.types.map(|t| t.kind).as_deref(),
                Some("PartialObjectMetadata")
            );
        }
        other => panic!("expected ADDED, got {other:?}"),
    }
}
