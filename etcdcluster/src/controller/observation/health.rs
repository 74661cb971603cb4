//! Health of every member, checked over mutual TLS with bounded concurrency, turned into the
//! observation's `EtcdView`; plus the in-memory client certificate and per-member clients it
//! uses (and the membership changes after it).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use tracing::debug;

use etcdadm_shared::api::MemberStatus as StoredMember;
use etcdadm_shared::error::Error;
use etcdadm_shared::etcd::{EtcdError, EtcdTls, HashKv, Health, Member, MemberClient, MemberStatus};
use etcdadm_shared::names;
use etcdadm_shared::pki::CertificateAuthority;

use super::clock::UnhealthyClock;
use super::machine_for_member;
use super::read::Reads;
use super::views::{Alarm, AlarmKind, Checked, EtcdView, MachineView, MemberView};
use crate::metrics::EtcdClusterMetrics;

mod full;

/// The metric etcd publishes the backend quota it runs with as (from 3.4).
pub const QUOTA_METRIC: &str = "etcd_server_quota_backend_bytes";
/// Members probed at the same time, per cluster.
pub const PROBE_CONCURRENCY: usize = 8;
/// Lifetime of the controller's own client certificate.
pub const CLIENT_CERT_VALIDITY: Duration = Duration::from_secs(2 * 3600);
/// The certificate is replaced once less than this is left.
pub const CLIENT_CERT_RENEW_BEFORE: Duration = Duration::from_secs(30 * 60);
/// Common name of the controller's client certificate.
pub const CLIENT_CERT_COMMON_NAME: &str = "etcdadm-controller";

/// A member client for one URL, or why there is none.
pub type UrlClient = (String, Result<Arc<MemberClient>, EtcdError>);

/// The controller's client identity per etcd cluster (certificate minted from the CA, TLS
/// settings with its session cache), kept across reconciles so it is minted and parsed once.
/// Member clients, and so their connections, last one reconcile: a steady controller holds no
/// connection between health checks, and reconnecting resumes the TLS session.
#[derive(Default)]
pub struct EtcdClients {
    clusters: Mutex<HashMap<String, ClusterIdentity>>,
}

struct ClusterIdentity {
    /// The certificates of the CAs it was minted from, concatenated.
    ca_pem: String,
    tls: Arc<rustls::ClientConfig>,
    not_after: SystemTime,
}

impl EtcdClients {
    pub fn new() -> Self {
        Self::default()
    }

    /// Clients for `urls` of the cluster `key` (`<namespace>/<cluster>`), minting or renewing the
    /// client certificate from `cas` as needed: one CA, or both CAs of a rotation, each trusted
    /// and each issuing an identity (`EtcdTls::issued_by_each`).
    pub fn clients(
        &self,
        key: &str,
        cas: &[&CertificateAuthority],
        urls: &[String],
        timeout: Duration,
    ) -> Result<Vec<UrlClient>, Error> {
        let tls = self.identity(key, cas)?;
        Ok(urls
            .iter()
            .map(|url| {
                let client = MemberClient::with_config(url, tls.clone(), timeout).map(Arc::new);
                (url.clone(), client)
            })
            .collect())
    }

    fn identity(&self, key: &str, cas: &[&CertificateAuthority]) -> Result<Arc<rustls::ClientConfig>, Error> {
        let ca_pem: String = cas.iter().map(|ca| ca.cert_pem()).collect();
        let mut clusters = self
            .clusters
            .lock()
            .map_err(|_| Error::Internal("the etcd client cache was poisoned by a panic".into()))?;
        let now = SystemTime::now();
        if let Some(known) = clusters.get(key)
            && known.ca_pem == ca_pem
            && known.not_after > now + CLIENT_CERT_RENEW_BEFORE
        {
            return Ok(known.tls.clone());
        }
        let tls = EtcdTls::issued_by_each(cas, CLIENT_CERT_COMMON_NAME, CLIENT_CERT_VALIDITY)?;
        debug!(cluster = key, "minted the controller's etcd client certificate");
        clusters.insert(
            key.to_string(),
            ClusterIdentity {
                ca_pem,
                tls: tls.clone(),
                not_after: now + CLIENT_CERT_VALIDITY,
            },
        );
        Ok(tls)
    }

    /// A client of the member at `url` of the cluster `key`, with the identity this round's
    /// health check minted or found: a membership change follows the check that planned it.
    pub fn client(&self, key: &str, url: &str, timeout: Duration) -> Result<Arc<MemberClient>, Error> {
        let tls = self
            .clusters
            .lock()
            .map_err(|_| Error::Internal("the etcd client cache was poisoned by a panic".into()))?
            .get(key)
            .map(|known| known.tls.clone())
            .ok_or_else(|| {
                Error::Internal(format!(
                    "no etcd client identity for {key}: a membership change was planned without a health check"
                ))
            })?;
        Ok(Arc::new(MemberClient::with_config(url, tls, timeout)?))
    }

    /// Drop everything kept for `key` (the cluster is gone).
    pub fn forget(&self, key: &str) {
        if let Ok(mut clusters) = self.clusters.lock() {
            clusters.remove(key);
        }
    }
}

/// What one member said (or why it said nothing).
#[derive(Debug)]
pub struct Probe {
    pub client_url: String,
    client: Option<Arc<MemberClient>>,
    /// `/health` verdict; `Err` when there was no answer at all.
    pub health: Result<Health, String>,
    pub status: Result<MemberStatus, String>,
    /// `notAfter` of the server certificate the member presented in the handshake.
    pub certificate_expiry: Option<SystemTime>,
    /// That certificate (DER).
    pub server_certificate: Option<Vec<u8>>,
    /// Whether its history before its revision is compacted, asked only while NOSPACE is raised
    /// (the repair compacts first; [`full`]).
    pub history_compacted: Option<bool>,
    /// The backend quota it runs with as it publishes it on `/metrics`, read only while NOSPACE
    /// is raised and its Status does not say (etcd before 3.6; [`full`]).
    pub quota_published: Option<u64>,
    /// etcd's hash of its store at the cluster's common revision, asked only while CORRUPT is
    /// raised (`hash_all`).
    pub hash: Option<HashKv>,
}

impl Probe {
    /// Healthy: `/health` answered 200 + true and Status answered.
    pub fn healthy(&self) -> bool {
        matches!(&self.health, Ok(h) if h.healthy) && self.status.is_ok()
    }

    fn answered(&self) -> bool {
        self.health.is_ok() || self.status.is_ok()
    }

    /// Why the member is not healthy.
    pub fn problem(&self) -> Option<String> {
        match (&self.health, &self.status) {
            (Err(e), _) => Some(e.clone()),
            (Ok(h), _) if !h.healthy => {
                Some(h.reason.clone().unwrap_or_else(|| "/health is not true".into()))
            }
            (Ok(_), Err(e)) => Some(e.clone()),
            (Ok(_), Ok(_)) => None,
        }
    }
}

async fn probe(url: String, client: Result<Arc<MemberClient>, EtcdError>) -> Probe {
    match client {
        Err(e) => Probe {
            client_url: url,
            client: None,
            health: Err(e.to_string()),
            status: Err(e.to_string()),
            certificate_expiry: None,
            server_certificate: None,
            history_compacted: None,
            quota_published: None,
            hash: None,
        },
        Ok(client) => {
            let (health, status) = tokio::join!(client.health(), client.status());
            Probe {
                client_url: url,
                health: health.map_err(|e| e.to_string()),
                status: status.map_err(|e| e.to_string()),
                certificate_expiry: client.server_certificate_expiry(),
                server_certificate: client.server_certificate(),
                client: Some(client),
                history_compacted: None,
                quota_published: None,
                hash: None,
            }
        }
    }
}

/// While CORRUPT is raised, every probed member's hash of its store at the lowest revision any
/// healthy member reports (served by each member alone, without quorum): etcd's own evidence of
/// which members hold the same data.
async fn hash_all(probes: &mut BTreeMap<String, Probe>) {
    let Some(common) = probes
        .values()
        .filter(|p| p.healthy())
        .filter_map(|p| p.status.as_ref().ok().map(|s| s.revision))
        .filter(|r| *r > 0)
        .min()
    else {
        return;
    };
    let asked: Vec<(String, Arc<MemberClient>)> = probes
        .values()
        .filter(|p| p.healthy())
        .filter_map(|p| Some((p.client_url.clone(), p.client.clone()?)))
        .collect();
    let hashes: Vec<(String, Result<HashKv, EtcdError>)> = futures::stream::iter(asked)
        .map(|(url, client)| async move { (url, client.hash_kv(common).await) })
        .buffer_unordered(PROBE_CONCURRENCY)
        .collect()
        .await;
    for (url, hash) in hashes {
        match hash {
            Ok(hash) => {
                if let Some(p) = probes.get_mut(&url) {
                    p.hash = Some(hash);
                }
            }
            Err(e) => debug!(url = %url, error = %e, "HashKV failed"),
        }
    }
}

/// Probe every URL, at most [`PROBE_CONCURRENCY`] at a time.
pub async fn probe_all(clients: Vec<UrlClient>) -> Vec<Probe> {
    futures::stream::iter(clients)
        .map(|(url, client)| probe(url, client))
        .buffer_unordered(PROBE_CONCURRENCY)
        .collect()
        .await
}

/// Inputs of one health check of one etcd cluster.
pub struct CheckInput<'a> {
    /// `<namespace>/<cluster>`: the cache key.
    pub key: &'a str,
    /// The CAs the controller's client trusts and carries an identity from.
    pub cas: &'a [&'a CertificateAuthority],
    pub machines: &'a [MachineView],
    /// `status.members` as stored: who was ever healthy, and since when who is not.
    pub previous: &'a [StoredMember],
    pub clock: &'a UnhealthyClock,
    pub timeout: Duration,
}

/// The etcd side of `reads` at `now`: every member checked (none without a usable CA), timed
/// and measured into `metrics`.
pub async fn check_observed(
    clients: &EtcdClients,
    metrics: Option<&EtcdClusterMetrics>,
    reads: &Reads,
    now: Timestamp,
) -> Result<Checked, Error> {
    let Some(ca) = reads.ca.ca() else {
        return Ok(Checked::nothing(EtcdView::NotChecked));
    };
    let key = format!("{}/{}", reads.namespace, reads.etcd_cluster.name_any());
    let cas = reads.ca_secrets.client_cas(ca);
    let clock = reads.clock(now);
    let machines = reads.machine_views(&clock);
    let input = CheckInput {
        key: &key,
        cas: &cas,
        machines: &machines,
        previous: reads.stored_members(),
        clock: &clock,
        timeout: reads.etcd_cluster.spec.health_settings().timeout,
    };
    let started = std::time::Instant::now();
    let checked = check(clients, &input).await;
    if let Some(m) = metrics {
        let (ns, name) = (reads.namespace.as_str(), reads.etcd_cluster.name_any());
        m.observe_health_check(ns, &name, started.elapsed());
        if let Ok(Checked {
            view: EtcdView::Members(members),
            ..
        }) = &checked
        {
            for member in members {
                if let Some(bytes) = member.db_size.and_then(|b| u64::try_from(b).ok()) {
                    let in_use = member.db_size_in_use.and_then(|b| u64::try_from(b).ok());
                    m.observe_db_size(ns, &name, &member.name, bytes, in_use, member.quota());
                }
            }
        }
    }
    checked
}

/// Check every member: `/health` and Status per member, the member list from a healthy one,
/// alarms; members are matched to Machines by name and peer URL.
pub async fn check(clients: &EtcdClients, input: &CheckInput<'_>) -> Result<Checked, Error> {
    let mut urls: Vec<String> = input
        .machines
        .iter()
        .filter_map(|m| m.address.as_deref())
        .map(names::client_url)
        .collect();
    urls.sort();
    urls.dedup();
    if urls.is_empty() {
        return Ok(Checked::nothing(EtcdView::NotChecked));
    }
    let mut probes: BTreeMap<String, Probe> =
        probe_all(clients.clients(input.key, input.cas, &urls, input.timeout)?)
            .await
            .into_iter()
            .map(|p| (p.client_url.clone(), p))
            .collect();

    let Some((members, alarms)) = member_list(&probes).await else {
        let summary: Vec<String> = probes
            .values()
            .map(|p| {
                format!(
                    "{}: {}",
                    p.client_url,
                    p.problem().unwrap_or_else(|| "no member list".into())
                )
            })
            .collect();
        return Ok(Checked::nothing(EtcdView::Unreachable {
            message: summary.join("; "),
        }));
    };

    probe_strangers(clients, input, &urls, &members, &mut probes).await?;
    full::read_all(&mut probes, &alarms).await;
    if alarms.iter().any(|a| a.kind == AlarmKind::Corrupt) {
        hash_all(&mut probes).await;
    }
    let leader = probes
        .values()
        .filter(|p| p.healthy())
        .chain(probes.values())
        .find_map(|p| p.status.as_ref().ok().and_then(|s| s.leader_id));
    let views = members
        .iter()
        .map(|member| {
            let machine = machine_for_member(&member.name, &member.peer_urls, input.machines);
            let url = machine
                .and_then(|name| input.machines.iter().find(|m| m.name == name))
                .and_then(|m| m.address.as_deref())
                .map(names::client_url)
                .or_else(|| member.client_urls.first().cloned());
            let probe = url.as_ref().and_then(|u| probes.get(u));
            member_view(member, machine, probe, leader, &alarms, input)
        })
        .collect();
    Ok(Checked {
        view: EtcdView::Members(views),
        alarms,
    })
}

/// Members on no Machine are probed too, through the client URL they advertise.
async fn probe_strangers(
    clients: &EtcdClients,
    input: &CheckInput<'_>,
    urls: &[String],
    members: &[Member],
    probes: &mut BTreeMap<String, Probe>,
) -> Result<(), Error> {
    let extra: Vec<String> = members
        .iter()
        .filter(|m| machine_for_member(&m.name, &m.peer_urls, input.machines).is_none())
        .filter_map(|m| m.client_urls.first().cloned())
        .filter(|url| !probes.contains_key(url))
        .collect();
    if extra.is_empty() {
        return Ok(());
    }
    let mut all = urls.to_vec();
    all.extend(extra.iter().cloned());
    let clients: Vec<_> = clients
        .clients(input.key, input.cas, &all, input.timeout)?
        .into_iter()
        .filter(|(url, _)| extra.contains(url))
        .collect();
    for p in probe_all(clients).await {
        probes.insert(p.client_url.clone(), p);
    }
    Ok(())
}

/// The member list and alarms, from a healthy member if any, else from any that answered.
async fn member_list(probes: &BTreeMap<String, Probe>) -> Option<(Vec<Member>, Vec<Alarm>)> {
    let candidates = probes
        .values()
        .filter(|p| p.healthy())
        .chain(probes.values().filter(|p| !p.healthy() && p.answered()));
    for p in candidates {
        let Some(client) = &p.client else { continue };
        match client.member_list().await {
            Ok(members) => {
                let alarms = match client.alarms().await {
                    Ok(alarms) => alarms,
                    Err(e) => {
                        debug!(url = %p.client_url, error = %e, "reading alarms failed");
                        Vec::new()
                    }
                };
                return Some((members, alarms));
            }
            Err(e) => debug!(url = %p.client_url, error = %e, "member list failed"),
        }
    }
    None
}

fn member_view(
    member: &Member,
    machine: Option<&str>,
    probe: Option<&Probe>,
    leader: Option<u64>,
    alarms: &[Alarm],
    input: &CheckInput<'_>,
) -> MemberView {
    let member_alarms: Vec<String> = alarms
        .iter()
        .filter(|a| a.member_id == member.id)
        .map(|a| a.kind.as_str().to_string())
        .collect();
    let (healthy, message) = match probe {
        None if !member.is_started() => (false, Some("added, not started yet".to_string())),
        None => (false, Some("no client URL to check".to_string())),
        Some(p) if serves_despite_alarms(p, alarms) => (true, None),
        Some(p) => match p.problem() {
            Some(problem) => (false, Some(problem)),
            None => (true, None),
        },
    };
    let id_hex = etcdadm_shared::etcd::member_id_hex(member.id);
    let stored = input
        .previous
        .iter()
        .find(|s| s.member_id.as_deref() == Some(id_hex.as_str()));
    let ever_healthy = healthy
        || input.previous.iter().any(|s| {
            s.last_healthy_time.is_some()
                && (s.member_id.as_deref() == Some(id_hex.as_str())
                    || machine.is_some_and(|name| s.name == name))
        });
    let status = probe.and_then(|p| p.status.as_ref().ok());
    let machine_view = machine.and_then(|name| input.machines.iter().find(|m| m.name == name));
    let mut view = MemberView {
        id: member.id,
        name: member.name.clone(),
        peer_urls: member.peer_urls.clone(),
        client_urls: member.client_urls.clone(),
        is_learner: member.is_learner,
        healthy,
        ever_healthy,
        is_leader: leader == Some(member.id),
        message,
        machine: machine.map(String::from),
        alarms: member_alarms,
        quota_backend_bytes: probe
            .and_then(|p| p.quota_published)
            .or_else(|| machine_view.and_then(|m| m.quota_backend_bytes)),
        quota_reported: probe.is_some_and(|p| p.quota_published.is_some()),
        hash: probe.and_then(|p| p.hash),
        history_compacted: probe.and_then(|p| p.history_compacted),
        defragmented_at: stored
            .and_then(|s| s.last_defragmentation.as_ref())
            .map(|d| d.revision),
        last_defragmentation: stored.and_then(|s| s.last_defragmentation.clone()),
        unhealthy_for: input.clock.unhealthy_for(stored),
        certificate_expiry: probe
            .and_then(|p| p.certificate_expiry)
            .and_then(|t| Timestamp::try_from(t).ok()),
        server_certificate: probe.and_then(|p| p.server_certificate.clone()),
        ..MemberView::default()
    };
    if let Some(status) = status {
        view.read_status(status);
    }
    view
}

/// A member whose `/health` failed only for an alarm serves (see
/// [`Health::serves_despite_alarms`](etcdadm_shared::etcd::Health::serves_despite_alarms)).
fn serves_despite_alarms(probe: &Probe, alarms: &[Alarm]) -> bool {
    let follows_leader = matches!(&probe.status, Ok(s) if s.leader_id.is_some());
    matches!(&probe.health, Ok(h) if h.serves_despite_alarms(!alarms.is_empty(), follows_leader))
}
