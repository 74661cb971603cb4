//! Why: the rotation's decisions take plain values (`RotationView`); this is where they are made
//! from the observation: once per observation from what was read (which Machines a roll
//! outdates is known before the plan is asked), and at plan time with what only the health
//! check tells (which CA signed each member, whether the cluster is settled).

use std::collections::BTreeMap;

use kube::ResourceExt;

use etcdadm_shared::api::Format;
use etcdadm_shared::api::cluster::other_operation;
use etcdadm_shared::contract::ca::Ca;
use etcdadm_shared::error::Error;
use etcdadm_shared::names;

use super::view::{self, KnownCas};
use super::{Bundle, NextCa, Phase, RotationStep, RotationView, decide, new_member_bundle, phase, words};
use crate::controller::decision::{ConcernView, Decision};
use crate::controller::observation::clock::UnhealthyClock;
use crate::controller::observation::{KcpView, Observation, Reads, is_ready};

/// What the rotation sees at one moment, from what was read.
#[derive(Clone, Debug, Default)]
pub struct RotationSeen {
    /// None: there is no usable current CA (nothing to rotate). Its `settled`, `busy` and each
    /// member's `signed_by` are filled at plan time (`RotationSeen::at`).
    pub view: Option<RotationView>,
    /// The next CA, when `<cluster>-managed-etcd-next` holds a usable one.
    pub next_ca: Option<Ca>,
    /// The version of `<cluster>-managed-etcd` read: the adoption writes over exactly it.
    pub current_version: Option<String>,
    /// Machines the roll under way replaces, each with why.
    pub outdated: BTreeMap<String, String>,
}

impl ConcernView for RotationSeen {
    /// Everything it reads is read with the CA (`observation::ca_secrets`): the health check
    /// needs the next CA first.
    type Read = ();

    async fn read(_: &kube::Client, _: &str, _: &etcdadm_shared::api::EtcdadmCluster) -> Result<(), Error> {
        Ok(())
    }

    fn view(_: &(), reads: &Reads, _: &UnhealthyClock) -> Self {
        seen(reads).unwrap_or_default()
    }

    /// A Machine whose `ca.crt` is not the roll's target is outdated.
    fn outdates(&self, machine: &str) -> Option<String> {
        self.outdated.get(machine).cloned()
    }
}

/// The rotation's view from what was read, None without a usable current CA.
fn seen(reads: &Reads) -> Option<RotationSeen> {
    let current = reads.ca.ca()?;
    let current_fp = current.fingerprint().ok()?;
    let secrets = &reads.ca_secrets;
    let (next, next_ca) = view::next_ca(secrets.next.as_ref(), &reads.namespace);
    let next_ca = next_ca.map(Ca::new);
    let cas = KnownCas {
        current,
        next: next_ca.as_deref(),
    };
    let members = reads
        .machines
        .iter()
        // A Machine on its way out whose config is gone says nothing of its `ca.crt`.
        .filter(|m| !(m.read.deleting && m.config.is_none()))
        .map(|m| {
            let annotations = m.config.as_ref().map(|_| {
                m.ca_bundle
                    .iter()
                    .map(|b| (names::CA_BUNDLE_ANNOTATION.to_string(), b.clone()))
                    .collect::<BTreeMap<_, _>>()
            });
            view::member(&m.read.name, annotations.as_ref(), None, cas, &current_fp)
        })
        .collect();
    let e = &reads.etcd_cluster;
    let control_plane = match &reads.kcp {
        KcpView::Found {
            name,
            local_etcd: false,
            rollout_after,
            rollout_complete,
            ..
        } if e.status.as_ref().is_some_and(|s| s.creation_complete) => Some(view::control_plane(
            name,
            *rollout_after,
            *rollout_complete,
            secrets.kcp_etcd_ca.as_ref(),
            secrets.apiserver_client.as_ref(),
            cas,
        )),
        _ => None,
    };
    let v = RotationView {
        request: e.annotations().get(names::ROTATE_CA_ANNOTATION).cloned(),
        current: current_fp,
        rotated_for: secrets
            .current
            .as_ref()
            .and_then(|m| m.annotations.as_ref())
            .and_then(|a| a.get(names::CA_ROTATED_FOR_ANNOTATION))
            .filter(|r| !r.is_empty())
            .cloned(),
        next,
        members,
        control_plane,
        // Filled at plan time; a roll's targets do not depend on them.
        settled: true,
        busy: None,
        bottlerocket: e.spec.etcdadm_config_spec.format() == Format::Bottlerocket,
    };
    let outdated = match decide(&v) {
        Some(Decision::Do(RotationStep::Roll { phase, outdated, .. })) => outdated
            .into_iter()
            .map(|m| (m, words::outdated_reason(phase)))
            .collect(),
        _ => BTreeMap::new(),
    };
    Some(RotationSeen {
        view: Some(v),
        next_ca,
        current_version: secrets.current.as_ref().and_then(|m| m.resource_version.clone()),
        outdated,
    })
}

impl RotationSeen {
    /// The rotation's view now: what was read, with which CA signed each member (by the
    /// certificate it presented this round), whether the cluster is settled, and what else is
    /// under way.
    pub fn at(&self, o: &Observation) -> Option<RotationView> {
        let mut v = self.view.clone()?;
        let current = o.ca.ca()?;
        let cas = KnownCas {
            current,
            next: self.next_ca.as_deref(),
        };
        let rotating = !matches!(v.next, NextCa::Missing);
        for member in &mut v.members {
            member.signed_by = o
                .member_of(&member.machine)
                .and_then(|m| m.server_certificate.as_deref())
                .filter(|_| rotating)
                .and_then(|der| cas.signer_of(der));
        }
        v.settled = is_ready(o) && o.machines.iter().all(|m| !m.deleting) && o.leftovers.is_empty();
        v.busy = other_operation(&o.etcd_cluster.rotation_facts());
        Some(v)
    }
}

/// The rotation's view now, when there is a current CA.
pub fn rotation(o: &Observation) -> Option<RotationView> {
    o.view::<RotationSeen>().at(o)
}

/// The `ca-bundle` annotation a Machine created now gets: the target of the roll under way
/// (None: the current CA alone).
pub fn new_member_annotation(o: &Observation) -> Option<String> {
    let v = rotation(o)?;
    new_member_bundle(&v).map(|Bundle(fingerprints)| fingerprints.join(","))
}

/// The CA the API server's client certificate is issued from now: the next CA from the
/// ControlPlane phase on (every member trusts it by then, and members of the last roll trust
/// nothing else), the current one otherwise.
pub fn client_issuer(o: &Observation) -> Option<Ca> {
    let seen = o.view::<RotationSeen>();
    let current = o.ca.ca()?.clone();
    let Some(v) = seen.view.as_ref() else {
        return Some(current);
    };
    match &seen.next_ca {
        Some(next) if phase(v) >= Phase::ControlPlane => Some(next.clone()),
        _ => Some(current),
    }
}

#[cfg(test)]
mod tests;
