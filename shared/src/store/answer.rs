//! Reading a store's answer without letting the store decide how much memory it takes: at most
//! [`MAX_ANSWER_BYTES`] are kept, the rest is never read (the connection is dropped).

use super::limits::MAX_ANSWER_BYTES;

/// An answer's body, cut at [`MAX_ANSWER_BYTES`].
pub(crate) struct Answer {
    pub bytes: Vec<u8>,
    /// The store sent more than was kept.
    pub truncated: bool,
}

impl Answer {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// Read `response`'s body up to the cap. Its deadline still applies (set on the request).
pub(crate) async fn read_capped(mut response: reqwest::Response) -> Result<Answer, reqwest::Error> {
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let room = MAX_ANSWER_BYTES - bytes.len();
        if chunk.len() > room {
            bytes.extend_from_slice(&chunk[..room]);
            return Ok(Answer {
                bytes,
                truncated: true,
            });
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(Answer {
        bytes,
        truncated: false,
    })
}
