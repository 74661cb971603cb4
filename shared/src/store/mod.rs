//! An S3-compatible object store for etcd snapshots: rusty-s3 signs each request (presigned, so
//! credentials never travel in a header a proxy could log), reqwest sends it, and every failure
//! is sorted by cause ([`StoreError`]).
//!
//! Only what snapshots need: multipart uploads (create, upload part, complete, abort), presigned
//! GET URLs, delete, list by prefix, and bucket creation for tests and demos.

mod client;
mod error;
mod multipart;

pub use self::client::{StoreClient, StoreCredentials, StoredObject};
pub use self::error::StoreError;
pub use self::multipart::{MAX_PARTS, MultipartWriter, PART_SIZE};
