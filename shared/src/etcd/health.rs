//! Judging a member's `/health` answer. Only "200 and health true" is healthy: the reference
//! controller counted a 503 as healthy, which hid members that had lost quorum.

/// The verdict of one `/health` probe of a member that answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    pub healthy: bool,
    /// Why the member is unhealthy, in etcd's words where it gave any (e.g. `RAFT NO LEADER`).
    pub reason: Option<String>,
}

impl Health {
    /// Whether a member serves although `/health` (alarms excluded) answered false because of
    /// an alarm: etcd 3.4 before 3.4.23 ignores `exclude`, and etcd 3.5.1 excludes one alarm of
    /// each kind only (measured: once two members have raised NOSPACE it answers
    /// `ALARM NOSPACE`). Such a member serves when alarms are raised, its only complaint is an
    /// alarm (etcd's reason names one, or it gave none, as 3.4 does) and its Status follows a
    /// leader; the alarm is reported apart.
    pub fn serves_despite_alarms(&self, alarms_raised: bool, follows_leader: bool) -> bool {
        let alarm_only = self
            .reason
            .as_deref()
            .is_some_and(|r| r.starts_with("ALARM ") || r.ends_with(WITHOUT_REASON));
        !self.healthy && alarm_only && alarms_raised && follows_leader
    }
}

/// How a verdict of false without etcd's reason ends.
const WITHOUT_REASON: &str = "health not true";

/// How much of an unexpected body ends up in a reason: enough to recognise it, short enough
/// for a status message.
const BODY_EXCERPT: usize = 200;

/// Judge an HTTP answer from `/health`: `status` is the HTTP status code, `body` the raw body.
pub fn health_from_response(status: u16, body: &[u8]) -> Health {
    let parsed = serde_json::from_slice::<serde_json::Value>(body).ok();
    let flag = parsed.as_ref().and_then(|v| match v.get("health") {
        Some(serde_json::Value::String(s)) => Some(s == "true"),
        Some(serde_json::Value::Bool(b)) => Some(*b),
        _ => None,
    });
    let etcd_reason = parsed
        .as_ref()
        .and_then(|v| v.get("reason"))
        .and_then(|r| r.as_str())
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .map(str::to_string);
    match (status, flag) {
        (200, Some(true)) => Health {
            healthy: true,
            reason: None,
        },
        (_, Some(_)) => Health {
            healthy: false,
            reason: Some(etcd_reason.unwrap_or_else(|| format!("HTTP {status}, {WITHOUT_REASON}"))),
        },
        (_, None) => Health {
            healthy: false,
            reason: Some(format!(
                "HTTP {status} without a health verdict: {}",
                excerpt(body)
            )),
        },
    }
}

fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    match text.char_indices().nth(BODY_EXCERPT) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unhealthy(reason: &str) -> Health {
        Health {
            healthy: false,
            reason: Some(reason.into()),
        }
    }

    #[test]
    fn only_200_with_health_true_is_healthy() {
        let healthy = Health {
            healthy: true,
            reason: None,
        };
        assert_eq!(health_from_response(200, br#"{"health":"true"}"#), healthy);
        assert_eq!(
            health_from_response(200, br#"{"health":"true","reason":""}"#),
            healthy
        );
        assert_eq!(health_from_response(200, br#"{"health":true}"#), healthy);
    }

    #[test]
    fn a_503_is_unhealthy_with_etcds_reason() {
        assert_eq!(
            health_from_response(503, br#"{"health":"false","reason":"RAFT NO LEADER"}"#),
            unhealthy("RAFT NO LEADER")
        );
        // 503 with a body claiming health is still not healthy.
        assert_eq!(
            health_from_response(503, br#"{"health":"true"}"#),
            unhealthy("HTTP 503, health not true")
        );
        assert_eq!(
            health_from_response(200, br#"{"health":"false"}"#),
            unhealthy("HTTP 200, health not true")
        );
    }

    #[test]
    fn an_alarm_only_verdict_serves_while_alarms_are_raised_and_a_leader_is_followed() {
        let nospace = health_from_response(503, br#"{"health":"false","reason":"ALARM NOSPACE"}"#);
        let bare = health_from_response(503, br#"{"health":"false"}"#);
        for alarm in [&nospace, &bare] {
            assert!(alarm.serves_despite_alarms(true, true), "{alarm:?}");
            assert!(
                !alarm.serves_despite_alarms(false, true),
                "no alarm raised: {alarm:?}"
            );
            assert!(!alarm.serves_despite_alarms(true, false), "no leader: {alarm:?}");
        }
        let no_leader = health_from_response(503, br#"{"health":"false","reason":"RAFT NO LEADER"}"#);
        assert!(!no_leader.serves_despite_alarms(true, true));
        let range = health_from_response(503, br#"{"health":"false","reason":"RANGE ERROR:timeout"}"#);
        assert!(!range.serves_despite_alarms(true, true));
        let garbage = health_from_response(502, b"bad gateway");
        assert!(!garbage.serves_despite_alarms(true, true));
        let healthy = health_from_response(200, br#"{"health":"true"}"#);
        assert!(
            !healthy.serves_despite_alarms(true, true),
            "healthy needs no excuse"
        );
    }

    #[test]
    fn bodies_without_a_verdict_are_unhealthy_and_quoted() {
        let h = health_from_response(200, b"<html>hello</html>");
        assert!(!h.healthy);
        assert_eq!(
            h.reason.as_deref(),
            Some("HTTP 200 without a health verdict: <html>hello</html>")
        );
        let h = health_from_response(404, b"");
        assert!(!h.healthy && h.reason.unwrap().starts_with("HTTP 404"));
        let long = "é".repeat(1000);
        let h = health_from_response(500, long.as_bytes());
        assert!(h.reason.unwrap().ends_with("..."));
        let h = health_from_response(200, &[0xff, 0xfe, b'{']);
        assert!(!h.healthy);
        assert_eq!(
            health_from_response(200, br#"{"health":"yes"}"#),
            unhealthy("HTTP 200, health not true")
        );
    }
}
