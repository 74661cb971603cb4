//! A stand-in for an object store a tenant controls, to show it cannot hurt the controller: an
//! HTTP server on 127.0.0.1 that answers every request the same bad way, and counts the bytes
//! it managed to send.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How the stand-in answers every request but HEAD, which it answers 200 at once (so a bucket
/// check passes and the request after it meets the hostility).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hostility {
    /// A 200 whose headers come one byte every 100 ms, for ever.
    TrickleHeaders,
    /// A 200 with its headers at once, then a body of one byte every 100 ms, for ever.
    TrickleBody,
    /// A 500 announcing a 1 GiB error body, and sending it as fast as it is read.
    HugeErrorBody,
    /// A 403 whose S3 error document carries text from "inside" (an internal host's banner),
    /// and whose code is not an S3 code.
    InternalText,
    /// A 500 that is not an S3 document at all: an internal admin page.
    InternalPage,
}

/// The secret-looking text [`Hostility::InternalText`] and [`Hostility::InternalPage`] answer;
/// it must never reach a status or an Event.
pub const INTERNAL_TEXT: &str = "admin console of 10.96.0.17: root password hunter2";

/// One running stand-in; stops when dropped.
pub struct HostileStore {
    endpoint: String,
    sent: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for HostileStore {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl HostileStore {
    /// Serve `hostility` on a free 127.0.0.1 port.
    pub async fn start(hostility: Hostility) -> HostileStore {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the stand-in");
        let endpoint = format!("http://{}", listener.local_addr().expect("its address"));
        let sent = Arc::new(AtomicU64::new(0));
        let counter = sent.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let counter = counter.clone();
                tokio::spawn(async move {
                    let _ = answer(stream, hostility, counter).await;
                });
            }
        });
        HostileStore { endpoint, sent, task }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Bytes written to clients so far (all connections).
    pub fn bytes_sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
}

async fn answer(mut stream: TcpStream, hostility: Hostility, sent: Arc<AtomicU64>) -> std::io::Result<()> {
    let head = read_request_head(&mut stream).await?;
    if head.starts_with(b"HEAD ") {
        return respond(&mut stream, "200 OK", "", &sent).await;
    }
    let send = |bytes: Vec<u8>| {
        sent.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        bytes
    };
    match hostility {
        Hostility::TrickleHeaders => {
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Slow: "
                .iter()
                .chain(std::iter::repeat(&b'z'))
            {
                stream.write_all(&send(vec![*byte])).await?;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Hostility::TrickleBody => {
            let head = b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n<Initiate".to_vec();
            stream.write_all(&send(head)).await?;
            loop {
                stream.write_all(&send(b" ".to_vec())).await?;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Hostility::HugeErrorBody => {
            let head = format!(
                "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\r\n<Error><Code>InternalError</Code><Message>",
                1u64 << 30
            );
            stream.write_all(&send(head.into_bytes())).await?;
            let chunk = vec![b'x'; 64 << 10];
            loop {
                stream.write_all(&send(chunk.clone())).await?;
            }
        }
        Hostility::InternalText => {
            let body = format!(
                "<?xml version=\"1.0\"?><Error><Code>AccessDenied</Code><Message>{INTERNAL_TEXT}</Message></Error>"
            );
            respond(&mut stream, "403 Forbidden", &body, &sent).await?;
        }
        Hostility::InternalPage => {
            let body = format!(
                "<html><body><h1>{INTERNAL_TEXT}</h1><Error><Code>{INTERNAL_TEXT}</Code></Error></body></html>"
            );
            respond(&mut stream, "500 Internal Server Error", &body, &sent).await?;
        }
    }
    Ok(())
}

async fn respond(stream: &mut TcpStream, status: &str, body: &str, sent: &AtomicU64) -> std::io::Result<()> {
    let answer = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    sent.fetch_add(answer.len() as u64, Ordering::Relaxed);
    stream.write_all(answer.as_bytes()).await?;
    stream.shutdown().await
}

/// Read up to the end of the request's headers (a body, if any, is ignored); what was read.
async fn read_request_head(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::new();
    let mut buffer = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buffer).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buffer[..n]);
    }
    Ok(head)
}
