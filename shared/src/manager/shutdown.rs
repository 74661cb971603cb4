//! One shutdown signal (SIGINT/SIGTERM or a test's trigger) fanned out to every controller,
//! server and the lease, so they stop in order instead of being killed mid-write.

use std::sync::Arc;

use tokio::sync::watch;
use tracing::info;

/// Triggers shutdown. Cheap to clone; all clones trigger the same signal.
#[derive(Clone, Debug)]
pub struct Shutdown {
    sender: Arc<watch::Sender<bool>>,
}

/// Resolves once shutdown is triggered. Clone it for every task that must stop.
#[derive(Clone, Debug)]
pub struct ShutdownSignal {
    receiver: watch::Receiver<bool>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    pub fn new() -> Self {
        let (sender, _) = watch::channel(false);
        Shutdown {
            sender: Arc::new(sender),
        }
    }

    /// Trigger shutdown; idempotent.
    pub fn trigger(&self) {
        self.sender.send_replace(true);
    }

    /// A signal that resolves when [`Shutdown::trigger`] is called.
    pub fn signal(&self) -> ShutdownSignal {
        ShutdownSignal {
            receiver: self.sender.subscribe(),
        }
    }

    /// Trigger on the first SIGINT or SIGTERM (Kubernetes sends SIGTERM on pod deletion).
    pub fn trigger_on_os_signals(&self) -> std::io::Result<()> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut terminate = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        let shutdown = self.clone();
        tokio::spawn(async move {
            let name = tokio::select! {
                _ = terminate.recv() => "SIGTERM",
                _ = interrupt.recv() => "SIGINT",
            };
            info!(signal = name, "shutting down");
            shutdown.trigger();
        });
        Ok(())
    }
}

impl ShutdownSignal {
    /// Whether shutdown has been triggered.
    pub fn is_triggered(&self) -> bool {
        *self.receiver.borrow()
    }

    /// Wait for shutdown. Also resolves if every [`Shutdown`] handle is gone, since nothing could
    /// trigger it any more.
    pub async fn wait(mut self) {
        let _ = self.receiver.wait_for(|triggered| *triggered).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn every_signal_resolves_once_triggered() {
        let shutdown = Shutdown::new();
        let a = shutdown.signal();
        let b = a.clone();
        assert!(!a.is_triggered());
        let waiting = tokio::spawn(b.wait());
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished());
        shutdown.trigger();
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .unwrap()
            .unwrap();
        assert!(a.is_triggered());
        // A signal taken after the trigger resolves at once.
        tokio::time::timeout(Duration::from_secs(1), shutdown.signal().wait())
            .await
            .unwrap();
    }
}
