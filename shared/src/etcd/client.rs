//! A client bound to exactly one member: etcd's gRPC clients balance over endpoints, which would
//! blur whose status or health we are looking at.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use etcd_client::{AlarmAction, AlarmOptions, AlarmType, CompactionOptions, GetOptions, MemberAddOptions};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::OnceCell;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tonic::transport::{Channel, Endpoint, Uri};
use tower::Service;

use super::error::{EtcdError, Refusal, from_client_error, from_transport};
use super::health::{Health, health_from_response};
use super::member::{Alarm, AlarmKind, Member, MemberStatus};
use crate::pki::{CertificateAuthority, LeafRequest, PkiError};

/// PEM material for mutual TLS with etcd: the CA that signed the members' serving certificates,
/// and the client certificate and key to present.
#[derive(Clone)]
pub struct EtcdTls {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl EtcdTls {
    /// A short-lived in-memory client identity issued by `ca`, trusting only `ca`: how a
    /// controller, test or tool talks to members whose CA it holds.
    pub fn issued_by(
        ca: &CertificateAuthority,
        common_name: &str,
        validity: Duration,
    ) -> Result<Self, PkiError> {
        let leaf = ca.issue(&LeafRequest::in_memory_client(common_name, validity))?;
        Ok(EtcdTls {
            ca_pem: ca.cert_pem().to_string(),
            cert_pem: leaf.cert_pem,
            key_pem: leaf.key_pem,
        })
    }
}

impl EtcdTls {
    /// The TLS settings (as [`EtcdTls::client_config`] makes them) for talking to members that
    /// may be signed by, and trust, any of `cas` (a CA rotation, docs/security.md): every CA is
    /// trusted, and a short-lived identity issued by each is presented to the members that
    /// accept its CA. One CA gives exactly what [`EtcdTls::issued_by`] does.
    pub fn issued_by_each(
        cas: &[&CertificateAuthority],
        common_name: &str,
        validity: Duration,
    ) -> Result<Arc<rustls::ClientConfig>, PkiError> {
        if let [ca] = cas {
            return Self::issued_by(ca, common_name, validity)?.client_config();
        }
        let mut roots = String::new();
        let mut leaves = Vec::new();
        for ca in cas {
            roots.push_str(ca.cert_pem());
            roots.push('\n');
            leaves.push(ca.issue(&LeafRequest::in_memory_client(common_name, validity))?);
        }
        let identities: Vec<(&str, &str)> = leaves
            .iter()
            .map(|l| (l.cert_pem.as_str(), l.key_pem.as_str()))
            .collect();
        let mut config = crate::pki::client_tls_config_each(&roots, &identities)?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        config.resumption = rustls::client::Resumption::in_memory_sessions(SESSION_CACHE_TICKETS);
        Ok(Arc::new(config))
    }
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTls").finish_non_exhaustive()
    }
}

/// One member, addressed by its client URL. Nothing is dialled until the first call; then one
/// HTTP/2 connection carries every call (gRPC and `GET /health`) until the client is dropped,
/// which closes it. Use it from one tokio runtime: the connection's tasks live on the runtime of
/// the first call.
pub struct MemberClient {
    pub(super) endpoint: String,
    host: String,
    port: u16,
    timeout: Duration,
    tls: Arc<rustls::ClientConfig>,
    connection: OnceCell<Connection>,
    /// The server certificate (DER) the member presented at the last handshake.
    server_certificate: Arc<Mutex<Option<Vec<u8>>>>,
}

/// The channel to one member and the etcd client speaking gRPC over it.
pub(super) struct Connection {
    pub(super) channel: Channel,
    pub(super) grpc: etcd_client::Client,
}

impl std::fmt::Debug for MemberClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemberClient")
            .field("endpoint", &self.endpoint)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl EtcdTls {
    /// The TLS settings for talking to members with this identity (HTTP/2 only). Build them once
    /// per cluster and share them through [`MemberClient::with_config`]: each holds the parsed
    /// key and a session cache that lets reconnections skip the full handshake.
    pub fn client_config(&self) -> Result<Arc<rustls::ClientConfig>, PkiError> {
        let mut config = crate::pki::client_tls_config(&self.ca_pem, &self.cert_pem, &self.key_pem)?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        config.resumption = rustls::client::Resumption::in_memory_sessions(SESSION_CACHE_TICKETS);
        Ok(Arc::new(config))
    }
}

/// TLS 1.3 tickets remembered per client configuration (rustls keeps up to 8 per server): room
/// for the members of one cluster.
const SESSION_CACHE_TICKETS: usize = 64;

impl MemberClient {
    /// A client for the member at `client_url` (`https://<host>:<port>`, as etcd advertises it).
    /// Every call made through it gives up after `timeout`. Nothing is dialled yet.
    pub fn new(client_url: &str, tls: &EtcdTls, timeout: Duration) -> Result<Self, EtcdError> {
        let config = tls.client_config().map_err(|e| EtcdError::Tls {
            endpoint: client_url.trim().to_string(),
            operation: "load client certificates",
            message: e.to_string(),
        })?;
        Self::with_config(client_url, config, timeout)
    }

    /// Like [`MemberClient::new`], with TLS settings from [`EtcdTls::client_config`].
    pub fn with_config(
        client_url: &str,
        tls: Arc<rustls::ClientConfig>,
        timeout: Duration,
    ) -> Result<Self, EtcdError> {
        let invalid = |why: String| EtcdError::InvalidInput(format!("client URL {client_url:?}: {why}"));
        let url = reqwest::Url::parse(client_url.trim()).map_err(|e| invalid(e.to_string()))?;
        let plain_origin = url.username().is_empty()
            && url.password().is_none()
            && url.query().is_none()
            && url.fragment().is_none()
            && matches!(url.path(), "" | "/");
        // IPv6 literals come bracketed; the dialer and the certificate check want them bare.
        let host = url
            .host_str()
            .unwrap_or_default()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        if url.scheme() != "https" || host.is_empty() || !plain_origin {
            return Err(EtcdError::InvalidInput(format!(
                "client URL {client_url:?} must look like https://<address>:2379 (mutual TLS, no \
                 path)"
            )));
        }
        let port = url.port_or_known_default().unwrap_or(443);
        Ok(MemberClient {
            endpoint: format!("https://{}", url.authority()),
            host,
            port,
            timeout,
            tls,
            connection: OnceCell::new(),
            server_certificate: Arc::default(),
        })
    }

    /// The member's client URL, normalised (`https://<host>:<port>`).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// When the member's server certificate expires (`notAfter`), as it presented it in the
    /// mutual-TLS handshake of this client's connection (a resumed session carries the
    /// certificate of the handshake it resumes). None before a handshake succeeded.
    pub fn server_certificate_expiry(&self) -> Option<SystemTime> {
        presented_expiry(self.server_certificate().as_deref())
    }

    /// The server certificate (DER) the member presented in the mutual-TLS handshake of this
    /// client's connection (as [`MemberClient::server_certificate_expiry`]): which CA signed it
    /// tells a CA rotation where the member is. None before a handshake succeeded.
    pub fn server_certificate(&self) -> Option<Vec<u8>> {
        self.server_certificate
            .lock()
            .map(|der| der.clone())
            .unwrap_or_else(|poisoned| poisoned.into_inner().clone())
    }

    /// `GET /health` over mutual TLS. A member that answers is judged by
    /// [`health_from_response`]: a 503 or `{"health":"false"}` is an unhealthy `Health`, not an
    /// error; errors mean no verdict could be had (unreachable, TLS, timeout).
    pub async fn health(&self) -> Result<Health, EtcdError> {
        const OPERATION: &str = "GET /health";
        let probe = async {
            let (status, body) = self.get(OPERATION, HEALTH_PATH, MAX_HEALTH_ANSWER).await?;
            Ok(health_from_response(status, &body))
        };
        self.with_deadline(OPERATION, probe).await
    }

    /// `GET path` on this member's connection (beside gRPC, on the client port): the status
    /// and at most `cap` bytes of the body; the stream is reset on the rest of a longer answer,
    /// which is refused, never buffered. No deadline of its own: the caller's bounds it.
    pub(super) async fn get(
        &self,
        operation: &'static str,
        path: &'static str,
        cap: usize,
    ) -> Result<(u16, tonic::codegen::Bytes), EtcdError> {
        let failed = |e: &(dyn std::error::Error + 'static)| from_transport(&self.endpoint, operation, e);
        let mut channel = self.connection(operation).await?.channel.clone();
        let request = http::Request::get(path)
            .body(tonic::body::Body::empty())
            .map_err(|e| failed(&e))?;
        std::future::poll_fn(|cx| Service::poll_ready(&mut channel, cx))
            .await
            .map_err(|e| failed(&e))?;
        let response = channel.call(request).await.map_err(|e| failed(&e))?;
        let status = response.status().as_u16();
        let body = Limited::new(response.into_body(), cap)
            .collect()
            .await
            .map_err(|e| match e.downcast_ref::<LengthLimitError>() {
                Some(_) => self.protocol(operation, &format!("answered with more than {cap} bytes")),
                None => failed(&*e),
            })?
            .to_bytes();
        Ok((status, body))
    }

    /// The etcd client on this member's connection, for the parts of the etcd API not wrapped
    /// here (tools and stand-ins); it keeps the connection open while it lives.
    pub async fn etcd_client(&self) -> Result<etcd_client::Client, EtcdError> {
        const OPERATION: &str = "connect";
        let connect = async { Ok(self.connection(OPERATION).await?.grpc.clone()) };
        self.with_deadline(OPERATION, connect).await
    }

    /// An etcd client on this member's connection whose answers are not capped at
    /// [`MAX_ANSWER`]: for a workload writing and reading its own keys (every test's and
    /// benchmark's client), never for the controller, which reads nothing a member may make
    /// large.
    pub async fn workload_client(&self) -> Result<etcd_client::Client, EtcdError> {
        const OPERATION: &str = "connect";
        let connect = async {
            let channel = self.connection(OPERATION).await?.channel.clone();
            etcd_client::Client::from_channel(etcd_client::Channel::Tonic(channel), None)
                .await
                .map_err(|e| from_client_error(&self.endpoint, OPERATION, self.timeout, e))
        };
        self.with_deadline(OPERATION, connect).await
    }

    /// The member's own status: its ID, the leader it follows, raft progress, DB size.
    pub async fn status(&self) -> Result<MemberStatus, EtcdError> {
        const OPERATION: &str = "Status";
        let response = self
            .call(OPERATION, |mut c| async move { c.status().await })
            .await?;
        let header = response
            .header()
            .ok_or_else(|| self.protocol(OPERATION, "answer has no header"))?;
        Ok(MemberStatus {
            member_id: header.member_id(),
            leader_id: Some(response.leader()).filter(|id| *id != 0),
            version: response.version().to_string(),
            db_size: u64::try_from(response.db_size()).unwrap_or(0),
            db_size_in_use: u64::try_from(response.raft_used_db_size()).unwrap_or(0),
            db_size_quota: u64::try_from(response.db_size_quota()).ok().filter(|q| *q > 0),
            raft_term: response.raft_term(),
            raft_index: response.raft_index(),
            revision: header.revision(),
            is_learner: response.is_learner(),
            errors: response.errors().to_vec(),
        })
    }

    /// Alarms active anywhere in the cluster, as this member knows them.
    pub async fn alarms(&self) -> Result<Vec<Alarm>, EtcdError> {
        let response = self
            .call("Alarm", |mut c| async move {
                c.alarm(AlarmAction::Get, AlarmType::None, None).await
            })
            .await?;
        Ok(response
            .alarms()
            .iter()
            .filter_map(|alarm| {
                let kind = match alarm.alarm() {
                    AlarmType::Nospace => AlarmKind::NoSpace,
                    AlarmType::Corrupt => AlarmKind::Corrupt,
                    AlarmType::None => return None,
                };
                Some(Alarm {
                    member_id: alarm.member_id(),
                    kind,
                })
            })
            .collect())
    }

    /// Compact the history up to `revision` (the cluster-wide key space: asked of any member).
    /// `physical` waits until the compaction is applied to the backend, so the space it frees is
    /// what the next defragmentation returns. A revision compacted already is
    /// [`Refusal::Compacted`].
    pub async fn compact(&self, revision: i64, physical: bool) -> Result<(), EtcdError> {
        let options = physical.then(|| CompactionOptions::new().with_physical());
        self.call(
            "Compact",
            |mut c| async move { c.compact(revision, options).await },
        )
        .await
        .map(drop)
    }

    /// Whether this member's history before `revision` is compacted away: a read at
    /// `revision - 1` is refused as compacted (served by the member alone, without quorum).
    pub async fn is_compacted_before(&self, revision: i64) -> Result<bool, EtcdError> {
        if revision <= 1 {
            return Ok(true);
        }
        let options = GetOptions::new()
            .with_revision(revision - 1)
            .with_keys_only()
            .with_limit(1)
            .with_serializable();
        match self
            .call("Range", |mut c| async move { c.get("/", Some(options)).await })
            .await
        {
            Ok(_) => Ok(false),
            Err(EtcdError::Refused {
                refusal: Refusal::Compacted,
                ..
            }) => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// Defragment this member's backend: it returns the free pages to the file system and
    /// serves nothing meanwhile. The call takes as long as the database is large, so it has a
    /// deadline of its own (see [`defragment_timeout`]).
    pub async fn defragment(&self, timeout: Duration) -> Result<(), EtcdError> {
        const OPERATION: &str = "Defragment";
        let attempt = async {
            let mut client = self.connection(OPERATION).await?.grpc.clone();
            client
                .defragment()
                .await
                .map(drop)
                .map_err(|e| from_client_error(&self.endpoint, OPERATION, timeout, e))
        };
        tokio::time::timeout(timeout, attempt).await.unwrap_or_else(|_| {
            Err(EtcdError::Timeout {
                endpoint: self.endpoint.clone(),
                operation: OPERATION,
                timeout,
            })
        })
    }

    /// Clear alarm `kind` raised on member `member_id` (an alarm of the whole cluster's: asked of
    /// any member).
    pub async fn alarm_disarm(&self, member_id: u64, kind: AlarmKind) -> Result<(), EtcdError> {
        let alarm = match kind {
            AlarmKind::NoSpace => AlarmType::Nospace,
            AlarmKind::Corrupt => AlarmType::Corrupt,
        };
        let mut options = AlarmOptions::new();
        options.with_member(member_id);
        self.call("Alarm", |mut c| async move {
            c.alarm(AlarmAction::Deactivate, alarm, Some(options)).await
        })
        .await
        .map(drop)
    }

    /// The cluster membership as this member sees it.
    pub async fn member_list(&self) -> Result<Vec<Member>, EtcdError> {
        let response = self
            .call("MemberList", |mut c| async move { c.member_list().await })
            .await?;
        Ok(response.members().iter().map(Member::from_client).collect())
    }

    /// Add a member with the given peer URLs, as a learner or a voter. The member is pending
    /// (no name, no client URLs) until its process starts and joins.
    pub async fn member_add(&self, peer_urls: &[String], learner: bool) -> Result<Member, EtcdError> {
        const OPERATION: &str = "MemberAdd";
        let urls = peer_urls.to_vec();
        let options = learner.then(|| MemberAddOptions::new().with_is_learner());
        let response = self
            .call(
                OPERATION,
                |mut c| async move { c.member_add(urls, options).await },
            )
            .await?;
        response
            .member()
            .map(Member::from_client)
            .ok_or_else(|| self.protocol(OPERATION, "answer names no added member"))
    }

    /// Remove a member by ID.
    pub async fn member_remove(&self, id: u64) -> Result<(), EtcdError> {
        self.call("MemberRemove", |mut c| async move { c.member_remove(id).await })
            .await
            .map(drop)
    }

    /// Turn a learner into a voter; etcd refuses until the learner has caught up
    /// ([`Refusal::LearnerNotReady`](super::Refusal::LearnerNotReady)).
    pub async fn member_promote(&self, id: u64) -> Result<(), EtcdError> {
        self.call("MemberPromote", |mut c| async move { c.member_promote(id).await })
            .await
            .map(drop)
    }

    /// Hand leadership to member `to`. Must be sent to the current leader; anywhere else etcd
    /// refuses with [`Refusal::NotLeader`](super::Refusal::NotLeader).
    pub async fn move_leader(&self, to: u64) -> Result<(), EtcdError> {
        self.call("MoveLeader", |mut c| async move { c.move_leader(to).await })
            .await
            .map(drop)
    }

    /// Run one gRPC call on this member's connection, under the deadline.
    pub(super) async fn call<T, F, Fut>(&self, operation: &'static str, request: F) -> Result<T, EtcdError>
    where
        F: FnOnce(etcd_client::Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let attempt = async {
            let client = self.connection(operation).await?.grpc.clone();
            request(client)
                .await
                .map_err(|e| from_client_error(&self.endpoint, operation, self.timeout, e))
        };
        self.with_deadline(operation, attempt).await
    }

    /// The connection, set up on first use (the channel dials lazily, on the first request).
    pub(super) async fn connection(&self, operation: &'static str) -> Result<&Connection, EtcdError> {
        self.connection
            .get_or_try_init(|| async {
                let failed =
                    |e: &(dyn std::error::Error + 'static)| from_transport(&self.endpoint, operation, e);
                // No timeouts of tonic's own: every call is bounded by `with_deadline`, so a
                // member that never answers reads as a timeout, whichever step it hangs in.
                let endpoint = Endpoint::from_shared(self.endpoint.clone())
                    .map_err(|e| failed(&e))?
                    .initial_stream_window_size(WINDOW)
                    .initial_connection_window_size(WINDOW)
                    .http2_max_header_list_size(MAX_HEADER_LIST);
                let channel = endpoint.connect_with_connector_lazy(TlsDialer {
                    host: self.host.clone(),
                    port: self.port,
                    tls: self.tls.clone(),
                    server_certificate: self.server_certificate.clone(),
                });
                let capped =
                    etcd_client::Channel::Custom(tower::util::BoxCloneSyncService::new(CappedAnswers {
                        inner: channel.clone(),
                    }));
                let grpc = etcd_client::Client::from_channel(capped, None)
                    .await
                    .map_err(|e| from_client_error(&self.endpoint, operation, self.timeout, e))?;
                Ok(Connection { channel, grpc })
            })
            .await
    }

    pub(super) async fn with_deadline<T>(
        &self,
        operation: &'static str,
        work: impl Future<Output = Result<T, EtcdError>>,
    ) -> Result<T, EtcdError> {
        tokio::time::timeout(self.timeout, work)
            .await
            .unwrap_or_else(|_| {
                Err(EtcdError::Timeout {
                    endpoint: self.endpoint.clone(),
                    operation,
                    timeout: self.timeout,
                })
            })
    }

    pub(super) fn protocol(&self, operation: &'static str, message: &str) -> EtcdError {
        EtcdError::Protocol {
            endpoint: self.endpoint.clone(),
            operation,
            message: message.to_string(),
        }
    }
}

/// Where `/health` is served, on the client port beside gRPC. Alarms are excluded from the
/// verdict (etcd 3.4.23+ and 3.5 honour `exclude`, not always fully: see
/// [`Health::serves_despite_alarms`]): a member that serves with an alarm raised is up, and the
/// alarm is read apart (`alarms`), so an alarm is never mistaken for a member down.
const HEALTH_PATH: &str = "/health?exclude=NOSPACE&exclude=CORRUPT";

/// The most of a `/health` answer that is read: etcd's is some 40 bytes
/// (`{"health":"true","reason":""}`).
pub const MAX_HEALTH_ANSWER: usize = 4 << 10;

/// The most of any other answer that is read, but a snapshot's or a watch's: a member list of a
/// large cluster is a few KiB. Their messages are each at most tonic's 4 MiB.
pub const MAX_ANSWER: usize = 64 << 10;

/// HTTP/2 flow-control window, per stream and per connection: what a member can send before it
/// is read, so what one connection can make the controller hold however the member behaves. At
/// 1 MiB a snapshot runs at 1 MiB per round trip (100 MiB/s at 10 ms).
const WINDOW: u32 = 1 << 20;

/// The largest block of response headers accepted (hyper's default, said here).
const MAX_HEADER_LIST: u32 = 16 << 10;

/// The calls whose answer is a stream of any length, read a message at a time (each at most
/// tonic's 4 MiB): a snapshot, and continuous backup's watch.
const STREAMED_PATHS: [&str; 2] = ["/etcdserverpb.Maintenance/Snapshot", "/etcdserverpb.Watch/Watch"];

/// The channel the etcd client speaks gRPC over, with every answer but a stream's cut at
/// [`MAX_ANSWER`]: a member that answers more fails the call instead of growing the controller.
#[derive(Clone)]
struct CappedAnswers {
    inner: Channel,
}

type GrpcRequest = http::Request<tonic::body::Body>;
type GrpcResponse = http::Response<tonic::body::Body>;

impl Service<GrpcRequest> for CappedAnswers {
    type Response = GrpcResponse;
    type Error = tower::BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<GrpcResponse, tower::BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Service::poll_ready(&mut self.inner, cx).map_err(Into::into)
    }

    fn call(&mut self, request: GrpcRequest) -> Self::Future {
        let capped = !STREAMED_PATHS.contains(&request.uri().path());
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            Ok(if capped {
                response.map(|body| tonic::body::Body::new(Limited::new(body, MAX_ANSWER)))
            } else {
                response
            })
        })
    }
}

/// The deadline of a defragmentation of a `db_size`-byte database: etcd rewrites the whole
/// file, so a minute, and a second more for every 16 MiB (measured: about 20 ms for 16 MiB).
/// The size is the member's word, so it counts up to the largest quota etcd is run with
/// (32 GiB): a defragmentation holds a reconcile for at most 35 min 8 s.
pub fn defragment_timeout(db_size: u64) -> Duration {
    let size = db_size.min(*crate::api::config::QUOTA_BACKEND_BYTES_RANGE.end());
    Duration::from_secs(60 + size / (16 << 20))
}

/// Dials one member: TCP, then TLS with the shared client configuration, naming the host for
/// certificate verification, and notes the certificate the member presented.
/// tonic speaks HTTP/2 over the result.
#[derive(Clone)]
struct TlsDialer {
    host: String,
    port: u16,
    tls: Arc<rustls::ClientConfig>,
    server_certificate: Arc<Mutex<Option<Vec<u8>>>>,
}

impl Service<Uri> for TlsDialer {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let dialer = self.clone();
        Box::pin(async move {
            let name = rustls::pki_types::ServerName::try_from(dialer.host.clone())
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
            let tcp = TcpStream::connect((dialer.host.as_str(), dialer.port)).await?;
            tcp.set_nodelay(true)?;
            let tls = TlsConnector::from(dialer.tls).connect(name, tcp).await?;
            let leaf = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map(|der| der.to_vec());
            if let Ok(mut slot) = dialer.server_certificate.lock() {
                *slot = leaf;
            }
            Ok(TokioIo::new(tls))
        })
    }
}

/// `notAfter` of the leaf certificate a TLS peer presented.
fn presented_expiry(leaf: Option<&[u8]>) -> Option<SystemTime> {
    crate::pki::der_validity(leaf?)
        .ok()
        .map(|(_, not_after)| not_after)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls() -> EtcdTls {
        // An ECDSA "CA" would do for parsing, but the PKI only issues from RSA CAs; one is enough.
        static TLS: std::sync::OnceLock<EtcdTls> = std::sync::OnceLock::new();
        TLS.get_or_init(|| {
            let ca = CertificateAuthority::generate("etcd-ca").unwrap();
            EtcdTls::issued_by(&ca, "probe", Duration::from_secs(600)).unwrap()
        })
        .clone()
    }

    #[test]
    fn accepts_https_origins_and_normalises_them() {
        let t = Duration::from_secs(1);
        let c = MemberClient::new("https://10.0.0.1:2379", &tls(), t).unwrap();
        assert_eq!(c.endpoint(), "https://10.0.0.1:2379");
        assert_eq!((c.host.as_str(), c.port), ("10.0.0.1", 2379));
        let c = MemberClient::new("https://[fd00::1]:2379", &tls(), t).unwrap();
        assert_eq!(
            (c.endpoint(), c.host.as_str()),
            ("https://[fd00::1]:2379", "fd00::1")
        );
        let c = MemberClient::new("https://etcd-a.example:2379/", &tls(), t).unwrap();
        assert_eq!(c.endpoint(), "https://etcd-a.example:2379");
    }

    #[test]
    fn refuses_urls_that_are_not_plain_https_origins() {
        let t = Duration::from_secs(1);
        for bad in [
            "http://10.0.0.1:2379",
            "10.0.0.1:2379",
            "https://10.0.0.1:2379/v3",
            "https://user:pw@10.0.0.1:2379",
            "https://10.0.0.1:2379?x=1",
            "",
        ] {
            let err = MemberClient::new(bad, &tls(), t).unwrap_err();
            assert!(matches!(err, EtcdError::InvalidInput(_)), "{bad}: {err}");
            assert_eq!(err.category().as_str(), "EtcdInvalidInput");
        }
    }

    /// Controllers share clients across tasks and spawn their calls.
    #[test]
    fn clients_and_their_calls_can_move_between_threads() {
        fn send_sync<T: Send + Sync>(_: &T) {}
        fn send<T: Send>(_: T) {}
        let c = MemberClient::new("https://10.0.0.1:2379", &tls(), Duration::from_secs(1)).unwrap();
        send_sync(&c);
        send(c.health());
        send(c.status());
        send(c.alarms());
        send(c.member_list());
        send(c.member_add(&[], true));
        send(c.member_remove(1));
        send(c.member_promote(1));
        send(c.move_leader(1));
    }

    #[test]
    fn the_expiry_is_the_presented_leafs_not_after_and_unknown_without_one() {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let ca = CertificateAuthority::generate("etcd-ca").unwrap();
        let leaf = ca
            .issue(&LeafRequest::in_memory_client("m", Duration::from_secs(86_400)))
            .unwrap();
        let der = |pem: &str| CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
        let expiry = presented_expiry(Some(&der(&leaf.cert_pem))).unwrap();
        let seconds = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
        assert_eq!(seconds(expiry), seconds(leaf.not_after));
        assert_eq!(presented_expiry(None), None);
        assert_eq!(presented_expiry(Some(&[])), None);
        assert_eq!(presented_expiry(Some(&[1, 2, 3])), None);
        let client = MemberClient::new("https://10.0.0.1:2379", &tls(), Duration::from_secs(1)).unwrap();
        assert_eq!(client.server_certificate_expiry(), None);
        assert_eq!(client.server_certificate(), None);
    }

    #[test]
    fn a_defragmentations_deadline_grows_with_the_size_up_to_the_largest_quota() {
        assert_eq!(defragment_timeout(0), Duration::from_secs(60));
        assert_eq!(defragment_timeout(16 << 20), Duration::from_secs(61));
        assert_eq!(defragment_timeout(32 << 30), Duration::from_secs(60 + 2048));
        assert_eq!(defragment_timeout(u64::MAX), Duration::from_secs(60 + 2048));
    }

    #[test]
    fn only_a_snapshots_and_a_watchs_answers_go_uncapped() {
        assert_eq!(
            STREAMED_PATHS,
            ["/etcdserverpb.Maintenance/Snapshot", "/etcdserverpb.Watch/Watch"]
        );
        const { assert!(MAX_HEALTH_ANSWER < MAX_ANSWER && MAX_ANSWER < WINDOW as usize) };
    }

    #[test]
    fn bad_pem_is_a_tls_error_naming_the_problem() {
        let mut bad = tls();
        bad.key_pem = "not a key".into();
        let err = MemberClient::new("https://10.0.0.1:2379", &bad, Duration::from_secs(1)).unwrap_err();
        assert!(matches!(err, EtcdError::Tls { .. }), "{err}");
        assert!(err.to_string().contains("key"), "{err}");
    }
}
