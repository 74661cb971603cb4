//! The API: our two groups (wire-compatible with the reference) and minimal CAPI views.

pub mod capi;
pub mod cluster;
pub mod conditions;
pub mod config;
pub mod quantity;
pub mod schema_rules;
pub mod snapshot;

pub use cluster::{EtcdadmCluster, EtcdadmClusterSpec, EtcdadmClusterStatus, MemberStatus};
pub use conditions::{Condition, ConditionStatus, NewCondition, Severity};
pub use config::{
    EtcdadmConfig, EtcdadmConfigSpec, EtcdadmConfigStatus, EtcdadmConfigTemplate, EtcdadmConfigTemplateSpec,
    Format,
};
pub use snapshot::{EtcdadmSnapshot, EtcdadmSnapshotSpec, EtcdadmSnapshotStatus, SnapshotPhase};
