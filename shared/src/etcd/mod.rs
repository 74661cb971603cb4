//! Talking to etcd members over mutual TLS, one client per member, so every answer is about
//! that member and the controller can judge each one on its own.
//!
//! `MemberClient` wraps the etcd v3 gRPC API (status, alarms, membership, leadership,
//! compaction, defragmentation, HashKV) and the HTTP `/health` and `/metrics` endpoints, all over one HTTP/2 connection
//! per member; every call carries a deadline and failures land in [`EtcdError`], sorted by what
//! the caller should do next.

mod client;
mod error;
mod health;
mod inspect;
mod member;
mod snapshot;

pub use client::{EtcdTls, MemberClient, defragment_timeout};
pub use error::{EtcdError, Refusal};
pub use health::{Health, health_from_response};
pub use inspect::{HashKv, METRICS_CAP, metric_value};
pub use member::{Alarm, AlarmKind, Member, MemberStatus, member_id_hex, parse_member_id};
pub use snapshot::SnapshotStream;
