//! Cheap stand-ins for etcd members, for the scale benchmark: real mutual TLS on the member's
//! client URL, answering `/health` and the three RPCs the health check makes (Status,
//! MemberList, Alarm) from a fixed membership, and counting when each member was probed. And a
//! member that only serves a snapshot stream (Maintenance.Snapshot, plus the Range a snapshot's
//! revision is read with) of bytes the test chooses, so a corrupted stream can be sent.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Response, StatusCode};
use axum::routing::{get, post};
use axum_server::tls_rustls::RustlsConfig;
use futures::StreamExt;
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use prost::Message;

use etcdadm_shared::names;
use etcdadm_shared::pki::{CertificateAuthority, KeyType, LeafRequest};

use crate::error::SimError;

/// One fake etcd cluster: its members' names and addresses, in ID order (the first leads).
#[derive(Clone, Debug)]
pub struct FakeCluster {
    pub members: Vec<(String, IpAddr)>,
}

impl FakeCluster {
    fn member_id(&self, index: usize) -> u64 {
        // Stable, distinct and never 0 (0 means "no leader" in Status).
        let ip = match self.members[index].1 {
            IpAddr::V4(v4) => u64::from(u32::from(v4)),
            IpAddr::V6(v6) => u128::from(v6) as u64,
        };
        0x1000_0000_0000 | ip
    }
}

/// When each member (by address) was last asked for its Status, and the gaps seen in between.
#[derive(Default)]
pub struct ProbeLog {
    last: HashMap<IpAddr, Instant>,
    gaps: Vec<f64>,
    /// Gaps that began before the last reset (the warm-up's backlog reaching into the window).
    spanning: Vec<f64>,
    /// When the log was last reset.
    since: Option<Instant>,
    /// Members asked for their Status since the last reset.
    pub probed: HashSet<IpAddr>,
    /// When each member was first asked for its Status since the last reset.
    pub first: HashMap<IpAddr, Instant>,
    pub health_calls: u64,
    pub member_list_calls: u64,
}

impl ProbeLog {
    /// Forget the gaps recorded so far (the warm-up), keeping when each member was last seen.
    pub fn reset(&mut self) {
        self.gaps.clear();
        self.spanning.clear();
        self.since = Some(Instant::now());
        self.probed.clear();
        self.first.clear();
        self.health_calls = 0;
        self.member_list_calls = 0;
    }

    /// Seconds between consecutive Status probes of the same member, both since the last reset.
    pub fn gaps(&self) -> &[f64] {
        &self.gaps
    }

    /// Seconds between the last Status probe of a member before the last reset and its first
    /// after it.
    pub fn spanning_gaps(&self) -> &[f64] {
        &self.spanning
    }
}

#[derive(Clone)]
struct Member {
    cluster: Arc<FakeCluster>,
    index: usize,
    log: Arc<Mutex<ProbeLog>>,
}

/// Start responders for every member of `clusters` on `<address>:2379`, each cluster with a
/// server certificate from `ca` naming its members' addresses. They run until the runtime ends.
pub async fn serve(
    ca: &CertificateAuthority,
    clusters: &[FakeCluster],
    log: Arc<Mutex<ProbeLog>>,
) -> Result<(), SimError> {
    for cluster in clusters {
        let cluster = Arc::new(cluster.clone());
        let tls = member_tls(ca, cluster.members.iter().map(|(_, ip)| *ip).collect())?;
        for index in 0..cluster.members.len() {
            let member = Member {
                cluster: cluster.clone(),
                index,
                log: log.clone(),
            };
            let app = Router::new()
                .route("/health", get(health))
                .route("/etcdserverpb.Maintenance/Status", post(status))
                .route("/etcdserverpb.Cluster/MemberList", post(member_list))
                .route("/etcdserverpb.Maintenance/Alarm", post(alarms))
                .with_state(member);
            listen(
                SocketAddr::new(cluster.members[index].1, names::ETCD_CLIENT_PORT),
                tls.clone(),
                app,
            )?;
        }
    }
    Ok(())
}

/// What a snapshot-serving fake member streams: `database` in etcd's 32 KiB messages, then
/// `checksum` (etcd sends the database's SHA-256; a test sends anything else to corrupt it).
#[derive(Clone, Debug)]
pub struct FakeSnapshot {
    pub database: Arc<Vec<u8>>,
    pub checksum: [u8; 32],
    /// The revision the member reports.
    pub revision: i64,
    /// A hostile member's pace: this long before each message (none: as fast as it can).
    pub pace: Duration,
    /// A hostile member's word: the database size its first message announces (none: the
    /// size it sends).
    pub announced: Option<u64>,
}

impl FakeSnapshot {
    /// `database` and `checksum` sent as etcd sends them, at once.
    pub fn honest(database: Vec<u8>, checksum: [u8; 32], revision: i64) -> Self {
        FakeSnapshot {
            database: Arc::new(database),
            checksum,
            revision,
            pace: Duration::ZERO,
            announced: None,
        }
    }
}

/// Serve `snapshot` on `<ip>:2379` over mutual TLS (server certificate from `ca`) until the
/// runtime ends.
pub async fn serve_snapshot(
    ca: &CertificateAuthority,
    ip: IpAddr,
    snapshot: FakeSnapshot,
) -> Result<(), SimError> {
    let app = Router::new()
        .route("/etcdserverpb.Maintenance/Snapshot", post(snapshot_stream))
        .route("/etcdserverpb.KV/Range", post(range))
        .with_state(Arc::new(snapshot));
    listen(
        SocketAddr::new(ip, names::ETCD_CLIENT_PORT),
        member_tls(ca, vec![ip])?,
        app,
    )
}

/// A server certificate from `ca` for members at `ips`, and etcd's mutual TLS around it.
pub(crate) fn member_tls(ca: &CertificateAuthority, ips: Vec<IpAddr>) -> Result<RustlsConfig, SimError> {
    let setup = |e: &dyn std::fmt::Display| SimError::Setup(format!("fake etcd: {e}"));
    let mut request = LeafRequest::member("fake-etcd", vec![], ips);
    request.key_type = KeyType::EcdsaP256;
    let leaf = ca.issue(&request).map_err(|e| setup(&e))?;
    Ok(RustlsConfig::from_config(Arc::new(
        server_tls(ca.cert_pem(), &leaf.cert_pem, &leaf.key_pem).map_err(|e| setup(&e))?,
    )))
}

/// Serve `app` over `tls` on `addr` until the runtime ends.
pub(crate) fn listen(addr: SocketAddr, tls: RustlsConfig, app: Router) -> Result<(), SimError> {
    let setup = |e: &dyn std::fmt::Display| SimError::Setup(format!("fake etcd {addr}: {e}"));
    let listener = std::net::TcpListener::bind(addr).map_err(|e| setup(&e))?;
    listener.set_nonblocking(true).map_err(|e| setup(&e))?;
    let server = axum_server::tls_rustls::from_tcp_rustls(listener, tls).map_err(|e| setup(&e))?;
    tokio::spawn(async move {
        if let Err(e) = server.serve(app.into_make_service()).await {
            tracing::warn!(%addr, error = %e, "fake etcd member stopped");
        }
    });
    Ok(())
}

/// Mutual TLS as etcd does it with `--client-cert-auth`: only clients with a certificate from
/// the cluster's CA; HTTP/2 for gRPC and `/health` (the controller asks both on one connection),
/// HTTP/1.1 for `/health` too.
pub(crate) fn server_tls(
    ca_pem: &str,
    cert_pem: &str,
    key_pem: &str,
) -> Result<rustls::ServerConfig, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots
            .add(cert.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .map_err(|e| e.to_string())?;
    let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| e.to_string())?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| e.to_string())?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    // One session ticket per handshake, as etcd's Go TLS stack sends (rustls sends two): a client
    // resuming every round then holds one or two tickets per member, not eight.
    config.send_tls13_tickets = 1;
    Ok(config)
}

// The etcdserverpb messages the health check reads, with etcd's field numbers.

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ResponseHeader {
    #[prost(uint64, tag = "1")]
    pub(crate) cluster_id: u64,
    #[prost(uint64, tag = "2")]
    pub(crate) member_id: u64,
    #[prost(int64, tag = "3")]
    pub(crate) revision: i64,
    #[prost(uint64, tag = "4")]
    pub(crate) raft_term: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct StatusResponse {
    #[prost(message, optional, tag = "1")]
    pub(crate) header: Option<ResponseHeader>,
    #[prost(string, tag = "2")]
    pub(crate) version: String,
    #[prost(int64, tag = "3")]
    pub(crate) db_size: i64,
    #[prost(uint64, tag = "4")]
    pub(crate) leader: u64,
    #[prost(uint64, tag = "5")]
    pub(crate) raft_index: u64,
    #[prost(uint64, tag = "6")]
    pub(crate) raft_term: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct PbMember {
    #[prost(uint64, tag = "1")]
    pub(crate) id: u64,
    #[prost(string, tag = "2")]
    pub(crate) name: String,
    #[prost(string, repeated, tag = "3")]
    pub(crate) peer_urls: Vec<String>,
    #[prost(string, repeated, tag = "4")]
    pub(crate) client_urls: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct MemberListResponse {
    #[prost(message, optional, tag = "1")]
    pub(crate) header: Option<ResponseHeader>,
    #[prost(message, repeated, tag = "2")]
    pub(crate) members: Vec<PbMember>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct SnapshotResponse {
    #[prost(message, optional, tag = "1")]
    header: Option<ResponseHeader>,
    #[prost(uint64, tag = "2")]
    remaining_bytes: u64,
    #[prost(bytes = "vec", tag = "3")]
    blob: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RangeResponse {
    #[prost(message, optional, tag = "1")]
    header: Option<ResponseHeader>,
    #[prost(int64, tag = "4")]
    count: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct AlarmResponse {
    #[prost(message, optional, tag = "1")]
    pub(crate) header: Option<ResponseHeader>,
}

impl Member {
    fn header(&self) -> ResponseHeader {
        ResponseHeader {
            cluster_id: self.cluster.member_id(0) ^ 0xc1,
            member_id: self.cluster.member_id(self.index),
            revision: 1,
            raft_term: 2,
        }
    }

    fn record(&self, what: impl FnOnce(&mut ProbeLog)) {
        if let Ok(mut log) = self.log.lock() {
            what(&mut log);
        }
    }
}

async fn health(State(member): State<Member>) -> &'static str {
    member.record(|log| log.health_calls += 1);
    r#"{"health":"true","reason":""}"#
}

async fn status(State(member): State<Member>) -> Response<Body> {
    let ip = member.cluster.members[member.index].1;
    member.record(|log| {
        let now = Instant::now();
        if let Some(previous) = log.last.insert(ip, now) {
            let gap = now.duration_since(previous).as_secs_f64();
            match log.since {
                Some(since) if previous < since => log.spanning.push(gap),
                _ => log.gaps.push(gap),
            }
        }
        log.probed.insert(ip);
        log.first.entry(ip).or_insert(now);
    });
    grpc(StatusResponse {
        header: Some(member.header()),
        version: "3.5.21".into(),
        db_size: 20 << 20,
        leader: member.cluster.member_id(0),
        raft_index: 1000,
        raft_term: 2,
    })
}

async fn member_list(State(member): State<Member>) -> Response<Body> {
    member.record(|log| log.member_list_calls += 1);
    let members = member
        .cluster
        .members
        .iter()
        .enumerate()
        .map(|(i, (name, ip))| PbMember {
            id: member.cluster.member_id(i),
            name: name.clone(),
            peer_urls: vec![names::peer_url(&ip.to_string())],
            client_urls: vec![names::client_url(&ip.to_string())],
        })
        .collect();
    grpc(MemberListResponse {
        header: Some(member.header()),
        members,
    })
}

async fn alarms(State(member): State<Member>) -> Response<Body> {
    grpc(AlarmResponse {
        header: Some(member.header()),
    })
}

/// etcd's snapshot message size.
const SNAPSHOT_CHUNK: usize = 32 * 1024;

/// The database in etcd's chunks (no response header, as etcd sends none), then the checksum;
/// each message after the snapshot's pace, the first announcing the size the snapshot says.
pub(crate) async fn snapshot_stream(State(snapshot): State<Arc<FakeSnapshot>>) -> Response<Body> {
    let total = snapshot.announced.unwrap_or(snapshot.database.len() as u64);
    let mut frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = snapshot
        .database
        .chunks(SNAPSHOT_CHUNK)
        .scan(0u64, |sent, chunk| {
            *sent += chunk.len() as u64;
            Some(SnapshotResponse {
                header: None,
                remaining_bytes: total.saturating_sub(*sent),
                blob: chunk.to_vec(),
            })
        })
        .chain(std::iter::once(SnapshotResponse {
            header: None,
            remaining_bytes: 0,
            blob: snapshot.checksum.to_vec(),
        }))
        .map(|message| Ok(Frame::data(Bytes::from(framed(&message)))))
        .collect();
    frames.push(Ok(Frame::trailers(ok_trailers())));
    let pace = snapshot.pace;
    let paced = futures::stream::iter(frames).then(move |frame| async move {
        tokio::time::sleep(pace).await;
        frame
    });
    grpc_response(Body::new(StreamBody::new(paced)))
}

pub(crate) async fn range(State(snapshot): State<Arc<FakeSnapshot>>) -> Response<Body> {
    grpc(RangeResponse {
        header: Some(ResponseHeader {
            cluster_id: 1,
            member_id: 1,
            revision: snapshot.revision,
            raft_term: 2,
        }),
        count: 0,
    })
}

/// One gRPC message: a compression flag, its length, its bytes.
pub(crate) fn framed(message: &impl Message) -> Vec<u8> {
    let encoded = message.encode_to_vec();
    let mut framed = Vec::with_capacity(encoded.len() + 5);
    framed.push(0);
    framed.extend_from_slice(&(encoded.len() as u32).to_be_bytes());
    framed.extend_from_slice(&encoded);
    framed
}

pub(crate) fn ok_trailers() -> HeaderMap {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    trailers
}

/// A unary gRPC answer: one length-prefixed message, then `grpc-status: 0` in the trailers.
pub(crate) fn grpc(message: impl Message) -> Response<Body> {
    let trailers = ok_trailers();
    let body = Full::new(Bytes::from(framed(&message))).with_trailers(async move { Some(Ok(trailers)) });
    grpc_response(Body::new(body))
}

pub(crate) fn grpc_response(body: Body) -> Response<Body> {
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::OK;
    response
        .headers_mut()
        .insert("content-type", HeaderValue::from_static("application/grpc"));
    response
}
