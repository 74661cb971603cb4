//! SPDY/3.1 framing, as much as a kubelet needs to answer `pods/portforward`: KubeadmControlPlane
//! reads each control plane host's API server certificate through a port-forward to its
//! `kube-apiserver` pod, and the API server hands that upgrade to the node's kubelet in SPDY.
//!
//! Header blocks are zlib streams with SPDY/3's preset dictionary, one stream per connection and
//! direction. Blocks received are inflated (the peer's compressor refers to the dictionary);
//! blocks sent are stored (uncompressed) deflate blocks, each ended by a sync flush as a
//! compressor's would be: Go's inflater hands a stored block's bytes out only once it reads the
//! next block, so without the flush's empty block the peer would read past the frame.

use std::sync::OnceLock;

use miniz_oxide::inflate::TINFLStatus;
use miniz_oxide::inflate::core::{DecompressorOxide, decompress, inflate_flags};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Control frame types used here.
pub const SYN_STREAM: u16 = 1;
pub const SYN_REPLY: u16 = 2;
pub const RST_STREAM: u16 = 3;
pub const PING: u16 = 6;
pub const GOAWAY: u16 = 7;
/// The FIN flag of a data frame (the sender's half of the stream is closed).
pub const FLAG_FIN: u8 = 1;

/// The largest frame accepted (SPDY's length field holds 24 bits).
const MAX_FRAME: usize = (1 << 24) - 1;
/// A zlib header with a preset dictionary (FDICT), as Go's best-compression writer starts.
const ZLIB_HEADER: [u8; 2] = [0x78, 0xF9];
/// What a zlib sync flush ends with: an empty, non-final stored block.
const SYNC_FLUSH: [u8; 5] = [0, 0, 0, 0xFF, 0xFF];

/// What went wrong reading a peer's frames.
#[derive(Debug, thiserror::Error)]
pub enum SpdyError {
    #[error("SPDY connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("SPDY protocol error: {0}")]
    Protocol(String),
}

fn protocol(message: impl Into<String>) -> SpdyError {
    SpdyError::Protocol(message.into())
}

/// The SPDY/3 header compression dictionary (draft 3, section 2.6.10.1): length-prefixed
/// header names and common values, then a run of common value fragments.
pub fn dictionary() -> &'static [u8] {
    static DICTIONARY: OnceLock<Vec<u8>> = OnceLock::new();
    DICTIONARY.get_or_init(|| {
        const WORDS: &str = "options head post put delete trace accept accept-charset \
            accept-encoding accept-language accept-ranges age allow authorization cache-control \
            connection content-base content-encoding content-language content-length \
            content-location content-md5 content-range content-type date etag expect expires \
            from host if-match if-modified-since if-none-match if-range if-unmodified-since \
            last-modified location max-forwards pragma proxy-authenticate proxy-authorization \
            range referer retry-after server te trailer transfer-encoding upgrade user-agent vary \
            via warning www-authenticate method get status";
        const MORE_WORDS: [&str; 8] = [
            "200 OK",
            "version",
            "HTTP/1.1",
            "url",
            "public",
            "set-cookie",
            "keep-alive",
            "origin",
        ];
        const TAIL: &str = "100101201202205206300302303304305306307402405406407408409410411412\
            413414415416417502504505203 Non-Authoritative Information204 No Content301 Moved \
            Permanently400 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal \
            Server Error501 Not Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug \
            Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,\
            image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,\
            text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=\
            iso-8859-1,utf-,*,enq=0.";
        let mut bytes = Vec::with_capacity(1423);
        for word in WORDS.split_whitespace().chain(MORE_WORDS) {
            bytes.extend((word.len() as u32).to_be_bytes());
            bytes.extend(word.as_bytes());
        }
        bytes.extend(TAIL.as_bytes());
        bytes
    })
}

fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for byte in data {
        a = (a + u32::from(*byte)) % 65521;
        b = (b + a) % 65521;
    }
    (b << 16) | a
}

/// One frame as read from the wire.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    Control {
        kind: u16,
        flags: u8,
        payload: Vec<u8>,
    },
    Data {
        stream: u32,
        flags: u8,
        payload: Vec<u8>,
    },
}

/// Read the next frame; `None` when the peer closed the connection between frames.
pub async fn read_frame<R: AsyncRead + Unpin>(reader: &mut R) -> Result<Option<Frame>, SpdyError> {
    let mut head = [0u8; 8];
    match reader.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let first = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
    let flags = head[4];
    let length = u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize;
    if length > MAX_FRAME {
        return Err(protocol(format!("frame of {length} bytes")));
    }
    let mut payload = vec![0u8; length];
    reader.read_exact(&mut payload).await?;
    Ok(Some(if first & 0x8000_0000 != 0 {
        let version = (first >> 16) & 0x7FFF;
        if version != 3 {
            return Err(protocol(format!("SPDY version {version}, only 3 is spoken here")));
        }
        Frame::Control {
            kind: (first & 0xFFFF) as u16,
            flags,
            payload,
        }
    } else {
        Frame::Data {
            stream: first & 0x7FFF_FFFF,
            flags,
            payload,
        }
    }))
}

fn frame_head(first: u32, flags: u8, length: usize) -> Vec<u8> {
    let length = (length.min(MAX_FRAME) as u32).to_be_bytes();
    let mut head = first.to_be_bytes().to_vec();
    head.extend([flags, length[1], length[2], length[3]]);
    head
}

/// A control frame of `kind` carrying `payload`.
pub fn control_frame(kind: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut frame = frame_head(0x8003_0000 | u32::from(kind), flags, payload.len());
    frame.extend(payload);
    frame
}

/// A data frame on `stream` (at most [`MAX_FRAME`] bytes of `payload`: callers send less).
pub fn data_frame(stream: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut frame = frame_head(stream & 0x7FFF_FFFF, flags, payload.len());
    frame.extend(&payload[..payload.len().min(MAX_FRAME)]);
    frame
}

/// The stream ID a SYN_STREAM, SYN_REPLY or RST_STREAM payload starts with.
pub fn stream_id(payload: &[u8]) -> Result<u32, SpdyError> {
    payload
        .get(..4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) & 0x7FFF_FFFF)
        .ok_or_else(|| protocol("control frame too short for a stream ID"))
}

/// A SYN_STREAM's stream ID and headers.
pub fn syn_stream(
    payload: &[u8],
    headers: &mut HeaderDecoder,
) -> Result<(u32, Vec<(String, String)>), SpdyError> {
    let id = stream_id(payload)?;
    let block = payload
        .get(10..)
        .ok_or_else(|| protocol("SYN_STREAM too short"))?;
    Ok((id, headers.decode(block)?))
}

/// A SYN_REPLY accepting `stream`, with no headers.
pub fn syn_reply(stream: u32, headers: &mut HeaderEncoder) -> Vec<u8> {
    let mut payload = (stream & 0x7FFF_FFFF).to_be_bytes().to_vec();
    payload.extend(headers.encode(&[]));
    control_frame(SYN_REPLY, 0, &payload)
}

/// The header blocks a peer sends, inflated with the dictionary as one continuous zlib stream.
pub struct HeaderDecoder {
    inflater: Box<DecompressorOxide>,
    /// The dictionary, then everything inflated so far: back-references reach into both.
    history: Vec<u8>,
    filled: usize,
    /// zlib header bytes still to skip (2, plus 4 for a dictionary ID).
    header: Vec<u8>,
}

impl Default for HeaderDecoder {
    fn default() -> Self {
        let history = dictionary().to_vec();
        HeaderDecoder {
            inflater: Box::default(),
            filled: history.len(),
            history,
            header: vec![],
        }
    }
}

impl HeaderDecoder {
    /// The name/value pairs of the next header block.
    pub fn decode(&mut self, block: &[u8]) -> Result<Vec<(String, String)>, SpdyError> {
        let mut input = self.skip_zlib_header(block)?;
        let start = self.filled;
        let flags = inflate_flags::TINFL_FLAG_HAS_MORE_INPUT
            | inflate_flags::TINFL_FLAG_USING_NON_WRAPPING_OUTPUT_BUF;
        loop {
            if self.history.len() < self.filled + 4096 {
                self.history.resize(self.filled + 65536, 0);
            }
            let (status, read, written) =
                decompress(&mut self.inflater, input, &mut self.history, self.filled, flags);
            self.filled += written;
            input = &input[read..];
            match status {
                TINFLStatus::HasMoreOutput => continue,
                TINFLStatus::NeedsMoreInput | TINFLStatus::Done if input.is_empty() => break,
                TINFLStatus::NeedsMoreInput | TINFLStatus::Done if read == 0 && written == 0 => {
                    return Err(protocol("header block has bytes after its compressed data"));
                }
                TINFLStatus::NeedsMoreInput | TINFLStatus::Done => continue,
                failed => return Err(protocol(format!("header block does not inflate: {failed:?}"))),
            }
        }
        parse_pairs(&self.history[start..self.filled]).map_err(|e| {
            let hex: String = block.iter().map(|b| format!("{b:02x}")).collect();
            let text = String::from_utf8_lossy(&self.history[start..self.filled]).into_owned();
            protocol(format!("{e}; block {hex} inflated to {text:?}"))
        })
    }

    fn skip_zlib_header<'a>(&mut self, block: &'a [u8]) -> Result<&'a [u8], SpdyError> {
        let mut rest = block;
        while self.header.len() < 2 || (self.header[1] & 0x20 != 0 && self.header.len() < 6) {
            let Some((first, tail)) = rest.split_first() else {
                return Ok(rest);
            };
            self.header.push(*first);
            rest = tail;
            if self.header.len() == 6 {
                let id = u32::from_be_bytes([self.header[2], self.header[3], self.header[4], self.header[5]]);
                if id != adler32(dictionary()) {
                    return Err(protocol("header compression uses another dictionary"));
                }
            }
        }
        Ok(rest)
    }
}

fn parse_pairs(block: &[u8]) -> Result<Vec<(String, String)>, SpdyError> {
    let mut rest = block;
    let mut take = |n: usize| -> Result<&[u8], SpdyError> {
        if rest.len() < n {
            return Err(protocol("header block ends early"));
        }
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Ok(head)
    };
    let word = |bytes: &[u8]| u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
    let count = word(take(4)?);
    let mut pairs = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        let length = word(take(4)?);
        let name = String::from_utf8_lossy(take(length)?).into_owned();
        let length = word(take(4)?);
        let value = String::from_utf8_lossy(take(length)?).into_owned();
        pairs.push((name, value));
    }
    Ok(pairs)
}

/// The header blocks sent: one zlib stream of stored blocks (no compression, byte-aligned), each
/// block followed by a sync flush (an empty stored block).
#[derive(Default)]
pub struct HeaderEncoder {
    started: bool,
}

impl HeaderEncoder {
    /// The next header block carrying `pairs` (names lower case, as SPDY/3 wants).
    pub fn encode(&mut self, pairs: &[(&str, &str)]) -> Vec<u8> {
        let mut raw = (pairs.len() as u32).to_be_bytes().to_vec();
        for (name, value) in pairs {
            for text in [name, value] {
                raw.extend((text.len() as u32).to_be_bytes());
                raw.extend(text.as_bytes());
            }
        }
        let mut out = vec![];
        if !self.started {
            self.started = true;
            out.extend(ZLIB_HEADER);
            out.extend(adler32(dictionary()).to_be_bytes());
        }
        for chunk in raw.chunks(u16::MAX as usize) {
            let length = chunk.len() as u16;
            out.push(0);
            out.extend(length.to_le_bytes());
            out.extend((!length).to_le_bytes());
            out.extend(chunk);
        }
        out.extend(SYNC_FLUSH);
        out
    }
}

/// The value of header `name` among `pairs`.
pub fn header<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    #[test]
    fn the_dictionary_is_spdy3s() {
        let dictionary = dictionary();
        assert_eq!(dictionary.len(), 1423);
        let digest: String = Sha256::digest(dictionary)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            digest,
            "51d27341373f923f3cd88e1eb7162aeaa3723d7585ff2399201dc06498407f02"
        );
        assert_eq!(adler32(dictionary), 0xe3c6_a7c2);
    }

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Two header blocks of one stream compressed by zlib with the dictionary at level 9 (as
    /// a Go client's are): the second refers back into the first.
    #[test]
    fn inflates_a_peers_blocks_with_the_dictionary() {
        let mut decoder = HeaderDecoder::default();
        let first = decoder
            .decode(&hex(
                "78f9e3c6a7c202253a48f95b044eea662626c6409ab308125f99a074cc68004e892545a989b9d0c2863515141500000000ffff",
            ))
            .unwrap();
        assert_eq!(header(&first, "streamType"), Some("error"));
        assert_eq!(header(&first, "port"), Some("6443"));
        let second = decoder.decode(&hex("225333a8a44a04000000ffff")).unwrap();
        assert_eq!(header(&second, "streamtype"), Some("data"));
        assert_eq!(header(&second, "requestid"), Some("0"));
    }

    #[test]
    fn stored_blocks_read_back_in_sequence() {
        let mut encoder = HeaderEncoder::default();
        let mut decoder = HeaderDecoder::default();
        for value in ["one", "two"] {
            let block = encoder.encode(&[("streamtype", value), ("port", "10250")]);
            assert!(block.ends_with(&SYNC_FLUSH), "each block ends with a sync flush");
            let pairs = decoder.decode(&block).unwrap();
            assert_eq!(header(&pairs, "streamtype"), Some(value));
            assert_eq!(header(&pairs, "port"), Some("10250"));
        }
    }

    #[tokio::test]
    async fn frames_read_back() {
        let mut encoder = HeaderEncoder::default();
        let mut wire = syn_reply(3, &mut encoder);
        wire.extend(data_frame(3, FLAG_FIN, b"hello"));
        let mut reader = wire.as_slice();
        let Some(Frame::Control { kind, payload, .. }) = read_frame(&mut reader).await.unwrap() else {
            panic!("not a control frame");
        };
        assert_eq!((kind, stream_id(&payload).unwrap()), (SYN_REPLY, 3));
        assert_eq!(
            read_frame(&mut reader).await.unwrap(),
            Some(Frame::Data {
                stream: 3,
                flags: FLAG_FIN,
                payload: b"hello".to_vec()
            })
        );
        assert_eq!(read_frame(&mut reader).await.unwrap(), None);
    }
}
