//! The load balancer of a cluster's control plane endpoint, as CAPD's haproxy is: a TCP proxy on
//! the SimCluster's `spec.controlPlaneEndpoint` that hands each connection to one of the control
//! plane hosts whose API server is up, trying the next when one refuses. It is what the
//! `<cluster>-kubeconfig` Secret and a joining host's kubeadm reach.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tracing::debug;

/// How long one backend may take to accept before the next is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The API servers that are up, by cluster and then by host (Machine) name.
#[derive(Clone, Default)]
pub struct Backends(Arc<Mutex<BTreeMap<String, BTreeMap<String, SocketAddr>>>>);

impl Backends {
    /// Host `machine` of `cluster` serves at `address` from now on.
    pub fn add(&self, cluster: &str, machine: &str, address: SocketAddr) {
        self.lock()
            .entry(cluster.to_string())
            .or_default()
            .insert(machine.to_string(), address);
    }

    /// Host `machine` serves no more (powered off).
    pub fn remove(&self, machine: &str) {
        for hosts in self.lock().values_mut() {
            hosts.remove(machine);
        }
    }

    /// Where `cluster`'s API servers are, by host name.
    pub fn of(&self, cluster: &str) -> BTreeMap<String, SocketAddr> {
        self.lock().get(cluster).cloned().unwrap_or_default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, BTreeMap<String, SocketAddr>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A running load balancer; dropping it closes the listener and every proxied connection.
pub struct LoadBalancer {
    pub address: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LoadBalancer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Listen on `address` for `cluster`, forwarding to its [`Backends`] in turn.
pub async fn start(address: SocketAddr, cluster: &str, backends: Backends) -> std::io::Result<LoadBalancer> {
    let listener = TcpListener::bind(address).await?;
    let address = listener.local_addr()?;
    let cluster = cluster.to_string();
    let task = tokio::spawn(async move {
        let next = Arc::new(AtomicUsize::new(0));
        let mut connections = JoinSet::new();
        while let Ok((client, peer)) = listener.accept().await {
            let hosts: Vec<SocketAddr> = backends.of(&cluster).into_values().collect();
            let first = next.fetch_add(1, Ordering::Relaxed);
            connections.spawn(async move {
                if let Err(e) = proxy(client, &hosts, first).await {
                    debug!(%peer, error = %e, "load balancer connection ended");
                }
            });
            while connections.try_join_next().is_some() {}
        }
    });
    Ok(LoadBalancer { address, task })
}

/// Connect to the first of `hosts` (from `first`, round robin) that accepts, then pipe both ways.
async fn proxy(mut client: TcpStream, hosts: &[SocketAddr], first: usize) -> std::io::Result<()> {
    for i in 0..hosts.len() {
        let host = hosts[(first + i) % hosts.len()];
        if let Ok(Ok(mut backend)) = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(host)).await {
            tokio::io::copy_bidirectional(&mut client, &mut backend).await?;
            return Ok(());
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        format!("no API server up among {hosts:?}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn skips_a_host_that_is_down_and_forwards_to_one_that_is_up() {
        let up = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let up_address = up.local_addr().unwrap();
        let down_address = {
            let down = TcpListener::bind("127.0.0.1:0").await.unwrap();
            down.local_addr().unwrap()
        };
        let backends = Backends::default();
        backends.add("c1", "a-down", down_address);
        backends.add("c1", "b-up", up_address);
        let balancer = start("127.0.0.1:0".parse().unwrap(), "c1", backends)
            .await
            .unwrap();
        tokio::spawn(async move {
            let (mut server, _) = up.accept().await.unwrap();
            let mut buffer = [0u8; 4];
            server.read_exact(&mut buffer).await.unwrap();
            server.write_all(&buffer).await.unwrap();
        });
        // The first connection tries the host that is down first (round robin starts there).
        let mut client = TcpStream::connect(balancer.address).await.unwrap();
        client.write_all(b"ping").await.unwrap();
        let mut echoed = [0u8; 4];
        client.read_exact(&mut echoed).await.unwrap();
        assert_eq!(&echoed, b"ping");
    }
}
