//! Failures of etcd calls, sorted by what the caller does next: retry later (unreachable,
//! timeout), fix certificates (TLS), respect etcd's refusal (refused), or report a bug (protocol).

use std::error::Error as StdError;
use std::time::Duration;

use crate::category::ErrorCategory;

/// Why a call to one etcd member failed.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error(
        "etcd member at {endpoint} is unreachable ({operation}): {message}; check that the member \
         runs and listens on that address"
    )]
    Unreachable {
        endpoint: String,
        operation: &'static str,
        message: String,
    },
    #[error(
        "etcd member at {endpoint} did not answer {operation} within {timeout:?}; it may be \
         stopped, overloaded or cut off"
    )]
    Timeout {
        endpoint: String,
        operation: &'static str,
        timeout: Duration,
    },
    #[error(
        "TLS with etcd member at {endpoint} failed ({operation}): {message}; the client \
         certificate and the member's serving certificate must both be signed by the cluster's \
         etcd CA, and the serving certificate must name this address"
    )]
    Tls {
        endpoint: String,
        operation: &'static str,
        message: String,
    },
    #[error("etcd member at {endpoint} refused {operation}: {message}{}", .refusal.hint())]
    Refused {
        endpoint: String,
        operation: &'static str,
        refusal: Refusal,
        /// etcd's own words, kept verbatim.
        message: String,
    },
    #[error("unexpected answer from etcd member at {endpoint} to {operation}: {message}")]
    Protocol {
        endpoint: String,
        operation: &'static str,
        message: String,
    },
    #[error("invalid etcd client input: {0}")]
    InvalidInput(String),
}

impl EtcdError {
    /// The category for Event reasons and metric labels.
    pub fn category(&self) -> ErrorCategory {
        match self {
            EtcdError::Unreachable { .. } => ErrorCategory::EtcdUnreachable,
            EtcdError::Timeout { .. } => ErrorCategory::EtcdTimeout,
            EtcdError::Tls { .. } => ErrorCategory::EtcdTls,
            EtcdError::Refused { .. } => ErrorCategory::EtcdRefused,
            EtcdError::Protocol { .. } => ErrorCategory::EtcdProtocol,
            EtcdError::InvalidInput(_) => ErrorCategory::EtcdInvalidInput,
        }
    }

    /// What etcd refused, when it did.
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            EtcdError::Refused { refusal, .. } => Some(*refusal),
            _ => None,
        }
    }
}

/// The refusals a membership planner reacts to; everything else is [`Refusal::Other`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The call must go to the leader (MoveLeader).
    NotLeader,
    /// The member knows no leader: election running or quorum lost.
    NoLeader,
    /// Strict reconfiguration check: not every voting member is connected (e.g. one was just
    /// added and has not started, or has just joined).
    UnhealthyCluster,
    /// Too few started voting members for the change to keep quorum.
    NotEnoughStartedMembers,
    /// etcd allows one learner at a time.
    TooManyLearners,
    /// The learner has not caught up with the leader yet (or has not started); promote again
    /// later.
    LearnerNotReady,
    /// The member answering is a learner: it serves only `Status` and serializable reads.
    NotForLearners,
    MemberNotFound,
    /// Promote of a member that is already voting.
    MemberNotLearner,
    /// Another member already uses this peer URL.
    PeerUrlExists,
    /// MoveLeader to a member that cannot lead (unknown, learner).
    BadLeaderTransferee,
    /// etcd's own deadline for the request passed (usually no quorum to commit it).
    RequestTimedOut,
    /// A compaction at or below a revision compacted already.
    Compacted,
    /// The NOSPACE alarm is raised: the cluster refuses writes until it is disarmed.
    NoSpace,
    /// The CORRUPT alarm is raised: the cluster refuses writes until it is disarmed.
    Corrupt,
    Other,
}

impl Refusal {
    /// Recognise a refusal from etcd's error message (etcd's gRPC errors carry fixed texts).
    pub fn from_message(message: &str) -> Refusal {
        let m = message.to_ascii_lowercase();
        let table: [(&str, Refusal); 15] = [
            ("not leader", Refusal::NotLeader),
            ("no leader", Refusal::NoLeader),
            ("unhealthy cluster", Refusal::UnhealthyCluster),
            ("not enough started members", Refusal::NotEnoughStartedMembers),
            ("too many learner", Refusal::TooManyLearners),
            ("in sync with leader", Refusal::LearnerNotReady),
            ("not supported for learner", Refusal::NotForLearners),
            ("member not found", Refusal::MemberNotFound),
            ("can only promote a learner member", Refusal::MemberNotLearner),
            ("peer urls already exists", Refusal::PeerUrlExists),
            ("bad leader transferee", Refusal::BadLeaderTransferee),
            ("request timed out", Refusal::RequestTimedOut),
            ("required revision has been compacted", Refusal::Compacted),
            ("database space exceeded", Refusal::NoSpace),
            ("corrupt cluster", Refusal::Corrupt),
        ];
        table
            .iter()
            .find(|(needle, _)| m.contains(needle))
            .map_or(Refusal::Other, |(_, refusal)| *refusal)
    }

    fn hint(self) -> &'static str {
        match self {
            Refusal::NotLeader => "; send this call to the current leader (see status().leader_id)",
            Refusal::NoLeader => "; the cluster has no leader: wait for an election or restore quorum",
            Refusal::UnhealthyCluster | Refusal::NotEnoughStartedMembers => {
                "; wait until every voting member is started and connected, then retry"
            }
            Refusal::TooManyLearners => "; promote or remove the existing learner first",
            Refusal::LearnerNotReady => "; the learner is still catching up, retry shortly",
            Refusal::NotForLearners => "; ask a voting member, or promote this learner first",
            Refusal::MemberNotFound => "; the member is not (or no longer) in the cluster",
            Refusal::RequestTimedOut => "; the cluster could not commit it in time, check quorum",
            Refusal::NoSpace => "; compact, defragment and disarm the NOSPACE alarm, or raise the quota",
            Refusal::Corrupt => "; a member's data differs from the others': replace it, then disarm CORRUPT",
            Refusal::MemberNotLearner
            | Refusal::PeerUrlExists
            | Refusal::BadLeaderTransferee
            | Refusal::Compacted
            | Refusal::Other => "",
        }
    }
}

/// Sort an etcd-client failure.
pub(crate) fn from_client_error(
    endpoint: &str,
    operation: &'static str,
    timeout: Duration,
    err: etcd_client::Error,
) -> EtcdError {
    match err {
        etcd_client::Error::GRpcStatus(status) => from_status(
            endpoint,
            operation,
            timeout,
            i32::from(status.code()),
            status.message(),
            StdError::source(&status),
        ),
        etcd_client::Error::TransportError(e) => from_transport(endpoint, operation, &e),
        etcd_client::Error::IoError(e) => from_transport(endpoint, operation, &e),
        etcd_client::Error::InvalidArgs(m) | etcd_client::Error::EndpointError(m) => {
            EtcdError::InvalidInput(format!("{endpoint}: {m}"))
        }
        etcd_client::Error::InvalidUri(e) => {
            EtcdError::InvalidInput(format!("{endpoint} is not a valid URL: {e}"))
        }
        other => EtcdError::Protocol {
            endpoint: endpoint.to_string(),
            operation,
            message: other.to_string(),
        },
    }
}

/// gRPC status codes (fixed by the gRPC wire protocol) this module tells apart.
mod grpc_code {
    pub const CANCELLED: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const DEADLINE_EXCEEDED: i32 = 4;
    pub const PERMISSION_DENIED: i32 = 7;
    pub const INTERNAL: i32 = 13;
    pub const UNAVAILABLE: i32 = 14;
    pub const UNAUTHENTICATED: i32 = 16;
}

fn from_status(
    endpoint: &str,
    operation: &'static str,
    timeout: Duration,
    code: i32,
    message: &str,
    source: Option<&(dyn StdError + 'static)>,
) -> EtcdError {
    // etcd prefixes every error it raises itself; anything else came from the transport.
    if message.starts_with("etcdserver:") {
        return EtcdError::Refused {
            endpoint: endpoint.to_string(),
            operation,
            refusal: Refusal::from_message(message),
            message: message.to_string(),
        };
    }
    if source.is_some_and(|s| {
        causes(s)
            .iter()
            .any(|e| e.is::<http_body_util::LengthLimitError>())
    }) {
        return EtcdError::Protocol {
            endpoint: endpoint.to_string(),
            operation,
            message: format!("answered with more than {} bytes", super::client::MAX_ANSWER),
        };
    }
    let detail = match source.map(chain_text) {
        Some(chain) if chain.contains(message) => chain,
        Some(chain) => format!("{message}: {chain}"),
        None => message.to_string(),
    };
    let endpoint = endpoint.to_string();
    match code {
        grpc_code::DEADLINE_EXCEEDED => EtcdError::Timeout {
            endpoint,
            operation,
            timeout,
        },
        grpc_code::UNAVAILABLE | grpc_code::UNKNOWN | grpc_code::CANCELLED | grpc_code::INTERNAL => {
            let tls = source.is_some_and(is_tls_failure) || mentions_tls(message);
            transport_failure(endpoint, operation, detail, tls)
        }
        grpc_code::UNAUTHENTICATED | grpc_code::PERMISSION_DENIED => EtcdError::Tls {
            endpoint,
            operation,
            message: detail,
        },
        _ => EtcdError::Protocol {
            endpoint,
            operation,
            message: detail,
        },
    }
}

/// A failure below gRPC or HTTP: TLS when anything in the cause chain is a TLS failure,
/// otherwise the member could not be reached.
pub(crate) fn from_transport(
    endpoint: &str,
    operation: &'static str,
    err: &(dyn StdError + 'static),
) -> EtcdError {
    transport_failure(
        endpoint.to_string(),
        operation,
        chain_text(err),
        is_tls_failure(err),
    )
}

fn transport_failure(endpoint: String, operation: &'static str, message: String, tls: bool) -> EtcdError {
    if tls {
        EtcdError::Tls {
            endpoint,
            operation,
            message,
        }
    } else {
        EtcdError::Unreachable {
            endpoint,
            operation,
            message,
        }
    }
}

/// Every error in the chain, including the payload of `io::Error`s (whose `source()` skips it).
fn causes<'a>(err: &'a (dyn StdError + 'static)) -> Vec<&'a (dyn StdError + 'static)> {
    let mut out = Vec::new();
    let mut next = Some(err);
    while let Some(e) = next {
        if out.len() > 32 {
            break;
        }
        out.push(e);
        next = match e.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()) {
            Some(inner) => Some(inner as &(dyn StdError + 'static)),
            None => e.source(),
        };
    }
    out
}

fn chain_text(err: &(dyn StdError + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    for e in causes(err) {
        let text = e.to_string();
        if !text.is_empty() && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
    }
    parts.join(": ")
}

fn is_tls_failure(err: &(dyn StdError + 'static)) -> bool {
    causes(err)
        .iter()
        .any(|e| e.downcast_ref::<rustls::Error>().is_some() || mentions_tls(&e.to_string()))
}

/// Errors that wrap a TLS failure only as text (tonic flattens some into strings).
fn mentions_tls(text: &str) -> bool {
    let text = text.to_ascii_lowercase();
    ["certificate", "handshake", "fatal alert"]
        .iter()
        .any(|needle| text.contains(needle))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_refusal_texts_are_recognised() {
        let cases = [
            ("etcdserver: not leader", Refusal::NotLeader),
            ("etcdserver: no leader", Refusal::NoLeader),
            ("etcdserver: unhealthy cluster", Refusal::UnhealthyCluster),
            (
                "etcdserver: re-configuration failed due to not enough started members",
                Refusal::NotEnoughStartedMembers,
            ),
            (
                "etcdserver: too many learner members in cluster",
                Refusal::TooManyLearners,
            ),
            (
                "etcdserver: can only promote a learner member which is in sync with leader",
                Refusal::LearnerNotReady,
            ),
            (
                "etcdserver: can only promote a learner member",
                Refusal::MemberNotLearner,
            ),
            (
                "etcdserver: rpc not supported for learner",
                Refusal::NotForLearners,
            ),
            ("etcdserver: member not found", Refusal::MemberNotFound),
            ("etcdserver: Peer URLs already exists", Refusal::PeerUrlExists),
            ("etcdserver: bad leader transferee", Refusal::BadLeaderTransferee),
            ("etcdserver: request timed out", Refusal::RequestTimedOut),
            ("etcdserver: something new", Refusal::Other),
        ];
        for (text, want) in cases {
            assert_eq!(Refusal::from_message(text), want, "{text}");
        }
    }

    #[test]
    fn refused_keeps_etcds_message_and_says_what_to_do() {
        let err = EtcdError::Refused {
            endpoint: "https://10.0.0.1:2379".into(),
            operation: "MoveLeader",
            refusal: Refusal::NotLeader,
            message: "etcdserver: not leader".into(),
        };
        let text = err.to_string();
        assert!(text.contains("etcdserver: not leader"), "{text}");
        assert!(text.contains("current leader"), "{text}");
        assert_eq!(err.category().as_str(), "EtcdRefused");
        assert_eq!(err.refusal(), Some(Refusal::NotLeader));
    }

    #[test]
    fn io_errors_wrapping_rustls_errors_count_as_tls() {
        let inner = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(rustls::AlertDescription::UnknownCA),
        );
        let err = from_transport("https://10.0.0.1:2379", "Status", &inner);
        assert!(matches!(err, EtcdError::Tls { .. }), "{err}");
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let err = from_transport("https://10.0.0.1:2379", "Status", &refused);
        assert!(matches!(err, EtcdError::Unreachable { .. }), "{err}");
        assert!(err.to_string().contains("connection refused"));
        let named = std::io::Error::other("dns error: failed to lookup address tls-etcd-0");
        let err = from_transport("https://tls-etcd-0:2379", "Status", &named);
        assert!(matches!(err, EtcdError::Unreachable { .. }), "{err}");
    }
}
