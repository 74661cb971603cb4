//! Certificate lifecycle (docs/day2.md, "Certificates"): members whose server certificate
//! expires within `rolloutBefore.certificatesExpiryDays` are outdated (`observation::outdated`),
//! so the rolling replacement renews them; the API server client certificate is re-issued in
//! the same window and then owed one control plane rollout; and which certificates are inside
//! their warning window, for the status.

use crate::controller::decision::ConcernMetrics;
use etcdadm_shared::api::EtcdadmClusterStatus;
use etcdadm_shared::manager::Metrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use std::sync::atomic::AtomicU64;
use std::time::SystemTime;

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tracing::warn;

use etcdadm_shared::api::MemberStatus;
use etcdadm_shared::api::cluster::CertificatesStatus;
use etcdadm_shared::api::cluster::condition::{CERTIFICATES_AVAILABLE, CERTIFICATES_EXPIRING};
use etcdadm_shared::api::conditions::{self, NewCondition, Severity};
use etcdadm_shared::contract::bytes;
use etcdadm_shared::contract::ca::Ca;
use etcdadm_shared::error::Error;
use etcdadm_shared::names;
use etcdadm_shared::pki::LeafRequest;

use super::ca_rotation::seen::client_issuer;
use super::secrets::reason::CA_CORRUPT;
use crate::controller::decision::{
    After, Applied, ConcernStep, Decision, EventNote, FIELD_MANAGER, Outputs, StatusPart,
};
use crate::controller::observation::outdated::inside;
use crate::controller::observation::{CaView, ClusterView, KcpView, Observation, is_ready};

/// Condition reasons of certificate renewal.
pub mod reason {
    pub const RENEWING_CERTIFICATES: &str = "RenewingCertificates";
}

/// The CA is replaced only by a rotation someone asks for: its warning starts this long before it
/// expires.
const CA_WARNING: Duration = Duration::from_secs(365 * 86_400);
/// The apply site of the control plane rollout request.
const ROLLOUT_MANAGER: &str = "etcdadm-controller/control-plane-rollout";

/// A step of this concern.
#[derive(Clone, Debug, PartialEq)]
pub enum CertificateStep {
    /// Re-issue `<cluster>-apiserver-etcd-client` from the CA over exactly the version read
    /// (the old one, expiring at `expiry`, stays valid until then).
    RenewApiserverClientCertificate {
        cluster: String,
        ca: Ca,
        expiry: Timestamp,
        resource_version: Option<String>,
    },
    /// Ask KubeadmControlPlane `kcp` to replace its Machines created before `after` (the
    /// re-issue time), so the API servers get the new client certificate.
    RequestControlPlaneRollout { kcp: String, after: Timestamp },
}

impl ConcernStep for CertificateStep {
    type View = ();
    type Metrics = CertificateMetrics;

    /// `status.certificates`, `CertificatesAvailable`, and `CertificatesExpiring` with a Warning
    /// Event when it begins warning or names other certificates.
    fn status(part: &mut StatusPart<'_>, _: Option<&Self>) {
        part.status.certificates = Some(status(part.o, &part.status.members));
        part.set_condition(available_condition(part.o));
        let expiring = expiring_condition(part.o);
        let was_expiring = conditions::find(&part.old.conditions, CERTIFICATES_EXPIRING)
            .filter(|c| c.status == conditions::ConditionStatus::True)
            .and_then(|c| c.message.clone());
        if expiring.status == conditions::ConditionStatus::True
            && was_expiring.as_deref() != Some(expiring.message.as_str())
        {
            part.event(EventNote::warning(
                CERTIFICATES_EXPIRING,
                expiring.message.clone(),
            ));
        }
        part.set_condition(expiring);
    }

    /// The condition reason and message for `Ready` while this step is next.
    fn reason(&self) -> (&'static str, String) {
        match self {
            CertificateStep::RenewApiserverClientCertificate { expiry, .. } => (
                reason::RENEWING_CERTIFICATES,
                format!("re-issuing the API server client certificate, which expires {expiry}"),
            ),
            CertificateStep::RequestControlPlaneRollout { .. } => (
                reason::RENEWING_CERTIFICATES,
                "asking the KubeadmControlPlane for a rollout so its Machines get the re-issued API server client certificate".into(),
            ),
        }
    }

    /// The Event this step leaves once applied.
    fn event(&self, _: &Observation) -> Option<EventNote> {
        let (reason, note) = match self {
            CertificateStep::RenewApiserverClientCertificate { cluster, expiry, .. } => (
                "ApiserverClientCertificateRenewed",
                format!(
                    "re-issued the API server client certificate in Secret {} from the etcd CA (the old one stays valid until {expiry})",
                    names::apiserver_client_secret_name(cluster)
                ),
            ),
            CertificateStep::RequestControlPlaneRollout { kcp, after } => (
                "ControlPlaneRolloutRequested",
                format!(
                    "asked KubeadmControlPlane {kcp} to replace its Machines created before {after}, so they carry the re-issued API server client certificate"
                ),
            ),
        };
        Some(EventNote::normal(reason, note))
    }

    /// Perform the step.
    async fn apply(&self, out: &Outputs<'_>, o: &Observation) -> Result<Applied, Error> {
        match self {
            CertificateStep::RenewApiserverClientCertificate {
                cluster,
                ca,
                resource_version,
                ..
            } => renew_apiserver_client(out, o, cluster, ca, resource_version.as_deref()).await,
            CertificateStep::RequestControlPlaneRollout { kcp, after } => {
                super::control_plane::request_rollout(out, o, kcp, after, ROLLOUT_MANAGER).await
            }
        }
    }

    /// What comes after: the next step may follow at once.
    fn after(&self, _: &Observation) -> After {
        match self {
            CertificateStep::RenewApiserverClientCertificate { .. }
            | CertificateStep::RequestControlPlaneRollout { .. } => After::Again,
        }
    }
}

// Decisions.

/// The API server client certificate, only while etcd is Ready and the control plane uses it:
/// a rollout still owed for the last re-issue (its time is later than the KCP's rollout time,
/// which survives any restart) comes first, then a re-issue inside the window, from the CA a
/// rotation says (`ca_rotation::seen::client_issuer`).
pub fn client_renewal(o: &Observation) -> Option<Decision<CertificateStep>> {
    let KcpView::Found {
        name,
        local_etcd: false,
        secrets_present: true,
        rollout_after,
        ..
    } = &o.kcp
    else {
        return None;
    };
    if !is_ready(o) {
        return None;
    }
    let c = &o.certificates;
    if let Some(renewed) = c.apiserver_client_renewed
        && rollout_after.is_none_or(|after| after < renewed)
    {
        return Some(Decision::Do(CertificateStep::RequestControlPlaneRollout {
            kcp: name.clone(),
            after: renewed,
        }));
    }
    let expiry = c.apiserver_client_expiry?;
    // From the next CA once a rotation has handed it to the control plane: a certificate of the
    // old one would be refused by the members of its last roll.
    let (ClusterView::Found { reference, .. }, Some(ca)) = (&o.cluster, client_issuer(o)) else {
        return None;
    };
    inside(expiry, c.now, c.renew_before).then(|| {
        Decision::Do(CertificateStep::RenewApiserverClientCertificate {
            cluster: reference.name.clone(),
            ca,
            expiry,
            resource_version: c.apiserver_client_version.clone(),
        })
    })
}

/// One certificate inside its window.
#[derive(Clone, Debug, PartialEq)]
pub struct Expiring {
    pub kind: CertificateKind,
    /// What holds it: the Secret or the member's Machine.
    pub holder: String,
    pub expiry: Timestamp,
}

impl Expiring {
    pub fn describe(&self) -> String {
        let (holder, expiry) = (&self.holder, self.expiry);
        match self.kind {
            CertificateKind::Ca => format!("the etcd CA in Secret {holder} expires {expiry}"),
            CertificateKind::Member => format!("{holder}: server certificate expires {expiry}"),
            CertificateKind::ApiserverClient => {
                format!("the API server client certificate in Secret {holder} expires {expiry}")
            }
        }
    }
}

/// Every certificate inside its window, soonest first: members and the API server client
/// certificate within `renewBefore`, the CA within a year.
pub fn expiring(o: &Observation, ca_secret: &str, client_secret: &str) -> Vec<Expiring> {
    let c = &o.certificates;
    let mut found: Vec<Expiring> = Vec::new();
    if let Some(expiry) = c.ca_expiry.filter(|e| inside(*e, c.now, CA_WARNING)) {
        found.push(Expiring {
            kind: CertificateKind::Ca,
            holder: ca_secret.to_string(),
            expiry,
        });
    }
    if let Some(expiry) = c
        .apiserver_client_expiry
        .filter(|e| inside(*e, c.now, c.renew_before))
    {
        found.push(Expiring {
            kind: CertificateKind::ApiserverClient,
            holder: client_secret.to_string(),
            expiry,
        });
    }
    for member in o.members() {
        if let Some(expiry) = member
            .certificate_expiry
            .filter(|e| inside(*e, c.now, c.renew_before))
        {
            found.push(Expiring {
                kind: CertificateKind::Member,
                holder: member.describe(),
                expiry,
            });
        }
    }
    found.sort_by_key(|e| e.expiry);
    found
}

// Status.

/// `CertificatesAvailable`: the CA is usable.
pub fn available_condition(o: &Observation) -> NewCondition {
    match &o.ca {
        CaView::Valid(_) => NewCondition::true_(CERTIFICATES_AVAILABLE, "CertificatesAvailable"),
        CaView::Missing => NewCondition::false_(
            CERTIFICATES_AVAILABLE,
            Severity::Info,
            "WaitingForCA",
            "the etcd CA Secret does not exist yet",
        ),
        CaView::Corrupt(problem) => NewCondition::false_(
            CERTIFICATES_AVAILABLE,
            Severity::Error,
            CA_CORRUPT,
            problem.as_str(),
        ),
    }
}

/// `CertificatesExpiring`: True with severity Warning, naming every certificate inside its
/// window (the CA from a year before its expiry: only a rotation replaces it).
pub fn expiring_condition(o: &Observation) -> NewCondition {
    let cluster = o.cluster.name().unwrap_or(o.name.as_str());
    let found = expiring(
        o,
        &names::ca_secret_name(cluster),
        &names::apiserver_client_secret_name(cluster),
    );
    if found.is_empty() {
        return NewCondition::false_(CERTIFICATES_EXPIRING, Severity::Info, "CertificatesValid", "");
    }
    let mut message: Vec<String> = found.iter().map(Expiring::describe).collect();
    if found.iter().any(|e| e.kind == CertificateKind::Ca) {
        message
            .push(format!(
                "the CA is not renewed by itself: rotate it by annotating the EtcdadmCluster {}=<a new value> (docs/operating.md, \"Certificates\")",
                names::ROTATE_CA_ANNOTATION
            ));
    }
    if found.iter().any(|e| e.kind != CertificateKind::Ca) {
        message.push("members and the API server client certificate are renewed before they expire".into());
    }
    NewCondition {
        severity: Some(Severity::Warning),
        ..NewCondition::true_(CERTIFICATES_EXPIRING, CERTIFICATES_EXPIRING)
    }
    .with_message(message.join("; "))
}

/// `status.certificates`: the CA's and the client certificate's expiry, and the soonest of
/// those and the members' (as recorded in `members`).
pub fn status(o: &Observation, members: &[MemberStatus]) -> CertificatesStatus {
    let c = &o.certificates;
    let next = members
        .iter()
        .filter_map(|m| m.certificate_expiry.as_ref().map(|t| t.0))
        .chain(c.ca_expiry)
        .chain(c.apiserver_client_expiry)
        .min();
    CertificatesStatus {
        ca_expiry: c.ca_expiry.map(Time),
        apiserver_client_expiry: c.apiserver_client_expiry.map(Time),
        next_expiry: next.map(Time),
    }
}

// Effects.

/// Re-issue `<cluster>-apiserver-etcd-client` from the CA and note when on it, over exactly the
/// version observed: a concurrent writer makes this fail and the next pass decide again. The old
/// certificate is not revoked; it stays valid until it expires.
async fn renew_apiserver_client(
    out: &Outputs<'_>,
    o: &Observation,
    cluster: &str,
    ca: &Ca,
    resource_version: Option<&str>,
) -> Result<Applied, Error> {
    let leaf = ca.issue(&LeafRequest::apiserver_etcd_client(cluster))?;
    let patch = json!({
        "metadata": {
            "resourceVersion": resource_version,
            "annotations": { names::APISERVER_CLIENT_RENEWED_ANNOTATION: Timestamp::now().to_string() },
        },
        "data": {
            names::TLS_CERT_KEY: bytes(&leaf.cert_pem),
            names::TLS_KEY_KEY: bytes(&leaf.key_pem),
        },
    });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    Api::<Secret>::namespaced(out.client.clone(), &o.namespace)
        .patch(
            &names::apiserver_client_secret_name(cluster),
            &params,
            &Patch::Merge(&patch),
        )
        .await?;
    if std::env::var_os(names::EXIT_AFTER_CLIENT_RENEWAL_ENV).is_some() {
        warn!(
            "{} is set: exiting after the re-issue, as a crash would",
            names::EXIT_AFTER_CLIENT_RENEWAL_ENV
        );
        std::process::exit(3);
    }
    Ok(Applied::Done)
}

// Metrics.

/// The kinds of certificate the controller watches, as the expiry metric and the
/// `CertificatesExpiring` condition name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CertificateKind {
    Ca,
    Member,
    ApiserverClient,
}

impl CertificateKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CertificateKind::Ca => "ca",
            CertificateKind::Member => "member",
            CertificateKind::ApiserverClient => "apiserver-client",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CertificateLabels {
    pub namespace: String,
    pub name: String,
    /// `ca`, `member` (the soonest member's), `apiserver-client`.
    pub kind: String,
}

/// Time left on each kind of certificate.
#[derive(Clone, Debug, Default)]
pub struct CertificateMetrics {
    expiry: Family<CertificateLabels, Gauge<f64, AtomicU64>>,
}

impl ConcernMetrics for CertificateMetrics {
    fn register(&self, registry: &Metrics) {
        registry.register(
            "etcdadm_certificate_expiry_seconds",
            "Seconds until the certificate of each kind expires (ca, member: the soonest member, apiserver-client); negative once expired",
            self.expiry.clone(),
        );
    }

    fn observe(&self, namespace: &str, name: &str, _: &Observation, status: &EtcdadmClusterStatus) {
        self.observe_status(namespace, name, status);
    }
}

impl CertificateMetrics {
    /// The expiry gauges from `status.certificates` and the soonest member's certificate.
    pub fn observe_status(&self, namespace: &str, name: &str, status: &EtcdadmClusterStatus) {
        let certificates = status.certificates.clone().unwrap_or_default();
        let member = status
            .members
            .iter()
            .filter_map(|m| m.certificate_expiry.as_ref())
            .min_by_key(|t| t.0);
        for (kind, expiry) in [
            (CertificateKind::Ca, certificates.ca_expiry.as_ref()),
            (CertificateKind::Member, member),
            (
                CertificateKind::ApiserverClient,
                certificates.apiserver_client_expiry.as_ref(),
            ),
        ] {
            let Some(expiry) = expiry else { continue };
            let labels = CertificateLabels {
                namespace: namespace.into(),
                name: name.into(),
                kind: kind.as_str().into(),
            };
            let left = match SystemTime::from(expiry.0).duration_since(SystemTime::now()) {
                Ok(left) => left.as_secs_f64(),
                Err(past) => -past.duration().as_secs_f64(),
            };
            self.expiry.get_or_create(&labels).set(left);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::controller::testing::*;
    use std::time::Duration;

    use k8s_openapi::jiff::Timestamp;

    use crate::controller::observation::outdated::outdate_expiring;

    const DAY: i64 = 86_400;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    /// Three healthy members, the first one's certificate expiring at `expiry`, the others in a
    /// year; judged at day 1000 with the default 30-day window.
    fn with_first_expiring(expiry: Option<Timestamp>) -> Observation {
        let mut o = running(3);
        let now = at(1000 * DAY);
        o.certificates.now = now;
        for (i, m) in members_mut(&mut o).iter_mut().enumerate() {
            m.certificate_expiry = if i == 0 { expiry } else { Some(at(1365 * DAY)) };
        }
        let certificates = o.certificates.clone();
        outdate_expiring(&mut o.machines, &o.etcd, &certificates);
        o
    }

    #[test]
    fn the_window_edges_decide_which_members_roll() {
        let now = 1000 * DAY;
        let window = 30 * DAY;
        // Just inside: one second less than the window left.
        let o = with_first_expiring(Some(at(now + window - 1)));
        let why = o.machines[0].outdated.clone().unwrap();
        assert!(why.starts_with("certificate expires "), "{why}");
        assert!(why.contains(&at(now + window - 1).to_string()), "{why}");
        assert!(o.machines[1..].iter().all(|m| m.outdated.is_none()));
        assert!(matches!(
            plan(&o),
            Step::Machines(MachineStep::CreateMachine {
                purpose: Growth::Rollout,
                ..
            })
        ));
        // Exactly the window left is outside (KCP: expiry before now + window), and so is more.
        for expiry in [now + window, now + window + 1] {
            let o = with_first_expiring(Some(at(expiry)));
            assert!(o.machines.iter().all(|m| m.outdated.is_none()), "{expiry}");
            assert_eq!(plan(&o), Step::Steady, "{expiry}");
        }
        // Already expired yet still answering (a clock ahead of the member's): rolled too.
        let o = with_first_expiring(Some(at(now - 1)));
        assert!(o.machines[0].outdated.is_some());
        // Unknown expiry (no handshake yet, or the TLS failed): nothing is guessed.
        let o = with_first_expiring(None);
        assert!(o.machines.iter().all(|m| m.outdated.is_none()));
        assert_eq!(plan(&o), Step::Steady);
    }

    #[test]
    fn an_expired_member_fails_its_handshake_and_is_remediated_not_rolled() {
        // Past expiry the member's TLS fails: no expiry is known and it is unhealthy.
        let mut o = with_first_expiring(None);
        members_mut(&mut o)[0] = unhealthy(
            members_mut(&mut o)[0].clone(),
            "TLS: invalid peer certificate: Expired",
        );
        members_mut(&mut o)[0].unhealthy_for = Duration::from_secs(3600);
        o.machines[0].unhealthy_for = Duration::from_secs(3600);
        assert!(o.machines.iter().all(|m| m.outdated.is_none()));
        let step = plan(&o);
        assert!(
            matches!(&step, Step::Machines(MachineStep::DeleteMachine { machine, purpose: Removal::Remediation { .. }, .. }) if machine == "c1-etcd-m0"),
            "{step:?}"
        );
    }

    #[test]
    fn a_renewal_rolls_one_member_at_a_time_and_keeps_other_reasons() {
        let now = 1000 * DAY;
        let mut o = running(3);
        o.certificates.now = at(now);
        o.machines[1].outdated = Some("etcdadmConfigSpec changed (files)".into());
        for m in members_mut(&mut o) {
            m.certificate_expiry = Some(at(now + 2 * DAY));
        }
        let certificates = o.certificates.clone();
        outdate_expiring(&mut o.machines, &o.etcd, &certificates);
        assert_eq!(
            o.machines[1].outdated.as_deref(),
            Some(
                format!(
                    "etcdadmConfigSpec changed (files); certificate expires {}",
                    at(now + 2 * DAY)
                )
                .as_str()
            )
        );
        let mut w = World::new(o);
        w.run();
        assert_eq!(w.max_members, 4, "maxSurge 1 without a KCP: never more than N+1");
        assert!(new_members_only(&w), "{:?}", w.member_names());
    }

    /// Three Ready members under a KCP that uses them, judged at day 1000.
    fn with_client_certificate(expiry: i64, renewed: Option<i64>, rollout_after: Option<i64>) -> Observation {
        let mut o = running(3);
        let urls = voting_endpoints(&o);
        let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
        o.kcp = kcp(&refs, false, true);
        if let KcpView::Found {
            rollout_after: after, ..
        } = &mut o.kcp
        {
            *after = rollout_after.map(at);
        }
        o.creation_complete = true;
        o.certificates.now = at(1000 * DAY);
        o.certificates.apiserver_client_expiry = Some(at(expiry));
        o.certificates.apiserver_client_renewed = renewed.map(at);
        o
    }

    #[test]
    fn the_client_certificate_is_reissued_inside_the_window_then_owes_exactly_one_rollout() {
        let now = 1000 * DAY;
        // Outside the window, never re-issued: nothing.
        assert_eq!(
            plan(&with_client_certificate(now + 30 * DAY, None, None)),
            Step::Steady
        );
        // Just inside: re-issued.
        let o = with_client_certificate(now + 30 * DAY - 1, None, None);
        assert_eq!(
            plan(&o),
            Step::Certificates(CertificateStep::RenewApiserverClientCertificate {
                cluster: "c1".into(),
                ca: test_ca(),
                expiry: at(now + 30 * DAY - 1),
                resource_version: None,
            })
        );
        // Never while etcd is not Ready.
        let mut sick = o.clone();
        members_mut(&mut sick)[1] = unhealthy(members_mut(&mut sick)[1].clone(), "down");
        assert!(!matches!(
            plan(&sick),
            Step::Certificates(CertificateStep::RenewApiserverClientCertificate { .. })
        ));
        // Nor without a control plane that uses it.
        let mut alone = o.clone();
        alone.kcp = KcpView::None;
        assert_eq!(plan(&alone), Step::Steady);
        // Re-issued (now valid a year), the KCP not yet asked: one rollout, at the re-issue
        // time, also after a restart (the state is the Secret's and the KCP's).
        let renewed = now + 10;
        let owed = with_client_certificate(now + 365 * DAY, Some(renewed), None);
        assert_eq!(
            plan(&owed),
            Step::Certificates(CertificateStep::RequestControlPlaneRollout {
                kcp: "c1-cp".into(),
                after: at(renewed)
            })
        );
        let older = with_client_certificate(now + 365 * DAY, Some(renewed), Some(now - 50 * DAY));
        assert_eq!(
            plan(&older),
            Step::Certificates(CertificateStep::RequestControlPlaneRollout {
                kcp: "c1-cp".into(),
                after: at(renewed)
            })
        );
        // Asked (or the user asked for a later one): nothing more.
        for after in [renewed, renewed + 1] {
            let done = with_client_certificate(now + 365 * DAY, Some(renewed), Some(after));
            assert_eq!(plan(&done), Step::Steady, "{after}");
        }
        // The owed rollout waits for Ready too.
        let mut sick = owed.clone();
        members_mut(&mut sick)[0] = unhealthy(members_mut(&mut sick)[0].clone(), "down");
        assert!(!matches!(
            plan(&sick),
            Step::Certificates(CertificateStep::RequestControlPlaneRollout { .. })
        ));
    }

    #[test]
    fn the_ca_warns_a_year_ahead_the_others_within_the_window() {
        let now = 1000 * DAY;
        let mut o = running(1);
        o.certificates.now = at(now);
        o.certificates.ca_expiry = Some(at(now + 366 * DAY));
        o.certificates.apiserver_client_expiry = Some(at(now + 31 * DAY));
        members_mut(&mut o)[0].certificate_expiry = Some(at(now + 300 * DAY));
        assert!(expiring(&o, "c1-managed-etcd", "c1-apiserver-etcd-client").is_empty());
        o.certificates.ca_expiry = Some(at(now + 364 * DAY));
        o.certificates.apiserver_client_expiry = Some(at(now + 29 * DAY));
        members_mut(&mut o)[0].certificate_expiry = Some(at(now + 3 * DAY));
        let found = expiring(&o, "c1-managed-etcd", "c1-apiserver-etcd-client");
        let kinds: Vec<&str> = found.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(kinds, ["member", "apiserver-client", "ca"]);
        assert_eq!(
            found[0].describe(),
            format!(
                "member of Machine c1-etcd-m0: server certificate expires {}",
                at(now + 3 * DAY)
            )
        );
    }
}
