//! The kernel both providers stand on: API types, names, PKI, CRD rendering and the etcd client.
//!
//! This crate knows nothing about either controller; `bootstrap/` and `etcdcluster/` build on it
//! and never on each other.

pub mod api;
pub mod backup;
pub mod bottlerocket;
pub mod category;
pub mod contract;
pub mod crd;
pub mod cron;
pub mod duration;
pub mod error;
pub mod etcd;
pub mod etcd_settings;
pub mod manager;
pub mod names;
pub mod pki;
pub mod quoting;
pub mod ssa;
pub mod store;
pub mod validation;

#[cfg(feature = "testing")]
pub mod testing;
