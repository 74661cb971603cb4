//! An S3-compatible object store for etcd snapshots: rusty-s3 signs each request (presigned, so
//! credentials never travel in a header a proxy could log), reqwest sends it, and every failure
//! is sorted by cause ([`StoreError`]). A store is named by a tenant, so it is given no power
//! over the controller: answers are capped, requests have deadlines, redirects are not
//! followed, its words are not repeated ([`limits`]), and the operator's policy says which
//! addresses it may have ([`policy`]; docs/security.md).
//!
//! Only what snapshots need: multipart uploads (create, upload part, complete, abort), the
//! SHA-256 in an object's metadata, presigned GET URLs, delete, list by prefix, small objects
//! written and read whole (continuous backup's deltas), and bucket creation for tests and
//! demos.

mod answer;
mod client;
mod error;
pub mod limits;
mod multipart;
mod object;
pub mod policy;
mod whole_object;

pub use self::client::{StoreClient, StoreCredentials, StoredObject};
pub use self::error::StoreError;
pub use self::multipart::{MAX_PARTS, MultipartWriter, PART_SIZE};
pub use self::object::{MAX_SINGLE_COPY, ObjectHead, SHA256_METADATA};
pub use self::policy::{HostRule, StorePolicy};
