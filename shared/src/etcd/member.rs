//! What etcd reports about members, in our own types so callers never touch protobuf shapes.

use super::error::EtcdError;

/// One entry of the cluster membership, as `MemberList` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub id: u64,
    /// Empty until the member has started and published itself (etcd leaves it blank).
    pub name: String,
    pub peer_urls: Vec<String>,
    /// Empty until the member has started.
    pub client_urls: Vec<String>,
    pub is_learner: bool,
}

impl Member {
    /// Whether the member's process has joined and published its name: an added but unstarted
    /// member is the "pending" member the membership rules wait for.
    pub fn is_started(&self) -> bool {
        !self.name.is_empty()
    }

    pub(crate) fn from_client(member: &etcd_client::Member) -> Member {
        Member {
            id: member.id(),
            name: member.name().to_string(),
            peer_urls: member.peer_urls().to_vec(),
            client_urls: member.client_urls().to_vec(),
            is_learner: member.is_learner(),
        }
    }
}

/// A member's view of itself and of the raft group (the Maintenance `Status` call).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberStatus {
    pub member_id: u64,
    /// `None` while this member knows no leader (election in progress or quorum lost).
    pub leader_id: Option<u64>,
    pub version: String,
    /// Bytes the backend database file takes.
    pub db_size: u64,
    /// Bytes of it in use; the rest is free pages a defragmentation returns (etcd ≥ 3.4).
    pub db_size_in_use: u64,
    /// The backend quota, when the member says (etcd ≥ 3.6; older ones do not report it).
    pub db_size_quota: Option<u64>,
    pub raft_term: u64,
    pub raft_index: u64,
    /// The revision of the member's own store (from the answer's header: no quorum needed).
    pub revision: i64,
    pub is_learner: bool,
    /// Errors the member reports about itself (e.g. a raised alarm), verbatim.
    pub errors: Vec<String>,
}

impl MemberStatus {
    /// Whether the member answering is the leader it reports.
    pub fn is_leader(&self) -> bool {
        self.leader_id == Some(self.member_id)
    }
}

/// An alarm raised on a member; an alarmed cluster refuses writes until it is cleared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Alarm {
    pub member_id: u64,
    pub kind: AlarmKind,
}

/// The kinds of alarm etcd raises.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AlarmKind {
    /// The backend database reached its quota.
    NoSpace,
    /// A corruption check found the member's data inconsistent.
    Corrupt,
}

impl AlarmKind {
    /// Every kind, in etcd's order.
    pub const ALL: [AlarmKind; 2] = [AlarmKind::NoSpace, AlarmKind::Corrupt];

    /// The kind etcd calls `name`, if it is one.
    pub fn from_name(name: &str) -> Option<AlarmKind> {
        AlarmKind::ALL.into_iter().find(|kind| kind.as_str() == name)
    }

    /// etcd's own name for the alarm.
    pub fn as_str(self) -> &'static str {
        match self {
            AlarmKind::NoSpace => "NOSPACE",
            AlarmKind::Corrupt => "CORRUPT",
        }
    }
}

impl std::fmt::Display for AlarmKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A member ID as etcdctl prints it: 16 lowercase hex digits.
pub fn member_id_hex(id: u64) -> String {
    format!("{id:016x}")
}

/// Read a member ID written in hex (etcdctl's format, any case, leading zeros optional, an
/// optional `0x`), as found in `status.members[].memberID` or typed by a user.
pub fn parse_member_id(text: &str) -> Result<u64, EtcdError> {
    let trimmed = text.trim();
    let digits = trimmed
        .strip_prefix("0x")
        .or_else(|| trimmed.strip_prefix("0X"))
        .unwrap_or(trimmed);
    let well_formed =
        !digits.is_empty() && digits.len() <= 16 && digits.bytes().all(|b| b.is_ascii_hexdigit());
    if !well_formed {
        return Err(EtcdError::InvalidInput(format!(
            "member ID {text:?} is not a hex number of at most 16 digits (e.g. 8e9e05c52164694d)"
        )));
    }
    u64::from_str_radix(digits, 16).map_err(|e| EtcdError::InvalidInput(format!("member ID {text:?}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_ids_render_like_etcdctl_and_round_trip() {
        assert_eq!(member_id_hex(0x8e9e05c52164694d), "8e9e05c52164694d");
        assert_eq!(member_id_hex(1), "0000000000000001");
        assert_eq!(member_id_hex(u64::MAX), "ffffffffffffffff");
        for id in [0, 1, 0xabc, 0x8e9e05c52164694d, u64::MAX] {
            assert_eq!(parse_member_id(&member_id_hex(id)).unwrap(), id);
        }
        assert_eq!(parse_member_id("8E9E05C52164694D").unwrap(), 0x8e9e05c52164694d);
        assert_eq!(parse_member_id("0x1f").unwrap(), 0x1f);
        assert_eq!(parse_member_id(" 1f ").unwrap(), 0x1f);
    }

    #[test]
    fn malformed_member_ids_are_refused_with_the_expected_format() {
        for bad in ["", "0x", "xyz", "-1", "+1", "1 2", "10000000000000000", "８"] {
            let err = parse_member_id(bad).unwrap_err();
            assert!(matches!(err, EtcdError::InvalidInput(_)), "{bad:?}: {err}");
            assert!(err.to_string().contains("hex"), "{err}");
        }
    }

    #[test]
    fn started_means_the_member_published_its_name() {
        let mut member = Member {
            id: 7,
            name: String::new(),
            peer_urls: vec!["https://127.0.0.1:2380".into()],
            client_urls: vec![],
            is_learner: true,
        };
        assert!(!member.is_started());
        member.name = "etcd-a".into();
        assert!(member.is_started());
    }
}
