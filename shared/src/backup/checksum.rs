//! etcd ends a snapshot stream with the SHA-256 of the database before it (the file `etcdctl
//! snapshot save` writes has the same shape, and `snapshot restore` checks it). Pieces pass
//! through here, which holds the latest 32 bytes back, hashes the rest and checks the two
//! against each other at the end.

use sha2::{Digest, Sha256};

/// Length of the checksum etcd appends.
pub const CHECKSUM_LEN: usize = 32;

/// Separates database bytes from the trailing checksum while they stream by.
#[derive(Default)]
pub struct ChecksumTrailer {
    held: Vec<u8>,
    hasher: Sha256,
    size: u64,
}

/// Why the stream is not a verified database.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChecksumError {
    #[error(
        "the database's SHA-256 is {computed} but etcd sent {sent}: the stream was corrupted on \
         the way"
    )]
    Mismatch { computed: String, sent: String },
    #[error("the stream ended after {0} bytes, before etcd's 32-byte checksum")]
    Truncated(u64),
    #[error("etcd announced a {announced}-byte database but sent {received} bytes")]
    SizeMismatch { announced: u64, received: u64 },
}

/// A database whose checksum matched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    pub size: u64,
    pub sha256: [u8; 32],
}

impl ChecksumTrailer {
    /// Take the next piece of the stream: everything but the latest 32 bytes seen is database.
    pub fn push(&mut self, piece: &[u8]) {
        let total = self.held.len() + piece.len();
        if total <= CHECKSUM_LEN {
            self.held.extend_from_slice(piece);
            return;
        }
        let release = total - CHECKSUM_LEN;
        let from_held = release.min(self.held.len());
        let from_piece = release - from_held;
        self.hasher.update(&self.held[..from_held]);
        self.hasher.update(&piece[..from_piece]);
        self.size += release as u64;
        self.held.drain(..from_held);
        self.held.extend_from_slice(&piece[from_piece..]);
    }

    /// Check the held bytes are the SHA-256 of everything released, and (when etcd announced
    /// one) that the size is the announced size.
    pub fn finish(self, announced: Option<u64>) -> Result<Verified, ChecksumError> {
        if self.held.len() < CHECKSUM_LEN {
            return Err(ChecksumError::Truncated(self.size + self.held.len() as u64));
        }
        if let Some(announced) = announced
            && announced != self.size
        {
            return Err(ChecksumError::SizeMismatch {
                announced,
                received: self.size,
            });
        }
        let computed: [u8; 32] = self.hasher.finalize().into();
        if computed[..] != self.held[..] {
            return Err(ChecksumError::Mismatch {
                computed: hex(&computed),
                sent: hex(&self.held),
            });
        }
        Ok(Verified {
            size: self.size,
            sha256: computed,
        })
    }
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn stream(data: &[u8]) -> Vec<u8> {
        let mut all = data.to_vec();
        all.extend_from_slice(&Sha256::digest(data));
        all
    }

    fn run(pieces: &[&[u8]]) -> ChecksumTrailer {
        let mut trailer = ChecksumTrailer::default();
        for piece in pieces {
            trailer.push(piece);
        }
        trailer
    }

    #[test]
    fn verifies_the_database_whatever_the_piece_boundaries() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let all = stream(&data);
        for cut in [1, 5, 31, 32, 33, 64, 500, 1031] {
            let pieces: Vec<&[u8]> = all.chunks(cut).collect();
            let trailer = run(&pieces);
            let verified = trailer.finish(Some(1000)).unwrap();
            assert_eq!(verified.size, 1000, "pieces of {cut}");
            assert_eq!(verified.sha256[..], Sha256::digest(&data)[..]);
        }
        // etcd's shape: the database in 32 KiB messages, then the checksum alone.
        let trailer = run(&[&data[..600], &data[600..], &Sha256::digest(&data)]);
        assert!(trailer.finish(Some(1000)).is_ok());
    }

    #[test]
    fn a_wrong_checksum_a_short_stream_and_a_size_mismatch_fail() {
        let data = b"some etcd database bytes".repeat(10);
        let mut all = stream(&data);
        let last = all.len() - 1;
        all[last] ^= 1;
        let trailer = run(&[&all]);
        let err = trailer.finish(None).unwrap_err();
        assert!(matches!(err, ChecksumError::Mismatch { .. }), "{err}");
        assert!(err.to_string().contains(&hex(&Sha256::digest(&data))), "{err}");

        let trailer = run(&[&[1, 2, 3]]);
        assert_eq!(trailer.finish(None).unwrap_err(), ChecksumError::Truncated(3));

        let trailer = run(&[&stream(&data)]);
        let err = trailer.finish(Some(data.len() as u64 + 1)).unwrap_err();
        assert!(matches!(err, ChecksumError::SizeMismatch { .. }), "{err}");
        // A database cut short looks like one whose checksum is wrong.
        let trailer = run(&[&stream(&data)[..100]]);
        assert!(matches!(
            trailer.finish(None),
            Err(ChecksumError::Mismatch { .. })
        ));
    }
}
