//! The CA rotation's writes against the in-memory API server: created beside, never over;
//! written once over exactly the version read; each repeatable.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use super::*;
use crate::controller::plan::ca_rotation::NextCa;
use crate::controller::plan::ca_rotation::view::{self, KnownCas};
use etcdadm_shared::contract::ca::ca_from_secret;
use etcdadm_shared::contract::secret_text;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;
use kube::api::PostParams;

const NS: &str = "default";

fn cluster() -> ClusterRef {
    ClusterRef {
        name: "c1".into(),
        namespace: NS.into(),
        owner: OwnerReference {
            api_version: "cluster.x-k8s.io/v1beta2".into(),
            kind: "Cluster".into(),
            name: "c1".into(),
            uid: "uid-c1".into(),
            controller: Some(true),
            ..Default::default()
        },
    }
}

async fn put(client: &Client, name: &str, data: &[(&str, &str)]) -> Secret {
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(data.iter().map(|(k, v)| (k.to_string(), bytes(v))).collect()),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap()
}

async fn get(client: &Client, name: &str) -> Option<Secret> {
    Api::<Secret>::namespaced(client.clone(), NS)
        .get_opt(name)
        .await
        .unwrap()
}

fn ca_pair(ca: &CertificateAuthority) -> [(&'static str, &str); 2] {
    [
        (names::TLS_CERT_KEY, ca.cert_pem()),
        (names::TLS_KEY_KEY, ca.key_pem()),
    ]
}

#[tokio::test]
async fn the_next_ca_is_created_beside_the_current_one_and_never_replaced() {
    let (_server, client) = etcdadm_sim_apiserver::fake_client().unwrap();
    let current = CertificateAuthority::generate("etcd-ca").unwrap();
    put(&client, "c1-managed-etcd", &ca_pair(&current)).await;
    assert!(create_next_ca(&client, &cluster(), "r1").await.unwrap());
    let next = get(&client, "c1-managed-etcd-next").await.unwrap();
    let (seen, ca) = view::next_ca(Some(&next), NS);
    let NextCa::Present { fingerprint, request } = seen else {
        panic!("{seen:?}")
    };
    assert_eq!(request, "r1");
    assert_ne!(fingerprint, current.fingerprint().unwrap());
    // Usable, and named apart from the current CA, so a client of both can tell them apart.
    let ca = ca.unwrap();
    assert!(ca.cert_pem() != current.cert_pem());
    let issued = ca.issue(&LeafRequest::apiserver_etcd_client("c1")).unwrap();
    assert!(!current.signed(&etcdadm_shared::pki::certificates_der(&issued.cert_pem).unwrap()[0]));
    assert_eq!(next.owner_references()[0].uid, "uid-c1");
    assert_eq!(next.labels()[names::CLUSTER_NAME_LABEL], "c1");
    // A second request while the first rotation is under way: nothing is replaced.
    assert!(!create_next_ca(&client, &cluster(), "r2").await.unwrap());
    let again = get(&client, "c1-managed-etcd-next").await.unwrap();
    assert_eq!(
        secret_text(&again, names::TLS_CERT_KEY),
        secret_text(&next, names::TLS_CERT_KEY)
    );
    assert_eq!(view::rotated_for(&again).as_deref(), Some("r1"));
    // The current CA is untouched.
    let kept = get(&client, "c1-managed-etcd").await.unwrap();
    assert_eq!(
        secret_text(&kept, names::TLS_CERT_KEY).as_deref(),
        Some(current.cert_pem())
    );
}

#[tokio::test]
async fn the_control_plane_is_handed_both_cas_and_a_client_certificate_from_the_next() {
    let (_server, client) = etcdadm_sim_apiserver::fake_client().unwrap();
    let old = CertificateAuthority::generate("etcd-ca").unwrap();
    let new = CertificateAuthority::generate("etcd-ca-2").unwrap();
    let leaf = old.issue(&LeafRequest::apiserver_etcd_client("c1")).unwrap();
    put(&client, "c1-etcd", &[(names::TLS_CERT_KEY, old.cert_pem())]).await;
    put(
        &client,
        "c1-apiserver-etcd-client",
        &[
            (names::TLS_CERT_KEY, &leaf.cert_pem),
            (names::TLS_KEY_KEY, &leaf.key_pem),
        ],
    )
    .await;
    let known = KnownCas {
        current: &old,
        next: Some(&new),
    };
    let read = |client: Client| async move {
        view::control_plane(
            "cp",
            None,
            true,
            get(&client, "c1-etcd").await.as_ref(),
            get(&client, "c1-apiserver-etcd-client").await.as_ref(),
            known,
        )
    };
    let before = read(client.clone()).await;
    assert_eq!(before.trusted, [old.fingerprint().unwrap()]);
    assert_eq!(before.client_signed_by, Some(old.fingerprint().unwrap()));
    hand_control_plane(&client, NS, "c1", &[&old, &new], Some(&new))
        .await
        .unwrap();
    let after = read(client.clone()).await;
    assert_eq!(
        after.trusted,
        [old.fingerprint().unwrap(), new.fingerprint().unwrap()]
    );
    assert_eq!(after.client_signed_by, Some(new.fingerprint().unwrap()));
    assert!(after.client_reissued.is_some());
    // Again, the trust alone: the client certificate is kept.
    let client_pem = secret_text(
        &get(&client, "c1-apiserver-etcd-client").await.unwrap(),
        names::TLS_CERT_KEY,
    );
    hand_control_plane(&client, NS, "c1", &[&old, &new], None)
        .await
        .unwrap();
    assert_eq!(
        secret_text(
            &get(&client, "c1-apiserver-etcd-client").await.unwrap(),
            names::TLS_CERT_KEY
        ),
        client_pem
    );
}

#[tokio::test]
async fn the_next_ca_is_adopted_over_exactly_the_version_read_then_the_old_one_forgotten() {
    let (_server, client) = etcdadm_sim_apiserver::fake_client().unwrap();
    let old = CertificateAuthority::generate("etcd-ca").unwrap();
    let new = CertificateAuthority::generate("etcd-ca-2").unwrap();
    let current = put(&client, "c1-managed-etcd", &ca_pair(&old)).await;
    put(&client, "c1-managed-etcd-next", &ca_pair(&new)).await;
    put(&client, "c1-etcd", &[(names::TLS_CERT_KEY, old.cert_pem())]).await;
    let version = current.resource_version().unwrap();
    // Someone changed the Secret since it was read: the write fails, nothing changes.
    let mut changed = current.clone();
    changed.annotations_mut().insert("touched".into(), "yes".into());
    let changed = Api::<Secret>::namespaced(client.clone(), NS)
        .replace("c1-managed-etcd", &PostParams::default(), &changed)
        .await
        .unwrap();
    assert!(
        adopt_next_ca(&client, NS, "c1", &version, &new, "r1")
            .await
            .is_err()
    );
    let kept = get(&client, "c1-managed-etcd").await.unwrap();
    assert_eq!(
        ca_from_secret(&kept, NS, "c1-managed-etcd")
            .unwrap()
            .fingerprint()
            .unwrap(),
        old.fingerprint().unwrap()
    );
    // Over the version read: the new CA, marked with its request.
    adopt_next_ca(
        &client,
        NS,
        "c1",
        &changed.resource_version().unwrap(),
        &new,
        "r1",
    )
    .await
    .unwrap();
    let adopted = get(&client, "c1-managed-etcd").await.unwrap();
    assert_eq!(
        ca_from_secret(&adopted, NS, "c1-managed-etcd")
            .unwrap()
            .fingerprint()
            .unwrap(),
        new.fingerprint().unwrap()
    );
    assert_eq!(view::rotated_for(&adopted).as_deref(), Some("r1"));
    // Then the control plane trusts the new CA alone and the next CA's Secret goes; twice.
    for _ in 0..2 {
        forget_old_ca(&client, NS, "c1", Some(&new)).await.unwrap();
        assert!(get(&client, "c1-managed-etcd-next").await.is_none());
        let trust = get(&client, "c1-etcd").await.unwrap();
        assert_eq!(
            secret_text(&trust, names::TLS_CERT_KEY).as_deref(),
            Some(new.cert_pem())
        );
    }
}
