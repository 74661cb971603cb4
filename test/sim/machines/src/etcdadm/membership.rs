//! Talking to the cluster as etcdadm does: MemberList through the given endpoint, MemberAdd as
//! a voter (retried with backoff while etcd refuses), MemberRemove (never retried), and the
//! health read that a learner refuses.

use std::time::{Duration, Instant};

use etcd_client::Client;
use etcdadm_shared::etcd::{EtcdTls, MemberClient, Refusal};

/// etcdadm's per-request timeout.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long `join` keeps retrying a refused MemberAdd.
const ADD_RETRY_BUDGET: Duration = Duration::from_secs(120);

/// A member as the membership API reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberInfo {
    pub id: u64,
    pub name: String,
    pub peer_urls: Vec<String>,
}

impl MemberInfo {
    fn from_client(member: &etcd_client::Member) -> MemberInfo {
        MemberInfo {
            id: member.id(),
            name: member.name().to_string(),
            peer_urls: member.peer_urls().to_vec(),
        }
    }

    /// A member that has started has published its name.
    pub fn started(&self) -> bool {
        !self.name.is_empty()
    }
}

/// The member owning `peer_url`, if any.
pub fn member_for_peer_url<'a>(members: &'a [MemberInfo], peer_url: &str) -> Option<&'a MemberInfo> {
    members.iter().find(|m| m.peer_urls.iter().any(|u| u == peer_url))
}

/// An etcd client on one connection to `endpoint`; errors come back as their text, which is
/// what etcdadm prints and what [`is_transient_refusal`] reads.
async fn connect(endpoint: &str, tls: &EtcdTls) -> Result<Client, String> {
    let member = MemberClient::new(endpoint, tls, REQUEST_TIMEOUT).map_err(|e| e.to_string())?;
    member.etcd_client().await.map_err(|e| e.to_string())
}

/// MemberList through `endpoint`. Like the Go client, an endpoint that cannot be reached (or a
/// string that is not one URL, such as a comma list) is retried until the request deadline,
/// then reported as `context deadline exceeded`.
pub async fn list_members(endpoint: &str, tls: &EtcdTls) -> Result<Vec<MemberInfo>, String> {
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    let mut last_error = String::new();
    while Instant::now() < deadline {
        let attempt = async {
            let mut client = connect(endpoint, tls).await?;
            client.member_list().await.map_err(|e| e.to_string())
        };
        match tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), attempt).await {
            Ok(Ok(response)) => return Ok(response.members().iter().map(MemberInfo::from_client).collect()),
            Ok(Err(e)) => last_error = e,
            Err(_) => break,
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    if !last_error.is_empty() {
        eprintln!(
            "{}",
            crate::log::go_log_line(&format!("[membership] last attempt: {last_error}"))
        );
    }
    Err("context deadline exceeded".into())
}

/// Whether etcd refused a membership change only for now (a recent change, a member catching up).
pub fn is_transient_refusal(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    [
        "unhealthy cluster",
        "too many learner",
        "not enough started members",
        "timed out",
        "deadline",
        "unavailable",
        "leader changed",
        "no leader",
    ]
    .iter()
    .any(|needle| message.contains(needle))
}

/// MemberAdd (voting) through `endpoint`, retried with exponential backoff while etcd refuses
/// transiently and `retry` is set. Returns the added member and the membership after the add.
pub async fn add_member(
    endpoint: &str,
    tls: &EtcdTls,
    peer_url: &str,
    retry: bool,
) -> Result<(MemberInfo, Vec<MemberInfo>), String> {
    let give_up = Instant::now() + ADD_RETRY_BUDGET;
    let mut backoff = Duration::from_millis(500);
    loop {
        let attempt = async {
            let mut client = connect(endpoint, tls).await?;
            client
                .member_add([peer_url], None)
                .await
                .map_err(|e| e.to_string())
        };
        let error = match tokio::time::timeout(REQUEST_TIMEOUT, attempt).await {
            Ok(Ok(response)) => {
                let members: Vec<MemberInfo> = response
                    .member_list()
                    .iter()
                    .map(MemberInfo::from_client)
                    .collect();
                let added = response
                    .member()
                    .map(MemberInfo::from_client)
                    .ok_or_else(|| "error adding member: etcd named no added member".to_string())?;
                return Ok((added, members));
            }
            Ok(Err(e)) => e,
            Err(_) => "context deadline exceeded".to_string(),
        };
        if !retry || !is_transient_refusal(&error) || Instant::now() + backoff > give_up {
            return Err(format!("error adding member: {error}"));
        }
        eprintln!(
            "{}",
            crate::log::go_log_line(&format!(
                "[membership] Error adding member: {error}; retrying in {backoff:?}"
            ))
        );
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(8));
    }
}

/// MemberRemove through `endpoint`, once.
pub async fn remove_member(endpoint: &str, tls: &EtcdTls, id: u64) -> Result<(), String> {
    let attempt = async {
        let mut client = connect(endpoint, tls).await?;
        client.member_remove(id).await.map_err(|e| e.to_string())
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, attempt).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("[membership] Error removing member: {e}")),
        Err(_) => Err("[membership] Error removing member: context deadline exceeded".into()),
    }
}

/// How long etcdadm's last health read keeps trying while the member is a learner, which refuses
/// linearizable reads: measured with upstream etcdadm and etcd 3.5.1, it gives up about 2.7 s
/// after etcd is ready, so a learner not promoted by then fails the join.
pub const LEARNER_PATIENCE: Duration = Duration::from_millis(2700);

/// Linearizable reads through `endpoint` until one succeeds (the cluster reached consensus on
/// it): a learner's refusal is given up on after [`LEARNER_PATIENCE`], anything else after
/// `budget`. The error is etcd's own words.
pub async fn wait_healthy(endpoint: &str, tls: &EtcdTls, budget: Duration) -> Result<(), String> {
    let started = Instant::now();
    let member = MemberClient::new(endpoint, tls, REQUEST_TIMEOUT).map_err(|e| e.to_string())?;
    loop {
        let attempt = async {
            let mut client = member.etcd_client().await.map_err(|e| e.to_string())?;
            client.get("health", None).await.map_err(|e| match e {
                etcd_client::Error::GRpcStatus(status) => status.message().to_string(),
                other => other.to_string(),
            })
        };
        let error = match tokio::time::timeout(REQUEST_TIMEOUT, attempt).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) => e,
            Err(_) => "context deadline exceeded".to_string(),
        };
        let learner = Refusal::from_message(&error) == Refusal::NotForLearners;
        let (patience, pause) = if learner {
            (LEARNER_PATIENCE, Duration::from_millis(100))
        } else {
            (budget, Duration::from_millis(500))
        };
        if started.elapsed() >= patience {
            return Err(error);
        }
        tokio::time::sleep(pause).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_members_by_peer_url() {
        let members = vec![
            MemberInfo {
                id: 1,
                name: "a".into(),
                peer_urls: vec!["https://a:2380".into()],
            },
            MemberInfo {
                id: 2,
                name: String::new(),
                peer_urls: vec!["https://b:2380".into()],
            },
        ];
        assert_eq!(
            member_for_peer_url(&members, "https://b:2380").map(|m| m.id),
            Some(2)
        );
        assert!(member_for_peer_url(&members, "https://c:2380").is_none());
        assert!(members[0].started());
        assert!(!members[1].started());
    }

    #[test]
    fn transient_refusals() {
        assert!(is_transient_refusal(
            "grpc request error: status: Unavailable, message: \"etcdserver: unhealthy cluster\""
        ));
        assert!(!is_transient_refusal("etcdserver: Peer URLs already exists"));
    }
}
