//! The kubelet's streaming endpoint of a control plane host, for `pods/portforward` only: the
//! real KubeadmControlPlane reads each new Machine's API server certificate expiry by
//! port-forwarding to its `kube-apiserver-<node>` pod (and fails its reconcile until it can),
//! so the API server dials `https://<node address>:10250/portForward/...` and hands over SPDY.
//! Every pod here is a static pod on the host network, so a forwarded port is the host's.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::{debug, warn};

use etcdadm_shared::pki::{CertificateAuthority, KeyType, LeafRequest, Usage};

use crate::error::SimError;
use crate::spdy::{self, Frame, HeaderDecoder, HeaderEncoder, SpdyError};

/// The kubelet's port, which the Node reports as its `daemonEndpoints.kubeletEndpoint`.
pub const KUBELET_PORT: u16 = 10250;
/// The sub-protocol of `kubectl port-forward` and KCP's dialer.
const PROTOCOL: &str = "portforward.k8s.io";
/// Frames queued towards the peer before the forwarders wait.
const QUEUE: usize = 64;

/// The endpoint while it serves; dropping it closes the listener and every connection.
pub struct PortForward {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for PortForward {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn setup(what: &str) -> impl Fn(&dyn std::fmt::Display) -> SimError + '_ {
    move |e| SimError::Setup(format!("kubelet port-forward {what}: {e}"))
}

/// Serve on `address`:10250 with a serving certificate for `node` from the cluster CA (the API
/// server does not verify it unless told a kubelet CA, as here).
pub async fn serve(address: IpAddr, node: &str, ca: &CertificateAuthority) -> Result<PortForward, SimError> {
    let leaf = ca
        .issue(&LeafRequest {
            common_name: node.to_string(),
            organizations: vec![],
            dns_names: vec![node.to_string()],
            ips: vec![address],
            usage: Usage {
                client: false,
                server: true,
            },
            validity: Duration::from_secs(365 * 24 * 3600),
            key_type: KeyType::EcdsaP256,
        })
        .map_err(|e| setup("certificate")(&e))?;
    let chain = CertificateDer::pem_slice_iter(leaf.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| setup("certificate")(&e))?;
    let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).map_err(|e| setup("key")(&e))?;
    let config =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| setup("TLS")(&e))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| setup("TLS")(&e))?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = listen(address).await?;
    let task = tokio::spawn(async move {
        let mut connections = JoinSet::new();
        while let Ok((tcp, peer)) = listener.accept().await {
            let acceptor = acceptor.clone();
            connections.spawn(async move {
                match connection(tcp, acceptor, address).await {
                    Err(e @ SpdyError::Protocol(_)) => warn!(%peer, error = %e, "port-forward refused"),
                    Err(e) => debug!(%peer, error = %e, "port-forward connection ended"),
                    Ok(()) => {}
                }
            });
            while connections.try_join_next().is_some() {}
        }
    });
    Ok(PortForward { task })
}

/// Bind `address`:10250, waiting out a host powered off on the same address a moment ago
/// (its listener closes when its task is next polled).
async fn listen(address: IpAddr) -> Result<TcpListener, SimError> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match TcpListener::bind((address, KUBELET_PORT)).await {
            Ok(listener) => return Ok(listener),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(setup(&format!("listening on {address}:{KUBELET_PORT}"))(&e)),
        }
    }
}

async fn connection(
    tcp: TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    host: IpAddr,
) -> Result<(), SpdyError> {
    let tls = acceptor.accept(tcp).await?;
    let mut stream = BufReader::new(tls);
    let (path, headers) = read_request(&mut stream).await?;
    debug!(path, "kubelet request");
    let upgrade = headers
        .get("upgrade")
        .is_some_and(|u| u.eq_ignore_ascii_case("SPDY/3.1"));
    let offers = headers
        .get("x-stream-protocol-version")
        .cloned()
        .unwrap_or_default();
    let refusal = if !path.starts_with("/portForward/") {
        Some("404 Not Found")
    } else if !upgrade || !offers.split(',').any(|p| p.trim() == PROTOCOL) {
        Some("400 Bad Request")
    } else {
        None
    };
    if let Some(status) = refusal {
        let answer = format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        stream.write_all(answer.as_bytes()).await?;
        return Ok(stream.shutdown().await?);
    }
    let answer = format!(
        "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
         X-Stream-Protocol-Version: {PROTOCOL}\r\n\r\n"
    );
    stream.write_all(answer.as_bytes()).await?;
    stream.flush().await?;
    session(stream, host).await
}

/// The request line's path and the headers (names lower case, repeated values joined by `,`).
async fn read_request<S: AsyncRead + Unpin>(
    stream: &mut BufReader<S>,
) -> Result<(String, HashMap<String, String>), SpdyError> {
    let mut line = String::new();
    stream.read_line(&mut line).await?;
    let path = line.split_whitespace().nth(1).unwrap_or_default().to_string();
    let mut headers: HashMap<String, String> = HashMap::new();
    for _ in 0..100 {
        line.clear();
        if stream.read_line(&mut line).await? == 0 || line.trim().is_empty() {
            return Ok((path, headers));
        }
        if let Some((name, value)) = line.split_once(':') {
            let entry = headers.entry(name.trim().to_ascii_lowercase()).or_default();
            if !entry.is_empty() {
                entry.push(',');
            }
            entry.push_str(value.trim());
        }
    }
    Err(SpdyError::Protocol(
        "request has more than 100 header lines".into(),
    ))
}

/// The streams of one SPDY session.
struct Streams {
    decoder: HeaderDecoder,
    encoder: HeaderEncoder,
    /// The `error` stream of each request ID.
    errors: HashMap<String, u32>,
    /// Where each `data` stream's bytes go (`None`: the peer closed its half).
    forwards: HashMap<u32, mpsc::Sender<Option<Vec<u8>>>>,
}

/// One SPDY session: each `data` stream is forwarded to its port on the host; its `error`
/// stream (same request ID) carries a failure to connect.
async fn session<S: AsyncRead + AsyncWrite + Send + 'static>(
    stream: S,
    host: IpAddr,
) -> Result<(), SpdyError> {
    let (mut reader, mut writer) = tokio::io::split(stream);
    let (to_peer, mut outgoing) = mpsc::channel::<Vec<u8>>(QUEUE);
    let mut tasks = JoinSet::new();
    tasks.spawn(async move {
        while let Some(frame) = outgoing.recv().await {
            if writer.write_all(&frame).await.is_err() || writer.flush().await.is_err() {
                break;
            }
        }
    });
    let mut streams = Streams {
        decoder: HeaderDecoder::default(),
        encoder: HeaderEncoder::default(),
        errors: HashMap::new(),
        forwards: HashMap::new(),
    };
    while let Some(frame) = spdy::read_frame(&mut reader).await? {
        match frame {
            Frame::Control {
                kind: spdy::SYN_STREAM,
                payload,
                ..
            } => {
                if let Some(forward) = streams.open(&payload, host, &to_peer).await? {
                    tasks.spawn(forward);
                }
            }
            Frame::Control {
                kind: spdy::PING,
                payload,
                ..
            } => send(&to_peer, spdy::control_frame(spdy::PING, 0, &payload)).await,
            Frame::Control {
                kind: spdy::GOAWAY, ..
            } => break,
            Frame::Control {
                kind: spdy::RST_STREAM,
                payload,
                ..
            } => {
                streams.forwards.remove(&spdy::stream_id(&payload)?);
            }
            Frame::Control { .. } => {}
            Frame::Data {
                stream,
                flags,
                payload,
            } => streams.deliver(stream, flags, payload).await,
        }
    }
    Ok(())
}

impl Streams {
    /// Accept the stream a SYN_STREAM opens; a `data` stream's forwarder is returned to run.
    async fn open(
        &mut self,
        payload: &[u8],
        host: IpAddr,
        to_peer: &mpsc::Sender<Vec<u8>>,
    ) -> Result<Option<impl Future<Output = ()> + Send + 'static>, SpdyError> {
        let (id, headers) = spdy::syn_stream(payload, &mut self.decoder)?;
        debug!(id, ?headers, "SYN_STREAM");
        send(to_peer, spdy::syn_reply(id, &mut self.encoder)).await;
        let request = spdy::header(&headers, "requestid")
            .unwrap_or_default()
            .to_string();
        match spdy::header(&headers, "streamtype") {
            Some("error") => {
                self.errors.insert(request, id);
                Ok(None)
            }
            Some("data") => {
                let port = spdy::header(&headers, "port").and_then(|p| p.parse::<u16>().ok());
                let (to_target, from_peer) = mpsc::channel(QUEUE);
                self.forwards.insert(id, to_target);
                let streams = (id, self.errors.get(&request).copied());
                let target = port.map(|port| SocketAddr::new(host, port));
                Ok(Some(forward(target, streams, from_peer, to_peer.clone())))
            }
            _ => Ok(None),
        }
    }

    /// A data frame from the peer: to its stream's forwarder, FIN closing that half.
    async fn deliver(&mut self, stream: u32, flags: u8, payload: Vec<u8>) {
        let Some(to_target) = self.forwards.get(&stream) else {
            return;
        };
        if !payload.is_empty() {
            let _ = to_target.send(Some(payload)).await;
        }
        if flags & spdy::FLAG_FIN != 0 {
            let _ = to_target.send(None).await;
            self.forwards.remove(&stream);
        }
    }
}

async fn send(to_peer: &mpsc::Sender<Vec<u8>>, frame: Vec<u8>) {
    let _ = to_peer.send(frame).await;
}

/// Pipe one data stream to `target` and back; a failure to connect goes to the error stream.
async fn forward(
    target: Option<SocketAddr>,
    (data, error): (u32, Option<u32>),
    mut from_peer: mpsc::Receiver<Option<Vec<u8>>>,
    to_peer: mpsc::Sender<Vec<u8>>,
) {
    let connected = match target {
        Some(target) => TcpStream::connect(target)
            .await
            .map_err(|e| format!("error forwarding port to {target}: {e}")),
        None => Err("port-forward request without a valid port header".to_string()),
    };
    let tcp = match connected {
        Ok(tcp) => tcp,
        Err(message) => {
            if let Some(error) = error {
                send(&to_peer, spdy::data_frame(error, 0, message.as_bytes())).await;
                send(&to_peer, spdy::data_frame(error, spdy::FLAG_FIN, &[])).await;
            }
            send(&to_peer, spdy::data_frame(data, spdy::FLAG_FIN, &[])).await;
            return;
        }
    };
    let (mut read, mut write) = tcp.into_split();
    let upstream = async move {
        while let Some(Some(bytes)) = from_peer.recv().await {
            if write.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = write.shutdown().await;
    };
    let downstream = async {
        let mut buffer = vec![0u8; 32 * 1024];
        while let Ok(n) = read.read(&mut buffer).await {
            if n == 0 {
                break;
            }
            send(&to_peer, spdy::data_frame(data, 0, &buffer[..n])).await;
        }
        send(&to_peer, spdy::data_frame(data, spdy::FLAG_FIN, &[])).await;
    };
    tokio::join!(upstream, downstream);
}
