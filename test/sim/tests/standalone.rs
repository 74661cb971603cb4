#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! End to end without an EtcdadmCluster: the real bootstrap controller binary, the CAPI stand-in
//! and three process machines form one etcd cluster through `etcdadm init` and two joins, with
//! the member certificate validity the plane was told to give them.

use std::time::{Duration, SystemTime};

use etcdadm_shared::api::EtcdadmConfig;
use etcdadm_shared::names;
use etcdadm_shared::pki::cert_not_after;
use etcdadm_shared::testing::TempDir;
use etcdadm_sim::demo;
use etcdadm_sim::history::{RECORD_EVERY, Recorder};
use etcdadm_sim::plane::{DEFAULT_KCP_ROLLOUT_STEP, Plane, PlaneOptions};
use kube::api::Api;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_machines_form_one_cluster_through_init_and_joins() {
    let work = TempDir::new("sim-standalone");
    let plane = Plane::start(PlaneOptions {
        work_dir: work.path().to_path_buf(),
        ip_prefix: [127, 0, 2],
        kubeconfig: std::env::var_os("SIM_KUBECONFIG").map(Into::into),
        machine_runtime: None,
        controllers: vec!["etcdadm-bootstrap"],
        kcp_rollout_step: DEFAULT_KCP_ROLLOUT_STEP,
        namespace: format!("sim-standalone-{}", std::process::id()),
        ..Default::default()
    })
    .await
    .unwrap();
    let client = plane.client.clone();
    // Every machine the plane boots from now on gets member certificates valid 20 days.
    let twenty_days = Duration::from_secs(20 * 24 * 3600);
    plane.set_member_certificate_validity(Some(twenty_days));
    demo::create_standalone_cluster(&client, client.default_namespace(), "c1", 3, None)
        .await
        .unwrap();

    // Record membership from etcd as soon as the CA exists.
    let tls = loop {
        if let Some(tls) = demo::etcd_tls(&client, client.default_namespace(), "c1")
            .await
            .unwrap()
        {
            break tls;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let urls: Vec<String> = (2..=10).map(|n| format!("https://127.0.2.{n}:2379")).collect();
    let recorder = Recorder::start(tls.clone(), move || urls.clone(), RECORD_EVERY);

    let ready = demo::wait_for_members(&client, "c1", 3, Duration::from_secs(240)).await;
    let history = recorder.finish();
    let log = std::fs::read_to_string(work.path().join("etcdadm-bootstrap.log")).unwrap_or_default();
    let urls = ready.unwrap_or_else(|e| panic!("{e}\nbootstrap controller log:\n{log}"));
    assert_eq!(urls.len(), 3);

    let rows = demo::member_table(&urls, &tls).await;
    assert!(
        rows.iter().all(|r| r.healthy),
        "unhealthy member: {:?}",
        rows.iter().map(|r| &r.url).collect::<Vec<_>>()
    );
    assert_eq!(rows.iter().filter(|r| r.leader).count(), 1);
    let mut member_names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
    member_names.sort();
    assert_eq!(
        member_names,
        ["c1-etcd-0", "c1-etcd-1", "c1-etcd-2"],
        "members are named after their Machines"
    );

    // etcd never held a member that is not one of the three Machines.
    assert_eq!(history.max_size(), 3, "{history:?}");
    assert_eq!(history.last().map(|s| s.members.len()), Some(3));

    // Exactly one Machine initialized (the lock holder); the init Secret names it.
    let init = Api::<k8s_openapi::api::core::v1::Secret>::default_namespaced(client.clone())
        .get(&names::init_secret_name("c1"))
        .await
        .unwrap();
    let address = String::from_utf8(init.data.unwrap()[names::INIT_ADDRESS_KEY].0.clone()).unwrap();
    assert!(address.starts_with("127.0.2."), "{address}");
    let mut inits = 0;
    for config in Api::<EtcdadmConfig>::default_namespaced(client.clone())
        .list(&Default::default())
        .await
        .unwrap()
    {
        assert!(config.status.as_ref().is_some_and(|s| s.ready));
        let secret = Api::<k8s_openapi::api::core::v1::Secret>::default_namespaced(client.clone())
            .get(&kube::ResourceExt::name_any(&config))
            .await
            .unwrap();
        let user_data =
            String::from_utf8(secret.data.unwrap()[names::DATA_SECRET_VALUE_KEY].0.clone()).unwrap();
        if user_data.contains("etcdadm init") {
            inits += 1;
        } else {
            assert!(
                user_data.contains(&format!("etcdadm join https://{address}:2379")),
                "{user_data}"
            );
        }
    }
    assert_eq!(inits, 1);

    for name in member_names {
        let pem = std::fs::read_to_string(
            work.path()
                .join(format!("machines/{name}/etc/etcd/pki/server.crt")),
        )
        .unwrap();
        let left = cert_not_after(&pem)
            .unwrap()
            .duration_since(SystemTime::now())
            .unwrap();
        assert!(
            left <= twenty_days && left > twenty_days - Duration::from_secs(3600),
            "{name}: {left:?}"
        );
    }
    drop(plane);
}
