//! A hostile etcd member for the tenant-isolation scenario: a server holding a certificate of
//! its cluster's CA, standing at a real member's address, that either streams every answer
//! without end (`/health`, Status, MemberList, Alarm: the memory attack) or impersonates the
//! member it replaced, healthy, and trickles its snapshot (the slot attack). It counts what it
//! got to send, so a test can show where the controller stopped reading.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::Response;
use axum::routing::{get, post};
use http_body::Frame;
use http_body_util::StreamBody;

use etcdadm_shared::names;
use etcdadm_shared::pki::CertificateAuthority;

use crate::error::SimError;
use crate::fake_etcd::{
    AlarmResponse, FakeSnapshot, MemberListResponse, PbMember, ResponseHeader, StatusResponse, grpc,
    grpc_response, listen, member_tls, range, snapshot_stream,
};

/// The member a hostile server stands in for, and how it misbehaves.
#[derive(Clone, Debug)]
pub struct HostileMember {
    /// The ID, name and version of the member it replaced (what the controller last saw).
    pub member_id: u64,
    pub name: String,
    pub version: String,
    pub ip: IpAddr,
    /// Every answer but the snapshot's streams without end; else the member looks healthy.
    pub endless: bool,
    /// What a snapshot streams (with its pace: the trickle).
    pub snapshot: FakeSnapshot,
}

/// What a hostile server got to send.
#[derive(Debug, Default)]
pub struct HostileLog {
    /// Endless answers begun.
    pub endless_answers: AtomicU64,
    /// Bytes sent in all endless answers.
    pub endless_bytes: AtomicU64,
    /// The most bytes one endless answer got to send before its client went away.
    pub longest_answer: AtomicU64,
    /// Snapshot streams begun.
    pub snapshots: AtomicU64,
}

#[derive(Clone)]
struct Hostile {
    member: Arc<HostileMember>,
    log: Arc<HostileLog>,
}

/// Serve `member` on its address's client port over etcd's mutual TLS (a server certificate
/// from `ca`) until the runtime ends.
pub fn serve_hostile(ca: &CertificateAuthority, member: HostileMember) -> Result<Arc<HostileLog>, SimError> {
    let addr = SocketAddr::new(member.ip, names::ETCD_CLIENT_PORT);
    let tls = member_tls(ca, vec![member.ip])?;
    let log = Arc::new(HostileLog::default());
    let snapshot = Arc::new(member.snapshot.clone());
    let (for_range, counted) = (snapshot.clone(), log.clone());
    let app = Router::new()
        .route(
            "/etcdserverpb.Maintenance/Snapshot",
            post(move || {
                counted.snapshots.fetch_add(1, Ordering::Relaxed);
                snapshot_stream(State(snapshot.clone()))
            }),
        )
        .route(
            "/etcdserverpb.KV/Range",
            post(move || range(State(for_range.clone()))),
        )
        .route("/health", get(health))
        .route("/etcdserverpb.Maintenance/Status", post(status))
        .route("/etcdserverpb.Cluster/MemberList", post(member_list))
        .route("/etcdserverpb.Maintenance/Alarm", post(alarms))
        .with_state(Hostile {
            member: Arc::new(member),
            log: log.clone(),
        });
    listen(addr, tls, app)?;
    Ok(log)
}

/// An answer's bytes as it goes, recorded in the log when its client drops it.
struct Sent {
    log: Arc<HostileLog>,
    bytes: u64,
}

impl Drop for Sent {
    fn drop(&mut self) {
        self.log.longest_answer.fetch_max(self.bytes, Ordering::Relaxed);
    }
}

/// A body that starts with `first` and then sends 16 KiB of spaces for as long as it is read.
fn endless(log: &Arc<HostileLog>, first: Vec<u8>) -> Body {
    log.endless_answers.fetch_add(1, Ordering::Relaxed);
    let filler = Bytes::from(vec![b' '; 16 << 10]);
    let sent = Sent {
        log: log.clone(),
        bytes: 0,
    };
    let frames = futures::stream::unfold((sent, Some(Bytes::from(first))), move |(mut sent, first)| {
        let data = first.unwrap_or_else(|| filler.clone());
        let len = data.len() as u64;
        sent.bytes += len;
        sent.log.endless_bytes.fetch_add(len, Ordering::Relaxed);
        std::future::ready(Some((Ok::<_, Infallible>(Frame::data(data)), (sent, None))))
    });
    Body::new(StreamBody::new(frames))
}

/// A gRPC answer announcing the largest message a length prefix can, then never ending it.
fn endless_grpc(log: &Arc<HostileLog>) -> Response<Body> {
    grpc_response(endless(log, vec![0, 0x7f, 0xff, 0xff, 0xff]))
}

impl Hostile {
    fn header(&self) -> ResponseHeader {
        ResponseHeader {
            cluster_id: self.member.member_id ^ 0xc1,
            member_id: self.member.member_id,
            revision: self.member.snapshot.revision,
            raft_term: 2,
        }
    }
}

async fn health(State(h): State<Hostile>) -> Response<Body> {
    if h.member.endless {
        return Response::new(endless(&h.log, br#"{"health":"true","reason":""#.to_vec()));
    }
    Response::new(Body::from(r#"{"health":"true","reason":""}"#))
}

async fn status(State(h): State<Hostile>) -> Response<Body> {
    if h.member.endless {
        return endless_grpc(&h.log);
    }
    grpc(StatusResponse {
        header: Some(h.header()),
        version: h.member.version.clone(),
        db_size: i64::try_from(h.member.snapshot.database.len()).unwrap_or(i64::MAX),
        leader: h.member.member_id,
        raft_index: 1000,
        raft_term: 2,
    })
}

async fn member_list(State(h): State<Hostile>) -> Response<Body> {
    if h.member.endless {
        return endless_grpc(&h.log);
    }
    let ip = h.member.ip.to_string();
    grpc(MemberListResponse {
        header: Some(h.header()),
        members: vec![PbMember {
            id: h.member.member_id,
            name: h.member.name.clone(),
            peer_urls: vec![names::peer_url(&ip)],
            client_urls: vec![names::client_url(&ip)],
        }],
    })
}

async fn alarms(State(h): State<Hostile>) -> Response<Body> {
    if h.member.endless {
        return endless_grpc(&h.log);
    }
    grpc(AlarmResponse {
        header: Some(h.header()),
    })
}
