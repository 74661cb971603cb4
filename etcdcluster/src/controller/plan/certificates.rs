//! Certificate lifecycle (SPEC-day2.md section 1): a member whose server certificate expires
//! within `rolloutBefore.certificatesExpiryDays` is outdated, so the rolling replacement renews
//! it under every rule of a rollout; the API server client certificate is re-issued in the same
//! window and then owed one control plane rollout; and which certificates are inside their
//! warning window.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::observed::{EtcdView, KcpView, MachineView, Observed, is_ready};
use super::step::Step;

/// The CA is never replaced: its warning starts this long before it expires.
const CA_WARNING: Duration = Duration::from_secs(365 * 86_400);

/// What is known of the certificates' expiry, and the time it is judged at.
#[derive(Clone, Debug, PartialEq)]
pub struct CertificateView {
    pub now: Timestamp,
    /// `rolloutBefore.certificatesExpiryDays`, defaulted.
    pub renew_before: Duration,
    /// `notAfter` of the CA in `<cluster>-managed-etcd`.
    pub ca_expiry: Option<Timestamp>,
    /// `notAfter` of the certificate in `<cluster>-apiserver-etcd-client`.
    pub apiserver_client_expiry: Option<Timestamp>,
    /// When this controller last re-issued it (the Secret's annotation).
    pub apiserver_client_renewed: Option<Timestamp>,
}

impl Default for CertificateView {
    fn default() -> Self {
        CertificateView {
            now: Timestamp::UNIX_EPOCH,
            renew_before: etcdadm_shared::api::EtcdadmClusterSpec::default().certificates_renew_before(),
            ca_expiry: None,
            apiserver_client_expiry: None,
            apiserver_client_renewed: None,
        }
    }
}

/// The kinds of certificate the controller watches, as the metric and the condition name them.
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

/// Whether `expiry` falls before `now + window` (an expired one does too).
fn inside(expiry: Timestamp, now: Timestamp, window: Duration) -> bool {
    let window = SignedDuration::try_from(window).unwrap_or(SignedDuration::MAX);
    now.checked_add(window).is_ok_and(|edge| expiry < edge)
}

/// Why a member must be replaced for its certificate, if it must (unknown expiry: never).
fn renewal_reason(expiry: Option<Timestamp>, now: Timestamp, renew_before: Duration) -> Option<String> {
    let expiry = expiry?;
    inside(expiry, now, renew_before).then(|| format!("certificate expires {expiry}"))
}

/// Add the certificate rule to each Machine's outdated reasons: a member whose server
/// certificate expires within the window is rolled like any other outdated member.
pub fn outdate_expiring(machines: &mut [MachineView], etcd: &EtcdView, certificates: &CertificateView) {
    let EtcdView::Members(members) = etcd else {
        return;
    };
    for machine in machines.iter_mut() {
        let expiry = members
            .iter()
            .find(|m| m.machine.as_deref() == Some(machine.name.as_str()))
            .and_then(|m| m.certificate_expiry);
        if let Some(why) = renewal_reason(expiry, certificates.now, certificates.renew_before) {
            machine.outdated = Some(match machine.outdated.take() {
                Some(other) => format!("{other}; {why}"),
                None => why,
            });
        }
    }
}

/// The API server client certificate, only while etcd is Ready and the control plane uses it:
/// a rollout still owed for the last re-issue (its time is later than the KCP's rollout time,
/// which survives any restart) comes first, then a re-issue inside the window.
pub(super) fn client_renewal(o: &Observed) -> Option<Step> {
    let KcpView::Found {
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
        return Some(Step::RequestControlPlaneRollout { after: renewed });
    }
    let expiry = c.apiserver_client_expiry?;
    inside(expiry, c.now, c.renew_before).then_some(Step::RenewApiserverClientCertificate { expiry })
}

/// Every certificate inside its window, soonest first: members and the API server client
/// certificate within `renewBefore`, the CA within a year.
pub fn expiring(o: &Observed, ca_secret: &str, client_secret: &str) -> Vec<Expiring> {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::super::testing::*;
    use super::super::*;
    use super::*;

    const DAY: i64 = 86_400;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    /// Three healthy members, the first one's certificate expiring at `expiry`, the others in a
    /// year; judged at day 1000 with the default 30-day window.
    fn with_first_expiring(expiry: Option<Timestamp>) -> Observed {
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
            Step::CreateMachine {
                purpose: Growth::Rollout,
                ..
            }
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
            matches!(&step, Step::DeleteMachine { machine, purpose: Removal::Remediation { .. }, .. } if machine == "c1-etcd-m0"),
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
    fn with_client_certificate(expiry: i64, renewed: Option<i64>, rollout_after: Option<i64>) -> Observed {
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
            Step::RenewApiserverClientCertificate {
                expiry: at(now + 30 * DAY - 1)
            }
        );
        // Never while etcd is not Ready.
        let mut sick = o.clone();
        members_mut(&mut sick)[1] = unhealthy(members_mut(&mut sick)[1].clone(), "down");
        assert!(!matches!(
            plan(&sick),
            Step::RenewApiserverClientCertificate { .. }
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
            Step::RequestControlPlaneRollout { after: at(renewed) }
        );
        let older = with_client_certificate(now + 365 * DAY, Some(renewed), Some(now - 50 * DAY));
        assert_eq!(
            plan(&older),
            Step::RequestControlPlaneRollout { after: at(renewed) }
        );
        // Asked (or the user asked for a later one): nothing more.
        for after in [renewed, renewed + 1] {
            let done = with_client_certificate(now + 365 * DAY, Some(renewed), Some(after));
            assert_eq!(plan(&done), Step::Steady, "{after}");
        }
        // The owed rollout waits for Ready too.
        let mut sick = owed.clone();
        members_mut(&mut sick)[0] = unhealthy(members_mut(&mut sick)[0].clone(), "down");
        assert!(!matches!(plan(&sick), Step::RequestControlPlaneRollout { .. }));
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
