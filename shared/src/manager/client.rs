//! The Kubernetes clients of a manager (kubeconfig or in-cluster config): the reconcilers', with
//! an optional client-side rate limit for `--kube-api-qps`/`--kube-api-burst`, and the metrics
//! guard's own.

use std::time::Duration;

use kube::Client;
use kube::client::ClientBuilder;
use tower::limit::RateLimitLayer;

/// Requests per window and the window, approximating a token bucket of `burst` tokens refilled
/// at `qps` per second with tower's fixed-window limiter: at most `burst` requests back to back,
/// and `qps` per second on average. `None`: no limit.
pub fn rate_limit(qps: Option<f64>, burst: Option<u32>) -> Option<(u64, Duration)> {
    let qps = qps.filter(|q| q.is_finite() && *q > 0.0)?;
    // The window holds at least one request; bursts default to the QPS, rounded up.
    let burst = burst.map_or_else(|| qps.ceil().max(1.0), |b| f64::from(b.max(1)));
    Some((burst as u64, Duration::from_secs_f64(burst / qps)))
}

/// The metrics guard's client for `config`: not rate limited (its callers are bounded by the
/// guard), and quick to give up on an API server that does not answer.
pub fn for_reviews(mut config: kube::Config) -> Result<Client, kube::Error> {
    config.connect_timeout = Some(super::diagnostics::REVIEW_TIMEOUT);
    config.read_timeout = Some(super::diagnostics::REVIEW_TIMEOUT);
    config.write_timeout = Some(super::diagnostics::REVIEW_TIMEOUT);
    Client::try_from(config)
}

/// A client for `config`, rate limited as [`rate_limit`] says.
pub fn from_config(
    config: kube::Config,
    qps: Option<f64>,
    burst: Option<u32>,
) -> Result<Client, kube::Error> {
    let builder = ClientBuilder::try_from(config)?;
    Ok(match rate_limit(qps, burst) {
        Some((requests, per)) => builder.with_layer(&RateLimitLayer::new(requests, per)).build(),
        None => builder.build(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qps_and_burst_become_a_window() {
        assert_eq!(rate_limit(None, None), None);
        assert_eq!(rate_limit(None, Some(30)), None);
        assert_eq!(
            rate_limit(Some(20.0), Some(30)),
            Some((30, Duration::from_millis(1500)))
        );
        assert_eq!(rate_limit(Some(5.0), None), Some((5, Duration::from_secs(1))));
        assert_eq!(rate_limit(Some(0.5), None), Some((1, Duration::from_secs(2))));
    }
}
