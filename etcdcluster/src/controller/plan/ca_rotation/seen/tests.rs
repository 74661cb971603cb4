//! The rotation as the plan asks it: from what was read to the step, the Machines it outdates,
//! the bundle a new Machine gets, the client certificate's issuer and `status.caRotation`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use std::collections::BTreeMap;
use std::sync::OnceLock;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

use etcdadm_shared::contract::bytes;
use etcdadm_shared::names;
use etcdadm_shared::pki::{CertificateAuthority, LeafRequest, certificates_der};

use super::*;
use crate::controller::decision::EventNote;
use crate::controller::observation::ca_secrets::CaSecrets;
use crate::controller::observation::read::MachineRecord;
use crate::controller::observation::{EtcdView, UnhealthyClock};
use crate::controller::plan::machines::MachineStep;
use crate::controller::plan::{Step, plan};
use crate::controller::status::next_status;
use crate::controller::testing::*;

fn next() -> &'static CertificateAuthority {
    static NEXT: OnceLock<CertificateAuthority> = OnceLock::new();
    NEXT.get_or_init(|| CertificateAuthority::generate("etcd-ca-next").unwrap())
}

fn fingerprints() -> (String, String) {
    (test_ca().fingerprint().unwrap(), next().fingerprint().unwrap())
}

/// The next CA's Secret, as a rotation for request `r1` makes it.
fn next_secret() -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(names::next_ca_secret_name("c1")),
            annotations: Some(BTreeMap::from([(
                names::CA_ROTATED_FOR_ANNOTATION.to_string(),
                "r1".to_string(),
            )])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            (names::TLS_CERT_KEY.to_string(), bytes(next().cert_pem())),
            (names::TLS_KEY_KEY.to_string(), bytes(next().key_pem())),
        ])),
        ..Default::default()
    }
}

/// `o` asked to rotate (`rotate-ca: r1`), the next CA made when `made`, each Machine's config
/// naming the bundle of its rank (None: no annotation), seen as the observation sees it: the
/// view kept and the Machines it outdates marked.
fn rotating(mut o: Observation, made: bool, ranks: &[Option<u8>]) -> Observation {
    o.etcd_cluster
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(names::ROTATE_CA_ANNOTATION.into(), "r1".into());
    let (old, new) = fingerprints();
    let reads = Reads {
        cluster: o.cluster.clone(),
        ca: o.ca.clone(),
        ca_secrets: CaSecrets {
            current: Some(ObjectMeta {
                resource_version: Some("7".into()),
                ..Default::default()
            }),
            next: made.then(next_secret),
            ..Default::default()
        },
        machines: o
            .machines
            .iter()
            .zip(ranks)
            .map(|(m, rank)| MachineRecord {
                read: m.clone(),
                config: Some(Default::default()),
                ca_bundle: rank.map(|r| Bundle::of_rank(r, &old, &new).0.join(",")),
                ..Default::default()
            })
            .collect(),
        kcp: o.kcp.clone(),
        ..reads_of(o.etcd_cluster.clone(), &o.namespace)
    };
    let seen = RotationSeen::view(&(), &reads, &UnhealthyClock::new(&[], Timestamp::now()));
    for machine in &mut o.machines {
        machine.outdated = seen.outdates(&machine.name);
    }
    o.views.insert::<RotationSeen, _>(seen);
    o
}

#[test]
fn a_request_on_a_ready_cluster_generates_the_next_ca_and_waits_while_a_recovery_is_asked() {
    let o = rotating(running(3), false, &[None, None, None]);
    assert_eq!(
        plan(&o),
        Step::CaRotation(RotationStep::CreateNextCa { request: "r1".into() })
    );
    assert!(o.machines.iter().all(|m| m.outdated.is_none()));
    let mut recovering = running(3);
    recovering
        .etcd_cluster
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(names::RECOVER_ANNOTATION.into(), "m0".into());
    let held = plan(&rotating(recovering, false, &[None, None, None]));
    assert_eq!(wait_reason(&held), super::super::reason::CA_ROTATION_WAITING);
    assert!(wait_message(&held).contains("recovery"), "{held:?}");
}

#[test]
fn each_roll_outdates_the_members_below_its_target_and_new_machines_get_the_target() {
    let (old, new) = fingerprints();
    for (ranks, phase, target) in [
        ([None, None, None], "Trusting", 1),
        ([Some(1), Some(1), Some(2)], "Signing", 2),
        ([Some(2), Some(3), Some(3)], "Dropping", 3),
    ] {
        let o = rotating(running(3), true, &ranks);
        let outdated: Vec<&str> = o.machines.iter().filter_map(|m| m.outdated.as_deref()).collect();
        let expected = ranks.iter().filter(|r| r.unwrap_or(0) < target).count();
        assert_eq!(outdated.len(), expected, "{phase}: {outdated:?}");
        assert!(
            outdated
                .iter()
                .all(|why| why.starts_with(&format!("CA rotation, phase {phase}"))),
            "{outdated:?}"
        );
        // The rolling replacement adds a Machine first, made with the target bundle.
        let Step::Machines(MachineStep::CreateMachine { template, .. }) = plan(&o) else {
            panic!("{phase}: {:?}", plan(&o))
        };
        assert_eq!(
            template.ca_bundle,
            Some(Bundle::of_rank(target, &old, &new).0.join(",")),
            "{phase}"
        );
    }
}

#[test]
fn members_two_phases_apart_are_refused_and_nothing_is_outdated() {
    let o = rotating(running(3), true, &[None, Some(2), Some(2)]);
    assert!(o.machines.iter().all(|m| m.outdated.is_none()));
    let step = plan(&o);
    let hold = step.hold().expect("held");
    assert_eq!(hold.reason, super::super::reason::CA_ROTATION_REFUSED);
    assert!(step.is_refusal());
}

#[test]
fn the_client_certificate_is_issued_from_the_next_ca_once_the_control_plane_phase_begins() {
    let mut cp = running(3);
    cp.creation_complete = true;
    cp.etcd_cluster.status = Some(etcdadm_shared::api::EtcdadmClusterStatus {
        creation_complete: true,
        ..Default::default()
    });
    cp.kcp = kcp(
        &[
            "https://10.0.0.1:2379",
            "https://10.0.0.2:2379",
            "https://10.0.0.3:2379",
        ],
        false,
        true,
    );
    let trusting = rotating(cp.clone(), true, &[None, None, None]);
    assert_eq!(client_issuer(&trusting).unwrap(), test_ca());
    let handing = rotating(cp, true, &[Some(1), Some(1), Some(1)]);
    assert_eq!(phase(&rotation(&handing).unwrap()), Phase::ControlPlane);
    assert_eq!(
        client_issuer(&handing).unwrap().fingerprint().unwrap(),
        next().fingerprint().unwrap()
    );
    let step = plan(&handing);
    assert!(
        matches!(
            step,
            Step::CaRotation(RotationStep::HandControlPlane {
                reissue_client: true,
                ..
            })
        ),
        "{step:?}"
    );
    // Without a rotation: the current CA.
    assert_eq!(client_issuer(&running(3)).unwrap(), test_ca());
}

#[test]
fn status_says_the_phase_who_signed_each_member_and_what_is_left_with_an_event_per_phase() {
    let mut o = running(3);
    let EtcdView::Members(members) = &mut o.etcd else {
        panic!()
    };
    for (i, member) in members.iter_mut().enumerate() {
        let signer: &CertificateAuthority = if i == 2 { next() } else { &test_ca() };
        let leaf = signer
            .issue(&LeafRequest::member(&member.name, vec![], vec![]))
            .unwrap();
        member.server_certificate = Some(certificates_der(&leaf.cert_pem).unwrap().remove(0));
    }
    let o = rotating(o, true, &[Some(1), Some(1), Some(2)]);
    let now = Time(Timestamp::now());
    let (status, events) = next_status(&o.etcd_cluster, &o, &plan(&o), &now);
    let rotation = status.ca_rotation.clone().expect("status.caRotation");
    assert_eq!(rotation.phase, "Signing");
    assert_eq!(rotation.request.as_deref(), Some("r1"));
    let signers: Vec<(&str, &str)> = rotation
        .members
        .iter()
        .map(|m| (m.machine.as_str(), m.signed_by.as_str()))
        .collect();
    assert_eq!(
        signers,
        [
            ("c1-etcd-m0", "current"),
            ("c1-etcd-m1", "current"),
            ("c1-etcd-m2", "next")
        ]
    );
    assert_eq!(rotation.remaining, ["Dropping", "Finishing"]);
    let phase_events: Vec<&EventNote> = events
        .iter()
        .filter(|e| e.reason == "CARotationSigning")
        .collect();
    assert_eq!(phase_events.len(), 1, "{events:?}");
    // Recorded: the same phase again leaves no second Event.
    let mut again = o.clone();
    again.etcd_cluster.status = Some(status);
    let (_, events) = next_status(&again.etcd_cluster, &again, &plan(&again), &now);
    assert!(
        !events.iter().any(|e| e.reason.starts_with("CARotation")),
        "{events:?}"
    );
    // No rotation: no status.caRotation.
    let (idle, _) = next_status(&again.etcd_cluster, &running(3), &Step::Steady, &now);
    assert_eq!(idle.ca_rotation, None);
}
