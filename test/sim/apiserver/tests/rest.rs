#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! REST semantics through kube's typed `Api`, in-process.

use std::collections::BTreeMap;
use std::time::Duration;

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::capi::{Cluster, KubeadmControlPlane, Machine};
use etcdadm_sim_apiserver::{ApiServer, fake_client};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams, Preconditions,
};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};

fn code(err: kube::Error) -> u16 {
    match err {
        kube::Error::Api(status) => status.code,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn reason(err: kube::Error) -> (u16, String) {
    match err {
        kube::Error::Api(status) => (status.code, status.reason),
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn cm(name: &str, labels: &[(&str, &str)]) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels.iter().cloned().collect::<BTreeMap<_, _>>()},
        "data": {"k": "v"},
    }))
    .unwrap()
}

fn etcdadm_cluster(name: &str, replicas: i32) -> EtcdadmCluster {
    serde_json::from_value(json!({
        "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1",
        "kind": "EtcdadmCluster",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "infrastructureTemplate": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
                "kind": "SimMachineTemplate", "name": "t"},
            "etcdadmConfigSpec": {},
        },
    }))
    .unwrap()
}

/// Polls until `check` holds, failing after 10 s.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn client() -> (ApiServer, Client) {
    fake_client().unwrap()
}

#[tokio::test]
async fn discovery_lists_groups_resources_and_subresources() {
    let (server, client) = client();
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.major, "1");
    let core = client.list_core_api_versions().await.unwrap();
    assert_eq!(core.versions, vec!["v1"]);
    let groups = client.list_api_groups().await.unwrap();
    let names: Vec<&str> = groups.groups.iter().map(|g| g.name.as_str()).collect();
    for group in [
        "etcdcluster.cluster.x-k8s.io",
        "bootstrap.cluster.x-k8s.io",
        "cluster.x-k8s.io",
        "controlplane.cluster.x-k8s.io",
        "infrastructure.cluster.x-k8s.io",
        "coordination.k8s.io",
        "events.k8s.io",
    ] {
        assert!(names.contains(&group), "{group} missing from {names:?}");
    }
    let resources = client
        .list_api_group_resources("etcdcluster.cluster.x-k8s.io/v1beta1")
        .await
        .unwrap();
    let main = resources
        .resources
        .iter()
        .find(|r| r.name == "etcdadmclusters")
        .unwrap();
    assert!(main.namespaced);
    assert_eq!(main.kind, "EtcdadmCluster");
    assert_eq!(main.short_names.as_deref(), Some(&["etcdc".to_string()][..]));
    assert!(main.verbs.contains(&"watch".to_string()));
    assert!(
        resources
            .resources
            .iter()
            .any(|r| r.name == "etcdadmclusters/status")
    );
    let scale = resources
        .resources
        .iter()
        .find(|r| r.name == "etcdadmclusters/scale")
        .unwrap();
    assert_eq!(scale.kind, "Scale");
    let core_resources = client.list_core_api_resources("v1").await.unwrap();
    assert!(
        core_resources
            .resources
            .iter()
            .any(|r| r.name == "namespaces" && !r.namespaced)
    );
    // kube's own discovery walks every group and must accept the documents.
    let discovery = kube::Discovery::new(client.clone()).run().await.unwrap();
    assert!(discovery.has_group("infrastructure.cluster.x-k8s.io"));
    // CRDs are served back.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds
        .get("etcdadmclusters.etcdcluster.cluster.x-k8s.io")
        .await
        .unwrap();
    let established = crd.status.unwrap().conditions.unwrap();
    assert!(
        established
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
    );
    assert!(crds.list(&ListParams::default()).await.unwrap().items.len() >= 9);
    assert_eq!(
        code(
            crds.delete(
                "simmachines.infrastructure.cluster.x-k8s.io",
                &DeleteParams::default()
            )
            .await
            .unwrap_err()
        ),
        405
    );
    assert!(server.request_count() > 10);
}

#[tokio::test]
async fn create_sets_server_fields_and_rejects_duplicates_and_bad_input() {
    let (_server, client) = client();
    let api: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let created = api.create(&PostParams::default(), &cm("a", &[])).await.unwrap();
    assert!(created.uid().is_some());
    assert!(created.creation_timestamp().is_some());
    assert!(created.resource_version().unwrap().parse::<u64>().unwrap() > 0);
    assert_eq!(created.namespace().as_deref(), Some("default"));
    assert_eq!(
        reason(
            api.create(&PostParams::default(), &cm("a", &[]))
                .await
                .unwrap_err()
        ),
        (409, "AlreadyExists".into())
    );

    let mut generated = cm("", &[]);
    generated.metadata.name = None;
    generated.metadata.generate_name = Some("gen-".into());
    let generated = api.create(&PostParams::default(), &generated).await.unwrap();
    assert!(generated.name_any().starts_with("gen-") && generated.name_any().len() == 9);

    let mut nameless = cm("", &[]);
    nameless.metadata.name = None;
    assert_eq!(
        code(api.create(&PostParams::default(), &nameless).await.unwrap_err()),
        422
    );
    assert_eq!(
        code(
            api.create(&PostParams::default(), &cm("Not_Valid", &[]))
                .await
                .unwrap_err()
        ),
        422
    );

    let missing_ns: Api<ConfigMap> = Api::namespaced(client.clone(), "nowhere");
    let err = missing_ns
        .create(&PostParams::default(), &cm("a", &[]))
        .await
        .unwrap_err();
    assert_eq!(reason(err), (404, "NotFound".into()));

    let mut wrong_ns = cm("b", &[]);
    wrong_ns.metadata.namespace = Some("kube-system".into());
    assert_eq!(
        code(api.create(&PostParams::default(), &wrong_ns).await.unwrap_err()),
        400
    );

    // Kind and apiVersion must match the URL.
    let dynamic = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        "default",
        &ApiResource::from_gvk(&GroupVersionKind::gvk("", "v1", "ConfigMap")),
    );
    let mut secret_as_cm: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "c"}}))
    .unwrap();
    assert_eq!(
        code(
            dynamic
                .create(&PostParams::default(), &secret_as_cm)
                .await
                .unwrap_err()
        ),
        400
    );
    secret_as_cm.types.as_mut().unwrap().kind = "ConfigMap".into();
    secret_as_cm.data = json!({"data": {"k": 1}});
    // A number where the ConfigMap type has strings: the built-in kinds are validated.
    assert_eq!(
        code(
            dynamic
                .create(&PostParams::default(), &secret_as_cm)
                .await
                .unwrap_err()
        ),
        422
    );

    // Strict field validation is not implemented: refused rather than pretended.
    let strict = PatchParams::default().validation_strict();
    assert_eq!(
        code(
            api.patch("a", &strict, &Patch::Merge(json!({"data": {"x": "y"}})))
                .await
                .unwrap_err()
        ),
        400
    );

    // Dry run stores nothing.
    api.create(
        &PostParams {
            dry_run: true,
            ..Default::default()
        },
        &cm("dry", &[]),
    )
    .await
    .unwrap();
    assert!(api.get_opt("dry").await.unwrap().is_none());

    // Fields the CRD schema does not declare are pruned, as by the real server; the shipped
    // CAPI kinds preserve everything.
    let raw = Api::<DynamicObject>::default_namespaced_with(
        client.clone(),
        &ApiResource::from_gvk(&GroupVersionKind::gvk(
            "etcdcluster.cluster.x-k8s.io",
            "v1beta1",
            "EtcdadmCluster",
        )),
    );
    let mut undeclared: DynamicObject =
        serde_json::from_value(serde_json::to_value(etcdadm_cluster("pruned", 1)).unwrap()).unwrap();
    undeclared.data["spec"]["notInSchema"] = json!(true);
    let stored = raw.create(&PostParams::default(), &undeclared).await.unwrap();
    assert!(stored.data["spec"].get("notInSchema").is_none());
    assert_eq!(stored.data["spec"]["replicas"], 1);
    let patched = raw
        .patch(
            "pruned",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"alsoNot": 1}})),
        )
        .await
        .unwrap();
    assert!(patched.data["spec"].get("alsoNot").is_none());
    assert_eq!(
        patched.metadata.generation,
        Some(1),
        "a pruned-away change is no change"
    );

    // Custom resources start at generation 1 and drop status on create (status subresource).
    let clusters: Api<EtcdadmCluster> = Api::default_namespaced(client.clone());
    let mut with_status = etcdadm_cluster("e1", 3);
    with_status.status = Some(Default::default());
    with_status.status.as_mut().unwrap().ready = true;
    let created = clusters
        .create(&PostParams::default(), &with_status)
        .await
        .unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    assert!(created.status.is_none_or(|s| !s.ready));
}

#[tokio::test]
async fn list_filters_by_label_and_field_selectors_across_namespaces_and_pages() {
    let (_server, client) = client();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "other"}})).unwrap(),
        )
        .await
        .unwrap();
    let default: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let other: Api<ConfigMap> = Api::namespaced(client.clone(), "other");
    default
        .create(
            &PostParams::default(),
            &cm("a", &[("app", "etcd"), ("tier", "db")]),
        )
        .await
        .unwrap();
    default
        .create(&PostParams::default(), &cm("b", &[("app", "web")]))
        .await
        .unwrap();
    default
        .create(&PostParams::default(), &cm("c", &[]))
        .await
        .unwrap();
    other
        .create(&PostParams::default(), &cm("a", &[("app", "etcd")]))
        .await
        .unwrap();

    let names = |list: kube::core::ObjectList<ConfigMap>| -> Vec<String> {
        list.items
            .iter()
            .map(|o| format!("{}/{}", o.namespace().unwrap(), o.name_any()))
            .collect()
    };
    let cases = [
        ("app=etcd", vec!["default/a"]),
        ("app==web", vec!["default/b"]),
        ("app!=etcd", vec!["default/b", "default/c"]),
        ("app in (etcd,web)", vec!["default/a", "default/b"]),
        ("app notin (etcd)", vec!["default/b", "default/c"]),
        ("tier", vec!["default/a"]),
        ("!app", vec!["default/c"]),
        ("app=etcd,tier=db", vec!["default/a"]),
    ];
    for (selector, expected) in cases {
        let got = names(
            default
                .list(&ListParams::default().labels(selector))
                .await
                .unwrap(),
        );
        assert_eq!(got, expected, "selector {selector}");
    }
    let by_name = default
        .list(&ListParams::default().fields("metadata.name=b"))
        .await
        .unwrap();
    assert_eq!(names(by_name), vec!["default/b"]);
    assert_eq!(
        code(
            default
                .list(&ListParams::default().fields("data.k=v"))
                .await
                .unwrap_err()
        ),
        400
    );
    assert_eq!(
        code(
            default
                .list(&ListParams::default().labels("app ~ x"))
                .await
                .unwrap_err()
        ),
        400
    );

    let all: Api<ConfigMap> = Api::all(client.clone());
    let everywhere = names(all.list(&ListParams::default().labels("app=etcd")).await.unwrap());
    assert_eq!(everywhere, vec!["default/a", "other/a"]);
    let in_other = names(
        all.list(&ListParams::default().fields("metadata.namespace=other"))
            .await
            .unwrap(),
    );
    assert_eq!(in_other, vec!["other/a"]);

    // Paging: two pages of two, then one; the list is a snapshot taken at the first page.
    let first = all.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(first.items.len(), 2);
    let token = first.metadata.continue_.clone().unwrap();
    assert_eq!(first.metadata.remaining_item_count, Some(2));
    default
        .create(&PostParams::default(), &cm("d", &[]))
        .await
        .unwrap();
    let second = all
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(second.items.len(), 2);
    assert_eq!(second.metadata.resource_version, first.metadata.resource_version);
    assert!(second.metadata.continue_.is_none());
    // A token is good once.
    assert_eq!(
        code(
            all.list(&ListParams::default().limit(2).continue_token(&token))
                .await
                .unwrap_err()
        ),
        410
    );
}

#[tokio::test]
async fn replace_checks_resource_version_and_bumps_generation_only_on_spec_change() {
    let (_server, client) = client();
    let api: Api<EtcdadmCluster> = Api::default_namespaced(client.clone());
    let created = api
        .create(&PostParams::default(), &etcdadm_cluster("e", 3))
        .await
        .unwrap();

    let mut stale = created.clone();
    stale.spec.replicas = Some(5);
    let updated = api.replace("e", &PostParams::default(), &stale).await.unwrap();
    assert_eq!(updated.metadata.generation, Some(2));
    assert_ne!(updated.resource_version(), created.resource_version());
    let err = api
        .replace("e", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert_eq!(reason(err), (409, "Conflict".into()));

    // Custom resources need a resourceVersion on update.
    let mut unconditional = updated.clone();
    unconditional.metadata.resource_version = None;
    assert_eq!(
        code(
            api.replace("e", &PostParams::default(), &unconditional)
                .await
                .unwrap_err()
        ),
        422
    );

    // Metadata-only change: no generation bump. A no-op write keeps the resourceVersion.
    let mut labelled = updated.clone();
    labelled.labels_mut().insert("x".into(), "y".into());
    let labelled = api.replace("e", &PostParams::default(), &labelled).await.unwrap();
    assert_eq!(labelled.metadata.generation, Some(2));
    let same = api.replace("e", &PostParams::default(), &labelled).await.unwrap();
    assert_eq!(same.resource_version(), labelled.resource_version());

    // uid and creationTimestamp are the server's.
    let mut tampered = same.clone();
    tampered.metadata.uid = Some("other".into());
    let kept = api.replace("e", &PostParams::default(), &tampered).await.unwrap();
    assert_eq!(kept.metadata.uid, created.metadata.uid);

    // Replace of something missing is 404; built-ins allow an unconditional replace.
    assert_eq!(
        code(
            api.replace("missing", &PostParams::default(), &etcdadm_cluster("missing", 1))
                .await
                .unwrap_err()
        ),
        404
    );
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    cms.create(&PostParams::default(), &cm("c", &[])).await.unwrap();
    let mut changed = cm("c", &[]);
    changed.data = Some([("k".to_string(), "w".to_string())].into());
    assert_eq!(
        cms.replace("c", &PostParams::default(), &changed)
            .await
            .unwrap()
            .data,
        changed.data
    );
}

#[tokio::test]
async fn patches_merge_json_strategic_and_apply() {
    let (_server, client) = client();
    let api: Api<EtcdadmCluster> = Api::default_namespaced(client.clone());
    let created = api
        .create(&PostParams::default(), &etcdadm_cluster("e", 3))
        .await
        .unwrap();

    let merged = api
        .patch(
            "e",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 5}, "metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap();
    assert_eq!(merged.spec.replicas, Some(5));
    assert_eq!(merged.labels().get("a").map(String::as_str), Some("b"));
    assert_eq!(merged.metadata.generation, Some(2));

    // A resourceVersion in the patch is a precondition.
    let stale = Patch::Merge(
        json!({"metadata": {"resourceVersion": created.resource_version()}, "spec": {"replicas": 1}}),
    );
    assert_eq!(
        code(api.patch("e", &PatchParams::default(), &stale).await.unwrap_err()),
        409
    );

    // JSON patch, with `test`.
    let json_patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/spec/replicas", "value": 5},
        {"op": "replace", "path": "/spec/replicas", "value": 7},
    ]))
    .unwrap();
    let patched = api
        .patch(
            "e",
            &PatchParams::default(),
            &Patch::<()>::Json(json_patch.clone()),
        )
        .await
        .unwrap();
    assert_eq!(patched.spec.replicas, Some(7));
    assert_eq!(
        code(
            api.patch("e", &PatchParams::default(), &Patch::<()>::Json(json_patch))
                .await
                .unwrap_err()
        ),
        422
    );

    // Strategic merge is refused for custom resources, as the real server does.
    let err = api
        .patch(
            "e",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"replicas": 1}})),
        )
        .await
        .unwrap_err();
    assert_eq!(reason(err), (415, "UnsupportedMediaType".into()));
    // ...and served for built-in kinds.
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    cms.create(&PostParams::default(), &cm("c", &[])).await.unwrap();
    let smp = cms
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"finalizers": ["x/y"]}, "data": {"l": "w"}})),
        )
        .await
        .unwrap();
    assert_eq!(smp.data.unwrap().len(), 2);
    assert_eq!(smp.metadata.finalizers, Some(vec!["x/y".to_string()]));

    // Patch of a missing object is 404; an unknown patch type is 415.
    assert_eq!(
        code(
            api.patch("nope", &PatchParams::default(), &Patch::Merge(json!({})))
                .await
                .unwrap_err()
        ),
        404
    );

    // Server-side apply: creates, merges, removes what the manager stops applying, conflicts.
    let applied = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "applied", "labels": {"owner": "one"}},
        "data": {"a": "1", "b": "2"},
    });
    let one = PatchParams::apply("one");
    let created = cms.patch("applied", &one, &Patch::Apply(&applied)).await.unwrap();
    assert_eq!(created.data.as_ref().unwrap().len(), 2);
    cms.patch(
        "applied",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"c": "3"}})),
    )
    .await
    .unwrap();
    let reapplied =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}, "data": {"a": "1"}});
    let after = cms
        .patch("applied", &one, &Patch::Apply(&reapplied))
        .await
        .unwrap();
    let data = after.data.unwrap();
    assert_eq!(
        data.keys().cloned().collect::<Vec<_>>(),
        vec!["a", "c"],
        "b dropped by its applier, c kept"
    );
    assert!(after.metadata.labels.is_none_or(|l| l.is_empty()));
    let rival =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}, "data": {"a": "9"}});
    let err = cms
        .patch("applied", &PatchParams::apply("two"), &Patch::Apply(&rival))
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 409);
            assert!(
                status.message.contains("conflict with \"one\""),
                "{}",
                status.message
            );
        }
        other => panic!("{other:?}"),
    }
    let forced = cms
        .patch(
            "applied",
            &PatchParams::apply("two").force(),
            &Patch::Apply(&rival),
        )
        .await
        .unwrap();
    assert_eq!(forced.data.unwrap().get("a").map(String::as_str), Some("9"));
    // Apply needs a field manager.
    let no_manager = PatchParams::default();
    assert_eq!(
        code(
            cms.patch("applied", &no_manager, &Patch::Apply(&rival))
                .await
                .unwrap_err()
        ),
        400
    );
}

#[tokio::test]
async fn status_subresource_separates_spec_and_status_writes() {
    let (_server, client) = client();
    let api: Api<EtcdadmCluster> = Api::default_namespaced(client.clone());
    api.create(&PostParams::default(), &etcdadm_cluster("e", 3))
        .await
        .unwrap();

    // A main write carrying status: status ignored.
    let ignored = api
        .patch(
            "e",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"ready": true}, "spec": {"replicas": 5}})),
        )
        .await
        .unwrap();
    assert_eq!(ignored.spec.replicas, Some(5));
    assert!(ignored.status.as_ref().is_none_or(|s| !s.ready));

    // A status write carrying spec: spec ignored, generation unchanged.
    let status = api
        .patch_status(
            "e",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"ready": true, "readyReplicas": 1}, "spec": {"replicas": 1}})),
        )
        .await
        .unwrap();
    assert!(status.status.as_ref().unwrap().ready);
    assert_eq!(status.spec.replicas, Some(5));
    assert_eq!(status.metadata.generation, ignored.metadata.generation);
    let mut replaced = status.clone();
    replaced.status.as_mut().unwrap().endpoints = "https://127.0.0.1:2379".into();
    let replaced = api
        .replace_status("e", &PostParams::default(), &replaced)
        .await
        .unwrap();
    assert_eq!(replaced.status.unwrap().endpoints, "https://127.0.0.1:2379");
    assert!(api.get_status("e").await.unwrap().status.unwrap().ready);

    // Status apply by a named manager, as controllers do.
    let applied = api
        .patch_status(
            "e",
            &PatchParams::apply("etcdadm-controller").force(),
            &Patch::Apply(
                json!({"apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
                "status": {"initialized": true}}),
            ),
        )
        .await
        .unwrap();
    assert!(applied.status.unwrap().initialized);

    // The CAPI kinds shipped by the server have status subresources too.
    let machines: Api<Machine> = Api::default_namespaced(client.clone());
    let machine: Machine = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "metadata": {"name": "m"},
        "spec": {"clusterName": "c", "bootstrap": {}, "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "SimMachine", "name": "m"}},
    }))
    .unwrap();
    machines.create(&PostParams::default(), &machine).await.unwrap();
    let with_addr = machines
        .patch_status(
            "m",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"addresses": [{"type": "InternalIP", "address": "127.0.1.1"}]}})),
        )
        .await
        .unwrap();
    assert_eq!(with_addr.etcd_address(), Some("127.0.1.1"));
    // Unknown subresource: 404; status of a kind without it: 404.
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    cms.create(&PostParams::default(), &cm("c", &[])).await.unwrap();
    assert_eq!(code(cms.get_status("c").await.unwrap_err()), 404);
}

#[tokio::test]
async fn scale_subresource_maps_replicas() {
    let (_server, client) = client();
    let api: Api<EtcdadmCluster> = Api::default_namespaced(client.clone());
    api.create(&PostParams::default(), &etcdadm_cluster("e", 3))
        .await
        .unwrap();
    api.patch_status(
        "e",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"readyReplicas": 2, "selector": "a=b"}})),
    )
    .await
    .unwrap();
    let scale = api.get_scale("e").await.unwrap();
    assert_eq!(scale.spec.as_ref().unwrap().replicas, Some(3));
    assert_eq!(scale.status.as_ref().unwrap().replicas, 2);
    assert_eq!(scale.status.as_ref().unwrap().selector.as_deref(), Some("a=b"));

    let mut five = scale.clone();
    five.spec.as_mut().unwrap().replicas = Some(5);
    let five = api
        .replace_scale("e", &PostParams::default(), &five)
        .await
        .unwrap();
    assert_eq!(five.spec.unwrap().replicas, Some(5));
    let obj = api.get("e").await.unwrap();
    assert_eq!(obj.spec.replicas, Some(5));
    assert_eq!(obj.metadata.generation, Some(2));
    // Stale Scale: 409.
    assert_eq!(
        code(
            api.replace_scale("e", &PostParams::default(), &scale)
                .await
                .unwrap_err()
        ),
        409
    );
    let patched = api
        .patch_scale(
            "e",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.spec.unwrap().replicas, Some(1));
    assert_eq!(api.get("e").await.unwrap().spec.replicas, Some(1));
    let negative = api
        .patch_scale(
            "e",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": -1}})),
        )
        .await;
    assert_eq!(code(negative.unwrap_err()), 422);
    // Kinds without a scale subresource: 404.
    let kcps: Api<KubeadmControlPlane> = Api::default_namespaced(client);
    assert_eq!(code(kcps.get_scale("x").await.unwrap_err()), 404);
}

#[tokio::test]
async fn delete_honours_finalizers_preconditions_and_policies() {
    let (_server, client) = client();
    let api: Api<EtcdadmCluster> = Api::default_namespaced(client.clone());
    let mut guarded = etcdadm_cluster("e", 3);
    guarded.metadata.finalizers = Some(vec!["etcdcluster.cluster.x-k8s.io".into()]);
    let created = api.create(&PostParams::default(), &guarded).await.unwrap();
    let deleting = api
        .delete("e", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert!(deleting.metadata.deletion_timestamp.is_some());
    assert_eq!(deleting.metadata.deletion_grace_period_seconds, Some(0));
    assert_eq!(deleting.metadata.generation, Some(2));
    // Still there; no new finalizers may be added now.
    let still = api.get("e").await.unwrap();
    let add = Patch::Merge(json!({"metadata": {"finalizers": ["etcdcluster.cluster.x-k8s.io", "other"]}}));
    assert_eq!(
        code(api.patch("e", &PatchParams::default(), &add).await.unwrap_err()),
        422
    );
    // Removing the finalizer completes the deletion.
    let remove = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    api.patch("e", &PatchParams::default(), &remove).await.unwrap();
    assert!(api.get_opt("e").await.unwrap().is_none());
    assert_eq!(still.metadata.uid, created.metadata.uid);
    assert_eq!(
        code(api.delete("e", &DeleteParams::default()).await.unwrap_err()),
        404
    );

    // Preconditions.
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    cms.create(&PostParams::default(), &cm("c", &[])).await.unwrap();
    let wrong = DeleteParams::default().preconditions(Preconditions {
        uid: Some("nope".into()),
        resource_version: None,
    });
    assert_eq!(code(cms.delete("c", &wrong).await.unwrap_err()), 409);
    // Foreground is not implemented: refused, not pretended.
    assert_eq!(
        code(cms.delete("c", &DeleteParams::foreground()).await.unwrap_err()),
        422
    );
    cms.delete("c", &DeleteParams::background()).await.unwrap();
    assert!(cms.get_opt("c").await.unwrap().is_none());
}

fn owned_by(name: &str, owner: &ConfigMap) -> ConfigMap {
    let mut child = cm(name, &[]);
    child.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: owner.name_any(),
            uid: owner.uid().unwrap(),
            ..Default::default()
        },
    ]);
    child
}

#[tokio::test]
async fn owner_deletion_cascades_in_background_and_orphan_keeps_dependents() {
    let (_server, client) = client();
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let parent = cms
        .create(&PostParams::default(), &cm("parent", &[]))
        .await
        .unwrap();
    let child = cms
        .create(&PostParams::default(), &owned_by("child", &parent))
        .await
        .unwrap();
    cms.create(&PostParams::default(), &owned_by("grandchild", &child))
        .await
        .unwrap();
    let other = cms
        .create(&PostParams::default(), &cm("other", &[]))
        .await
        .unwrap();
    // Two owners: survives while one remains.
    let mut shared = owned_by("shared", &parent);
    shared
        .metadata
        .owner_references
        .as_mut()
        .unwrap()
        .extend(owned_by("x", &other).metadata.owner_references.unwrap());
    cms.create(&PostParams::default(), &shared).await.unwrap();

    cms.delete("parent", &DeleteParams::default()).await.unwrap();
    eventually("the dependents to be collected", || async {
        cms.get_opt("child").await.unwrap().is_none() && cms.get_opt("grandchild").await.unwrap().is_none()
    })
    .await;
    assert!(cms.get_opt("shared").await.unwrap().is_some());

    // Orphan: the owner goes, the dependent stays without the reference.
    let keeper = cms
        .create(&PostParams::default(), &cm("keeper", &[]))
        .await
        .unwrap();
    cms.create(&PostParams::default(), &owned_by("kept", &keeper))
        .await
        .unwrap();
    cms.delete("keeper", &DeleteParams::orphan()).await.unwrap();
    eventually("the orphaning owner to go", || async {
        cms.get_opt("keeper").await.unwrap().is_none()
    })
    .await;
    let kept = cms.get("kept").await.unwrap();
    assert!(kept.metadata.owner_references.unwrap_or_default().is_empty());
}

#[tokio::test]
async fn namespace_deletion_removes_its_contents() {
    let (_server, client) = client();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "doomed"}})).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(ns.status.unwrap().phase.as_deref(), Some("Active"));
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "doomed");
    cms.create(&PostParams::default(), &cm("c", &[])).await.unwrap();
    let mut held = cm("held", &[]);
    held.metadata.finalizers = Some(vec!["test/hold".into()]);
    cms.create(&PostParams::default(), &held).await.unwrap();
    namespaces
        .delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    let terminating = namespaces.get("doomed").await.unwrap();
    assert_eq!(terminating.status.unwrap().phase.as_deref(), Some("Terminating"));
    assert_eq!(
        code(
            cms.create(&PostParams::default(), &cm("late", &[]))
                .await
                .unwrap_err()
        ),
        403
    );
    eventually("the contents to be deleted", || async {
        cms.get_opt("c").await.unwrap().is_none()
    })
    .await;
    assert!(
        namespaces.get_opt("doomed").await.unwrap().is_some(),
        "held by a finalizer of its content"
    );
    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    eventually("the namespace to go", || async {
        namespaces.get_opt("doomed").await.unwrap().is_none()
    })
    .await;
}

#[tokio::test]
async fn secrets_leases_capi_kinds_and_dynamic_objects() {
    let (_server, client) = client();
    let secrets: Api<Secret> = Api::default_namespaced(client.clone());
    let secret: Secret =
        serde_json::from_value(json!({"metadata": {"name": "s"}, "stringData": {"tls.key": "abc"}})).unwrap();
    let stored = secrets.create(&PostParams::default(), &secret).await.unwrap();
    assert_eq!(stored.data.unwrap().get("tls.key").unwrap().0, b"abc");
    assert!(stored.string_data.is_none());

    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let lease: Lease = serde_json::from_value(json!({"metadata": {"name": "leader"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}}))
    .unwrap();
    let mut held = leases.create(&PostParams::default(), &lease).await.unwrap();
    held.spec.as_mut().unwrap().holder_identity = Some("b".into());
    let taken = leases
        .replace("leader", &PostParams::default(), &held)
        .await
        .unwrap();
    assert_eq!(taken.spec.unwrap().holder_identity.as_deref(), Some("b"));
    // A second contender with the old version loses.
    assert_eq!(
        code(
            leases
                .replace("leader", &PostParams::default(), &held)
                .await
                .unwrap_err()
        ),
        409
    );

    let clusters: Api<Cluster> = Api::default_namespaced(client.clone());
    let cluster: Cluster = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "metadata": {"name": "c"},
        "spec": {"managedExternalEtcdRef": {"apiGroup": "etcdcluster.cluster.x-k8s.io", "kind": "EtcdadmCluster", "name": "e"},
            "topology": {"kept": "verbatim"}},
    }))
    .unwrap();
    let created = clusters.create(&PostParams::default(), &cluster).await.unwrap();
    assert_eq!(
        created.spec.rest.get("topology"),
        Some(&json!({"kept": "verbatim"}))
    );
    let kcps: Api<KubeadmControlPlane> = Api::default_namespaced(client.clone());
    let kcp: KubeadmControlPlane = serde_json::from_value(json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2", "kind": "KubeadmControlPlane",
        "metadata": {"name": "k"}, "spec": {"replicas": 1, "version": "v1.33.0"}}))
    .unwrap();
    kcps.create(&PostParams::default(), &kcp).await.unwrap();

    let sim_machine = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "infrastructure.cluster.x-k8s.io",
        "v1beta2",
        "SimMachine",
    ));
    let machines: Api<DynamicObject> = Api::default_namespaced_with(client.clone(), &sim_machine);
    let obj = DynamicObject::new("m1", &sim_machine).data(json!({"spec": {"anything": ["goes"]}}));
    machines.create(&PostParams::default(), &obj).await.unwrap();
    let back = machines.get("m1").await.unwrap();
    assert_eq!(back.data["spec"]["anything"], json!(["goes"]));
    assert_eq!(back.metadata.generation, Some(1));

    // Events through kube's recorder (events.k8s.io/v1).
    let recorder = kube::runtime::events::Recorder::new(client.clone(), "test-controller".into());
    recorder
        .publish(
            &kube::runtime::events::Event {
                type_: kube::runtime::events::EventType::Normal,
                reason: "Tested".into(),
                note: Some("hello".into()),
                action: "Test".into(),
                secondary: None,
            },
            &created.object_ref(&()),
        )
        .await
        .unwrap();
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::default_namespaced(client);
    let listed = events.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].reason.as_deref(), Some("Tested"));
    let _ = Value::Null;
}
